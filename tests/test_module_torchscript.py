"""`TorchModule(..., torchscript=True)`: graph calls traced and run from the
native op's kernel in C++, against the Python path and torch autograd; the
forwards it refuses, and the calls that take the Python path."""

import copy
import gc
import logging
import os
import sys

import torch  # before TensorFlow
import numpy as np
import pytest
import tensorflow as tf

import torchbridge as tb
from torchbridge._native import _loader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from td3.networks import TorchCritic  # noqa: E402

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge

native_cpp = pytest.mark.skipif(
  not _loader.has_torch_interop() or bool(tf.config.list_logical_devices("GPU")),
  reason="the C++ call path needs the complete native op, on the CPU",
)


class _Embed(torch.nn.Module):
  """An integer input (no gradient), a frozen parameter, a list result."""

  def __init__(self):
    super().__init__()
    self.emb = torch.nn.Embedding(10, 4)
    self.lin = torch.nn.Linear(4, 3)
    self.scale = torch.nn.Parameter(torch.tensor(2.0), requires_grad=False)

  def forward(self, ids, x):
    h = self.emb(ids).sum(1) * self.scale + x
    return [torch.tanh(self.lin(h)), h]


def _mlp():
  return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _cases():
  rng = np.random.default_rng(0)
  obs = rng.standard_normal((5, 3), dtype=np.float32)
  return {
    "mlp": (_mlp, [obs]),
    "td3 critic": (lambda: TorchCritic(3, 1), [obs, rng.standard_normal((5, 1), dtype=np.float32)]),
    "int input, frozen parameter, list result": (
      _Embed,
      [rng.integers(0, 10, (5, 2)), rng.standard_normal((5, 4), dtype=np.float32)],
    ),
  }


def _pair(make):
  torch.manual_seed(0)
  module = make()
  python_path = tb.TorchModule(copy.deepcopy(module), name="m")
  return tb.TorchModule(module, name="m", torchscript=True), python_path


def _loss_and_grads(module, inputs):
  with tf.GradientTape() as tape:
    floats = [x for x in inputs if x.dtype.is_floating]
    tape.watch(floats)
    out = module(*inputs)
    outs = [out] if isinstance(out, tf.Tensor) else list(out)
    loss = sum(tf.reduce_sum(o**2) * (k + 1) for k, o in enumerate(outs))
  return outs, tape.gradient(loss, floats + list(module.trainable_variables))


def _phases(trace):
  return {e["name"] for e in trace.events}


@native_cpp
@pytest.mark.parametrize("case", sorted(_cases()))
def test_graph_calls_run_in_cpp_and_match_the_python_path(case):
  make, inputs_np = _cases()[case]
  traced, python_path = _pair(make)
  inputs = [tf.constant(x) for x in inputs_np]
  step = tf.function(_loss_and_grads)
  step(traced, inputs)  # traced, with one real run of the forward
  with tb.timeline(annotate=False) as trace:
    outs, grads = step(traced, inputs)
  outs_ref, grads_ref = tf.function(_loss_and_grads)(python_path, inputs)
  # The C++ path ran: its callback phase, and none of the Python path's.
  assert "torchbridge/C++ callback" in _phases(trace)
  assert "torchbridge/torch forward" not in _phases(trace)
  for o, o_ref in zip(outs, outs_ref, strict=True):
    np.testing.assert_allclose(o.numpy(), o_ref.numpy(), rtol=1e-5, atol=1e-6)
  assert len(grads) == len(grads_ref) and all(g is not None for g in grads)
  for g, g_ref in zip(grads, grads_ref):
    np.testing.assert_allclose(
      tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(g_ref).numpy(), rtol=1e-5, atol=1e-6
    )
  # The frozen parameter is no trainable variable, and gets no gradient.
  names = [v.name for v in traced.trainable_variables]
  assert not any("scale" in n for n in names)


