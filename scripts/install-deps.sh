#!/usr/bin/env bash
# Installs the Debian packages kvpool builds against, skipping those already present.
# Non-interactive; needs root (or sudo). CUDA is optional: when /usr/local/cuda/bin/nvcc exists the
# CUDA kernels are built too, otherwise the build leaves them out.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config python3
  libabsl-dev            # Status, StatusOr, strings, flags
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  libzmq3-dev cppzmq-dev # transport (protocol/)
  capnproto libcapnp-dev # wire schema (protocol/)
  libspdlog-dev libfmt-dev # logs
  libcpp-httplib-dev     # kvpoold's /metrics and /healthz
  libsystemd-dev         # sd_notify: readiness and watchdog under systemd
  libsodium-dev          # keyed content digests of client tensors (protocol/)
  clang libclang-rt-14-dev # libFuzzer targets (scripts/fuzz.sh)
  python3-venv           # the Python client's environment (.venv, below)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-deps: installing ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python client's packages (pycapnp is not packaged by Debian 12) in .venv, from PyPI.
# Without PyPI the rest still builds and runs; only the Python client's test is skipped.
if ! .venv/bin/python3 -c "import capnp, zmq" 2>/dev/null; then
  echo "install-deps: creating .venv with pycapnp and pyzmq"
  if ! { python3 -m venv .venv &&
         .venv/bin/pip install --quiet --disable-pip-version-check pycapnp pyzmq; }; then
    echo "install-deps: could not install pycapnp and pyzmq from PyPI;" \
         "the Python client and its test need them" >&2
  fi
fi
