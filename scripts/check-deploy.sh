#!/usr/bin/env bash
# Checks what operators install, as CI does (needs root for the package install):
#   - the Debian package: built, lintian without errors, installed with apt-get, kvpoold from
#     /usr/bin, systemd-analyze verify on the installed units, removed again (scripts/package.sh);
#   - the Kubernetes manifests against the Kubernetes API schemas (kubernetes-validate, PyPI);
#   - the Prometheus alert rules (promtool check rules; /metrics itself is checked by
#     tests/tools/observability_test.py);
#   - the container image, built when podman or buildah works here; otherwise the .deb install
#     above is the same step the image's run stage takes.
# Installs lintian, prometheus (for promtool) and systemd when missing; --install-tools only does
# that (CI runs it before the tests: tests/tools/observability_test.py needs promtool there).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
for tool in lintian:lintian promtool:prometheus systemd-analyze:systemd; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "check-deploy: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[ "${1:-}" = "--install-tools" ] && exit 0

./scripts/package.sh --install-check

[ -x .venv/bin/pip ] || python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check kubernetes-validate
.venv/bin/kubernetes-validate --strict deploy/kubernetes/*.yaml
echo "check-deploy: Kubernetes manifests valid"

promtool check rules deploy/prometheus/kvpool-alerts.yml

built=""
for tool in podman buildah; do
  if command -v "$tool" >/dev/null && "$tool" info >/dev/null 2>&1; then
    ./scripts/container.sh && built=yes
    break
  fi
done
[ -n "$built" ] || echo "check-deploy: no working podman or buildah here: the image was not built" \
  "(its run stage installs the .deb checked above)"
echo "check-deploy: all checks passed"
