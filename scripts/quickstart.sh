#!/usr/bin/env bash
# The README's main job: install what is missing, build, then run the service end to end:
# kvpoold with a prefill and a decode worker (cuda when a GPU is visible, host otherwise) and a
# synthetic workload of 16 sequences x 2,048 prompt tokens x 64 decode steps on a 4-layer pool
# with an indexer and planted needles (scripts/service-demo.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
./scripts/service-demo.sh "$@"
