#!/usr/bin/env bash
# slotstream's RDMA suite on a real verbs stack: boots the Soft-RoCE VM once (scripts/softroce-vm.sh) and runs
# tests/rdma inside it (tests/rdma/in_vm.sh): the fabric over rxe0 (build/tests/rdma_tests), data, faults and the
# bindings over rdma (tests/rdma/test_*.py), and scripts/rdma-check.sh, which must say PASS.
#
#   bash tests/rdma/run.sh                 everything (tens of minutes: the VM emulates its CPU)
#   bash tests/rdma/run.sh --smoke         boot, one byte-exact transfer over rc, the passive receiver (scripts/test.sh)
#   bash tests/rdma/run.sh -k ud           pytest's arguments select tests (rdma_tests and rdma-check.sh then skip)
#
# Needs the build (bash scripts/build.sh: build/slotstream, build/tests/rdma_tests, build/gst) and, for the full suite,
# the Python package in build/python-venv (made here the first time, as CTest's python.install does). Results:
# $OUT_DIR (default build/rdma-suite): suite.log, junit.xml, summary.txt. Exit 0 only when every step passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=full
if [ "${1:-}" = --smoke ]; then mode=smoke; shift; fi
for f in build/slotstream build/tests/rdma_tests; do
  [ -x "$f" ] || { echo "rdma suite: $f is missing: build first (bash scripts/build.sh)" >&2; exit 2; }
done
if [ "$mode" = full ] && [ ! -x build/python-venv/bin/python ]; then
  echo "rdma suite: making build/python-venv (the Python package, pip install .)"
  bash tests/python/make_venv.sh /usr/bin/python3 build/python-venv
fi
export OUT_DIR=${OUT_DIR:-$PWD/build/rdma-suite}
rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR"
start=$SECONDS
set +e
bash scripts/softroce-vm.sh --script tests/rdma/in_vm.sh "$mode" "$@" 2>&1 | tee "$OUT_DIR/suite.log"
rc=${PIPESTATUS[0]}
set -e
echo "rdma suite ($mode): $((SECONDS - start)) s in all; results in $OUT_DIR"
if [ -f "$OUT_DIR/summary.txt" ]; then cat "$OUT_DIR/summary.txt"; else echo "rdma suite: the VM gave no summary"; rc=1; fi
exit "$rc"
