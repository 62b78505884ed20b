"""Bridged calls under XLA (tf.function(jit_compile=True)): the op lowered to
an XLA custom call (csrc/xla/) whose host handler runs the CPU kernel's
callback. Skipped where that library cannot be built or loaded."""

import copy
import functools
import gc
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf

import torchbridge as tb
from torchbridge._native import _exported_program
from torchbridge._native import _xla


@pytest.fixture(scope="module", autouse=True)
def xla_unit():
  reason = _xla.unavailable()  # builds it on first use
  if reason is not None:
    pytest.skip(f"the XLA custom call is unavailable: {reason}")


def _close(a, b, tol=1e-12):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [tf.float64, tf.float32])
def test_torch_function_values_and_gradients_equal_torch(dtype):
  @tb.torch_function
  def f(a, b):
    return torch.sin(a) * b, a.sum()

  @tf.function(jit_compile=True)
  def step(x, y):
    with tf.GradientTape() as tape:
      tape.watch([x, y])
      z, s = f(x, y)
      loss = tf.reduce_sum(z * z) + 3.0 * tf.cast(s, dtype)
    return z, s, tape.gradient(loss, [x, y])

  rng = np.random.default_rng(0)
  x_np, y_np = rng.standard_normal((2, 3, 4))
  calls = _xla.calls()
  z, s, (gx, gy) = step(tf.constant(x_np, dtype), tf.constant(y_np, dtype))
  assert _xla.calls() == calls + 2  # the forward and its backward ran in XLA
  torch_dtype = torch.float64 if dtype == tf.float64 else torch.float32
  xt = torch.tensor(x_np, dtype=torch_dtype, requires_grad=True)
  yt = torch.tensor(y_np, dtype=torch_dtype, requires_grad=True)
  zt, st = torch.sin(xt) * yt, xt.sum()
  ((zt * zt).sum() + 3.0 * st).backward()
  tol = 1e-12 if dtype == tf.float64 else 1e-5
  _close(z, zt.detach(), tol)
  _close(s, st.detach(), tol)
  _close(gx, xt.grad, tol)
  _close(gy, yt.grad, tol)
  assert z.shape == (3, 4) and s.shape == ()


def test_inference_call_under_xla_keeps_no_record():
  f = tb.torch_function(lambda a: a * 2.0)
  step = tf.function(lambda x: f(x), jit_compile=True)
  from torchbridge._call import _saved

  before = len(_saved._SAVED_BY_ID)
  for _ in range(3):
    _close(step(tf.ones([2, 2], tf.float64)), np.full([2, 2], 2.0))
  assert len(_saved._SAVED_BY_ID) == before


def test_records_of_a_jit_function_under_an_eager_tape_are_freed():
  # An eager tape outside the compiled function: each call's record goes
  # with its gradient (the backward's own record is not kept: nothing traced
  # a gradient of it), and a tape inside that is never asked keeps none.
  from torchbridge._call import _saved

  f = tb.torch_function(torch.sin)
  step = tf.function(lambda v: f(v), jit_compile=True)
  x = tf.constant([0.3, 0.5], tf.float64)
  before = len(_saved._SAVED_BY_ID)
  for _ in range(3):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = step(x)
    _close(tape.gradient(y, x), np.cos(x.numpy()))
    assert len(_saved._SAVED_BY_ID) == before

  @tf.function(jit_compile=True)
  def never_asked(v):
    with tf.GradientTape() as tape:
      tape.watch(v)
      return f(v)

  for _ in range(2):
    _close(never_asked(x), np.sin(x.numpy()))
  assert len(_saved._SAVED_BY_ID) == before


