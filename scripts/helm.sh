#!/usr/bin/env bash
# Helm, for the chart's offline checks (helm lint and helm template in tests/integration/test_deploy.py):
# built from the Go module proxy into build/tools-bin (no other download). Go comes from the host
# (/usr/local/go or PATH), else Debian's golang-go. The first build takes a few minutes (measured
# here: 8 min on a loaded 2-core machine, 2 min of CPU); later runs find it in build/tools-bin.
# scripts/setup.sh runs this; scripts/test.sh runs it in the background beside the build.
set -euo pipefail
cd "$(dirname "$0")/.."
helm_version=v3.22.0
tools_bin=$PWD/build/tools-bin
# (`go install` leaves no version in the binary that says which patch release it is: a stamp does.)
if [ ! -x "$tools_bin/helm" ] || [ "$(cat "$tools_bin/.helm-version" 2>/dev/null)" != "$helm_version" ]; then
  go=$(command -v go || true)
  [ -n "$go" ] || { [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go; }
  if [ -z "$go" ]; then
    echo "helm: installing golang-go (to build helm)"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq golang-go >/dev/null
    go=$(command -v go)
  fi
  echo "helm: building helm $helm_version from the Go module proxy into $tools_bin ($("$go" version))"
  mkdir -p "$tools_bin"
  GOBIN=$tools_bin GOFLAGS=-buildvcs=false "$go" install "helm.sh/helm/v3/cmd/helm@$helm_version"
  echo "$helm_version" > "$tools_bin/.helm-version"
fi
