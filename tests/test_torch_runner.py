"""The C++ torch runner: graph calls that run torch (`run="torch"`, or
`run="auto"` where the translation does not hold) captured once per
signature with `torch.export` and run from the native op's kernel in C++,
against the Python path and torch autograd; what it watches, what it
refuses, and where calls take the Python path."""

import collections
import copy
import gc
import logging
import os
import subprocess
import sys
import warnings

import torch  # before TensorFlow
import numpy as np
import pytest
import tensorflow as tf

import torchbridge as tb
from torchbridge._native import _loader
from torchbridge._runners import _record as _runners

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from td3.networks import TorchCritic  # noqa: E402

native_cpp = pytest.mark.skipif(
  not _loader.has_torch_interop() or bool(tf.config.list_logical_devices("GPU")),
  reason="the C++ torch runner needs the complete native op, on the CPU",
)


@pytest.fixture(autouse=True)
def _cpp_runner_on(monkeypatch):
  monkeypatch.delenv("TORCHBRIDGE_TORCH_RUNNER", raising=False)


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


def _python_path(wrapper):
  wrapper._runners.torch_runner.enabled = False
  return wrapper


def _pair(make, name="m", **kwargs):
  torch.manual_seed(0)
  module = make()
  python_path = _python_path(
    tb.TorchModule(copy.deepcopy(module), name=name, run="torch", **kwargs)
  )
  return tb.TorchModule(module, name=name, run="torch", **kwargs), python_path


def _programs(wrapper):
  return [entry[0].loaded for entry in wrapper._runners.torch_runner.captures.entries.values()]


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


def _path(name):
  return _runners.choices()[name].get("path")


@native_cpp
@pytest.mark.parametrize("case", sorted(_cases()))
def test_graph_calls_run_in_cpp_and_match_the_python_path(case):
  make, inputs_np = _cases()[case]
  in_cpp, python_path = _pair(make)
  inputs = [tf.constant(x) for x in inputs_np]
  step = tf.function(_loss_and_grads)
  step(in_cpp, inputs)  # captured and checked
  with tb.timeline(annotate=False) as trace:
    outs, grads = step(in_cpp, inputs)
  assert _path("m") == "C++"
  outs_ref, grads_ref = tf.function(_loss_and_grads)(python_path, inputs)
  assert _path("m") == "Python"
  # The C++ runner ran: its callback phase, and none of the Python path's.
  assert "torchbridge/C++ callback" in _phases(trace)
  assert "torchbridge/torch forward" not in _phases(trace)
  for o, o_ref in zip(outs, outs_ref, strict=True):
    np.testing.assert_array_equal(o.numpy(), o_ref.numpy())  # the same ATen kernels
  assert len(grads) == len(grads_ref) and all(g is not None for g in grads)
  for g, g_ref in zip(grads, grads_ref):
    np.testing.assert_allclose(
      tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(g_ref).numpy(), rtol=1e-6, atol=1e-7
    )
  names = [v.name for v in in_cpp.trainable_variables]
  assert not any("scale" in n for n in names)


@native_cpp
def test_results_and_gradients_are_torch_autograds():
  torch.manual_seed(0)
  module = TorchCritic(3, 1)
  reference = copy.deepcopy(module)
  in_cpp = tb.TorchModule(module, run="torch", name="critic")
  rng = np.random.default_rng(1)
  obs_np = rng.standard_normal((4, 3), dtype=np.float32)
  act_np = rng.standard_normal((4, 1), dtype=np.float32)
  (q1, q2), grads = tf.function(_loss_and_grads)(in_cpp, [tf.constant(obs_np), tf.constant(act_np)])
  assert _path("critic") == "C++"
  obs, act = torch.from_numpy(obs_np).requires_grad_(), torch.from_numpy(act_np).requires_grad_()
  r1, r2 = reference(obs, act)
  loss = (r1**2).sum() + 2 * (r2**2).sum()
  grads_ref = torch.autograd.grad(loss, [obs, act] + list(reference.parameters()))
  np.testing.assert_array_equal(q1.numpy(), r1.detach().numpy())
  np.testing.assert_array_equal(q2.numpy(), r2.detach().numpy())
  for g, g_ref in zip(grads[:2], grads_ref[:2]):
    np.testing.assert_allclose(g.numpy(), g_ref.numpy(), rtol=1e-6, atol=1e-7)
  by_name = {v.name: g for v, g in zip(in_cpp.trainable_variables, grads[2:])}
  for (n, _), g_ref in zip(reference.named_parameters(), grads_ref[2:]):
    np.testing.assert_allclose(by_name[f"critic/{n}:0"].numpy(), g_ref.numpy(), rtol=1e-6)


