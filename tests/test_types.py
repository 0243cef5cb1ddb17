"""The type hints are checked, not hoped for: mypy, at the strictness pyproject.toml's
[tool.mypy] states, finds no error anywhere in the package (.ci/run's mypy line fails
the same way)."""

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy is not installed (it comes with the test extra)")

ROOT = Path(__file__).resolve().parents[1]


def test_package_type_checks(monkeypatch):
    monkeypatch.chdir(ROOT)  # mypy reads pyproject.toml here and names files from here
    stdout, stderr, status = mypy_api.run(["pipesim"])
    # 0: clean, 1: errors found; anything else (2) is mypy failing to run at all
    assert status in (0, 1), stdout + stderr
    errors = [line for line in stdout.splitlines() if ": error: " in line]
    assert status == 0 and not errors, (
        "mypy finds type errors (a missing stub package? pip install '.[test]'):\n"
        + "\n".join(errors or [stdout])
    )