def test_results_and_gradients_are_torch_autograds():
  # On either path (the C++ one where the op has it, else Python's).
  torch.manual_seed(0)
  module = TorchCritic(3, 1)
  reference = copy.deepcopy(module)
  traced = tb.TorchModule(module, torchscript=True)
  rng = np.random.default_rng(1)
  obs_np = rng.standard_normal((4, 3), dtype=np.float32)
  act_np = rng.standard_normal((4, 1), dtype=np.float32)
  (q1, q2), grads = tf.function(_loss_and_grads)(traced, [tf.constant(obs_np), tf.constant(act_np)])
  obs, act = torch.from_numpy(obs_np).requires_grad_(), torch.from_numpy(act_np).requires_grad_()
  r1, r2 = reference(obs, act)
  loss = (r1**2).sum() + 2 * (r2**2).sum()
  grads_ref = torch.autograd.grad(loss, [obs, act])
  np.testing.assert_allclose(q1.numpy(), r1.detach().numpy(), rtol=1e-5)
  np.testing.assert_allclose(q2.numpy(), r2.detach().numpy(), rtol=1e-5)
  for g, g_ref in zip(grads[:2], grads_ref):
    np.testing.assert_allclose(g.numpy(), g_ref.numpy(), rtol=1e-4, atol=1e-6)


@native_cpp
def test_it_trains_as_the_python_path_does():
  traced, python_path = _pair(_mlp)
  x = tf.constant(np.random.default_rng(2).standard_normal((8, 3), dtype=np.float32))

  def make_step(module):
    opt = tf.keras.optimizers.Adam(0.05)

    @tf.function
    def step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(module(x) ** 2)
      opt.apply_gradients(
        zip(tape.gradient(loss, module.trainable_variables), module.trainable_variables)
      )
      return loss

    return step

  steps = [make_step(traced), make_step(python_path)]
  for _ in range(5):
    losses = [float(step()) for step in steps]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
  # TF's updates reached every traced call: the loss went down.
  assert losses[0] < float(tf.reduce_mean(python_path(x) ** 2)) + 1.0
  for v, v_ref in zip(traced.trainable_variables, python_path.trainable_variables):
    np.testing.assert_allclose(v.numpy(), v_ref.numpy(), rtol=1e-5, atol=1e-6)
  # Each forward's record went with its handle.
  gc.collect()
  [(module, _, _)] = traced._state.torchscript._traced.values()
  assert module.records(made=True) == 5 and module.records() == 0


@native_cpp
def test_a_persistent_tape_asks_twice_and_an_inference_call_records_nothing():
  traced, _ = _pair(_mlp)
  x = tf.ones([2, 3])

  @tf.function
  def twice():
    with tf.GradientTape(persistent=True) as tape:
      y = tf.reduce_sum(traced(x))
    return tape.gradient(y, traced.trainable_variables), tape.gradient(
      y, traced.trainable_variables
    )

  first, second = twice()
  for a, b in zip(first, second):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  [(module, _, _)] = traced._state.torchscript._traced.values()
  made = module.records(made=True)
  tf.function(lambda: traced(x))()
  assert module.records(made=True) == made


@native_cpp
def test_a_second_order_gradient_is_an_error_that_names_the_fix():
  traced, _ = _pair(_mlp)
  x = tf.ones([2, 3])

  @tf.function
  def penalty():
    with tf.GradientTape() as outer:
      outer.watch(x)
      with tf.GradientTape() as inner:
        inner.watch(x)
        y = tf.reduce_sum(traced(x))
      g = inner.gradient(y, x)
    return outer.gradient(tf.reduce_sum(g**2), x)

  with pytest.raises(NotImplementedError, match="second-order gradient.*torchscript=False"):
    penalty()


@native_cpp
def test_a_forward_that_writes_buffers_is_refused_in_that_mode_only():
  torch.manual_seed(0)
  net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
  traced = tb.TorchModule(net, name="bn", torchscript=True)
  python_path = tb.TorchModule(copy.deepcopy(net), name="bn")
  x = tf.constant(np.random.default_rng(3).standard_normal((6, 3), dtype=np.float32))
  with pytest.raises(
    ValueError,
    match=r"writes the buffers \['1.num_batches_tracked', '1.running_mean', '1.running_var'\].*training=False",
  ):
    tf.function(lambda: traced(x, training=True))()
  before = traced.get_weights()
  # Nothing was written by the refused call.
  for n, v in before.items():
    np.testing.assert_array_equal(v, python_path.get_weights()[n])
  y = tf.function(lambda: traced(x, training=False))()
  np.testing.assert_allclose(
    y.numpy(), python_path(x, training=False).numpy(), rtol=1e-5, atol=1e-6
  )