def test_torch_module_run_torch_trains_under_xla():
  torch.manual_seed(0)
  net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
  reference = torch.nn.Sequential(
    torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)
  ).double()
  reference.load_state_dict(net.state_dict())
  actor = tb.TorchModule(net, name="xla_actor", run="torch")

  @tf.function(jit_compile=True)
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = actor(x)
      loss = tf.reduce_sum(y**2)
    return y, tape.gradient(loss, [x] + list(actor.trainable_variables))

  x_np = np.random.default_rng(1).standard_normal((5, 3))
  calls = _xla.calls()
  y, grads = step(tf.constant(x_np))
  assert _xla.calls() == calls + 2
  from torchbridge._runners import _record as _runners

  # The C++ torch runner (its record found by an id under XLA), where it can.
  assert _runners.choices()["xla_actor"].get("path") == "C++"
  xt = torch.tensor(x_np, requires_grad=True)
  yt = reference(xt)
  (yt**2).sum().backward()
  _close(y, yt.detach())
  _close(grads[0], xt.grad)
  by_name = dict(reference.named_parameters())
  for var, grad in zip(actor.trainable_variables, grads[1:]):
    name = var.name.split("/", 1)[1].split(":")[0]
    _close(grad, by_name[name].grad)
  step(tf.constant(x_np))
  # Every record freed by its backward.
  # The C++ runner's programs (not torch.export's, which another test of
  # this worker may keep).
  programs = [p for p in gc.get_objects() if isinstance(p, _exported_program.ExportedProgram)]
  assert programs and all(p._lib.tbe_records(p._context, 0) == 0 for p in programs)


def test_torch_error_surfaces_as_tf_error_and_next_call_works():
  @tb.torch_function
  def picky(a):
    if bool((a < 0).any()):
      raise ValueError("picky: negative input")
    return torch.sqrt(a)

  step = tf.function(lambda x: picky(x), jit_compile=True)
  with pytest.raises(tf.errors.OpError, match="picky: negative input") as info:
    step(tf.constant([1.0, -1.0], tf.float64))
  assert "ValueError" in str(info.value)
  _close(step(tf.constant([4.0, 9.0], tf.float64)), [2.0, 3.0])


def test_a_call_placed_on_a_gpu_under_xla_is_refused_naming_the_fix(monkeypatch):
  # The custom call has no XLA GPU kernel: the placement is checked when the
  # call is traced (the device faked here: no GPU in these tests).
  f = tb.torch_function(torch.sin)
  x = tf.constant([0.3, 0.5], tf.float64)

  @tf.function(jit_compile=True)
  def scoped(v):
    with tf.device("/GPU:0"):
      return f(v)

  with pytest.raises(NotImplementedError, match=r"(?s)GPU:0.*CPU only.*tf\.device\(\"/CPU:0\"\)"):
    scoped(x)

  real = tf.config.list_physical_devices
  monkeypatch.setattr(
    tf.config,
    "list_physical_devices",
    lambda kind=None: ["/physical_device:GPU:0"] if kind == "GPU" else real(kind),
  )
  unscoped = tf.function(lambda v: f(v), jit_compile=True)
  with pytest.raises(NotImplementedError, match="jit_compile=False"):
    unscoped(x)
  with tf.device("/CPU:0"):  # the caller's scope places it on the CPU: it runs
    _close(tf.function(lambda v: f(v), jit_compile=True)(x), np.sin(x.numpy()))


def _torch_name(variable):
  return variable.name.split("/", 1)[1].split(":")[0]


@pytest.mark.parametrize("path", ["C++", "Python"])
def test_a_module_traced_with_an_unknown_batch_runs_every_batch_under_xla(path, monkeypatch):
  # One trace with (None, 3); XLA compiles it for each batch it meets, and
  # the op's output shapes (forward and gradients) are found then.
  if path == "Python":
    monkeypatch.setenv("TORCHBRIDGE_TORCH_RUNNER", "python")  # read when traced
  torch.manual_seed(0)
  net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
  reference = copy.deepcopy(net)
  name = f"unknown_batch_{path[0].lower()}"
  module = tb.TorchModule(net, name=name, run="torch")

  @tf.function(jit_compile=True, input_signature=[tf.TensorSpec([None, 3], tf.float32)])
  def step(x_tf):
    with tf.GradientTape() as tape:
      tape.watch(x_tf)
      y_tf = module(x_tf)
      loss_tf = tf.reduce_sum(y_tf * y_tf)
    return y_tf, tape.gradient(loss_tf, [x_tf] + list(module.trainable_variables))

  rng = np.random.default_rng(4)
  for batch in (5, 2, 5):
    x_np = rng.standard_normal((batch, 3)).astype(np.float32)
    calls = _xla.calls()
    y_tf, grads_tf = step(tf.constant(x_np))
    assert _xla.calls() == calls + 2  # the forward and its backward, in XLA
    assert y_tf.shape == (batch, 2)
    x_torch = torch.tensor(x_np, requires_grad=True)
    reference.zero_grad()
    y_torch = reference(x_torch)
    (y_torch * y_torch).sum().backward()
    _close(y_tf, y_torch.detach(), 1e-5)
    _close(grads_tf[0], x_torch.grad, 1e-5)
    by_name = dict(reference.named_parameters())
    for variable, grad_tf in zip(module.trainable_variables, grads_tf[1:]):
      _close(grad_tf, by_name[_torch_name(variable)].grad, 1e-5)
  assert step.experimental_get_tracing_count() == 1
  from torchbridge._runners import _record as _runners

  assert _runners.choices()[name]["path"] == path


