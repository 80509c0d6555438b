#!/usr/bin/env bash
# Installs what slotstream needs on Debian (bookworm), for one of three uses. Idempotent; run as root (or with sudo).
#   bash scripts/setup.sh demo    the CLI alone (scripts/demo.sh): compiler, CMake, Ninja and the library's
#                                 development packages (16 names, without their recommended packages)
#   bash scripts/setup.sh build   every target (scripts/build.sh): demo's, plus GStreamer's development files
#                                 (the plugin), GoogleTest, and python3-dev for `pip install .`
#   bash scripts/setup.sh test    (the default) everything scripts/test.sh runs: build's, plus the test tools —
#                                 pytest, clang + libFuzzer (fuzz/, sanitizers), clang-format, podman + runc +
#                                 debootstrap (the container image and its tests), etcd (the platform's tests),
#                                 ffmpeg, iperf3, sip-tester, GStreamer's tools and plugins, nftables, socat;
#                                 kubernetes-validate (PyPI, into build/tools-venv) and helm (scripts/helm.sh);
#                                 the Soft-RoCE VM of tests/rdma (scripts/softroce-vm.sh --setup: QEMU, a kernel,
#                                 rdma-core, and virtme-ng from PyPI into a venv of its own)
# Each profile includes the ones above it. SLOTSTREAM_SETUP_HELM=background (scripts/test.sh) leaves helm to the
# caller, which builds it beside the C++ build.
set -euo pipefail
profile=${1:-test}
# The library and the CLI: configure (CMake finds these) and compile.
demo=(build-essential cmake ninja-build ccache pkg-config python3 libucx-dev libcli11-dev nlohmann-json3-dev
      libspdlog-dev libfmt-dev libssl-dev libcurl4-openssl-dev libisal-dev prometheus-cpp-dev libcivetweb-dev)
# Every other target: the GStreamer plugin, the tests' executables, the Python extension's headers.
build=(libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev libgtest-dev python3-dev python3-venv)
# What the tests run or run against.
test=(python3-pytest python3-matplotlib python3-yaml python3-numpy ffmpeg curl
      podman runc debootstrap catatonit systemd
      ucx-utils iproute2 nftables socat iperf3 sip-tester
      clang clang-format libclang-rt-14-dev libfuzzer-14-dev etcd-server
      gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good python3-gst-1.0)
case "$profile" in
  demo) pkgs=("${demo[@]}") ;;
  build) pkgs=("${demo[@]}" "${build[@]}") ;;
  test) pkgs=("${demo[@]}" "${build[@]}" "${test[@]}") ;;
  *) echo "setup: unknown profile '$profile' (demo, build or test)" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup ($profile): installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  # demo: no recommended packages (dpkg-dev's gnupg and the like; the demo needs none of them). The other profiles
  # keep apt's default, which their tests were run with.
  norec=(); [ "$profile" = demo ] && norec=(--no-install-recommends)
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${norec[@]}" "${missing[@]}" >/dev/null
fi
[ "$profile" = test ] || exit 0

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
