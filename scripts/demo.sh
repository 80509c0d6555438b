#!/usr/bin/env bash
# Sets up, builds and runs the demo: 12 synthetic 640x480x3 cameras at 25 fps for ~10 s over shared memory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec build/slotstream demo "$@"
