#!/usr/bin/env bash
# Sets up, builds and runs every test (unit + integration over real UCX on shm and tcp).
# Without arguments also: the C++ layout check (scripts/format.sh --check), the unit, protocol and
# example tests under ThreadSanitizer and under AddressSanitizer + UBSan (scripts/sanitize.sh), and
# every fuzz target for 5 s (fuzz/run.sh).
# Arguments go to ctest alone (e.g. -R Delivery) and skip those.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
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
trap 'kill "$image_pid" 2>/dev/null || true' EXIT
if (($# == 0)); then
  bash scripts/format.sh --check
  bash scripts/sanitize.sh
  bash fuzz/run.sh --seconds 5
fi
if ! wait "$image_pid"; then
  cat "$image_log"
  echo "test: the container image failed to build (log above, also in $image_log)" >&2
  exit 1
fi
trap - EXIT
cat "$image_log"
echo "test: container image ready ($((SECONDS - t_image)) s after its start, in the background)"
# Last, so that its summary closes the run. Two entries at a time (CTEST_PARALLEL_LEVEL overrides):
# most integration tests wait on peers and timeouts; the few that need the machine to themselves
# are RUN_SERIAL (tests/CMakeLists.txt).
ctest --test-dir build --output-on-failure -j "${CTEST_PARALLEL_LEVEL:-2}" "$@"