@native_cpp
def test_forwards_a_trace_cannot_reproduce_are_refused():
  class ValueDependent(torch.nn.Module):
    def forward(self, x):
      return x * 2 if x.sum() > 0 else x

  class DictResult(torch.nn.Module):
    def forward(self, x):
      return {"y": x + 1}

  x = tf.ones([2, 3])
  with pytest.raises(ValueError, match="torch.jit.trace warns.*torchscript=False"):
    tf.function(lambda: tb.TorchModule(ValueDependent(), torchscript=True)(x))()
  with pytest.raises(ValueError, match="returned dict.*torchscript=False"):
    tf.function(lambda: tb.TorchModule(DictResult(), torchscript=True)(x))()


def test_torchscript_takes_a_bool():
  with pytest.raises(
    TypeError, match=r"TorchModule\(torchscript=\.\.\.\) takes True or False, got 'yes'"
  ):
    tb.TorchModule(_mlp(), torchscript="yes")
  with pytest.raises(
    TypeError, match=r"TorchLayer\(torchscript=\.\.\.\) takes True or False, got 1"
  ):
    tb.keras.TorchLayer(_mlp(), torchscript=1)


def test_eager_calls_and_unknown_ranks_take_the_python_path(caplog):
  # An unknown rank: only a declared output_signature lets any path run.
  torch.manual_seed(0)
  module, spec = _mlp(), tf.TensorSpec([None, 2], tf.float32)
  python_path = tb.TorchModule(copy.deepcopy(module), name="m", output_signature=spec)
  traced = tb.TorchModule(module, name="m", output_signature=spec, torchscript=True)
  x = tf.ones([2, 3])
  np.testing.assert_allclose(traced(x).numpy(), python_path(x).numpy(), rtol=1e-6)
  f = tf.function(lambda x: traced(x), input_signature=[tf.TensorSpec(None, tf.float32)])
  with caplog.at_level(logging.WARNING, logger="torchbridge"):
    y = f(x)
    f(tf.ones([4, 3]))
  np.testing.assert_allclose(y.numpy(), python_path(x).numpy(), rtol=1e-6)
  said = [r.getMessage() for r in caplog.records if "torchscript=True" in r.getMessage()]
  # Said once, with the reason and the fix.
  assert len(said) == 1
  if _loader.has_torch_interop():
    assert "unknown rank" in said[0] and "input_signature" in said[0]
  else:
    assert "the complete native op is not loaded" in said[0]


@native_cpp
def test_unknown_dimensions_run_in_cpp_at_every_size():
  traced, python_path = _pair(_mlp)
  spec = [tf.TensorSpec([None, 3], tf.float32)]
  f = tf.function(lambda x: _loss_and_grads(traced, [x]), input_signature=spec)
  f_ref = tf.function(lambda x: _loss_and_grads(python_path, [x]), input_signature=spec)
  # The output's batch dimension follows the input's: unknown in the graph.
  [out], _ = f.get_concrete_function().structured_outputs
  assert out.shape.as_list() == [None, 2]
  for n in (1, 4, 7):
    x = tf.constant(np.random.default_rng(n).standard_normal((n, 3), dtype=np.float32))
    with tb.timeline(annotate=False) as trace:
      (y,), grads = f(x)
    (y_ref,), grads_ref = f_ref(x)
    assert "torchbridge/C++ callback" in _phases(trace)
    assert y.shape == (n, 2)
    np.testing.assert_allclose(y.numpy(), y_ref.numpy(), rtol=1e-5, atol=1e-6)
    for g, g_ref in zip(grads, grads_ref, strict=True):
      np.testing.assert_allclose(g.numpy(), g_ref.numpy(), rtol=1e-5, atol=1e-6)
  assert f.experimental_get_tracing_count() == 1  # one trace serves every size


