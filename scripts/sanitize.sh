#!/usr/bin/env bash
# Builds the host code with AddressSanitizer and UndefinedBehaviorSanitizer (Debug, no CUDA) in
# build-asan/ and runs the CPU tests there. CI runs it after the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
KVP_BUILD_DIR=build-asan ./scripts/build.sh -DKVP_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure --parallel "$(nproc)" -L cpu
