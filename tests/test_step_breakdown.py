"""benchmarks/step_breakdown.py: each instant of a step to the right row,
and the rows held against clocks independent of the split.

That the rows add up to the step they split is no check (`split_step`
gives every instant to one row by construction); the checks are the
hand-worked splits below and, on real steps, a time.perf_counter wall
clock around the very same recorded and profiled steps."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import step_breakdown as sb
from torchbridge._native import _loader

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
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


def test_a_step_split_by_hand():
  # The step is [100, 200). Thread 1 is TF's: a runtime event begun before
  # the step, then (after a gap in which no thread works) a kernel waiting
  # for the torch thread, then a TF op begun inside the kernel that
  # outlasts the step. Thread 2 is the torch thread: a forward and a
  # backward. Thread 3 runs a TF op that overlaps both of them.
  events = [
    (sb.STEP, 0, 100, 200),  # the step's own span: no row
    ("adam/Mul:Mul", 1, 40, 90),  # before the step
    ("x/Neg:Neg", 3, 60, 100),  # ends where the step begins
    ("EagerLocalExecute: f", 1, 80, 120),  # TF runtime, begun before the step
    ("torchbridge/kernel", 1, 130, 190),
    ("torchbridge/wait for torch thread", 1, 135, 185),
    ("adam/Sub:Sub", 1, 188, 215),  # begun inside the kernel, ends after
    ("torchbridge/torch thread", 2, 138, 183),
    ("torchbridge/torch forward", 2, 140, 160),
    ("torchbridge/torch backward", 2, 165, 180),
    ("loss/Mean:Mean", 3, 150, 170),  # over the forward's end, the backward's start
    ("adam/Add:AddV2", 1, 200, 230),  # begins where the step ends
    ("late/Mul:Mul", 2, 250, 260),  # after the step
  ]
  handoff = sb.BRIDGE["torchbridge/wait for torch thread"]
  assert sb.split_step(events, 100, 200) == {
    sb.TF_RUNTIME: 20,  # 100-120: clipped at the step's begin
    sb.NO_THREAD: 10,  # 120-130
    sb.BRIDGE["torchbridge/kernel"]: 5 + 3,  # 130-135, 185-188
    handoff: 3 + 2 + 3 + 2,  # waiting 135-138 and 183-185, torch thread 138-140, 180-183
    sb.TORCH["torchbridge/torch forward"]: 10,  # 140-150: then Mean begins, later
    sb.TF_OPS: 15 + 12,  # Mean 150-165 (until the backward begins), Sub 188-200
    sb.TORCH["torchbridge/torch backward"]: 15,  # 165-180: begun after Mean
  }
  # The same events split over a step that ends inside the forward.
  assert sb.split_step(events, 100, 145) == {
    sb.TF_RUNTIME: 20,
    sb.NO_THREAD: 10,
    sb.BRIDGE["torchbridge/kernel"]: 5,
    handoff: 3 + 2,
    sb.TORCH["torchbridge/torch forward"]: 5,
  }
  # A step in which nothing was recorded: all of it is "no thread working".
  assert sb.split_step(events, 300, 340) == {sb.NO_THREAD: 40}


def test_the_rows_over_steps_are_means_of_each_steps_split():
  # Two steps of 10 and 30 ns: a forward of 4 in the first, a backward of
  # 12 in the second; the rest of each is TF's side.
  events = [
    ("torchbridge/torch forward", 2, 3, 7),
    ("torchbridge/torch backward", 2, 110, 122),
  ]
  steps = [(sb.STEP, 0, 0, 10), (sb.STEP, 0, 100, 130)]
  per_step = sb._per_step_rows(events, steps, sb.TF_SIDE)  # pylint: disable=protected-access
  assert per_step == [
    {sb.TF_SIDE: 6, sb.TORCH["torchbridge/torch forward"]: 4},
    {sb.TF_SIDE: 18, sb.TORCH["torchbridge/torch backward"]: 12},
  ]
  # ms per step, over all the steps.
  assert sb._rows_all_steps_ms(events, steps, sb.TF_SIDE) == pytest.approx(20 / 1e6)  # pylint: disable=protected-access


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


# How far the rows over a run of steps may be from a wall clock around the
# same steps: generous (the wall clock also counts the loop between steps,
# and this machine is noisy), yet a split that lost TF's side (half the
# small MLP's step) or counted a waiting thread's time again (the kernel's
# thread waits while the torch thread works) would be far outside it.
WALL_REL = 0.2


def _same_steps_agree(rows_ms, wall_ms):
  """The rows' sum over some steps, against time.perf_counter around the
  very same steps: no more than the wall (it holds the steps), and near."""
  assert 0 < rows_ms <= wall_ms * 1.001 + 0.01
  assert rows_ms == pytest.approx(wall_ms, rel=WALL_REL)


@pytest.mark.skipif(not _loader.available(), reason="needs the native op")
def test_the_rows_match_an_independent_clock_on_the_same_steps(tmp_path):
  result = _breakdown(tmp_path, "--only", "small_mlp", "--placement", "both")
  assert sorted(result["placements"]) == sorted(sb.PLACEMENTS)
  for placement, steps in result["placements"].items():
    r = steps["small_mlp"]
    t = r["timeline"]
    assert t["steps"] == 10 and r["steps"] == 10
    # The recorded steps, all of them: the timeline's rows against the wall
    # clock around them. The rows neither lose time nor invent it.
    _same_steps_agree(t["rows_all_steps_ms"], t["recorded_wall_ms"])
    # The profiled steps: the rows over the profiler's step spans (its own
    # clock) against time.perf_counter around each step.
    _same_steps_agree(r["rows_all_steps_ms"], r["profiled_wall_ms"])
    _same_steps_agree(r["profiled_all_steps_ms"], r["profiled_wall_ms"])
    # The other clock: the step with recording off, in alternated blocks.
    # Both steps are measured, and the overheads are their quotients.
    assert t["step_mean_ms"] > 0 and t["unrecorded_mean_ms"] > 0
    assert t["recording_overhead"] == pytest.approx(t["step_mean_ms"] / t["unrecorded_mean_ms"])
    assert t["rows_over_unrecorded"] == pytest.approx(t["rows_sum_ms"] / t["unrecorded_mean_ms"])
    assert r["profiled_mean_ms"] > 0 and r["unprofiled_mean_ms"] == t["unrecorded_mean_ms"]
    assert r["profiling_overhead"] == pytest.approx(r["profiled_mean_ms"] / r["unprofiled_mean_ms"])
    # (By construction, not a check: every instant is in one row.)
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
  assert (tmp_path / "step_trace_small_mlp_tf_thread.png").exists()
  # The trace holds its step's bounds: the picture can be drawn again from it.
  last = sb.last_step_from_trace(tmp_path / "step_trace_small_mlp.json")
  assert "bounds" not in last
  assert last["begin_ns"] <= min(e["begin_ns"] for e in last["events"]) < last["end_ns"]
  text = (tmp_path / "step_breakdown.md").read_text()
  t = result["placements"]["torch-thread"]["small_mlp"]["timeline"]
  assert "| **sum of the rows** = the recorded step" in text
  # Each table shows its independent clocks beside the rows.
  assert (
    "| *independent clock:* time.perf_counter around the same recorded steps, "
    f"all 10 (the loop between them included) | {t['recorded_wall_ms']:.2f} |"
  ) in text
  assert (
    "| *independent clock:* the unrecorded step (timeline off; time.perf_counter, "
    f"blocks alternated with the recorded ones) | {t['unrecorded_mean_ms']:.2f} |"
  ) in text
  assert "| *independent clock:* the unprofiled step" in text
  assert "The floor with torch tensors in and out of its ops" in text
  assert "through the leanest Python bridge" in text


@pytest.mark.skipif(not _loader.has_torch_interop(), reason="needs the complete native op")
def test_the_cpp_torch_runners_steps_rows_hold_no_python(tmp_path):
  result = _breakdown(tmp_path, "--only", "td3", "--placement", "tf-thread", "--no-plot")
  t = result["placements"]["tf-thread"]["td3"]["timeline"]
  rows = t["cpp_runner_rows_ms"]
  # Its recorded rows over all its recorded steps against the wall clock
  # around the same steps; its unrecorded step measured beside them.
  _same_steps_agree(t["cpp_runner_rows_all_steps_ms"], t["cpp_runner_recorded_wall_ms"])
  assert t["cpp_runner_recording_overhead"] == pytest.approx(
    t["cpp_runner_recorded_mean_ms"] / t["cpp_runner_mean_ms"]
  )
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