@native_cpp
def test_it_trains_as_the_python_path_does():
  in_cpp, python_path = _pair(_mlp)
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

  steps = [make_step(in_cpp), make_step(python_path)]
  first = None
  for _ in range(5):
    losses = [float(step()) for step in steps]
    first = first or losses[0]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
  assert losses[0] < first  # TF's updates reached every call
  for v, v_ref in zip(in_cpp.trainable_variables, python_path.trainable_variables):
    np.testing.assert_allclose(v.numpy(), v_ref.numpy(), rtol=1e-6, atol=1e-7)
  # The torch module sees the trained values.
  np.testing.assert_array_equal(
    in_cpp.torch_module[0].weight.detach().numpy(), in_cpp.get_weights()["0.weight"]
  )
  gc.collect()
  [program] = _programs(in_cpp)
  assert program.records(made=True) >= 5 and program.records() == 0  # freed with their handles


@native_cpp
def test_a_persistent_tape_asks_twice_and_an_inference_call_records_nothing():
  in_cpp, _ = _pair(_mlp)
  x = tf.ones([2, 3])

  @tf.function
  def twice():
    with tf.GradientTape(persistent=True) as tape:
      y = tf.reduce_sum(in_cpp(x))
    return tape.gradient(y, in_cpp.trainable_variables), tape.gradient(
      y, in_cpp.trainable_variables
    )

  first, second = twice()
  for a, b in zip(first, second):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  [program] = _programs(in_cpp)
  made = program.records(made=True)
  tf.function(lambda: in_cpp(x))()
  assert program.records(made=True) == made


@native_cpp
def test_a_second_order_gradient_is_an_error_that_names_the_fix():
  in_cpp, _ = _pair(_mlp)
  x = tf.ones([2, 3])

  @tf.function
  def penalty():
    with tf.GradientTape() as outer:
      outer.watch(x)
      with tf.GradientTape() as inner:
        inner.watch(x)
        y = tf.reduce_sum(in_cpp(x))
      g = inner.gradient(y, x)
      penalty = tf.reduce_sum(g**2)
    return outer.gradient(penalty, x)

  with pytest.raises(
    NotImplementedError, match="second-order gradient.*TORCHBRIDGE_TORCH_RUNNER=python"
  ):
    penalty()


@native_cpp
def test_a_tape_outside_the_tf_function_gets_first_order_gradients():
  # TF traces the backward of a tf.function called under an eager tape with
  # that tape active: the C++ runner used to refuse it as second order.
  in_cpp, python_path = _pair(_mlp)
  x = tf.constant(np.random.default_rng(5).standard_normal((4, 3), dtype=np.float32))
  results = []
  for module in (in_cpp, python_path):
    step = tf.function(lambda v, m=module: m(v))
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = tf.reduce_sum(step(x) ** 2)
    results.append(tape.gradient(loss, [x, *module.trainable_variables]))
  assert _programs(in_cpp) and not _programs(python_path)
  for a, b in zip(*results):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


@native_cpp
def test_batchnorm_in_training_writes_its_buffers_back_as_the_python_path_does():
  def make():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU())

  in_cpp, python_path = _pair(make, name="bn")
  x = tf.constant(np.random.default_rng(3).standard_normal((6, 3), dtype=np.float32))
  spec = [tf.TensorSpec([None, 3], tf.float32)]
  results = []
  for module in (in_cpp, python_path):
    f = tf.function(lambda x, module=module: _loss_and_grads(module, [x]), input_signature=spec)
    for _ in range(3):
      outs, grads = f(x)
    results.append((outs, grads, module.get_weights(), _path("bn")))
  (o1, g1, w1, p1), (o2, g2, w2, p2) = results
  assert (p1, p2) == ("C++", "Python")
  np.testing.assert_allclose(o1[0].numpy(), o2[0].numpy(), rtol=1e-6, atol=1e-7)
  for a, b in zip(g1, g2):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
  assert w1["1.num_batches_tracked"] == w2["1.num_batches_tracked"] == 3
  for n in ("1.running_mean", "1.running_var"):
    np.testing.assert_allclose(w1[n], w2[n], rtol=1e-6)
    assert not np.allclose(w1[n], make()[1].state_dict()[n[2:]].numpy())  # written
  # In eval mode the same module reads them and writes nothing.
  before = in_cpp.get_weights()
  tf.function(lambda: in_cpp(x, training=False))()
  for n, v in in_cpp.get_weights().items():
    np.testing.assert_array_equal(v, before[n])


