"""The Hugging Face example (examples/hf_text_classifier.py) trains,
restores, serves without torch and captures what its guide says.

The example runs in a process of its own at its tiny default size, writing
the trained classifier as a Hugging Face checkpoint; it runs once more from
that directory (`--pretrained`). Its summary (the last line of its output,
JSON) is checked here, and the checkpoint is read back in this process by
plain torch, to compare with what the served SavedModel computed.
"""

import json
import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "hf_text_classifier.py"
_TIMEOUT_S = 600


def _run(args, cwd):
  """The example's summary (its last line, JSON) and its whole output."""
  env = dict(
    os.environ,
    TF_CPP_MIN_LOG_LEVEL="3",
    # Captures kept on disk, where an install keeps them, are this run's own.
    TORCHBRIDGE_CAPTURE_CACHE=str(cwd / "captures"),
  )
  out = subprocess.run(
    [sys.executable, str(EXAMPLE), "--json", *args],
    capture_output=True,
    text=True,
    timeout=_TIMEOUT_S,
    cwd=cwd,
    env=env,
    check=False,
  )
  assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
  return json.loads(out.stdout.strip().splitlines()[-1]), out.stdout


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """(summary, output, the Hugging Face checkpoint it wrote) of one run."""
  tmp = tmp_path_factory.mktemp("hf_example")
  pretrained = tmp / "pretrained"
  summary, stdout = _run(["--save-pretrained", str(pretrained)], tmp)
  return summary, stdout, pretrained


def test_batches_are_padded_to_lengths_of_their_own(tiny):
  summary, _, _ = tiny
  assert len(summary["batch_lengths"]) >= 3, summary["batch_lengths"]


def test_the_loss_falls_and_the_model_learns_the_rule(tiny):
  summary, _, _ = tiny
  losses = summary["losses"]
  assert len(losses) == 3 and losses[-1] < 0.7 * losses[0], losses
  # Held out, scored by the translation that reads the variables fit trains.
  assert summary["held_out_loss_before"] > 0.6
  assert summary["held_out_loss_after"] < 0.5 * summary["held_out_loss_before"]
  assert summary["held_out_accuracy"] > 0.8


def test_fit_traces_once_and_captures_once_for_every_batch_length(tiny):
  # docs/guides/hugging-face.md: with a padded_batch dataset, fit traces its
  # step once, with [None, None] token ids, and torchbridge captures that
  # one signature (token ids and mask), whatever the batch lengths.
  summary, _, _ = tiny
  assert summary["traces"] == [[True, [None, None]]]
  (capture,) = summary["captures"]
  assert capture["mode"] == "train"
  assert capture["shapes"] == [[None, None], [None, None]]
  # The guide: training-mode attention dropout has no TF translation, so
  # fit runs torch (from C++ where the native op is complete).
  assert capture["runner"] in ("torch (C++)", "torch (Python)"), capture
  assert "attention dropout" in capture["why_not_tf"], capture


def test_restored_weights_equal_the_trained_ones(tiny):
  summary, stdout, _ = tiny
  assert summary["weights_restored_equal"] is True
  assert "weights restored into a fresh model: equal = True" in stdout


def test_the_saved_model_is_served_without_torch_and_matches_torch(tiny):
  summary, _, pretrained = tiny
  assert summary["serving_process_imported"] == {"torch": False, "torchbridge": False}
  served = np.array(summary["served_logits"])
  assert list(served.shape) == [summary["served_shape"][0], 2]
  # The same batch through plain torch, from the Hugging Face checkpoint
  # the example wrote from the trained weights.
  batch = summary["served_batch"]
  classifier = transformers.AutoModelForSequenceClassification.from_pretrained(
    pretrained, local_files_only=True
  )
  with torch.no_grad():
    logits_torch = classifier(
      input_ids=torch.tensor(batch["input_ids"]),
      attention_mask=torch.tensor(batch["attention_mask"]),
    ).logits.numpy()
  np.testing.assert_allclose(served, logits_torch, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(served, summary["torch_logits"], rtol=1e-5, atol=1e-5)
  assert summary["served_max_diff"] < 1e-5
  # Padding matters: the batch holds padded sequences, and both labels.
  assert 0 in np.array(batch["attention_mask"])
  assert set(np.argmax(served, axis=1)) == {0, 1}


def test_a_pretrained_directory_is_where_training_starts(tiny, tmp_path):
  summary, _, pretrained = tiny
  again, _ = _run(["--pretrained", str(pretrained), "--epochs", "1", "--examples", "64"], tmp_path)
  # Before training, the held-out loss is the first run's after training:
  # the weights came from the directory.
  assert again["held_out_loss_before"] == pytest.approx(summary["held_out_loss_after"], abs=1e-4)
  assert [c["mode"] for c in again["captures"]] == ["train"]
  assert again["serving_process_imported"]["torch"] is False
  assert again["served_max_diff"] < 1e-5
