#!/usr/bin/env bash
# Soak run (not a CI test): 12 synthetic cameras (25 fps, 640x480x3) into `recv --discard` for
# --duration seconds (default 3600), sampling RSS, threads, fds, CPU and frame loss of both
# processes every 10 s into OUT/soak.csv (default /tmp/slotstream-soak), plotted to OUT/soak.png.
#   bash scripts/soak.sh [--duration S] [--interval S] [--out DIR] [--transport shm|tcp] [--protocol P]
# Exits non-zero if a frame was lost. Results of the committed run: docs/hardening.md.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/slotstream ] || bash scripts/build.sh
exec /usr/bin/python3 scripts/soak.py "$@"