def test_a_function_traced_with_unknown_dimensions_differentiates_twice_under_xla():
  f = tb.torch_function(lambda a, b: torch.sin(a) * b)
  spec = tf.TensorSpec([None, None], tf.float64)

  @tf.function(jit_compile=True, input_signature=[spec, spec])
  def second(x_tf, y_tf):
    with tf.GradientTape() as outer:
      outer.watch(x_tf)
      with tf.GradientTape() as inner:
        inner.watch([x_tf, y_tf])
        z_tf = f(x_tf, y_tf)
      dx_tf, dy_tf = inner.gradient(z_tf, [x_tf, y_tf])
    return z_tf, dx_tf, dy_tf, outer.gradient(dx_tf, x_tf)

  rng = np.random.default_rng(5)
  for shape in ((2, 3), (4, 1)):
    x_np, y_np = rng.standard_normal((2, *shape))
    z, dx, dy, ddx = second(tf.constant(x_np), tf.constant(y_np))
    _close(z, np.sin(x_np) * y_np)
    _close(dx, np.cos(x_np) * y_np)
    _close(dy, np.sin(x_np))
    _close(ddx, -np.sin(x_np) * y_np)


def test_a_declared_signature_with_unknown_dimensions_is_completed_when_xla_compiles():
  f = tb.torch_function(
    lambda a: a.sum(dim=1, keepdim=True), output_signature=tf.TensorSpec([None, 1], tf.float64)
  )
  step = tf.function(
    lambda x: f(x), jit_compile=True, input_signature=[tf.TensorSpec([None, 3], tf.float64)]
  )
  for batch in (4, 1):
    x_np = np.arange(batch * 3.0).reshape(batch, 3)
    _close(step(tf.constant(x_np)), x_np.sum(axis=1, keepdims=True))
  wrong = tb.torch_function(
    lambda a: a[:, :2], output_signature=tf.TensorSpec([None, 3], tf.float64)
  )
  step = tf.function(
    lambda x: wrong(x), jit_compile=True, input_signature=[tf.TensorSpec([None, 3], tf.float64)]
  )
  with pytest.raises(tf.errors.InvalidArgumentError, match="declared") as info:
    step(tf.ones([4, 3], tf.float64))
  assert "[None, 3]" in str(info.value) and "[4, 2]" in str(info.value)
  assert "leave it out" in str(info.value)


class _PositivePart(torch.nn.Module):
  def forward(self, x):
    return x[x > 0]


@pytest.mark.parametrize("kind", ["function", "module"])
def test_an_output_whose_size_depends_on_values_is_refused_naming_the_fix(kind):
  if kind == "function":
    bridged = tb.torch_function(lambda a: a[a > 0], name="positive_part_f")
    name = "positive_part_f"
  else:  # the C++ runner's exported graph, on meta tensors
    bridged = tb.TorchModule(_PositivePart(), name="positive_part_m", run="torch")
    name = "positive_part_m"
  step = tf.function(
    lambda x: bridged(x), jit_compile=True, input_signature=[tf.TensorSpec([None], tf.float32)]
  )
  with pytest.raises(tf.errors.InvalidArgumentError, match="torch cannot say") as info:
    step(tf.constant([1.0, -1.0, 2.0]))
  message = str(info.value)
  assert f"{name}: under XLA" in message and "x[x > 0]" in message
  assert "jit_compile=False" in message and "[3]" in message


def test_an_unknown_rank_is_refused_naming_the_fix():
  f = tb.torch_function(lambda a: a + 1.0)
  step = tf.function(
    lambda x: f(x), jit_compile=True, input_signature=[tf.TensorSpec(None, tf.float32)]
  )
  with pytest.raises(ValueError, match="unknown rank") as info:
    step(tf.ones([2, 3]))
  assert "input_signature with known ranks" in str(info.value)
  g = tb.torch_function(lambda a: a + 1.0, output_signature=tf.TensorSpec(None, tf.float32))
  step = tf.function(
    lambda x: g(x), jit_compile=True, input_signature=[tf.TensorSpec([None, 3], tf.float32)]
  )
  with pytest.raises(ValueError, match="output 0 has an unknown rank") as info:
    step(tf.ones([2, 3]))
  assert "jit_compile=False" in str(info.value) and "output_signature" in str(info.value)


