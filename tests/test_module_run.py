"""Graph calls' runners (`run="auto" | "tf" | "torch"`): the TF translation
by default, checked against torch when captured; torch where it cannot hold;
never stale."""

import gc
import json
import re
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from torchbridge._runners import _record as _runners
from torchbridge._capture._guard import StaleCaptureError
from torchbridge._translate._aten import _table


@pytest.fixture(autouse=True)
def _collect_wrappers():
  # Wrappers made here are collected here: a collection in a later test
  # file would count their copy-back in its exchange statistics.
  yield
  gc.collect()


def seeded(seed, factory, *args):
  torch.manual_seed(seed)
  return factory(*args)


def mlp():
  return torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def op_types(fn, *args):
  graph = fn.get_concrete_function(*args).graph
  types = {op.type for op in graph.get_operations()}
  for f in graph._functions.values():  # pylint: disable=protected-access
    types |= {n.op for n in f.cached_definition.node_def}
  return types


def train(module, steps, x, y, jit_compile=False):
  opt = tf.keras.optimizers.Adam(1e-2)

  @tf.function(jit_compile=jit_compile)
  def step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((module(x, training=True) - y) ** 2)
    grads = tape.gradient(loss, module.trainable_variables)
    opt.apply_gradients(zip(grads, module.trainable_variables))
    return loss

  losses = [float(step(x, y)) for _ in range(steps)]
  return step, losses


def test_default_graph_call_runs_tf_ops_and_trains_as_torch_does():
  x, y = tf.random.normal([8, 3], seed=1), tf.random.normal([8, 2], seed=2)
  translated = tb.TorchModule(seeded(0, mlp), name="translated")
  bridged = tb.TorchModule(seeded(0, mlp), name="bridged", run="torch")
  step_tf, losses_tf = train(translated, 5, x, y)
  step_torch, losses_torch = train(bridged, 5, x, y)
  assert "TorchbridgeCall" not in op_types(step_tf, x, y)
  assert "MatMul" in op_types(step_tf, x, y)
  assert "TorchbridgeCall" in op_types(step_torch, x, y) or not tb.native_available()
  np.testing.assert_allclose(losses_tf, losses_torch, rtol=1e-5)
  for name, value in translated.get_weights().items():
    np.testing.assert_allclose(value, bridged.get_weights()[name], rtol=1e-5, atol=1e-6)
  # The torch module sees what TF trained.
  np.testing.assert_array_equal(
    translated.torch_module[0].weight.detach().numpy(), translated.get_weights()["0.weight"]
  )
  assert _runners.choices()["translated"]["runner"] == "tf"
  assert (
    _runners.choices()["bridged"]["runner"] == "torch" if "bridged" in _runners.choices() else True
  )


def test_gradients_match_torch_autograd():
  net = seeded(1, mlp)
  module = tb.TorchModule(net, name="grads")
  x_np = np.random.default_rng(0).standard_normal([5, 3]).astype(np.float32)

  @tf.function
  def grads(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = tf.reduce_sum(tf.sin(module(x)))
    return tape.gradient(out, [x] + list(module.trainable_variables))

  got = grads(tf.constant(x_np))
  x_torch = torch.from_numpy(x_np).requires_grad_(True)
  params = dict(net.named_parameters())
  out = torch.sin(torch.func.functional_call(net, params, (x_torch,))).sum()
  want = torch.autograd.grad(out, [x_torch] + list(params.values()))
  np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-5, atol=1e-6)
  by_name = {
    v.name.split("/", 1)[1].split(":")[0]: g for v, g in zip(module.trainable_variables, got[1:])
  }
  for (name, _), g_torch in zip(params.items(), want[1:]):
    np.testing.assert_allclose(by_name[name].numpy(), g_torch.numpy(), rtol=1e-5, atol=1e-6)


