#!/usr/bin/env bash
# Configures and builds slotstream into build/ (Release with debug info).
#   bash scripts/build.sh          every target: the CLI, the library, the GStreamer plugin, the tests, the examples
#                                  (what `scripts/setup.sh build` installs the packages for)
#   bash scripts/build.sh --cli    build/slotstream alone (scripts/demo.sh; `scripts/setup.sh demo`): configured
#                                  without the tests and the plugin; a later full build reuses its objects
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(); options=(-DBUILD_TESTING=ON -DSLOTSTREAM_GSTREAMER=ON)
if [ "${1:-}" = --cli ]; then
  targets=(--target slotstream_cli); options=(-DBUILD_TESTING=OFF -DSLOTSTREAM_GSTREAMER=OFF)
elif (($#)); then
  echo "build: unknown argument '$1' (--cli, or nothing for every target)" >&2; exit 2
fi
# Debian's python3 has the packages setup.sh installs (pytest, matplotlib); prefer it over any
# other python3 on PATH.
py=(); [ -x /usr/bin/python3 ] && py=(-DPython3_EXECUTABLE=/usr/bin/python3)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${options[@]}" "${py[@]}" >/dev/null
cmake --build build "${targets[@]}"