def test_a_declared_unknown_dimension_is_found_from_static_arguments():
  # TD3's critic declares (None, 1); under XLA on a batch of 5 it is (5, 1).
  f = tb.torch_function(
    lambda a: a.sum(dim=1, keepdim=True) * 2.0,
    output_signature=tf.TensorSpec([None, 1], tf.float64),
  )

  @tf.function(jit_compile=True)
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = f(x)
      loss = tf.reduce_sum(y * y)
    return y, tape.gradient(loss, x)

  x_np = np.random.default_rng(1).standard_normal((5, 3))
  y, gx = step(tf.constant(x_np))
  assert y.shape == (5, 1)
  _close(y, 2.0 * x_np.sum(axis=1, keepdims=True))
  _close(gx, np.repeat(8.0 * x_np.sum(axis=1, keepdims=True), 3, axis=1))


def test_a_declared_signature_the_code_does_not_fit_under_xla_names_both():
  f = tb.torch_function(lambda a: a[:, :2], output_signature=tf.TensorSpec([None, 3], tf.float32))
  with pytest.raises(ValueError, match="output_signature declares") as info:
    tf.function(lambda x: f(x), jit_compile=True)(tf.ones([4, 3]))
  assert "(4, 2)" in str(info.value) and "leave it out" in str(info.value)


def test_copies_into_xla_buffers_are_counted(own_crossings_only):
  f = tb.torch_function(lambda a: a * 3.0)
  step = tf.function(lambda x: f(x), jit_compile=True)
  x = tf.ones([16, 16], tf.float32)
  step(x)  # compiles
  tb.reset_exchange_stats()
  step(x)
  stats = tb.exchange_stats()
  # The input crosses zero-copy (a view of XLA's buffer that torch does not
  # keep); the handle and the result are copied into XLA's buffers.
  assert stats["copied"] == 2, stats
  assert stats["bytes_copied"] == 16 * 16 * 4 + 8, stats
  assert stats["zero_copy"] == 1, stats


def test_an_input_torch_keeps_gets_its_own_copy(own_crossings_only):
  kept = []

  def keep(a):
    kept.append(a)
    return a * 2.0

  f = tb.torch_function(keep)

  @tf.function(jit_compile=True)
  def step(x):
    return f(x + 1.0) + 0.0  # x + 1.0: a buffer XLA reuses

  step(tf.zeros([64], tf.float32))  # compiles
  kept.clear()
  tb.reset_exchange_stats()
  for k in range(3):
    step(tf.fill([64], float(k)))
  stats = tb.exchange_stats()
  for k, a in enumerate(kept):
    np.testing.assert_array_equal(a.numpy(), np.full([64], k + 1.0, np.float32))
  # Each call: the kept input copied when the call ends, handle and result.
  assert stats["copied"] == 3 * 3, stats
  assert stats["zero_copy"] == 0, stats


def _keep_weights(model, kept, epoch, logs):
  kept.append([w.numpy() for w in model.weights])


@pytest.mark.parametrize("path", ["C++", "Python"])
def test_keras_layer_run_torch_fits_under_xla_as_without(path, monkeypatch):
  # Keras traces its step with an unknown batch and feeds a smaller last
  # one (30 samples in batches of 8): XLA compiles each batch size it meets.
  import keras

  from torchbridge.keras import TorchLayer

  if path == "Python":
    monkeypatch.setenv("TORCHBRIDGE_TORCH_RUNNER", "python")  # read when traced
  rng = np.random.default_rng(2)
  x_np = rng.standard_normal((30, 3)).astype(np.float32)
  y_np = rng.standard_normal((30, 1)).astype(np.float32)
  histories, weights = [], []
  for jit in (False, True):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    layer = TorchLayer(net, run="torch")
    assert layer.supports_jit is True  # CPU only, the XLA unit builds here
    model = keras.Sequential([keras.Input((3,)), layer])
    model.compile(keras.optimizers.Adam(0.01), "mse", jit_compile=jit)
    assert model.jit_compile is jit
    after_epochs = []
    snapshot = keras.callbacks.LambdaCallback(
      on_epoch_end=functools.partial(_keep_weights, model, after_epochs)
    )
    calls = _xla.calls()
    history = model.fit(
      x_np, y_np, epochs=2, batch_size=8, verbose=0, shuffle=False, callbacks=[snapshot]
    )
    # Four batches an epoch, each a forward and a backward inside XLA.
    assert _xla.calls() - calls == (16 if jit else 0)
    histories.append(history.history["loss"])
    weights.append(after_epochs)
  np.testing.assert_allclose(histories[0], histories[1], rtol=1e-5)
  for epoch_plain, epoch_xla in zip(*weights):
    for w_plain, w_xla in zip(epoch_plain, epoch_xla):
      np.testing.assert_allclose(w_plain, w_xla, rtol=1e-5, atol=1e-6)
  from torchbridge._runners import _record as _runners

  assert _runners.choices()[layer.name]["path"] == path