class Spectrum(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.scale = torch.nn.Parameter(torch.ones(4))

  def forward(self, x):
    return torch.fft.fft(x * self.scale).real


def test_missing_op_falls_back_to_torch_with_one_info_line(caplog):
  module = tb.TorchModule(Spectrum(), name="spectrum")
  f = tf.function(lambda x: module(x))
  with caplog.at_level(logging.INFO, logger="torchbridge"):
    out = f(tf.ones([2, 4]))
    f(tf.ones([3, 4]))  # a second signature: no second line
  np.testing.assert_allclose(out.numpy(), np.fft.fft(np.ones([2, 4])).real, atol=1e-6)
  lines = [r.getMessage() for r in caplog.records if "spectrum" in r.getMessage()]
  assert len(lines) == 1, lines
  assert "aten._fft_r2c.default" in lines[0] and "torch through the bridge" in lines[0]
  assert _runners.choices()["spectrum"]["runner"] == "torch"


def test_run_tf_refuses_loudly():
  module = tb.TorchModule(Spectrum(), name="spectrum_tf", run="tf")
  with pytest.raises(tb.UntranslatedOpsError, match=r"(?s)aten\._fft_r2c.*run=\"auto\""):
    tf.function(lambda x: module(x))(tf.ones([2, 4]))
  # Eager calls stay on torch.
  assert module(tf.ones([2, 4])).shape == [2, 4]


def test_run_argument_is_checked():
  with pytest.raises(ValueError, match=r'run=\.\.\.\) takes "auto", "tf" or "torch", got \'TF\''):
    tb.TorchModule(torch.nn.Linear(2, 2), run="TF")
  with pytest.raises(ValueError, match="asks for two runners"):
    tb.TorchModule(torch.nn.Linear(2, 2), torchscript=True, run="tf")
  assert tb.TorchModule(torch.nn.Linear(2, 2), torchscript=True).run == "torch"


def test_failed_check_falls_back(monkeypatch, caplog):
  fn, channels_last, refuse = _table.OPS["aten.tanh.default"]
  monkeypatch.setitem(
    _table.OPS, "aten.tanh.default", (lambda out, x: fn(out, x) * 1.001, channels_last, refuse)
  )
  module = tb.TorchModule(seeded(0, mlp), name="wrong_tanh")
  x = tf.random.normal([4, 3])
  with caplog.at_level(logging.INFO, logger="torchbridge"):
    out = tf.function(lambda x: module(x))(x)
  assert "failed its check against torch: output 0 differs" in caplog.text
  np.testing.assert_allclose(out.numpy(), module(x).numpy(), rtol=1e-6)
  strict = tb.TorchModule(seeded(0, mlp), name="wrong_tanh_tf", run="tf")
  with pytest.raises(tb.ParityError, match="output 0 differs"):
    tf.function(lambda x: strict(x))(x)


def test_unknown_dimensions_one_capture_any_size():
  module = tb.TorchModule(seeded(0, mlp), name="dyn")
  f = tf.function(lambda x: module(x), input_signature=[tf.TensorSpec([None, 3], tf.float32)])
  for n in (1, 4, 7):
    x = tf.random.normal([n, 3])
    np.testing.assert_allclose(
      f(x).numpy(),
      module.torch_module(torch.from_numpy(x.numpy())).detach().numpy(),
      rtol=1e-5,
      atol=1e-6,
    )
  assert "TorchbridgeCall" not in op_types(f, tf.TensorSpec([None, 3], tf.float32))


class Noisy(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.25))

  def forward(self, x):
    return self.net(x)


def test_training_mode_dropout_draws_tf_random_at_torch_rate():
  module = tb.TorchModule(seeded(0, Noisy), name="noisy")
  x = tf.ones([256, 64])
  f = tf.function(lambda x, training: module(x, training=training))
  out_train = f(x, True).numpy()
  reference = module(x, training=False).numpy()
  kept = out_train != 0
  assert abs(kept.mean() - 0.75) < 0.01
  np.testing.assert_allclose(out_train[kept], reference[kept] / 0.75, rtol=1e-5)
  assert not np.array_equal(f(x, True).numpy(), out_train)  # a new draw per call
  np.testing.assert_allclose(f(x, False).numpy(), reference, rtol=1e-6)
  assert _runners.choices()["noisy"]["runner"] == "tf"


