"""Fixtures for the Python package's tests (tests/python): they run under the interpreter that has
`slotstream` installed (CTest: the venv of `python.install`), against real `slotstream` CLI
processes over real UCX transports.

The helpers of tests/integration/conftest.py (Receiver processes, the per-test deadline, ...) are
loaded from there under another module name, so both suites share one copy.
"""
import importlib.util
import pathlib
import sys

import pytest

_spec = importlib.util.spec_from_file_location(
    "integration_helpers", pathlib.Path(__file__).resolve().parents[1] / "integration" / "conftest.py")
helpers = importlib.util.module_from_spec(_spec)
sys.modules["integration_helpers"] = helpers
_spec.loader.exec_module(helpers)

# Fixtures and hooks pytest should see here.
pytest_configure = helpers.pytest_configure
_deadline = helpers._deadline
receiver = helpers.receiver
start_receiver = helpers.start_receiver
spawn = helpers.spawn

try:
    import slotstream  # noqa: F401
except ImportError as e:  # pragma: no cover - a setup problem, said plainly
    raise pytest.UsageError(f"the slotstream package is not importable by {sys.executable} ({e}): "
                            f"pip install . from the repository root, or run ctest (python.install makes a venv)")
