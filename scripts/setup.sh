#!/usr/bin/env bash
# Installs what slotstream needs to build and test on Debian (bookworm). Idempotent; run as root.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libucx-dev ucx-utils libcli11-dev
      nlohmann-json3-dev libspdlog-dev libfmt-dev libssl-dev libgtest-dev python3 python3-pytest python3-matplotlib
      python3-yaml python3-venv python3-dev python3-numpy ffmpeg curl
      podman runc debootstrap catatonit systemd
      libisal-dev iproute2 nftables socat iperf3 sip-tester
      prometheus-cpp-dev libcivetweb-dev clang clang-format libclang-rt-14-dev libfuzzer-14-dev
      libcurl4-openssl-dev etcd-server
      libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev gstreamer1.0-tools gstreamer1.0-plugins-base
      gstreamer1.0-plugins-good python3-gst-1.0)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Offline Kubernetes manifest validation (tests/integration/test_deploy.py), from PyPI into a
# venv of the build tree so the system Python stays untouched.
venv=build/tools-venv
cd "$(dirname "$0")/.."
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  echo "setup: installing kubernetes-validate into $venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check kubernetes-validate
fi

# Helm, for the chart's offline checks (helm lint and helm template in tests/integration/test_deploy.py):
# built from the Go module proxy into build/tools-bin (no other download). Go comes from the host
# (/usr/local/go or PATH), else Debian's golang-go. The first build takes a few minutes (measured
# here: 8 min on a loaded 2-core machine, 2 min of CPU); later runs find it in build/tools-bin.
helm_version=v3.22.0
tools_bin=$PWD/build/tools-bin
# (`go install` leaves no version in the binary that says which patch release it is: a stamp does.)
if [ ! -x "$tools_bin/helm" ] || [ "$(cat "$tools_bin/.helm-version" 2>/dev/null)" != "$helm_version" ]; then
  go=$(command -v go || true)
  [ -n "$go" ] || { [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go; }
  if [ -z "$go" ]; then
    echo "setup: installing golang-go (to build helm)"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq golang-go >/dev/null
    go=$(command -v go)
  fi
  echo "setup: building helm $helm_version from the Go module proxy into $tools_bin ($("$go" version))"
  mkdir -p "$tools_bin"
  GOBIN=$tools_bin GOFLAGS=-buildvcs=false "$go" install "helm.sh/helm/v3/cmd/helm@$helm_version"
  echo "$helm_version" > "$tools_bin/.helm-version"
fi
