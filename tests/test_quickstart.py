"""The quick-start example runs and reports a copy-free training loop."""

import os
import subprocess
import sys

import pytest

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quickstart_trains_restores_and_copies_nothing():
  out = subprocess.run(
    [sys.executable, os.path.join(ROOT, "examples", "quickstart.py")],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stdout + out.stderr
  assert "outputs identical = True" in out.stdout
  assert "tensors copied:             0" in out.stdout
  assert "bytes copied:               0" in out.stdout
  final, baseline = [
    float(v)
    for v in out.stdout.split("final training-set MSE: ")[1]
    .replace(")", "")
    .split(" (predicting 0 gives ")
  ]
  assert final < 0.1 * baseline  # it learned
