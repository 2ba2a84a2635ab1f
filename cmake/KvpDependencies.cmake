# Every third-party dependency, found once, from Debian packages (scripts/install-deps.sh).
find_package(absl REQUIRED)
find_package(GTest REQUIRED)
find_package(benchmark REQUIRED)
find_package(Threads REQUIRED)
if(KVP_HAVE_CUDA)
  find_package(CUDAToolkit REQUIRED)
endif()