@native_cpp
def test_keras_fit_with_dropout_and_batchnorm_runs_in_cpp_with_an_unknown_batch():
  import keras  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(3)
  x = rng.standard_normal((30, 3), dtype=np.float32)
  y = rng.standard_normal((30, 2), dtype=np.float32)
  torch.manual_seed(0)
  net = torch.nn.Sequential(
    torch.nn.Linear(3, 16),
    torch.nn.BatchNorm1d(16),
    torch.nn.ReLU(),
    torch.nn.Dropout(0.5),
    torch.nn.Linear(16, 2),
  )
  layer = tb.keras.TorchLayer(net, run="torch", name="fit_cpp")  # supports_jit: test_xla.py
  model = keras.Sequential([keras.Input((3,)), layer])
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)  # batches of 8 and 6
  with tb.timeline(annotate=False) as trace:
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
  assert _path("fit_cpp") == "C++"
  assert "torchbridge/C++ callback" in _phases(trace)
  assert "torchbridge/torch forward" not in _phases(trace)
  assert np.isfinite(history.history["loss"]).all()
  weights = layer.get_weights_by_name()
  assert weights["1.num_batches_tracked"] == 3 * 4  # every batch wrote it
  # Dropout draws in training: two training calls differ; inference does not.
  xt = tf.constant(x[:8])
  f = tf.function(lambda v: layer(v, training=True))
  a, b = f(xt).numpy(), f(xt).numpy()
  assert not np.array_equal(a, b)
  np.testing.assert_array_equal(model.predict(x, verbose=0), model.predict(x, verbose=0))


