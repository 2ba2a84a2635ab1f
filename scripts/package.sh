#!/usr/bin/env bash
# Builds the Debian package kvpool_<version>_amd64.deb from build/ (scripts/build.sh; the CUDA
# kernels are in it when nvcc was found) with CPack, then checks it with lintian (errors fail).
#   scripts/package.sh [--install-check]
# --install-check (CI; root): installs it with apt-get, runs `kvpoold --help` from /usr/bin and
# `systemd-analyze verify` on the installed units, then removes it again.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh >/dev/null
(cd build && cpack -G DEB >/dev/null)
deb=$(ls build/kvpool_*_amd64.deb)
echo "package: $deb ($(du -h "$deb" | cut -f1))"
dpkg-deb --info "$deb" | sed -n '/Depends/,/Description/p' | head -5
if command -v lintian >/dev/null; then
  # Errors fail the build; warnings are printed (no man pages yet).
  lintian --fail-on error --suppress-tags no-manual-page "$deb"
  echo "package: lintian found no errors"
else
  echo "package: lintian not installed; not checked" >&2
fi
[ "${1:-}" = "--install-check" ] || exit 0

export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq "./$deb" >/dev/null
trap 'apt-get purge -y -qq kvpool >/dev/null || true' EXIT
[ "$(command -v kvpoold)" = /usr/bin/kvpoold ]
# Abseil's --help prints the flags and exits 1: the check is that the installed binary starts,
# finds every library it links, and knows its flags.
help=$(/usr/bin/kvpoold --help 2>&1 || true)
grep -q -- "--pool_kind" <<<"$help"
getent passwd kvpool >/dev/null
for conf in /etc/kvpool/kvpoold.flags /etc/kvpool/kvpool-worker.flags; do
  dpkg-query --showformat='${Conffiles}\n' --show kvpool | grep -q "$conf"
done
systemd-analyze verify /lib/systemd/system/kvpoold.service /lib/systemd/system/kvpool-worker@.service
/usr/bin/python3 -c "import importlib.util as u; \
assert u.find_spec('kvpool_client') is not None"
echo "package: installed, kvpoold --help from /usr/bin, conffiles, the kvpool user and the units checked"
