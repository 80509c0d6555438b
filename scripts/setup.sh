#!/usr/bin/env bash
# Installs what slotstream needs to build and test on Debian (bookworm). Idempotent; run as root.
set -euo pipefail
pkgs=(build-essential cmake ninja-build ccache pkg-config libucx-dev ucx-utils libcli11-dev
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

# The Soft-RoCE VM of the RDMA tests (tests/rdma; scripts/test.sh runs its smoke): QEMU, a kernel, rdma-core, and
# virtme-ng (pinned) in a venv of its own.
bash scripts/softroce-vm.sh --setup

# Helm (tests/integration/test_deploy.py): scripts/helm.sh builds it from the Go module proxy. scripts/test.sh
# sets SLOTSTREAM_SETUP_HELM=background and builds it beside the C++ build instead (minutes on a machine whose Go
# cache is cold, mostly waiting on downloads).
if [ "${SLOTSTREAM_SETUP_HELM:-now}" = now ]; then
  bash scripts/helm.sh
fi
