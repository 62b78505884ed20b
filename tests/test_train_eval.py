"""torch's train/eval switch is never stale: a graph traced with
`training=None` (torch's own mode) refuses to run once the module's mode
changed, naming the switch, on every runner and through both wrappers; a
new trace runs the new mode, and switching back runs the old graph again.

The module has both kinds of mode-dependent layer: BatchNorm (batch
statistics and running-statistics updates in training, running statistics
in eval) and dropout (zeros in training, the identity in eval)."""

import copy
import gc

import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb
import torchbridge.keras as tbk

from _module_helpers import data, seeded

# run= of the wrapper, and the torch runner's path ("python": the forward's
# Python on every call, TORCHBRIDGE_TORCH_RUNNER=python).
RUNNERS = {
  "auto": ("auto", None),  # the TF translation
  "tf": ("tf", None),
  "torch-C++": ("torch", None),
  "torch-python": ("torch", "python"),
}


@pytest.fixture(autouse=True)
def _collect_wrappers():
  yield
  gc.collect()


def _net():
  return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5))


def _wrap(net, runner, wrapper, monkeypatch):
  run, path = RUNNERS[runner]
  if path is not None:
    monkeypatch.setenv("TORCHBRIDGE_TORCH_RUNNER", path)
  else:
    monkeypatch.delenv("TORCHBRIDGE_TORCH_RUNNER", raising=False)
  if wrapper == "TorchModule":
    return tb.TorchModule(net, name="net", run=run)
  return tbk.TorchLayer(net, run=run, name="net")


def _state(wrapper):
  """The module's parameters and buffers as numpy copies."""
  return {k: v.detach().numpy().copy() for k, v in wrapper.torch_module.state_dict().items()}


def _check_mode(out_tf, x_np, before, wrapper, training):
  """`out_tf` is what torch computes in that mode from the weights `before`
  the call, and the variables hold what torch's call leaves."""
  reference = copy.deepcopy(wrapper.torch_module)
  reference.load_state_dict({k: torch.from_numpy(a) for k, a in before.items()})
  reference.train(training)
  with torch.no_grad():
    want = reference(torch.from_numpy(x_np)).numpy()
  after = _state(wrapper)
  for name, value in reference.state_dict().items():
    # BatchNorm's running statistics: updated in training only, exactly as torch does.
    np.testing.assert_allclose(after[name], value.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
  out = out_tf.numpy()
  if training:
    # Dropout's draws are the runner's own: half the elements zeroed, the
    # rest torch's training-mode values (batch statistics) scaled by 2.
    zeroed = out == 0
    assert 0.2 < zeroed.mean() < 0.8, zeroed.mean()
    with torch.no_grad():
      reference.load_state_dict({k: torch.from_numpy(a) for k, a in before.items()})
      kept = torch.nn.Sequential(reference[0], reference[1])(torch.from_numpy(x_np)).numpy() * 2
    np.testing.assert_allclose(out[~zeroed], kept[~zeroed], rtol=1e-4, atol=1e-5)
  else:
    assert not (out == 0).any()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("traced_in", ["train", "eval"])
@pytest.mark.parametrize("wrapper", ["TorchModule", "TorchLayer"])
@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_graph_traced_with_torchs_mode_refuses_once_it_flips(
  runner, wrapper, traced_in, monkeypatch
):
  traced_training = traced_in == "train"
  net = seeded(0, _net).train(traced_training)
  wrapped = _wrap(net, runner, wrapper, monkeypatch)
  call = tf.function(lambda x: wrapped(x))  # training=None: torch's own mode
  x_np = data([16, 3])
  x_tf = tf.constant(x_np)

  before = _state(wrapped)
  _check_mode(call(x_tf), x_np, before, wrapped, traced_training)

  net.train(not traced_training)  # the switch every torch user flips
  before = _state(wrapped)
  message = f"training was {traced_training} when traced, {not traced_training} now"
  with pytest.raises(tb.StaleCaptureError, match=message) as refused:
    call(x_tf)
  assert "net" in str(refused.value) and "training=" in str(refused.value)  # the fix
  after = _state(wrapped)
  for name, value in before.items():  # the refused call wrote nothing
    np.testing.assert_array_equal(after[name], value, err_msg=name)

  # A new trace runs the module's new mode.
  retraced = tf.function(lambda x: wrapped(x))
  _check_mode(retraced(x_tf), x_np, before, wrapped, not traced_training)

  # Switched back, the first graph runs again (its modes are the module's),
  # and the second one refuses.
  net.train(traced_training)
  before = _state(wrapped)
  _check_mode(call(x_tf), x_np, before, wrapped, traced_training)
  with pytest.raises(tb.StaleCaptureError, match="train/eval mode changed"):
    retraced(x_tf)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_submodule_switched_alone_is_named(runner, monkeypatch):
  net = seeded(0, _net).train()
  wrapped = _wrap(net, runner, "TorchModule", monkeypatch)
  call = tf.function(lambda x: wrapped(x))
  x_tf = tf.constant(data([16, 3]))
  call(x_tf)
  net[2].eval()  # dropout only
  with pytest.raises(tb.StaleCaptureError, match=r"True when traced, False now \(submodule '2'\)"):
    call(x_tf)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_an_explicit_mode_ignores_torchs_own(runner, monkeypatch):
  """With training=True/False the graph sets the mode itself: flipping
  torch's own mode changes nothing and is no refusal."""
  net = seeded(0, _net).eval()
  wrapped = _wrap(net, runner, "TorchModule", monkeypatch)
  call = tf.function(lambda x: wrapped(x, training=False))
  x_np = data([16, 3])
  first = call(tf.constant(x_np)).numpy()
  net.train()
  np.testing.assert_array_equal(call(tf.constant(x_np)).numpy(), first)
  assert net.training  # the user's mode is left as they set it
