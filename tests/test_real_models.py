"""benchmarks/real_models.py: its `--tiny` orchestrator runs each contender
in a process of its own and writes the JSON and the table the docs include;
the torchbridge contenders' first loss is pure torch's; the table is
written from the JSON; `auto-second` runs right after `auto`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch  # before TensorFlow
import pytest

from benchmarks import real_models

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# Nothing here depends on the call path: run in the native pass only.
pytestmark = pytest.mark.one_pass


def _orchestrate(tmp_path, task, contenders):
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "benchmarks.real_models",
      "--tiny",
      "--tasks",
      task,
      "--contenders",
      *contenders,
      "--rounds",
      "1",
      "--steps",
      "2",
      "--threads",
      "1",
      "--out",
      str(tmp_path),
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  data = json.loads((tmp_path / "real_models.json").read_text())
  assert (tmp_path / "real_models.md").read_text() == real_models.markdown(data)
  return data


@pytest.mark.slow
def test_tiny_run_times_pure_torch_and_the_default_runner_from_the_same_weights(tmp_path):
  # ResNet: no dropout, so the first losses match tightly.
  data = _orchestrate(tmp_path, "resnet18-train", ["pure", "auto"])
  assert data["tiny"] and "TINY" in data["what"]
  assert data["commit"] and data["source"]["commit"].startswith(data["commit"])
  assert data["date"] and "cores" in data["machine"]
  assert data["environment"]["torch"] == torch.__version__
  assert data["failures"] == []
  rows = data["tasks"]["resnet18-train"]
  pids = set()
  for name in ("pure", "auto"):
    row = rows[name]
    for key in ("first_step_s", "steady_step_s", "peak_rss_mb", "rss_built_mb", "first_loss"):
      assert row[key] > 0, (name, key)
    assert row["peak_rss_mb"] >= row["rss_built_mb"]
    assert row["parameters"] == rows["pure"]["parameters"]
    (process,) = row["processes"]
    assert process["contender"] == name and len(process["steps_s"]) == 2
    assert len(process["losses"]) == 3 and process["first_loss"] == row["first_loss"]
    pids.add(process["pid"])
  assert len(pids) == 2 and os.getpid() not in pids
  assert rows["pure"]["runner"] == "-" and rows["pure"]["ratio_to_pure"] == 1.0
  auto = rows["auto"]
  assert set(auto["runners"]) == {"resnet18"}
  assert auto["runners"]["resnet18"]["runner"] in ("tf", "torch")
  assert auto["first_loss_matches_pure"], (auto["first_loss"], rows["pure"]["first_loss"])
  assert auto["first_loss"] == pytest.approx(rows["pure"]["first_loss"], rel=1e-3)
  assert auto["ratio_to_pure"] == pytest.approx(
    auto["steady_step_s"] / rows["pure"]["steady_step_s"]
  )
  assert auto["processes"][0]["capture_cache"]  # the variable was set for it


@pytest.mark.slow
def test_tiny_keras_hub_contender_runs_its_own_model_at_the_same_sizes():
  pytest.importorskip(
    "keras_hub", reason="keras-hub is a benchmark-only package: `make bench-real` installs it"
  )
  out = subprocess.run(
    [sys.executable, "-m", "benchmarks.real_models", "--one", "bert-train", "keras-hub"]
    + ["--tiny", "--steps", "1", "--threads", "1"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
  )
  assert out.returncode == 0, out.stderr[-3000:]
  record = json.loads(out.stdout.strip().splitlines()[-1])
  assert "skipped" not in record and record["first_step_s"] > 0
  assert record["runners"] == {} and record["keras_hub"]
  # mean(last_hidden_state ** 2) after a LayerNorm at init: about 1.
  assert record["first_loss"] == pytest.approx(1.0, rel=0.05)


def test_resnet_copy_is_torchvisions_resnet18():
  torchvision = pytest.importorskip(
    "torchvision",
    reason="torchvision is not importable here (PyPI's wheel needs a CUDA torch)",
    exc_type=ImportError,
  )
  torch.manual_seed(0)
  theirs = torchvision.models.resnet18().state_dict()
  torch.manual_seed(0)
  ours = real_models._ResNet(**real_models.SIZES["resnet18"]).state_dict()
  assert list(theirs) == list(ours)
  assert all(torch.equal(theirs[k], ours[k]) for k in theirs)


def test_auto_second_runs_right_after_auto_whatever_the_rotation():
  names = list(real_models.CONTENDERS)
  for rotation in range(6):
    flat = [n for unit in real_models._units(names, rotation) for n in unit]
    assert sorted(flat) == sorted(names)
    assert flat.index("auto-second") == flat.index("auto") + 1
  assert [u[0] for u in real_models._units(names, 1)] == ["auto", "torch", "keras-hub", "pure"]
  assert real_models._units(["pure", "auto-second"], 0) == [["pure"], ["auto-second"]]


def _record(name, steady, loss, runner=None):
  record = {
    "task": "bert-train",
    "contender": name,
    "first_step_s": 10 * steady,
    "steady_step_s": steady,
    "peak_rss_mb": 900.0,
    "rss_built_mb": 800.0,
    "first_loss": loss,
    "parameters": 7,
  }
  if runner:
    record["runners"] = {"bert": runner}
  return record


def test_summary_has_the_ratio_to_pure_torch_the_runner_and_the_loss_check():
  torch_runner = {"runner": "torch", "path": "C++", "reason": "no TF translation of the dropout"}
  results = {
    "bert-train": {
      "pure": [_record("pure", 5.0, 1.0), _record("pure", 4.0, 1.0)],
      "auto": [
        _record("auto", 6.0, 1.001, torch_runner),
        _record("auto", 5.0, 1.001, torch_runner),
      ],
      "torch": [_record("torch", 4.5, 1.5, torch_runner)],
      "keras-hub": [{"task": "bert-train", "contender": "keras-hub", "skipped": "not installed"}],
    }
  }
  summary = real_models.summarize(results)["bert-train"]
  assert summary["pure"]["steady_step_s"] == 4.5  # the median over rounds
  assert summary["auto"]["ratio_to_pure"] == pytest.approx(5.5 / 4.5)
  assert summary["auto"]["runner"] == "torch (C++)"
  assert summary["auto"]["first_loss_matches_pure"]
  assert not summary["torch"]["first_loss_matches_pure"]
  assert summary["keras-hub"] == {"processes": results["bert-train"]["keras-hub"]} | {
    "skipped": "not installed"
  }
  data = {
    "tiny": False,
    "commit": "0123456789",
    "date": "2026-01-01",
    "machine": "2 cores",
    "rounds": 2,
    "threads": 2,
    "steps": 5,
    "sizes": real_models.model_sizes(tiny=False),
    "tasks": {"bert-train": summary},
  }
  text = real_models.markdown(data)
  assert "| BERT-base, training | pure torch | 45.00 | 4.500 | 1.00x |" in text
  assert "| torchbridge (default runner) | 55.00 | 5.500 | 1.22x | 900 | 800 | torch (C++) |" in (
    text
  )
  assert "(differs from pure torch's)" in text
  assert "| keras-hub (TF-native) | skipped: not installed |" in text
  assert "1.10x pure torch's (torchbridge contenders): BERT-base, training, torchbridge" in text
  assert "BERT-base, training, bert: torch: no TF translation of the dropout" in text
  assert "Tiny smoke run" not in text
  assert "bert: 12 layers, hidden 768, vocabulary 30522, batch 8 x 128;" in text
  assert "resnet18: blocks 2-2-2-2, 1000 classes, batch 16 x 3 x 224 x 224." in text


def test_the_committed_table_is_written_from_the_committed_json():
  data = json.loads((RESULTS / "real_models.json").read_text())
  assert (RESULTS / "real_models.md").read_text() == real_models.markdown(data)
  assert set(data["tasks"]) == set(real_models.TASKS)
  if data["tiny"]:
    assert "Tiny smoke run" in real_models.markdown(data)


@pytest.mark.slow
def test_the_first_call_breakdown_times_each_part_and_reads_the_capture_back(tmp_path):
  """benchmarks/first_call_breakdown.py at one layer and a batch of 4 (a
  module of over a million parameters: checked at a batch of 3): the
  first process captures, a second reads the capture from disk."""
  env = dict(os.environ, TORCHBRIDGE_CAPTURE_CACHE=str(tmp_path), OMP_NUM_THREADS="1")
  command = [sys.executable, "benchmarks/first_call_breakdown.py", "--layers", "1"]
  command += ["--batch", "4", "--length", "8", "--steps", "1"]
  reports = []
  for _ in range(2):
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    reports.append(json.loads(done.stdout.strip().splitlines()[-1]))
  first, second = reports
  tracing = "TF: tracing (twice where Adam's slots are made)"
  for report in reports:
    parts = report["parts_s"]
    assert parts[tracing] >= report["capture_s"] > 0, report
    assert report["first_step_s"] >= parts[tracing], report
  assert "torch.export" in first["parts_s"] and "capture written to disk" in first["parts_s"]
  assert "torch.export" not in second["parts_s"], second
  assert "capture read from disk" in second["parts_s"], second