@native_cpp
def test_non_tensor_arguments_are_part_of_the_key():
  class Scaled(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.lin = torch.nn.Linear(3, 2)

    def forward(self, x, scale=1.0):
      return self.lin(x) * scale

  torch.manual_seed(0)
  m = tb.TorchModule(Scaled(), name="scaled", run="torch")
  x = tf.ones([2, 3])
  y2 = tf.function(lambda v: m(v, scale=2.0))(x)
  y3 = tf.function(lambda v: m(v, scale=3.0))(x)
  assert _path("scaled") == "C++"
  base = m.torch_module.lin(torch.ones(2, 3)).detach().numpy()
  np.testing.assert_allclose(y2.numpy(), 2 * base, rtol=1e-6)
  np.testing.assert_allclose(y3.numpy(), 3 * base, rtol=1e-6)
  assert len(m._runners.torch_runner.captures) == 2


class _Exploring(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(3, 2)
    self.t = 1.0  # a plain attribute the forward reads

  def forward(self, x):
    return self.lin(x) * self.t


@native_cpp
def test_an_attribute_changed_after_capture_is_captured_again_or_refused_by_name():
  torch.manual_seed(0)
  m = tb.TorchModule(_Exploring(), name="exploring", run="torch")
  x = tf.ones([2, 3])
  old = tf.function(lambda v: m(v))
  base = m.torch_module.lin(torch.ones(2, 3)).detach().numpy()
  np.testing.assert_allclose(old(x).numpy(), base, rtol=1e-6)
  m.torch_module.t = 5.0
  # A new trace captures the new value...
  np.testing.assert_allclose(tf.function(lambda v: m(v))(x).numpy(), 5 * base, rtol=1e-6)
  # ...and the graph traced before refuses, naming it.
  with pytest.raises(
    tb.StaleCaptureError,
    match=r"(?s)exploring: t: 1.0 when captured, 5.0 now.*TORCHBRIDGE_TORCH_RUNNER=python",
  ):
    old(x)
  m.torch_module.t = 1.0  # back as captured: runs again
  np.testing.assert_allclose(old(x).numpy(), base, rtol=1e-6)


def test_the_python_path_reads_attributes_on_every_call(monkeypatch):
  monkeypatch.setenv("TORCHBRIDGE_TORCH_RUNNER", "python")
  torch.manual_seed(0)
  m = tb.TorchModule(_Exploring(), name="exploring_py", run="torch")
  f = tf.function(lambda v: m(v))
  x = tf.ones([2, 3])
  base = m.torch_module.lin(torch.ones(2, 3)).detach().numpy()
  np.testing.assert_allclose(f(x).numpy(), base, rtol=1e-6)
  m.torch_module.t = 5.0
  np.testing.assert_allclose(f(x).numpy(), 5 * base, rtol=1e-6)
  assert _path("exploring_py") == "Python"


class _Counting(torch.nn.Module):
  """Changes its own Python state on every call: no capture can hold."""

  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(3, 2)
    self.calls = 0

  def forward(self, x):
    self.calls += 1
    return self.lin(x) * self.calls


@native_cpp
def test_a_capture_that_fails_its_check_takes_the_python_path_said_once(caplog):
  torch.manual_seed(0)
  m = tb.TorchModule(_Counting(), name="counting", run="torch")
  f = tf.function(lambda v: m(v))
  with caplog.at_level(logging.WARNING, logger="torchbridge"):
    f(tf.ones([2, 3]))
    tf.function(lambda v: m(v))(tf.ones([2, 3]))
  said = [r.getMessage() for r in caplog.records if "counting" in r.getMessage()]
  assert len(said) == 1 and "changed its Python state while captured: calls" in said[0], said
  assert _path("counting") == "Python"
  # The Python path runs the forward on every call, as eager torch does.
  calls = m.torch_module.calls
  f(tf.ones([2, 3]))
  assert m.torch_module.calls == calls + 1


@torch.library.custom_op("tbtest_runner::softsign_x", mutates_args=())
def _softsign_x(x: torch.Tensor) -> torch.Tensor:
  return x / (1 + x.abs())


@_softsign_x.register_fake
def _(x):
  return torch.empty_like(x)


def _softsign_x_setup(ctx, inputs, output):
  del output
  ctx.save_for_backward(inputs[0])


def _softsign_x_backward(ctx, grad):
  (x,) = ctx.saved_tensors
  return grad / (1 + x.abs()) ** 2


_softsign_x.register_autograd(_softsign_x_backward, setup_context=_softsign_x_setup)


class _CustomOp(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(3, 4)

  def forward(self, x):
    return torch.ops.tbtest_runner.softsign_x(self.lin(x))


class _NoFake(torch.nn.Module):
  """A custom op with a CPU kernel and no fake one: torch.export refuses."""

  def forward(self, x):
    return torch.ops.tbtest_nofake.twice(x)


_NOFAKE = torch.library.Library("tbtest_nofake", "FRAGMENT")  # pylint: disable=no-member
_NOFAKE.define("twice(Tensor x) -> Tensor")
_NOFAKE.impl("twice", lambda x: x * 2, "CPU")


@native_cpp
def test_a_module_the_translation_refuses_runs_in_cpp_by_default():
  # run="auto": an op registered with torch.library has no TF translation,
  # so the call runs torch, from C++.
  torch.manual_seed(0)
  m = tb.TorchModule(_CustomOp(), name="custom")
  x = tf.constant(np.random.default_rng(0).standard_normal((4, 3), dtype=np.float32))
  outs, grads = tf.function(_loss_and_grads)(m, [x])
  choice = _runners.choices()["custom"]
  assert choice["runner"] == "torch" and choice["path"] == "C++", choice
  assert "tbtest_runner.softsign_x" in choice["reason"], choice
  xt = torch.from_numpy(x.numpy()).requires_grad_(True)
  want = m.torch_module(xt)
  np.testing.assert_array_equal(outs[0].numpy(), want.detach().numpy())
  (grad_x,) = torch.autograd.grad((want**2).sum(), [xt])
  np.testing.assert_allclose(grads[0].numpy(), grad_x.numpy(), rtol=1e-6)


@native_cpp
def test_a_capture_torch_refuses_takes_the_python_path_with_one_warning(caplog):
  m = tb.TorchModule(_NoFake(), name="nofake", run="torch") if False else None
  # A module with no parameters or buffers cannot be wrapped: give it one.
  module = _NoFake()
  module.register_buffer("unused", torch.zeros(1))
  m = tb.TorchModule(module, name="nofake", run="torch", output_signature=tf.TensorSpec([2, 3]))
  with caplog.at_level(logging.WARNING, logger="torchbridge"):
    y = tf.function(lambda: m(tf.ones([2, 3])))()
    tf.function(lambda: m(tf.ones([2, 3])))()
  np.testing.assert_array_equal(y.numpy(), 2 * np.ones([2, 3]))
  said = [r.getMessage() for r in caplog.records if "nofake" in r.getMessage()]
  assert len(said) == 1 and "torch.export could not capture" in said[0], said
  assert _path("nofake") == "Python"


@native_cpp
def test_the_cpp_runner_says_once_at_info_that_it_runs_a_modules_calls(caplog):
  m = tb.TorchModule(_mlp(), name="said_cpp", run="torch")
  with caplog.at_level(logging.INFO, logger="torchbridge"):
    tf.function(lambda x: m(x))(tf.ones([2, 3]))
    tf.function(lambda x: m(x))(tf.ones([4, 3]))  # a second signature: not said again
  said = [r for r in caplog.records if "said_cpp" in r.getMessage()]
  assert len(said) == 1 and said[0].levelno == logging.INFO, [r.getMessage() for r in said]
  assert "graph calls run torch from C++" in said[0].getMessage()
  assert "run='torch'" in said[0].getMessage()
  assert _path("said_cpp") == "C++"


@native_cpp
def test_nested_and_named_results_keep_their_structure():
  Pair = collections.namedtuple("Pair", "a b")

  class Nested(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
      y = self.lin(x) * 2.0
      return {"y": y, "p": Pair(y.sum(-1), [torch.tanh(y), x.shape[0] * y])}

  torch.manual_seed(0)
  m = tb.TorchModule(Nested(), name="nested", run="torch")
  f = tf.function(m, input_signature=[tf.TensorSpec([None, 4], tf.float32)])
  out = f(tf.ones([3, 4]))
  assert _path("nested") == "C++"
  assert isinstance(out["p"], Pair) and isinstance(out["p"].b, list)
  want = m.torch_module(torch.ones(3, 4))
  np.testing.assert_allclose(out["p"].b[1].numpy(), want["p"].b[1].detach().numpy(), rtol=1e-6)
  assert f.get_concrete_function().structured_outputs["y"].shape.as_list() == [None, 4]


@native_cpp
def test_a_tied_weight_gets_the_sum_of_its_gradients():
  # torch.export lifts a tied weight once per name (GPT-2's wte and
  # lm_head): the variable is passed once per use and TF adds them up.
  class Tied(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.emb = torch.nn.Embedding(10, 4)
      self.head = torch.nn.Linear(4, 10, bias=False)
      self.head.weight = self.emb.weight

    def forward(self, ids):
      return self.head(self.emb(ids).sum(1))

  torch.manual_seed(0)
  net = Tied()
  m = tb.TorchModule(copy.deepcopy(net), name="tied", run="torch")
  ids = tf.constant([[1, 2], [3, 4]])

  @tf.function
  def step(ids):
    with tf.GradientTape() as tape:
      y = m(ids)
      loss = tf.reduce_sum(y**2)
    return y, tape.gradient(loss, m.trainable_variables)

  y, [grad] = step(ids)
  assert _path("tied") == "C++"
  y_torch = net(torch.tensor([[1, 2], [3, 4]]))
  (y_torch**2).sum().backward()
  np.testing.assert_array_equal(y.numpy(), y_torch.detach().numpy())
  np.testing.assert_allclose(grad.numpy(), net.emb.weight.grad.numpy(), rtol=1e-6)


@native_cpp
def test_a_check_that_torch_refuses_takes_the_python_path_naming_torchs_words(caplog):
  # A loss whose target must lie in [0, 1]: the check's random inputs make
  # torch raise (in its reference run, before the C++ runner's); the reason
  # is torch's message, without its C++ stack.
  module = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Sigmoid())
  loss = torch.nn.BCELoss()

  class WithTarget(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.net = module

    def forward(self, x, target):
      return loss(self.net(x), target)

  m = tb.TorchModule(WithTarget(), name="bce", run="torch")
  with caplog.at_level(logging.WARNING, logger="torchbridge"):
    y = tf.function(lambda x, t: m(x, t))(tf.ones([4, 3]), tf.fill([4, 1], 0.5))
  assert np.isfinite(y.numpy())
  said = [r.getMessage() for r in caplog.records if "bce" in r.getMessage()]
  assert (
    len(said) == 1
    and "the forward raised on random inputs: RuntimeError: all elements of target should "
    "be between 0 and 1"
    in said[0]
  ), said
  assert "Exception raised from" not in said[0] and "function_node" not in said[0]
  assert _path("bce") == "Python"


@native_cpp
def test_output_signature_with_read_only_buffers_runs_in_cpp():
  class WithBuffer(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.lin = torch.nn.Linear(3, 2)
      self.register_buffer("offset", torch.tensor([0.5, -1.0]))

    def forward(self, x):
      return self.lin(x) + self.offset

  torch.manual_seed(0)
  m = tb.TorchModule(
    WithBuffer(), name="declared", run="torch", output_signature=tf.TensorSpec([None, 2])
  )
  y = tf.function(lambda v: m(v))(tf.ones([4, 3]))
  assert _path("declared") == "C++"
  want = m.torch_module(torch.ones(4, 3)).detach().numpy()
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)


@native_cpp
def test_unknown_dimensions_run_in_cpp_at_every_size():
  in_cpp, python_path = _pair(_mlp)
  spec = [tf.TensorSpec([None, 3], tf.float32)]
  f = tf.function(lambda x: _loss_and_grads(in_cpp, [x]), input_signature=spec)
  f_ref = tf.function(lambda x: _loss_and_grads(python_path, [x]), input_signature=spec)
  [out], _ = f.get_concrete_function().structured_outputs
  assert out.shape.as_list() == [None, 2]
  for n in (1, 4, 7):
    x = tf.constant(np.random.default_rng(n).standard_normal((n, 3), dtype=np.float32))
    with tb.timeline(annotate=False) as trace:
      (y,), grads = f(x)
    (y_ref,), grads_ref = f_ref(x)
    assert "torchbridge/C++ callback" in _phases(trace)
    assert y.shape == (n, 2)
    np.testing.assert_array_equal(y.numpy(), y_ref.numpy())
    for g, g_ref in zip(grads, grads_ref, strict=True):
      np.testing.assert_allclose(g.numpy(), g_ref.numpy(), rtol=1e-6, atol=1e-7)
  assert f.experimental_get_tracing_count() == 1  # one trace serves every size


class _PerRow(torch.nn.Module):
  """Loops over the batch in Python: the capture specializes the size."""

  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(3, 3)

  def forward(self, x):
    return torch.stack([self.lin(x[i]) for i in range(x.shape[0])])


@native_cpp
def test_a_forward_that_needs_a_fixed_size_takes_the_python_path_where_it_is_unknown(caplog):
  module = tb.TorchModule(_PerRow(), run="torch", name="per_row")
  f = tf.function(module, input_signature=[tf.TensorSpec([None, 3], tf.float32)])
  with caplog.at_level(logging.WARNING, logger="torchbridge"):
    y = f(tf.ones([2, 3]))
  assert _path("per_row") == "Python"
  expected = module.torch_module(torch.ones(2, 3)).detach().numpy()
  np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6)
  np.testing.assert_allclose(f(tf.ones([5, 3])).numpy().shape, (5, 3))
  # With known shapes the same forward is captured and runs in C++.
  g = tf.function(module, input_signature=[tf.TensorSpec([2, 3], tf.float32)])
  with tb.timeline(annotate=False) as trace:
    y = g(tf.ones([2, 3]))
  assert _path("per_row") == "C++"
  assert "torchbridge/C++ callback" in _phases(trace)
  np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6)


def test_eager_calls_and_unknown_ranks_take_the_python_path(caplog):
  torch.manual_seed(0)
  module, spec = _mlp(), tf.TensorSpec([None, 2], tf.float32)
  m = tb.TorchModule(module, name="ranks", output_signature=spec, run="torch")
  x = tf.ones([2, 3])
  want = module(torch.ones(2, 3)).detach().numpy()
  np.testing.assert_allclose(m(x).numpy(), want, rtol=1e-6)
  f = tf.function(lambda x: m(x), input_signature=[tf.TensorSpec(None, tf.float32)])
  with caplog.at_level(logging.WARNING, logger="torchbridge"):
    y = f(x)
    f(tf.ones([4, 3]))
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
  said = [
    r.getMessage()
    for r in caplog.records
    if "ranks" in r.getMessage() and r.levelno >= logging.WARNING
  ]
  if _loader.has_torch_interop():  # said once, with the fix
    assert len(said) == 1 and "unknown rank" in said[0] and "input_signature" in said[0]
  else:  # the native op's own fallback said why (once per process)
    assert not said
  assert _path("ranks") == "Python"


def test_torchscript_is_a_deprecated_alias_of_the_torch_runner():
  with pytest.warns(
    DeprecationWarning, match=r'torchscript=True\) is deprecated and means run="torch"'
  ):
    m = tb.TorchModule(_mlp(), torchscript=True)
  assert m._run == "torch" and m._runners.tf_runner is None
  with pytest.warns(DeprecationWarning):
    layer = tb.keras.TorchLayer(_mlp(), torchscript=True, name="mlp")
  config = layer.get_config()
  assert config["run"] == "torch" and "torchscript" not in config
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    again = tb.keras.TorchLayer.from_config(config, safe_mode=False)
    assert again._run == "torch"
    assert copy.deepcopy(m)._run == "torch"
  with pytest.raises(
    TypeError, match=r"torchscript=\.\.\.\) is deprecated and takes True or False, got 'yes'"
  ):
    tb.TorchModule(_mlp(), torchscript="yes")
  with pytest.raises(ValueError, match="asks for two runners"):
    with pytest.warns(DeprecationWarning):
      tb.TorchModule(_mlp(), torchscript=True, run="tf")


def test_no_torch_jit_in_the_package_or_its_cpp():
  for top in ("torchbridge", "csrc"):
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
      for name in files:
        if not name.endswith((".py", ".cc", ".h")):
          continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
          text = f.read()
        for needle in ("torch.jit", "torch::jit", "torch/script.h", "jit.trace"):
          assert needle not in text, (name, needle)


@native_cpp
@pytest.mark.usefixtures("own_crossings_only")
def test_a_result_copied_in_cpp_is_counted_as_the_python_path_counts_it():
  # The critic's gradients for `obs` and `action` are columns of its
  # concatenation's gradient (strided): each is copied once to be handed
  # to TF, on either path, and tb.exchange_stats() counts it once.
  make, inputs_np = _cases()["td3 critic"]
  inputs = [tf.constant(x) for x in inputs_np]
  stats = []
  for module in _pair(make):
    step = tf.function(_loss_and_grads)
    step(module, inputs)
    tb.reset_exchange_stats()
    step(module, inputs)
    stats.append(tb.exchange_stats())
  assert stats[0]["copied"] == stats[1]["copied"] == 2
  assert stats[0]["bytes_copied"] == stats[1]["bytes_copied"] == 5 * 4 * 4
  assert stats[0]["zero_copy"] > 0


@native_cpp
def test_info_says_which_capture_and_runner_are_active():
  script = (
    "import json, torch, tensorflow as tf, torchbridge as tb\n"
    "from torchbridge._cli import _report\n"
    "m = tb.TorchModule(torch.nn.Linear(3, 2), name='lin', run='torch')\n"
    "tf.function(lambda: m(tf.ones([2, 3])))()\n"
    "print(json.dumps(_report.report()['runners']))\n"
  )
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TORCHBRIDGE_TORCH_RUNNER", None)
  out = subprocess.run(
    [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-3000:]
  import json  # pylint: disable=import-outside-toplevel

  runners = json.loads(out.stdout.strip().splitlines()[-1])
  assert "torch.export" in runners["capture"]
  assert runners["torch_runner"].startswith("C++")
  assert runners["modules"]["lin"].startswith("torch from C++ (run='torch')"), runners