def test_training_mode_batchnorm_writes_running_statistics():
  def net():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU())

  module = tb.TorchModule(seeded(0, net), name="bn")
  reference = seeded(0, net).train()
  x = np.random.default_rng(0).standard_normal([16, 3]).astype(np.float32)
  step, _ = train(module, 1, tf.constant(x), tf.zeros([16, 4]))
  assert "TorchbridgeCall" not in op_types(step, tf.constant(x), tf.zeros([16, 4]))
  reference(torch.from_numpy(x))
  weights = module.get_weights()
  np.testing.assert_allclose(
    weights["1.running_mean"], reference[1].running_mean.numpy(), rtol=1e-5, atol=1e-7
  )
  np.testing.assert_allclose(
    weights["1.running_var"], reference[1].running_var.numpy(), rtol=1e-5, atol=1e-7
  )
  assert weights["1.num_batches_tracked"] == 1


class Scaled(torch.nn.Module):
  def __init__(self, config):
    super().__init__()
    self.linear = torch.nn.Linear(2, 2)
    self.scale = 2.0
    self.config = config

  def forward(self, x):
    return self.linear(x) * self.scale * self.config.gain


class Config:
  gain = 1.0


def test_watched_attribute_recaptured_in_new_trace_refused_in_old_graph():
  module = tb.TorchModule(seeded(0, Scaled, Config()), name="scaled")
  x = tf.ones([1, 2])
  old = tf.function(lambda x: module(x))
  first = old(x).numpy()
  module.torch_module.scale = 3.0
  with pytest.raises(StaleCaptureError, match=r"scale: 2\.0 when captured, 3\.0 now"):
    old(x)
  new = tf.function(lambda x: module(x))
  np.testing.assert_allclose(new(x).numpy(), first * 1.5, rtol=1e-6)
  module.torch_module.scale = 2.0
  np.testing.assert_allclose(old(x).numpy(), first)  # back to what it read


def test_jit_compiled_graph_refuses_stale_attribute_too():
  module = tb.TorchModule(seeded(0, Scaled, Config()), name="scaled_xla")
  f = tf.function(lambda x: module(x), jit_compile=True)
  f(tf.ones([1, 2]))
  module.torch_module.scale = 5.0
  with pytest.raises(StaleCaptureError, match="scale"):
    f(tf.ones([1, 2]))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_concrete_function_refuses_stale_attribute_too(jit_compile):
  # The TD3 example calls its policy as a concrete function: the check
  # runs on those calls as on the tf.function's.
  module = tb.TorchModule(seeded(0, Scaled, Config()), name="scaled_concrete")
  f = tf.function(lambda x: module(x), jit_compile=jit_compile)
  concrete = f.get_concrete_function(tf.TensorSpec([1, 2], tf.float32))
  x = tf.ones([1, 2])
  first = concrete(x).numpy()
  module.torch_module.scale = 4.0
  with pytest.raises(StaleCaptureError, match=r"scale: 2\.0 when captured, 4\.0 now"):
    concrete(x)
  module.torch_module.scale = 2.0
  np.testing.assert_allclose(concrete(x).numpy(), first)


def test_unwatched_state_is_baked_in_as_documented():
  # Attributes of other objects (a config's fields) are not watched
  # (docs/guides/torch-module.md): the old graph keeps the captured value.
  config = Config()
  module = tb.TorchModule(seeded(0, Scaled, config), name="scaled_config")
  x = tf.ones([1, 2])
  f = tf.function(lambda x: module(x))
  first = f(x).numpy()
  config.gain = 2.0
  np.testing.assert_allclose(f(x).numpy(), first)
  config.gain = 1.0


