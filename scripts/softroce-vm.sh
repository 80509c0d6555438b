#!/usr/bin/env bash
# Runs a command inside a small virtual machine with a software RDMA NIC (Soft-RoCE, the kernel's
# rdma_rxe): slotstream's RDMA test rig (tests/rdma, docs/rdma.md). No machine this repository is
# developed on has an RDMA NIC; inside the VM UCX lists rc_verbs and ud_verbs on rxe0:1, so rdma runs
# on a real verbs stack: queue pairs, memory registration, one-sided puts and gets, rdmacm.
#
#   bash scripts/softroce-vm.sh 'build/slotstream transports; ibv_devices'
#   bash scripts/softroce-vm.sh --script tests/rdma/in_vm.sh [ARGS...]
#
# The VM runs Debian's stock kernel under QEMU with this machine's root filesystem (virtme-ng), so a
# build made here runs there unchanged. Inside, before the command: rdma_rxe and rdma_ucm loaded,
# dummy0 up at 10.9.0.1/24 with rxe0 on it (RoCE v2: both ends of a test connect to 10.9.0.1 and the
# NIC loops back), `ulimit -l unlimited`, cwd = where this was run. / is this machine's, read-only
# except for copy-on-write overlays on /tmp and the project's folders: write results under $OUT_DIR
# (default ./softroce-out, created here and shared with the VM through a writable mount). The
# command's exit status is this script's.
#
# Measured on these machines: /dev/kvm exists but the kernel hangs at start under nested KVM, so the
# VM runs under TCG emulation: ~60 s to boot (on an idle host), code many times slower than here.
# It shows correctness (one-sided verbs, wire-up, registration, ordering), never speed.
# Settings: SOFTROCE_VM_MEM (3G), SOFTROCE_VM_CPUS (2), SOFTROCE_VM_TIMEOUT (seconds, 1800), OUT_DIR.
# Needs (installed here the first time, as root): qemu-system-x86, linux-image-amd64, rdma-core,
# ibverbs-providers, ibverbs-utils, busybox-static (apt), and virtme-ng from PyPI, pinned, in a
# venv under ~/.cache/slotstream-vng. `--setup` installs them and exits.
set -euo pipefail
VNG_VERSION=1.42
mem=${SOFTROCE_VM_MEM:-3G}
cpus=${SOFTROCE_VM_CPUS:-2}
timeout_s=${SOFTROCE_VM_TIMEOUT:-1800}
out_dir=${OUT_DIR:-$PWD/softroce-out}
venv=${HOME}/.cache/slotstream-vng

setup() {
  local need=() p
  for p in qemu-system-x86 linux-image-amd64 rdma-core ibverbs-providers ibverbs-utils busybox-static; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
  done
  if ((${#need[@]})); then
    local sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  if [ ! -x "$venv/bin/vng" ] || ! "$venv/bin/pip" show -q virtme-ng 2>/dev/null | grep -qx "Version: $VNG_VERSION"; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "virtme-ng==$VNG_VERSION"
  fi
}

case ${1:-} in
  --setup) setup; exit 0 ;;
  --script) shift; script=$(realpath "${1:?usage: softroce-vm.sh --script FILE [ARGS...]}"); shift
            cmd="bash $(printf '%q ' "$script" "$@")" ;;
  ""|-h|--help) sed -n '2,25p' "$0"; exit 2 ;;
  *) cmd=$1 ;;
esac
setup
kernel=$(ls /boot/vmlinuz-* | sort -V | tail -n 1)
mkdir -p "$out_dir"
out_dir=$(realpath "$out_dir")
inner=$(mktemp /tmp/softroce-inner.XXXXXX.sh)
status=$(mktemp "$out_dir/.status.XXXXXX")
trap 'rm -f "$inner" "$status"' EXIT
cat >"$inner" <<INNER
set -e
modprobe rdma_rxe
modprobe rdma_ucm
ip link set lo up
ip link add dummy0 type dummy && ip link set dummy0 up && ip addr add 10.9.0.1/24 dev dummy0
rdma link add rxe0 type rxe netdev dummy0
ulimit -l unlimited
export OUT_DIR=$out_dir
cd $(printf '%q' "$PWD")
set +e
$cmd
echo \$? > $status
INNER
echo 255 >"$status"
PATH=$venv/bin:$PATH timeout "$timeout_s" vng --disable-kvm --force-initramfs -m "$mem" -p "$cpus" -r "$kernel" \
  --rwdir "$out_dir" --exec "bash $inner" || true
rc=$(cat "$status")
echo "softroce-vm: exit $rc"
exit "$rc"
