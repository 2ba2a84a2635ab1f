#!/usr/bin/env bash
# bundle-binaries.sh OUT BINARY...: copies the binaries (stripped) into OUT/bin and the shared
# libraries they load into OUT/lib, and writes OUT/run, which starts one of them with OUT/lib on
# the library path. For GPU hosts whose image has the CUDA driver, NCCL and a C++ runtime but
# not ZeroMQ, Cap'n Proto, Abseil and the rest. Left out, as the host's own must be used: the C
# and C++ runtimes, the CUDA driver libraries and NCCL.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OUT BINARY..." >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out/bin" "$out/lib"
host_owned='^(libc|libm|libpthread|libdl|librt|libresolv|libgcc_s|libstdc\+\+|libcuda|libnvidia.*|libnccl)\.so|^ld-linux'
for binary in "$@"; do
  name=$(basename "$binary")
  cp -L "$binary" "$out/bin/$name"
  strip --strip-unneeded "$out/bin/$name" 2>/dev/null || true
  # ldd lines "libfoo.so.1 => /path/libfoo.so.1 (0x...)": the resolved path is the third field.
  for lib in $(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'); do
    if ! basename "$lib" | grep -Eq "$host_owned"; then
      cp -Ln "$lib" "$out/lib/" 2>/dev/null || true
    fi
  done
done
cat > "$out/run" <<'RUN'
#!/usr/bin/env bash
# run BINARY [ARGS...]: BINARY from this bundle's bin/ (or a path), with its libraries.
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
binary=$1
shift
case "$binary" in
  */*) exec "$binary" "$@" ;;
  *) exec "$here/bin/$binary" "$@" ;;
esac
RUN
chmod +x "$out/run"
du -sh "$out"
