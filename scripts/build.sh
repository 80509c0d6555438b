#!/usr/bin/env bash
# Configures and builds slotstream into build/ (Release with debug info).
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's python3 has the packages setup.sh installs (pytest, matplotlib); prefer it over any
# other python3 on PATH.
py=(); [ -x /usr/bin/python3 ] && py=(-DPython3_EXECUTABLE=/usr/bin/python3)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${py[@]}" >/dev/null
cmake --build build
