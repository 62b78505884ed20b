"""benchmarks/step_breakdown.py: rows that add up to the step they split."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import step_breakdown as sb
from torchbridge._native import _loader

# A slow suite: `make test` and CI run it, `make check` does not.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_each_instant_goes_to_the_span_begun_last():
  # Thread 1 (TF's) enters the kernel at 10 and waits from 12; thread 2
  # (torch's) runs the forward from 20 to 60; nothing runs from 90 to 100.
  events = [
    ("torchbridge/kernel", 1, 10, 80),
    ("torchbridge/wait for torch thread", 1, 12, 78),
    ("torchbridge/torch thread", 2, 15, 70),
    ("torchbridge/torch forward", 2, 20, 60),
    ("adam/Sub:Sub", 1, 80, 90),
  ]
  rows = sb.split_step(events, 0, 100)
  assert sum(rows.values()) == 100  # a partition of the step
  assert rows[sb.NO_THREAD] == 10 + 10  # before the kernel, after Sub
  assert rows[sb.TORCH["torchbridge/torch forward"]] == 40
  assert rows[sb.TF_OPS] == 10
  handoff = sb.BRIDGE["torchbridge/wait for torch thread"]
  # 12-15 and 70-78 waiting (no torch-thread span begun later), 15-20 and
  # 60-70 on the torch thread outside its phases: the same row.
  assert rows[handoff] == 3 + 8 + 5 + 10
  assert rows[sb.BRIDGE["torchbridge/kernel"]] == 2 + 2  # 10-12, 78-80


def _breakdown(tmp_path, *args):
  """`python -m benchmarks.step_breakdown --steps 10 ARGS`'s JSON."""
  out = subprocess.run(
    [sys.executable, "-m", "benchmarks.step_breakdown", "--steps", "10", *args]
    + ["--out", str(tmp_path)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads((tmp_path / "step_breakdown.json").read_text())


@pytest.mark.skipif(not _loader.available(), reason="needs the native op")
def test_the_rows_add_up_to_the_measured_step(tmp_path):
  result = _breakdown(tmp_path, "--only", "small_mlp", "--placement", "both")
  assert sorted(result["placements"]) == sorted(sb.PLACEMENTS)
  for placement, steps in result["placements"].items():
    r = steps["small_mlp"]
    t = r["timeline"]
    assert t["steps"] == 10
    assert t["rows_sum_ms"] == pytest.approx(t["step_mean_ms"], rel=0.01)
    assert r["rows_sum_ms"] == pytest.approx(r["profiled_mean_ms"], rel=0.01)
    for rows in (t["rows_ms"], r["rows_ms"]):
      assert rows[sb.TORCH["torchbridge/torch forward"]] > 0
      assert rows[sb.TORCH["torchbridge/torch backward"]] > 0
      assert rows[sb.BRIDGE["torchbridge/python call"]] > 0
    assert t["rows_ms"][sb.TF_SIDE] > 0
    assert r["rows_ms"][sb.TF_OPS] > 0
    # The bridge's share is what the floor and torch's compute leave.
    torch_ms = sum(t["rows_ms"].get(row, 0) for row in sb.TORCH.values())
    assert t["torch_compute_ms"] == pytest.approx(torch_ms)
    assert t["bridge_share_ms"] == pytest.approx(
      t["unrecorded_mean_ms"] - t["floor_mean_ms"] - torch_ms
    )
    assert t["floor_mean_ms"] > 0 and t["unrecorded_mean_ms"] > 0
    # The floor whose ops take and make torch tensors, and the share over it.
    assert t["floor_torch_outputs_mean_ms"] > 0
    assert t["bridge_share_over_torch_floor_ms"] == pytest.approx(
      t["unrecorded_mean_ms"] - t["floor_torch_outputs_mean_ms"] - torch_ms
    )
    # The same step through the leanest Python bridge (a figure, so only
    # measured: orderings of timings are not pass/fail).
    assert t["lean_bridge_mean_ms"] > 0
    handoff = sb.BRIDGE["torchbridge/wait for torch thread"]
    # On TF's thread no call is handed over.
    assert (handoff in t["rows_ms"]) == (placement == "torch-thread")
  assert (tmp_path / "step_trace_small_mlp.json").exists()
  assert (tmp_path / "step_trace_small_mlp_tf_thread.png").exists()
  text = (tmp_path / "step_breakdown.md").read_text()
  assert "| **sum of the rows**" in text
  assert "The floor with torch tensors in and out of its ops" in text
  assert "through the leanest Python bridge" in text


@pytest.mark.skipif(not _loader.has_torch_interop(), reason="needs the complete native op")
def test_the_cpp_torch_runners_steps_rows_hold_no_python(tmp_path):
  result = _breakdown(tmp_path, "--only", "td3", "--placement", "tf-thread", "--no-plot")
  t = result["placements"]["tf-thread"]["td3"]["timeline"]
  rows = t["cpp_runner_rows_ms"]
  # Its recorded rows add up to its recorded step, as the bridged step's do.
  assert sum(rows.values()) == pytest.approx(t["cpp_runner_recorded_mean_ms"], rel=0.01)
  # Its calls are kernel phases and C++ callbacks only: no GIL, no Python.
  assert rows[sb.SCRIPTED_CALLBACK] > 0
  assert rows[sb.TF_SIDE] > 0
  python_rows = {sb.BRIDGE[p] for p in ("torchbridge/acquire GIL", "torchbridge/python call")}
  assert not python_rows & set(rows)
  assert not set(sb.TORCH.values()) & set(rows)
  assert t["no_python_floor_mean_ms"] > 0 and t["cpp_runner_mean_ms"] > 0
  text = sb.markdown(result)
  assert 'on the C++ torch runner (`tb.TorchModule(..., run="torch")`' in text
  assert (
    f"ops handing back fresh torch tensors from C++ (`scripted_native.NoPythonFloorModule`; alternated blocks): {t['no_python_floor_mean_ms']:.2f} ms"
    in text
  )
  assert "The C++ torch runner's step, recorded" in text
  assert f"| {sb.SCRIPTED_CALLBACK} | {rows[sb.SCRIPTED_CALLBACK]:.3f} |" in text
