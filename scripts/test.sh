#!/usr/bin/env bash
# Sets up, builds and runs every test (unit + integration over real UCX on shm and tcp).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# The container image for the podman worker tests (cached after the first build).
if [ "$(id -u)" -eq 0 ]; then
  bash deploy/image/build.sh || echo "test: the container image could not be built; container tests will say so and skip"
fi
ctest --test-dir build --output-on-failure "$@"
