"""The house style is checked, not hoped for: ruff's lint rules and its formatter
(configured in pyproject.toml) pass on the package, the tests, the calibration
scripts and the benchmarks."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ["pipesim", "tests", "calibration", "benchmarks"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        pytest.fail("ruff is not installed: it comes with the test extra (pip install '.[test]')")
    return subprocess.run([exe, *args, *TREES], cwd=ROOT, capture_output=True, text=True)


def test_lint_rules_pass():
    r = ruff("check", "--output-format", "concise")
    assert r.returncode == 0, r.stdout + r.stderr


def test_code_is_formatted():
    r = ruff("format", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
