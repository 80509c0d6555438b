#!/usr/bin/env bash
# A/B of two builds on a fixed panel of `slotstream bench` points (scripts/perf_ab.py has the details):
#   scripts/perf-ab.sh BASE [HEAD]    BASE, HEAD: commits; HEAD left out = the working tree (built in build/)
#   scripts/perf-ab.sh --build-only BASE [HEAD]; --rounds N; --tiny (the script's own test, no build)
# Builds what it needs under build-ab/ (a worktree per commit, only the CLI), then measures the two
# binaries alternately; prints per point both medians, HEAD/BASE, the A/A spread and REGRESSION where HEAD
# is worse beyond it. No verdict when the load is above 1.5. Every change to src/ is merged with its output
# against main (docs/benchmarks.md, "Before merging a change to src/").
set -euo pipefail
cd "$(dirname "$0")/.."
py=python3; [ -x /usr/bin/python3 ] && py=/usr/bin/python3
exec "$py" scripts/perf_ab.py "$@"
