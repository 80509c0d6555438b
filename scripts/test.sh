#!/usr/bin/env bash
# Sets up, builds and runs every test (unit + integration over real UCX on shm and tcp).
# Without arguments also: the C++ layout check (scripts/format.sh --check), the unit, protocol and
# example tests under ThreadSanitizer and under AddressSanitizer + UBSan (scripts/sanitize.sh),
# every fuzz target for 5 s (fuzz/run.sh), and the RDMA smoke in a Soft-RoCE VM (tests/rdma/run.sh --smoke).
# Arguments go to ctest alone (e.g. -R Delivery) and skip those.
set -euo pipefail
cd "$(dirname "$0")/.."
t_run=$SECONDS
phase() { echo "test: [$((SECONDS - t_run)) s] $*"; }  # phase times, for keeping CI inside its budget
phase "setup"
SLOTSTREAM_SETUP_HELM=background bash scripts/setup.sh test
# Every compile through ccache (setup.sh installs it) unless the caller chose a launcher: the four builds
# (build/, the two sanitizer builds, the fuzz build) and pip's are cold on a fresh machine, and a rerun on the
# same machine (CI runs where the last session ran) recompiles only what changed. CCACHE_BASEDIR: a clone
# in another folder finds the same entries. CCACHE_NOHASHDIR: build/ and build-python/ (python.install's
# `pip install .`, tests/python/make_venv.sh) compile the library with the same command lines, so the second
# finds the first's objects instead of compiling the library again (debug info then names build/ as its
# directory, harmless).
if command -v ccache >/dev/null && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=1
fi
# Helm (only test_deploy needs it) builds beside the C++ build: on a cold Go cache it is minutes of waiting on
# downloads. Waited for before CTest; a failed build fails the run.
mkdir -p build
helm_log=build/helm-build.log
bash scripts/helm.sh >"$helm_log" 2>&1 &
helm_pid=$!
phase "build"
bash scripts/build.sh
# The container image (the receiver daemon, and the podman worker tests' image; cached after the
# first build, a few minutes on a fresh machine, mostly spent downloading and unpacking Debian
# packages): built in the background while the sanitizer and fuzz builds use the CPUs, and waited
# for before CTest. An image that cannot be built fails the run: the README promises it, and its
# tests (integration.test_image) fail without it.
image_log=build/image-build.log
t_image=$SECONDS
if [ "$(id -u)" -eq 0 ]; then
  bash deploy/image/build.sh >"$image_log" 2>&1 &
else
  sudo bash deploy/image/build.sh >"$image_log" 2>&1 &
fi
image_pid=$!
trap 'kill "$image_pid" "$helm_pid" 2>/dev/null || true' EXIT
if (($# == 0)); then
  phase "format check"
  bash scripts/format.sh --check
  phase "ThreadSanitizer"
  bash scripts/sanitize.sh thread
  phase "AddressSanitizer + UBSan"
  bash scripts/sanitize.sh address
  phase "fuzz"
  bash fuzz/run.sh --seconds 5 --jobs 2
fi
phase "waiting for helm and the image"
if ! wait "$helm_pid"; then
  cat "$helm_log"
  echo "test: helm failed to build (log above, also in $helm_log)" >&2
  exit 1
fi
cat "$helm_log"
if ! wait "$image_pid"; then
  cat "$image_log"
  echo "test: the container image failed to build (log above, also in $image_log)" >&2
  exit 1
fi
trap - EXIT
cat "$image_log"
echo "test: container image ready ($((SECONDS - t_image)) s after its start, in the background)"
# RDMA on a real verbs stack: Soft-RoCE in a VM (docs/rdma.md) — boot, one byte-exact transfer over rc, the passive
# receiver. A few minutes (the VM emulates its CPU); the whole suite is `bash tests/rdma/run.sh`.
if (($# == 0)); then
  phase "rdma smoke in the Soft-RoCE VM"
  bash tests/rdma/run.sh --smoke
fi
# Last, so that its summary closes the run. Two entries at a time (CTEST_PARALLEL_LEVEL overrides):
# most integration tests wait on peers and timeouts; the few that need the machine to themselves
# are RUN_SERIAL (tests/CMakeLists.txt).
phase "CTest (its own total closes the run)"
ctest --test-dir build --output-on-failure -j "${CTEST_PARALLEL_LEVEL:-2}" "$@"