class Shift(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.linear = torch.nn.Linear(2, 2)

  def forward(self, x, shift, mode="add"):
    y = self.linear(x)
    return y + shift if mode == "add" else y * shift


def test_non_tensor_arguments_are_part_of_the_key():
  module = tb.TorchModule(seeded(0, Shift), name="shift")
  f = tf.function(lambda x, s, mode: module(x, s, mode=mode))
  x = tf.ones([1, 2])
  base = module.torch_module.linear(torch.ones(1, 2)).detach().numpy()
  np.testing.assert_allclose(f(x, 1.0, "add").numpy(), base + 1.0, rtol=1e-6)
  np.testing.assert_allclose(f(x, 2.0, "add").numpy(), base + 2.0, rtol=1e-6)
  np.testing.assert_allclose(f(x, 3.0, "mul").numpy(), base * 3.0, rtol=1e-6)


def test_jit_compile_training_step():
  x, y = tf.random.normal([8, 3], seed=1), tf.random.normal([8, 2], seed=2)
  compiled = tb.TorchModule(seeded(0, mlp), name="xla")
  plain = tb.TorchModule(seeded(0, mlp), name="plain")
  _, losses_xla = train(compiled, 3, x, y, jit_compile=True)
  _, losses = train(plain, 3, x, y)
  np.testing.assert_allclose(losses_xla, losses, rtol=1e-5)


def test_jit_compile_with_torch_runner_runs_inside_xla_or_refuses():
  # A module that runs torch (no translation of fft) compiles under XLA
  # through torchbridge's XLA custom call where it can be had
  # (tests/test_xla.py); elsewhere the call is refused naming XLA.
  from torchbridge._native import _xla  # pylint: disable=import-outside-toplevel

  module = tb.TorchModule(Spectrum(), name="spectrum_xla")
  x = tf.constant(np.random.default_rng(0).standard_normal([2, 4]).astype(np.float32))
  compiled = tf.function(lambda v: module(v), jit_compile=True)
  if not _xla.jit_usable():
    with pytest.raises(NotImplementedError, match="XLA"):
      compiled(x)
    return
  expected = torch.fft.fft(torch.from_numpy(x.numpy())).real.numpy()
  np.testing.assert_allclose(compiled(x).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_saved_model_runs_where_torch_cannot_be_imported(tmp_path):
  module = tb.TorchModule(seeded(0, mlp), name="served")

  class Serving(tf.Module):
    def __init__(self):
      super().__init__()
      self.actor = module

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def serve(self, x):
      return self.actor(x)

  serving = Serving()
  x = np.random.default_rng(0).standard_normal([4, 3]).astype(np.float32)
  serving.serve(tf.constant(x))  # traced (with its check) before the save
  path = str(tmp_path / "saved")
  tf.saved_model.save(serving, path)
  want = module(tf.constant(x)).numpy()
  script = textwrap.dedent(
    f"""
    import sys, json, importlib.abc
    class NoTorch(importlib.abc.MetaPathFinder):
      def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch.") or name.startswith("torchbridge"):
          raise ImportError("torch is not installed here")
    sys.meta_path.insert(0, NoTorch())
    import numpy as np, tensorflow as tf
    loaded = tf.saved_model.load({path!r})
    x = np.array({x.tolist()!r}, np.float32)
    print(json.dumps(loaded.serve(tf.constant(x)).numpy().tolist()))
    print("torch" in sys.modules)
    """
  )
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  done = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
  )
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.strip().splitlines()
  # float32 rounding of a TF matmul against torch's (the translator's tolerance)
  np.testing.assert_allclose(np.array(json.loads(lines[-2])), want, rtol=1e-5, atol=1e-6)
  assert lines[-1] == "False"


def test_keras_layer_keeps_xla_and_fits():
  import keras  # pylint: disable=import-outside-toplevel
  from keras.src.trainers import trainer  # pylint: disable=import-outside-toplevel

  def model_of(run):
    layer = tb.keras.TorchLayer(seeded(0, mlp), name=f"torch_{run}", run=run)
    model = keras.Sequential([keras.Input((3,)), layer])
    return model, layer

  translated, layer = model_of("auto")
  assert layer.supports_jit and trainer.model_supports_jit(translated)
  bridged, torch_layer = model_of("torch")
  # run="torch": XLA only where torchbridge's XLA custom call can be had.
  from torchbridge._native import _xla  # pylint: disable=import-outside-toplevel

  assert torch_layer.supports_jit is _xla.jit_usable()
  assert trainer.model_supports_jit(bridged) is _xla.jit_usable()
  x = np.random.default_rng(0).standard_normal([32, 3]).astype(np.float32)
  y = np.random.default_rng(1).standard_normal([32, 2]).astype(np.float32)
  losses = {}
  for name, model, jit in (("xla", translated, True), ("torch", bridged, False)):
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=jit)
    assert model.jit_compile is jit
    losses[name] = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
  np.testing.assert_allclose(losses["xla"], losses["torch"], rtol=1e-4)
  assert _runners.choices()["torch_auto"]["runner"] == "tf"
  assert layer.get_config().get("run") is None
  assert torch_layer.get_config()["run"] == "torch"


