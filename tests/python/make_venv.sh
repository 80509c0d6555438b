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
# reconfigured from scratch anyway). Its CMake build goes to build-python/ beside build/ (scikit-build-core's
# build-dir, emptied first) rather than a new temporary directory, with build/'s build type (RelWithDebInfo; a
# user's `pip install .` is Release): so the library's objects have exactly build/'s command lines, and with
# ccache (scripts/test.sh: CCACHE_BASEDIR, CCACHE_NOHASHDIR) the library is not compiled a second time — only
# nanobind and the extension are. It compiled the whole library again at -O3: 467 s of CTest's 1,189 here under
# load, alone (RUN_SERIAL).
set -euo pipefail
python=$1 venv=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=$repo/build-python
rm -rf "$venv" "$build_dir"
"$python" -m venv --system-site-packages "$venv"
# The compiler build/ was configured with, by the same name: pip's build would otherwise take Python's
# (x86_64-linux-gnu-g++, from sysconfig), and ccache hashes the compiler's name.
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$repo/build/CMakeCache.txt" 2>/dev/null)
start=$(date +%s)
CXX=${cxx:-c++} "$venv/bin/pip" install --disable-pip-version-check -q --config-settings=build-dir="$build_dir" \
  --config-settings=cmake.build-type=RelWithDebInfo "$repo"
echo "pip install . took $(($(date +%s) - start)) s"
"$venv/bin/python" -c "import numpy, pytest, slotstream; print('slotstream', slotstream.__version__, 'installed in $venv')"
