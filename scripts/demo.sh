#!/usr/bin/env bash
# Sets up (only what the demo needs: `scripts/setup.sh demo`), builds build/slotstream alone, and runs the demo:
# 12 synthetic 640x480x3 cameras at 25 fps for ~10 s over shared memory, every frame verified.
# Time on a fresh machine: tests/README.md ("How long").
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
bash scripts/setup.sh demo
echo "demo: set up in $((SECONDS - t0)) s; building build/slotstream"
t1=$SECONDS
bash scripts/build.sh --cli
echo "demo: built in $((SECONDS - t1)) s"
exec build/slotstream demo "$@"