def test_second_order_and_a_persistent_tape_asked_twice_under_xla():
  f = tb.torch_function(torch.sin)
  x = tf.constant([0.3, 0.5], tf.float64)

  @tf.function(jit_compile=True)
  def second(v):
    with tf.GradientTape() as outer:
      outer.watch(v)
      with tf.GradientTape() as inner:
        inner.watch(v)
        y = f(v)
      d = inner.gradient(y, v)
    return d, outer.gradient(d, v)

  d, dd = second(x)
  _close(d, np.cos(x.numpy()))
  _close(dd, -np.sin(x.numpy()))

  @tf.function(jit_compile=True)
  def twice(v):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(v)
      y = f(v)
      z = 2.0 * y
    return tape.gradient(y, v), tape.gradient(z, v)

  from torchbridge._call import _saved

  before = len(_saved._SAVED_BY_ID)
  for _ in range(2):
    g1, g2 = twice(x)
    _close(g1, np.cos(x.numpy()))
    _close(g2, 2.0 * np.cos(x.numpy()))
  assert len(_saved._SAVED_BY_ID) == before  # every record freed


def test_a_module_that_writes_its_buffers_under_xla():
  torch.manual_seed(0)
  net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).double()
  reference = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).double()
  reference.load_state_dict(net.state_dict())
  actor = tb.TorchModule(net, name="bn", run="torch")
  step = tf.function(lambda x: actor(x, training=True), jit_compile=True)
  x_np = np.random.default_rng(3).standard_normal((6, 3))
  for _ in range(2):
    y = step(tf.constant(x_np))
    y_ref = reference.train()(torch.tensor(x_np))
  _close(y, y_ref.detach())
  weights = actor.get_weights()
  for name in ("1.running_mean", "1.running_var", "1.num_batches_tracked"):
    _close(weights[name], reference.state_dict()[name].numpy())


