#!/usr/bin/env bash
# Sets up, builds and runs every test (unit + integration over real UCX on shm and tcp).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure "$@"