class _PerRow(torch.nn.Module):
  """Loops over the batch in Python: a trace freezes the loop's length."""

  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(3, 3)

  def forward(self, x):
    return torch.stack([self.lin(x[i]) for i in range(x.shape[0])])


@native_cpp
def test_a_trace_that_freezes_an_unknown_size_is_refused():
  module = tb.TorchModule(_PerRow(), torchscript=True)
  f = tf.function(module, input_signature=[tf.TensorSpec([None, 3], tf.float32)])
  with pytest.raises(ValueError, match="when the dimensions TF leaves unknown change size") as err:
    f(tf.ones([2, 3]))
  assert "input_signature with known shapes, or use torchscript=False" in str(err.value)
  # With known shapes the same forward traces and runs in C++.
  g = tf.function(module, input_signature=[tf.TensorSpec([2, 3], tf.float32)])
  with tb.timeline(annotate=False) as trace:
    y = g(tf.ones([2, 3]))
  assert "torchbridge/C++ callback" in _phases(trace)
  expected = module.torch_module(torch.ones(2, 3)).detach().numpy()
  np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6)


@native_cpp
def test_a_keras_layer_with_torchscript_fits_as_the_python_path_does():
  import keras  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(3)
  x = rng.standard_normal((30, 3), dtype=np.float32)
  y = rng.standard_normal((30, 2), dtype=np.float32)
  weights, phases = {}, {}
  for torchscript in (True, False):
    torch.manual_seed(0)
    layer = tb.keras.TorchLayer(_mlp(), torchscript=torchscript, name="mlp")
    model = keras.Sequential([keras.Input((3,)), layer])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    # Batches of 8 and a last one of 6: fit's batch dimension is unknown.
    # The first epoch traces (one real run of the forward in Python).
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    with tb.timeline(annotate=False) as trace:
      model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    phases[torchscript] = _phases(trace)
    weights[torchscript] = layer.get_weights_by_name()
  assert "torchbridge/C++ callback" in phases[True]
  assert "torchbridge/torch forward" not in phases[True]
  assert "torchbridge/torch forward" in phases[False]
  assert weights[True].keys() == weights[False].keys()
  for name, value in weights[True].items():
    np.testing.assert_allclose(value, weights[False][name], rtol=1e-5, atol=1e-6)


def test_a_keras_layers_config_keeps_torchscript():
  layer = tb.keras.TorchLayer(_mlp(), torchscript=True, name="mlp")
  config = layer.get_config()
  assert config["torchscript"] is True
  again = tb.keras.TorchLayer.from_config(config, safe_mode=False)
  assert again._torchscript is True and again._torch_state.torchscript is not None
  plain = tb.keras.TorchLayer(_mlp(), name="plain")
  assert "torchscript" not in plain.get_config()
  assert plain._torch_state.torchscript is None


def test_copies_keep_it():
  traced = tb.TorchModule(_mlp(), torchscript=True)
  assert copy.deepcopy(traced)._torchscript is True
  assert tb.TorchModule(_mlp())._torchscript is False


@native_cpp
def test_a_result_copied_in_cpp_is_counted_as_the_python_path_counts_it():
  # The critic's gradients for `obs` and `action` are columns of its
  # concatenation's gradient (strided): each is copied once to be handed
  # to TF, on either path, and tb.exchange_stats() counts it once.
  make, inputs_np = _cases()["td3 critic"]
  inputs = [tf.constant(x) for x in inputs_np]
  stats = {}
  for module in _pair(make):
    step = tf.function(_loss_and_grads)
    step(module, inputs)
    tb.reset_exchange_stats()
    step(module, inputs)
    stats[module._torchscript] = tb.exchange_stats()
  assert stats[True]["copied"] == stats[False]["copied"] == 2
  assert stats[True]["bytes_copied"] == stats[False]["bytes_copied"] == 5 * 4 * 4
  assert stats[True]["zero_copy"] > 0
