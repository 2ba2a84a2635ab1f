#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer in build-fuzz/, then fuzzes each for FUZZ_SECONDS (default 60) from
# its committed corpus. Fails on a crash, a leak, a timeout or an invariant broken; what
# libFuzzer found is left in build-fuzz/findings/<target>/ (crash-*, leak-*, timeout-*): add it to
# tests/fuzz/corpus/<target>/ once fixed, where every build replays it as a test.
#   scripts/fuzz.sh [TARGET...]   default: all targets
#   scripts/fuzz.sh --seeds       rewrites the seeds of the corpora (tests/fuzz/write_seeds.cc)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build-fuzz
targets=(envelope_fuzz broker_state_fuzz broker_peer_fuzz job_fuzz arena_description_fuzz
         text_files_fuzz)
seconds=${FUZZ_SECONDS:-60}

sanitizers="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DKVP_ENABLE_CUDA=OFF -DKVP_FUZZ=ON \
    -DKVP_WERROR=OFF -DCMAKE_CXX_FLAGS="$sanitizers -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
fi

if [ "${1:-}" = "--seeds" ]; then
  cmake --build "$build_dir" --parallel "$(nproc)" --target fuzz_write_seeds
  # Rewritten in place: the inputs kept beside the seeds (crashes once found) stay.
  "$build_dir/tests/fuzz/fuzz_write_seeds" tests/fuzz/corpus
  echo "fuzz: seeds written to tests/fuzz/corpus/"
  exit 0
fi
[ $# -gt 0 ] && targets=("$@")
cmake --build "$build_dir" --parallel "$(nproc)" --target "${targets[@]}"

failed=()
for t in "${targets[@]}"; do
  work="$build_dir/fuzz-corpus/$t" findings="$build_dir/findings/$t"
  rm -rf "$work" && mkdir -p "$work" "$findings"
  cp tests/fuzz/corpus/"$t"/* "$work"/
  echo "fuzz: $t for ${seconds}s from $(ls "$work" | wc -l) seeds"
  # New inputs go to the scratch corpus; the committed seeds stay as they are.
  if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
     "$build_dir/tests/fuzz/$t" "$work" -max_total_time="$seconds" -max_len=65536 -timeout=20 \
       -rss_limit_mb=3072 -print_final_stats=1 -artifact_prefix="$findings/" \
       >"$build_dir/findings/$t.log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$build_dir/findings/$t.log" |
      sed "s/^/fuzz: $t /"
  else
    echo "fuzz: $t FAILED; the last lines of $build_dir/findings/$t.log:" >&2
    tail -n 40 "$build_dir/findings/$t.log" >&2
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} of ${#targets[@]} targets found a failure: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no failure"