def test_timeline_and_info_say_which_runner_each_module_took():
  from torchbridge._cli import _report  # pylint: disable=import-outside-toplevel

  translated = tb.TorchModule(seeded(0, mlp), name="said_tf")
  bridged = tb.TorchModule(Spectrum(), name="said_torch")
  f = tf.function(lambda x, y: (translated(x), bridged(y)))
  with tb.timeline(annotate=False) as trace:
    f(tf.ones([2, 3]), tf.ones([2, 4]))
  assert trace.runners["said_tf"]["runner"] == "tf"
  assert trace.runners["said_torch"]["runner"] == "torch"
  assert "aten._fft_r2c" in trace.runners["said_torch"]["reason"]
  assert trace.chrome_trace()["metadata"]["torchbridge runners"]["said_tf"]["runner"] == "tf"
  modules = _report.report(load_native=False)["runners"]["modules"]
  assert modules["said_tf"] == "tf"
  # From C++ where the native op has torch's side, else on the Python path.
  assert re.match(
    r"torch from (C\+\+|Python) \(an op has no TF translation: aten\._fft_r2c",
    modules["said_torch"],
  ), modules


def test_capture_cost_is_said():
  module = tb.TorchModule(seeded(0, mlp), name="capture_cost")
  tf.function(lambda x: module(x))(tf.ones([2, 3]))
  seconds = _runners.choices()["capture_cost"]["capture_s"]
  assert 0 < seconds < 60


def test_a_hook_added_after_capture_is_seen():
  module = tb.TorchModule(seeded(0, mlp), name="hooked")
  f = tf.function(lambda x: module(x))
  f(tf.ones([1, 3]))
  handle = module.torch_module[2].register_forward_hook(lambda m, i, o: o * 2)
  with pytest.raises(StaleCaptureError, match=r"2\._forward_hooks \(its hooks changed\)"):
    f(tf.ones([1, 3]))
  handle.remove()
  f(tf.ones([1, 3]))  # as captured again


