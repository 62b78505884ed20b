"""Captures kept on disk across processes (`_capture/_disk.py`): a second
process of a script takes each signature's capture (or refusal) from disk,
exporting and checking nothing; anything its program could depend on that
differs (a hyper-parameter, the user's source) captures again; a module
that cannot be described is never kept."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
import tensorflow as tf  # noqa: F401  (after torch)

import torchbridge as tb
from torchbridge._capture import _disk

ROOT = pathlib.Path(__file__).parents[1]
WORKER = ROOT / "tests" / "_disk_worker.py"


def _run(cache, scale, worker=WORKER):
  env = dict(os.environ, TORCHBRIDGE_CAPTURE_CACHE=str(cache), PYTHONPATH=str(ROOT))
  done = subprocess.run(
    [sys.executable, str(worker), str(scale)], env=env, capture_output=True, text=True, timeout=600
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
  """A first process's captures on disk, and its report."""
  cache = tmp_path_factory.mktemp("captures")
  first = _run(cache, 2.0)
  assert first["exports"] == 3 and first["checks"] >= 2, first
  assert list(cache.glob("*.pt2")), "the captures were not kept"
  return cache, first


def _copy(kept, tmp_path):
  cache = tmp_path / "captures"
  shutil.copytree(kept[0], cache)
  return cache


@pytest.mark.slow
def test_a_second_process_takes_every_capture_and_refusal_from_disk(kept, tmp_path):
  first = kept[1]
  second = _run(_copy(kept, tmp_path), 2.0)
  assert second["exports"] == 0 and second["checks"] == 0, second
  for name in ("scaled", "spectrum", "counting"):
    for fact in ("runner", "path", "equal"):
      assert second[name][fact] == first[name][fact], (name, first, second)
    assert second[name]["equal"], second
  assert second["scaled"]["runner"] == "tf"
  assert second["spectrum"]["runner"] == "torch" and second["spectrum"]["path"] == "C++"
  assert second["counting"]["path"] == "Python"  # its refusal, kept
  assert first["stale"] == second["stale"] == "refused: scale", (first, second)


@pytest.mark.slow
def test_a_changed_hyper_parameter_captures_again(kept, tmp_path):
  rescaled = _run(_copy(kept, tmp_path), 3.0)
  assert rescaled["exports"] == 1 and rescaled["scaled"]["equal"], rescaled


@pytest.mark.slow
def test_changed_source_captures_again(kept, tmp_path):
  edited = tmp_path / "worker_copy.py"
  edited.write_text(WORKER.read_text().replace("torch.tanh(", "torch.sigmoid("))
  again = _run(_copy(kept, tmp_path), 2.0, edited)
  assert again["exports"] == 3 and again["scaled"]["equal"], again


@pytest.mark.slow
def test_an_unreadable_file_on_disk_is_captured_again(kept, tmp_path):
  cache = _copy(kept, tmp_path)
  for path in cache.glob("*.pt2"):
    path.write_bytes(b"not a program")
  again = _run(cache, 2.0)
  assert again["exports"] >= 1 and again["scaled"]["equal"], again


class _Net(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.linear = torch.nn.Linear(2, 2)
    self.flags = {"b", "a", "c"}
    self.mask = torch.tensor([1.0, 0.0], dtype=torch.bfloat16)

  def forward(self, x):
    return self.linear(x)


def _digest(net, signature=("sig",)):
  module = tb.TorchModule(net, name="described")
  return _disk.digest(module._state, signature)  # pylint: disable=protected-access


def test_the_digest_names_every_attribute_by_value():
  torch.manual_seed(0)
  net = _Net()
  first = _digest(net)
  assert first is not None and first == _digest(net)
  assert _digest(net, ("other",)) != first
  net.flags = {"c", "a", "b"}  # the same set, another order
  assert _digest(net) == first
  net.mask = torch.tensor([0.0, 1.0], dtype=torch.bfloat16)  # a plain tensor, by content
  assert _digest(net) != first
  other = _Net()
  other.linear = torch.nn.Linear(2, 3)  # another shape
  assert _digest(other) != first


def test_a_module_that_cannot_be_described_is_never_kept():
  net = _Net()
  net.helper = object()  # shown with a memory address
  assert _digest(net) is None
  hooked = _Net()
  hooked.register_forward_hook(lambda *args: None)
  assert _digest(hooked) is None


def test_off_keeps_nothing(tmp_path, monkeypatch):
  monkeypatch.setenv(_disk.ENV, "off")
  assert _disk.directory() is None
  monkeypatch.setenv(_disk.ENV, str(tmp_path))
  assert _disk.directory() == tmp_path
  monkeypatch.delenv(_disk.ENV)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert _disk.directory() == tmp_path / "torchbridge" / "captures"
