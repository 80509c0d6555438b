#!/usr/bin/env bash
# The RDMA suite, inside the Soft-RoCE VM (scripts/softroce-vm.sh runs it; tests/rdma/run.sh boots the VM for it).
#
#   tests/rdma/in_vm.sh full  [PYTEST ARGS]   the fabric over rxe (rdma_tests), every test_*.py here, rdma-check.sh
#   tests/rdma/in_vm.sh smoke                 one byte-exact transfer over rc and the passive-receiver check (CI)
#
# Prints each step and each test's result as it goes (pytest -v); writes suite.log, junit.xml and summary.txt under
# $OUT_DIR. Exit 1 when anything failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-full}
shift || true
out=${OUT_DIR:-/tmp/rdma-suite}
mkdir -p "$out"
py=/usr/bin/python3
[ -x build/python-venv/bin/python ] && py=build/python-venv/bin/python  # has the slotstream package (test_bindings)
export PYTHONUNBUFFERED=1
failed=()
step() { echo; echo "== rdma suite ($mode): $*"; }
summary() { { echo "rdma suite ($mode): ${#failed[@]} step(s) failed${failed[*]:+: ${failed[*]}}"; } | tee "$out/summary.txt"; }

step "the device: $(build/slotstream transports | grep '^rdma')"
ibv_devices | sed 's/^/   /'
if [ "$mode" = smoke ]; then
  step "pytest: one byte-exact transfer over rc, the passive status-byte receiver"
  "$py" -m pytest -v -p no:cacheprovider --junitxml="$out/junit.xml" tests/rdma/test_transfer.py \
    -k "test_files_arrive_byte_exact_over_rc and status_byte or test_the_status_byte_receiver_makes_no_progress" \
    || failed+=(pytest)
  summary
  [ ${#failed[@]} -eq 0 ]
  exit
fi

step "rdma_tests: the fabric over rxe0 (build/tests/rdma_tests)"
build/tests/rdma_tests || failed+=(rdma_tests)
step "pytest tests/rdma (python: $py)"
"$py" -m pytest -v -p no:cacheprovider --junitxml="$out/junit.xml" tests/rdma "$@" || failed+=(pytest)
if [ $# -eq 0 ]; then
  step "scripts/rdma-check.sh (its verdict must be PASS)"
  RDMA_CHECK_QUICK=1 OUT="$out/rdma-check" bash scripts/rdma-check.sh 2>&1 | tee "$out/rdma-check.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && grep -q '^VERDICT: PASS' "$out/rdma-check.log" || failed+=(rdma-check)
fi
summary
[ ${#failed[@]} -eq 0 ]
