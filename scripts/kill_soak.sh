#!/usr/bin/env bash
# Kill soak (not a CI test; CI runs 4 kills per protocol and transport in tests/integration/test_kill_loop.py):
# 200 sender deaths (SIGKILL within a sender's first 300 ms, half within 80 ms) per protocol and transport,
# each batch beside a live sender that must finish with everything stored, against one receiver that must
# survive them all. Prints a JSON summary; exits non-zero on any receiver death or incomplete live stream.
#   bash scripts/kill_soak.sh [--kills N] [--transport shm|tcp] [--protocol P] [--seed S] [--bin PATH]
# Results of the committed run: docs/hardening.md ("Kill loop").
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/slotstream ] || bash scripts/build.sh
exec /usr/bin/python3 tests/integration/kill_loop.py "$@"