def test_embedding_padding_row_gets_no_gradient_as_in_torch():
  # BERT's word embeddings: the check caught the translation giving the
  # padding row a gradient, and sent the model to torch; now it holds.
  module = tb.TorchModule(seeded(0, torch.nn.Embedding, 5, 3, 0), name="padded", run="tf")
  ids = tf.constant([[0, 1, 0, 2]])

  @tf.function
  def grads(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(module(ids) ** 2)
    return tape.gradient(loss, module.trainable_variables)[0]

  got = tf.convert_to_tensor(grads(ids)).numpy()
  weight = torch.from_numpy(module.get_weights()["weight"]).requires_grad_(True)
  loss = (torch.nn.functional.embedding(torch.tensor([[0, 1, 0, 2]]), weight, 0) ** 2).sum()
  loss.backward()
  np.testing.assert_allclose(got, weight.grad.numpy(), rtol=1e-6)
  assert not got[0].any()


class ValueDependent(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.linear = torch.nn.Linear(3, 3)

  def forward(self, x):
    y = self.linear(x)
    return y * 2 if y.sum() > 0 else y  # a decision on values: export refuses


def test_export_refusal_falls_back_and_run_tf_raises(caplog):
  module = tb.TorchModule(seeded(0, ValueDependent), name="value_dependent")
  x = tf.ones([2, 3])
  with caplog.at_level(logging.INFO, logger="torchbridge"):
    out = tf.function(lambda x: module(x))(x)
  assert "torch.export could not capture the forward" in caplog.text
  np.testing.assert_allclose(out.numpy(), module(x).numpy(), rtol=1e-6)
  strict = tb.TorchModule(seeded(0, ValueDependent), name="value_dependent_tf", run="tf")
  with pytest.raises(ValueError, match="torch.export could not capture"):
    tf.function(lambda x: strict(x))(x)


def test_a_translation_that_raises_falls_back(monkeypatch, caplog):
  fn, channels_last, refuse = _table.OPS["aten.tanh.default"]

  def broken(out, x):
    raise RuntimeError("a translation bug")

  monkeypatch.setitem(_table.OPS, "aten.tanh.default", (broken, channels_last, refuse))
  module = tb.TorchModule(seeded(0, mlp), name="broken_tanh")
  x = tf.random.normal([4, 3])
  with caplog.at_level(logging.INFO, logger="torchbridge"):
    out = tf.function(lambda x: module(x))(x)
  assert "an op's translation raised" in caplog.text and "a translation bug" in caplog.text
  np.testing.assert_allclose(out.numpy(), module(x).numpy(), rtol=1e-6)


def test_captures_make_tf_warn_of_no_retracing(caplog):
  # Each capture's check traces a function of its own: called as a new
  # tf.function each time, TF warned of "frequent retracing" from the
  # fifth capture of a process on, naming torchbridge's check.
  modules = [
    tb.TorchModule(seeded(k, mlp), name=f"mlp{k}", output_signature=tf.TensorSpec([None, 2]))
    for k in range(7)
  ]
  x = tf.ones([4, 3])

  @tf.function
  def all_of_them(x):
    return [m(x) for m in modules]

  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    outs = all_of_them(x)
  assert [_runners.choices()[m.name]["runner"] for m in modules] == ["tf"] * 7
  for m, out in zip(modules, outs):
    np.testing.assert_allclose(
      out.numpy(), m.torch_module(torch.ones(4, 3)).detach(), rtol=1e-5, atol=1e-6
    )
  retracing = [r.getMessage() for r in caplog.records if "retracing" in r.getMessage()]
  assert retracing == []


def test_translated_ops_carry_the_module_name_in_the_graph_and_tf_profiler(tmp_path):
  """A translated module's ops sit under its name scope, as a Keras layer's
  do: TensorBoard's graph and TF's profiler name `actor/...`, `critic/...`."""
  import glob  # pylint: disable=import-outside-toplevel
  import pathlib  # pylint: disable=import-outside-toplevel

  actor = tb.TorchModule(seeded(0, mlp), name="actor")
  critic = tb.TorchModule(seeded(1, mlp), name="critic")
  opt = tf.keras.optimizers.Adam(1e-3)

  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(critic(x)) + tf.reduce_mean(actor(x) ** 2)
    variables = actor.trainable_variables + critic.trainable_variables
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  x = tf.random.normal([8, 3])
  graph = step.get_concrete_function(x).graph
  matmuls = [op.name for op in graph.get_operations() if op.type == "MatMul"]
  forward = [n for n in matmuls if not n.startswith("gradient_tape/")]
  assert {n.split("/")[0] for n in forward} == {"actor", "critic"}
  # Their gradients too, under the tape's scope.
  assert all(
    n.split("/")[int(n.startswith("gradient_tape/"))] in ("actor", "critic") for n in matmuls
  )
  step(x)
  tf.profiler.experimental.start(str(tmp_path))
  try:
    step(x)
  finally:
    tf.profiler.experimental.stop()
  paths = glob.glob(str(tmp_path / "**" / "*.xplane.pb"), recursive=True)
  data = b"".join(pathlib.Path(p).read_bytes() for p in paths)
  assert re.search(rb"actor/MatMul", data) and re.search(rb"critic/MatMul", data)


def test_building_a_functional_model_captures_nothing():
  """Keras reads a functional model's output specs from a scratch graph it
  never runs: no capture there (a large model's costs seconds); a graph
  that runs captures once."""
  from torchbridge._capture import _shared_export  # pylint: disable=import-outside-toplevel

  before = _shared_export.SharedExport.exports
  layer = tb.keras.TorchLayer(torch.nn.Linear(4, 2), name="functional_linear")
  inputs = tf.keras.Input((4,))
  model = tf.keras.Model(inputs, layer(inputs))
  assert model.output_shape == (None, 2)
  assert _shared_export.SharedExport.exports == before
  tf.function(lambda x: model(x, training=False))(tf.ones([8, 4]))
  assert _shared_export.SharedExport.exports == before + 1  # a graph that runs


def test_a_name_starting_with_an_underscore_runs_in_a_graph():
  """A valid `tf.Module` name that no root name scope accepts."""
  torch.manual_seed(0)
  net = torch.nn.Linear(3, 2)
  module = tb.TorchModule(net, name="_private_linear")
  x = tf.random.normal([4, 3])
  y = tf.function(lambda x: module(x))(x)
  np.testing.assert_allclose(y.numpy(), net(torch.from_numpy(x.numpy())).detach().numpy(), 1e-6)
  assert _runners.choices()["_private_linear"]["runner"] == "tf"
