"""The soak (benchmarks/soak.py) runs end to end, short, and its bounds can fail."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import soak

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = pytest.mark.slow

SAMPLE_KEYS = {"step", "t_s", "rss_mb", "fds", "threads", "copies", "bytes_copied", "zero_copy"}


def test_short_soak_writes_curves_summaries_and_plot(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "benchmarks.soak",
      "--steps",
      "600",
      "--td3-steps",
      "800",
      "--td3-start-steps",
      "200",
      "--parallel",
      "--out",
      str(tmp_path),
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=240,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
  )
  assert out.returncode == 0, out.stdout + out.stderr
  assert "every bound holds" in out.stdout
  results = json.loads((tmp_path / "soak.json").read_text())
  assert (tmp_path / "soak.png").stat().st_size > 0
  assert results["complete"] and results["failures"] == []
  assert set(results["runs"]) == set(soak.RUNS)
  pids = {entry["pid"] for entry in results["runs"].values()}
  assert len(pids) == 3 and os.getpid() not in pids
  for run, entry in results["runs"].items():
    planned = 800 if run == "td3" else 600
    assert entry["returncode"] == 0
    assert entry["steps_planned"] == entry["steps_reached"] == planned
    samples = entry["samples"]
    assert samples[0]["step"] == 0 and samples[-1]["step"] == planned
    assert len(samples) >= 50 and all(SAMPLE_KEYS <= set(s) for s in samples)
    summary = entry["summary"]
    # The first sample at or after the warm-up point (one every planned // 100 steps).
    nominal = soak.warmup_step(run, planned, 200)
    assert nominal <= summary["warmup_step"] < nominal + planned // 100
    assert summary["end_step"] == planned
    assert summary["failures"] == []
    assert summary["rss_max_growth_mb"] < summary["bounds"]["rss_max_growth_mb"]
    assert summary["fds_at_end"] == summary["fds_at_warmup"]
    assert summary["threads_at_end"] == summary["threads_at_warmup"]
  # The small MLP's crossings are all zero-copy.
  for run in ("mlp_eager", "mlp_function"):
    assert results["runs"][run]["summary"]["copies_at_end"] == 0
    assert results["runs"][run]["samples"][-1]["zero_copy"] > 0

  # --check evaluates the same bounds again over the file's curves.
  again = subprocess.run(
    [sys.executable, "-m", "benchmarks.soak", "--check", str(tmp_path / "soak.json")],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert again.returncode == 0, again.stdout + again.stderr
  rechecked = json.loads((tmp_path / "soak.json").read_text())
  assert rechecked["runs"]["td3"]["summary"] == results["runs"]["td3"]["summary"]


def _curve(steps=10_000, every=100, rss=lambda step: 900.0, fds=lambda step: 5, threads=None):
  threads = threads or (lambda step: 6)
  return [
    {
      "step": step,
      "t_s": step / 100,
      "rss_mb": rss(step),
      "fds": fds(step),
      "threads": threads(step),
      "copies": 0,
      "bytes_copied": 0,
    }
    for step in range(0, steps + 1, every)
  ]


def test_flat_curve_holds_the_bounds():
  summary = soak.check_run("flat", _curve(), 1000, 20.0)
  assert summary["failures"] == []
  assert summary["rss_max_growth_mb"] == 0 and summary["rss_slope_bytes_per_step"] == 0


def test_warm_up_growth_is_not_counted():
  curve = _curve(rss=lambda step: 800.0 + min(step, 1000) / 10)
  assert soak.check_run("warm", curve, 1000, 20.0)["failures"] == []


def test_memory_growth_after_warm_up_fails():
  # 1 KB a step: 9 MB over 9,000 steps, past a bound of 5 MB.
  curve = _curve(rss=lambda step: 900.0 + step * 1024 / 2**20)
  (failure,) = soak.check_run("leaky", curve, 1000, 5.0)["failures"]
  assert failure.startswith("leaky: RSS grew 8.8 MB after warm-up (bound 5.0)")


@pytest.mark.parametrize("key", ["fds", "threads"])
def test_descriptor_or_thread_growth_fails(key):
  curve = _curve(**{key: lambda step: 5 + step // 5000})
  (failure,) = soak.check_run("grows", curve, 1000, 20.0)["failures"]
  assert failure.startswith(f"grows: {key} not flat after warm-up: 5 at step 1000, 7 at the end")


def test_a_transient_descriptor_beyond_the_slack_fails():
  curve = _curve(fds=lambda step: 6 if step == 5000 else 5)
  (failure,) = soak.check_run("spike", curve, 1000, 20.0)["failures"]
  assert "6 at most (slack 0)" in failure
  bounds = dict(soak.BOUNDS, fd_slack=1)
  assert soak.check_run("spike", curve, 1000, 20.0, bounds)["failures"] == []


def test_copies_constant_per_step_hold_growing_per_step_fail():
  constant = _curve()
  for s in constant:
    s["copies"] = s["step"] // 2
  summary = soak.check_run("constant", constant, 1000, 20.0)
  assert summary["failures"] == [] and summary["copies_per_step_after_warmup"] == 0.5
  growing = _curve()
  for s in growing:
    s["copies"] = s["step"] ** 2 // 10_000
  (failure,) = soak.check_run("growing", growing, 1000, 20.0)["failures"]
  assert failure.startswith("growing: exchange copies per step grew after warm-up")


def test_too_few_samples_after_warm_up_fail():
  (failure,) = soak.check_run("short", _curve(steps=1000), 1000, 20.0)["failures"]
  assert "too few samples" in failure


def test_td3_bound_counts_its_replay_buffer():
  assert soak.rss_bound_mb("mlp_eager", 100_000) == soak.BOUNDS["rss_growth_mb"]
  assert soak.rss_bound_mb("td3", 100_000) == pytest.approx(
    soak.BOUNDS["rss_growth_mb"] + 3.43, abs=0.01
  )
  # TD3: 10% of the steps after its first training episode (1,000 random
  # steps, then the episode that ends at 1,200 in the first burst).
  assert soak.warmup_step("td3", 100_000, 1000) == 11_080
  assert soak.warmup_step("td3", 1_000, 200) == 460
  assert soak.warmup_step("mlp_function", 100_000, 1000) == 10_000
