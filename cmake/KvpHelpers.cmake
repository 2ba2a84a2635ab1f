# Helpers that make every kvpool target the same way: explicit sources, C++20, our warnings as
# errors, no floating-point contraction on the host (docs/design.md §3: writes must be bit-exact).

# Off for builds with another compiler, such as the fuzzers' (clang warns of other things).
option(KVP_WERROR "Treat warnings as errors" ON)
set(KVP_CXX_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor)
if(KVP_WERROR)
  list(APPEND KVP_CXX_WARNINGS -Werror)
endif()

function(kvp_apply_flags target visibility)
  target_compile_options(${target} ${visibility}
    $<$<COMPILE_LANGUAGE:CXX>:${KVP_CXX_WARNINGS} -ffp-contract=off>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror,-ffp-contract=off>)
endfunction()

# kvp_cc_library(NAME name SRCS ... [CUDA_SRCS ...] DEPS ...): target kvp_<name>, alias kvp::<name>.
# CUDA_SRCS join the library only when nvcc was found.
function(kvp_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;CUDA_SRCS;DEPS" ${ARGN})
  set(target kvp_${ARG_NAME})
  set(srcs ${ARG_SRCS})
  if(KVP_HAVE_CUDA)
    list(APPEND srcs ${ARG_CUDA_SRCS})
  endif()
  if(srcs)
    add_library(${target} STATIC ${srcs})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
    target_link_libraries(${target} PUBLIC ${ARG_DEPS})
    kvp_apply_flags(${target} PRIVATE)
    if(KVP_HAVE_CUDA AND ARG_CUDA_SRCS)
      target_compile_definitions(${target} PUBLIC KVP_HAVE_CUDA=1)
      set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
    endif()
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR})
    target_link_libraries(${target} INTERFACE ${ARG_DEPS})
  endif()
  add_library(kvp::${ARG_NAME} ALIAS ${target})
endfunction()

# kvp_cc_binary(NAME name SRCS ... DEPS ...): an installed executable.
function(kvp_cc_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  kvp_apply_flags(${ARG_NAME} PRIVATE)
  install(TARGETS ${ARG_NAME} RUNTIME DESTINATION bin)
endfunction()

# kvp_cc_test(NAME name SRCS ... DEPS ... [LABELS cpu|gpu ...] [ARGS ...] [OWN_MAIN]): a GoogleTest
# binary registered with CTest under its labels (`ctest -L cpu`, `-LE gpu`). OWN_MAIN: the test
# defines main() itself (to take ARGS).
function(kvp_cc_test)
  cmake_parse_arguments(ARG "OWN_MAIN" "NAME" "SRCS;DEPS;LABELS;ARGS" ${ARGN})
  if(NOT ARG_LABELS)
    set(ARG_LABELS cpu)
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock)
  if(NOT ARG_OWN_MAIN)
    target_link_libraries(${ARG_NAME} PRIVATE GTest::gtest_main)
  endif()
  kvp_apply_flags(${ARG_NAME} PRIVATE)
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME} ${ARG_ARGS})
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}")
endfunction()
