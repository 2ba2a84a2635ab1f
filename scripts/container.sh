#!/usr/bin/env bash
# Builds and tags the container image kvpool:<version> from deploy/container/Containerfile with
# podman, buildah or docker (the first found). It needs network access to Debian's and NVIDIA's
# package repositories (the CUDA toolkit for the build stage).
#   scripts/container.sh [TAG]   default: kvpool:<project version>
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^project(kvpool VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
tag=${1:-kvpool:$version}
for tool in podman buildah docker; do
  command -v "$tool" >/dev/null || continue
  case $tool in
    buildah) buildah bud -f deploy/container/Containerfile -t "$tag" . ;;
    *) "$tool" build -f deploy/container/Containerfile -t "$tag" . ;;
  esac
  echo "container: built $tag with $tool"
  exit 0
done
echo "container: none of podman, buildah or docker is installed" >&2
exit 1
