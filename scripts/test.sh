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
# first build, a few minutes on a fresh machine). An image that cannot be built fails the run:
# the README promises it, and its tests (integration.test_image) fail without it.
t_image=$SECONDS
if [ "$(id -u)" -eq 0 ]; then
  bash deploy/image/build.sh
else
  sudo bash deploy/image/build.sh
fi
echo "test: container image ready ($((SECONDS - t_image)) s)"
if (($# == 0)); then
  bash scripts/format.sh --check
  bash scripts/sanitize.sh
  bash fuzz/run.sh --seconds 5
fi
# Last, so that its summary closes the run.
ctest --test-dir build --output-on-failure "$@"
