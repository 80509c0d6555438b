#!/usr/bin/env bash
# A fresh venv with the slotstream Python package installed the way a user installs it:
# `pip install .` from the repository root (pip fetches scikit-build-core and nanobind from PyPI
# and builds the C++ library into the extension). CTest's python.install runs this.
#
#   tests/python/make_venv.sh PYTHON VENV
#
# --system-site-packages: numpy and pytest come from Debian (scripts/setup.sh), so the tests
# need no other downloads. The build starts from nothing each time, as a user's does (pip's
# isolated build environment changes paths on every run, so a kept CMake build would be
# reconfigured from scratch anyway): about 80 s on this 2-core machine. Its CMake build goes to
# VENV-build (scikit-build-core's build-dir, emptied first) rather than a new temporary directory, so
# that with ccache (scripts/test.sh) the library's objects have the same command lines every run.
set -euo pipefail
python=$1 venv=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$venv" "$venv-build"
"$python" -m venv --system-site-packages "$venv"
start=$(date +%s)
"$venv/bin/pip" install --disable-pip-version-check -q --config-settings=build-dir="$venv-build" "$repo"
echo "pip install . took $(($(date +%s) - start)) s"
"$venv/bin/python" -c "import numpy, pytest, slotstream; print('slotstream', slotstream.__version__, 'installed in $venv')"