def test_threads_running_one_compiled_step_lose_no_buffer_write():
  # No tf.CriticalSection under XLA: what orders such calls is TF's launch
  # of the compiled program, which holds the locks of the variables it
  # reads and writes for the whole run. Three threads run one compiled step
  # whose forward counts in a buffer, slowly (the forward's Python, so that
  # runs would overlap if nothing ordered them): no count is lost, and no
  # two forwards overlap.
  import threading
  import time

  lock, in_flight, peak = threading.Lock(), [0], [0]

  class SlowCounter(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.linear = torch.nn.Linear(2, 2).double()
      self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def forward(self, x):
      with lock:
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
      time.sleep(0.01)
      self.count.add_(1.0)
      with lock:
        in_flight[0] -= 1
      return self.linear(x)

  module = tb.TorchModule(SlowCounter(), name="slow_counter", run="torch")
  module._runners.torch_runner.enabled = False  # the forward's Python each call
  step = tf.function(lambda x: module(x, training=True), jit_compile=True)
  x = tf.ones([3, 2], tf.float64)
  step(x)
  calls = _xla.calls()

  def work():
    for _ in range(8):
      step(x)

  threads = [threading.Thread(target=work) for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert _xla.calls() - calls == 24  # every call ran inside XLA
  assert module.get_weights()["count"] == 25.0
  assert peak[0] == 1


def test_records_an_outer_tape_never_asks_for_are_said_at_a_thousand(caplog, capfd):
  # Nothing frees the record of a call an eager tape outside the compiled
  # function recorded and never asked for (no TF tensor can own torch state
  # inside XLA): at 1,000 waiting, both runners say why and what to do.
  from torchbridge._call import _saved

  f = tb.torch_function(torch.sin)
  step_py = tf.function(lambda v: f(v), jit_compile=True)
  module = tb.TorchModule(torch.nn.Linear(2, 2).double(), name="xla_waiting", run="torch")
  step_cpp = tf.function(lambda v: module(v), jit_compile=True)
  x = tf.constant([[0.3, 0.5]], tf.float64)
  before = set(_saved._SAVED_BY_ID)
  with caplog.at_level("WARNING", logger="torchbridge"):
    for _ in range(1000):
      with tf.GradientTape() as tape:
        tape.watch(x)
        step_py(x)
        step_cpp(x)
  waiting = set(_saved._SAVED_BY_ID) - before
  assert len(waiting) == 1000  # the Python path's records, none freed
  for key in waiting:  # not leaving them to the rest of the run
    del _saved._SAVED_BY_ID[key]
  said = [r.getMessage() for r in caplog.records if "waiting for gradients" in r.getMessage()]
  assert said and "1000 records" in said[0] and "inside the jit-compiled function" in said[0]
  err = capfd.readouterr().err
  assert "1000 records of torch calls compiled with XLA" in err  # the C++ runner's
  # And a tape that is asked frees as before: no warning at 2,000.
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = step_cpp(x)
  _close(tape.gradient(y, x), np.sum(module.torch_module.weight.detach().numpy(), axis=0)[None])


def test_keras_auto_jit_compile_asks_a_torch_run_layer_truthfully():
  # Keras' default jit_compile="auto" asks every layer's supports_jit: a
  # run="torch" TorchLayer that can run inside XLA here no longer says no.
  # ("auto" itself turns XLA off on a machine with no accelerator, for any
  # model; with one, this layer's custom call has no GPU lowering and says
  # no: both are Keras' and the layer's truthful answers.)
  import keras
  from keras.src.trainers import trainer

  from torchbridge.keras import TorchLayer

  torch.manual_seed(0)
  layer = TorchLayer(torch.nn.Linear(4, 1).double(), run="torch")
  model = keras.Sequential([keras.Input((4,), dtype="float64"), keras.layers.Dense(4), layer])
  plain = keras.Sequential([keras.Input((4,), dtype="float64"), keras.layers.Dense(4)])
  assert layer.supports_jit is True
  assert trainer.model_supports_jit(model) is True  # what "auto" asks of the layers
  model.compile(keras.optimizers.SGD(0.1), "mse")  # jit_compile="auto"
  plain.compile(keras.optimizers.SGD(0.1), "mse")
  assert model.jit_compile == plain.jit_compile  # the layer changes nothing
  # jit_compile=True itself: test_keras_layer_run_torch_fits_under_xla_as_without.


def test_the_library_loaded_after_tf_compiled_with_xla_works():
  # In a fresh process: TF registers its XLA JIT kernels (a compiled
  # function runs) before torchbridge's XLA library is loaded.
  code = textwrap.dedent(
    """
    import numpy as np, torch, tensorflow as tf
    tf.function(lambda v: v * 2.0, jit_compile=True)(tf.ones([2]))
    import torchbridge as tb
    from torchbridge._native import _xla
    assert _xla.loaded_from() is None
    f = tb.torch_function(torch.cos)
    y = tf.function(lambda v: f(v), jit_compile=True)(tf.constant([0.5], tf.float64))
    assert _xla.calls() == 1 and abs(float(y[0]) - np.cos(0.5)) < 1e-15
    print("ok")
    """
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
  assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_the_timeline_records_a_call_under_xla_as_in_the_plain_graph():
  f = tb.torch_function(torch.sin)
  x = tf.constant([0.1], tf.float64)
  phases = {}
  for jit in (False, True):
    step = tf.function(lambda v: f(v), jit_compile=jit)
    step(x)
    with tb.timeline(annotate=False) as trace:
      step(x)
    phases[jit] = {(e["name"], e["source"]) for e in trace.events}
  # The same call's phases, Python's and the kernel's (the host handler's
  # under XLA), less the plain graph's wrapping of TF's buffers: XLA's are
  # viewed and its results copied.
  shared = {
    ("torchbridge/kernel", "kernel"),
    ("torchbridge/torch thread", "kernel"),
    ("torchbridge/callback (GIL held)", "kernel"),
    ("torchbridge/python call", "python"),
    ("torchbridge/torch forward", "python"),
  }
  assert shared <= phases[False] and shared <= phases[True]
  assert phases[True] <= phases[False]
