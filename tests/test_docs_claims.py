"""What the user guides state and no other test holds: each test names the
page and the section whose claim it checks (Translate, TorchModule,
Devices, Keras TorchLayer, Limitations, the public names, Installation)."""

import logging
from pathlib import Path
import re

import numpy as np
import pytest
import torch  # before TensorFlow
import tensorflow as tf

import torchbridge as tb
from torchbridge._runners import _record as _runners
from torchbridge._translate._aten import _table

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _seeded(make):
  torch.manual_seed(0)
  return make()


def _mlp():
  return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


# --- torch-module.md, "Which runner graph calls take": second order -----------


def test_the_default_runner_gives_second_order_gradients_as_torch_does():
  net = _seeded(_mlp).double()
  module = tb.TorchModule(net, name="second_order")
  x_np = np.random.default_rng(0).standard_normal((4, 3))

  @tf.function
  def second(x):
    with tf.GradientTape() as outer:
      with tf.GradientTape() as inner:
        inner.watch(x)
        y = tf.reduce_sum(module(x) ** 2)
      gx = inner.gradient(y, x)
      penalty = tf.reduce_sum(gx**2)
    return outer.gradient(penalty, module.trainable_variables)

  grads_tf = second(tf.constant(x_np))
  assert _runners.choices()["second_order"]["runner"] == "tf"
  x_torch = torch.tensor(x_np, requires_grad=True)
  (gx_torch,) = torch.autograd.grad((net(x_torch) ** 2).sum(), x_torch, create_graph=True)
  grads_torch = torch.autograd.grad((gx_torch**2).sum(), list(net.parameters()))
  by_name = dict(zip([n for n, _ in net.named_parameters()], grads_torch))
  for variable, grad_tf in zip(module.trainable_variables, grads_tf):
    name = variable.name.split("/", 1)[1].split(":")[0]
    np.testing.assert_allclose(grad_tf.numpy(), by_name[name].numpy(), rtol=1e-8, atol=1e-10)


# --- torch-module.md, "XLA": training mode on the default runner -------------


def test_training_mode_batchnorm_writes_its_statistics_under_xla_on_the_default_runner():
  def net():
    return torch.nn.Sequential(
      torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.25)
    ).double()

  module = tb.TorchModule(_seeded(net), name="bn_xla")
  reference = _seeded(net).train()
  x_np = np.random.default_rng(3).standard_normal((6, 3))
  step = tf.function(lambda x: module(x, training=True), jit_compile=True)
  for _ in range(2):
    step(tf.constant(x_np))
    reference(torch.from_numpy(x_np))
  assert _runners.choices()["bn_xla"]["runner"] == "tf"
  weights = module.get_weights()
  for name in ("1.running_mean", "1.running_var", "1.num_batches_tracked"):
    np.testing.assert_allclose(weights[name], reference.state_dict()[name].numpy(), rtol=1e-10)


# --- translate.md, "Training mode" -----------------------------------------------


class _Unused(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.used = torch.nn.Linear(3, 2)
    self.unused = torch.nn.Linear(3, 2)

  def forward(self, x):
    return self.used(x)


@pytest.mark.parametrize("run", ["auto", "torch"])
def test_a_parameter_the_outputs_do_not_use_gets_none_translated_and_zeros_on_torch(run):
  module = tb.TorchModule(_seeded(_Unused), name=f"unused_{run}", run=run)

  @tf.function
  def grads(x):
    with tf.GradientTape() as tape:
      y = tf.reduce_sum(module(x))
    return tape.gradient(y, module.trainable_variables)

  by_name = {
    v.name.split("/", 1)[1].split(":")[0]: g
    for v, g in zip(module.trainable_variables, grads(tf.ones([2, 3])))
  }
  assert _runners.choices()[f"unused_{run}"]["runner"] == ("tf" if run == "auto" else "torch")
  if run == "auto":
    assert by_name["unused.weight"] is None and by_name["unused.bias"] is None
  else:
    assert not np.any(by_name["unused.weight"].numpy()) and not np.any(
      by_name["unused.bias"].numpy()
    )
  assert by_name["used.weight"] is not None


def test_dropout_whose_own_draws_miss_the_keep_rate_fails_its_check(monkeypatch, caplog):
  fn, channels_last, refuse = _table.OPS["aten.native_dropout.default"]

  def keeps_all_of_its_own(out, x, p, train, draw=None):
    # torch's draws (the value-for-value part of the check) are used as
    # they are; TF's own keep every element, not 1 - p of them.
    if draw is None:
      return fn(out, x, 0.0, train)
    return fn(out, x, p, train, draw=draw)

  monkeypatch.setitem(
    _table.OPS, "aten.native_dropout.default", (keeps_all_of_its_own, channels_last, refuse)
  )

  def net():
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.5))

  module = tb.TorchModule(_seeded(net), name="dropout_rate")
  x = tf.ones([64, 64])
  with caplog.at_level(logging.INFO, logger="torchbridge"):
    tf.function(lambda v: module(v, training=True))(x)
  assert _runners.choices()["dropout_rate"]["runner"] == "torch"
  assert re.search(r"dropout .* kept 1\.000 of \d+ elements where torch keeps 0\.500", caplog.text)
  strict = tb.TorchModule(_seeded(net), name="dropout_rate_tf", run="tf")
  with pytest.raises(tb.ParityError, match="kept 1.000"):
    tf.function(lambda v: strict(v, training=True))(x)


class _Counts(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(3, 2)
    self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

  def forward(self, x):
    self.calls.add_(1)
    return self.lin(x)


def test_translate_refuses_a_forward_that_writes_a_buffer_in_eval_mode():
  module = tb.TorchModule(_seeded(_Counts), name="counts")
  with pytest.raises(ValueError, match=r"writes tensors in eval mode \(\['calls'\]\)"):
    tb.translate(module, [tf.TensorSpec([None, 3], tf.float32)])


# --- translate.md, "Training mode"; limitations.md: recurrent layers -------------


class _Recurrent(torch.nn.Module):
  def __init__(self, layer):
    super().__init__()
    self.layer = layer

  def forward(self, x):
    out = self.layer(x)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_a_recurrent_layer_in_training_mode_runs_torch_and_translates_in_eval(kind, caplog):
  def net():
    return _Recurrent(getattr(torch.nn, kind)(3, 4, batch_first=True))

  module = tb.TorchModule(_seeded(net), name=f"recurrent_{kind}")
  x = tf.ones([2, 5, 3])
  with caplog.at_level(logging.INFO, logger="torchbridge"):
    tf.function(lambda v: module(v, training=True))(x)
  assert _runners.choices()[f"recurrent_{kind}"]["runner"] == "torch"
  assert "a recurrent layer in training mode" in caplog.text
  tf.function(lambda v: module(v, training=False))(x)
  assert _runners.choices()[f"recurrent_{kind}"]["runner"] == "tf"
  strict = tb.TorchModule(_seeded(net), name=f"recurrent_{kind}_tf", run="tf")
  with pytest.raises(tb.UntranslatedOpsError, match="a recurrent layer in training mode"):
    tf.function(lambda v: strict(v, training=True))(x)


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell", "RNNCell"])
def test_a_recurrent_cell_translates_in_training_mode(kind):
  module = tb.TorchModule(_seeded(lambda: getattr(torch.nn, kind)(3, 4)), name=f"cell_{kind}")
  tf.function(lambda v: module(v, training=True))(tf.ones([2, 3]))
  assert _runners.choices()[f"cell_{kind}"]["runner"] == "tf"


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell", "RNNCell"])
def test_a_recurrent_cell_served_matches_torch_eagerly_in_a_graph_and_under_xla(kind):
  # translate.md, "Coverage": the cells.
  net = _seeded(lambda: getattr(torch.nn, kind)(3, 4))
  served = tb.translate(
    tb.TorchModule(net, name=f"served_{kind}"), [tf.TensorSpec([None, 3], tf.float32)]
  )
  x = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
  with torch.no_grad():
    out = net(torch.from_numpy(x))
  want = (out[0] if isinstance(out, tuple) else out).numpy()
  for call in (
    served,
    tf.function(served.__call__),
    tf.function(served.__call__, jit_compile=True),
  ):
    got = call(tf.constant(x))
    got = got[0] if isinstance(got, (tuple, list)) else got
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


# --- translate.md, "Training mode"; limitations.md: attention dropout ----------


class _SelfAttention(torch.nn.Module):
  """Attention as Hugging Face's models call it: dropout in training only,
  or always (`always=True`)."""

  def __init__(self, always=False):
    super().__init__()
    self.qkv = torch.nn.Linear(4, 12)
    self.always = always

  def forward(self, x):
    q, k, v = (t.unsqueeze(1) for t in self.qkv(x).chunk(3, dim=-1))  # one head
    p = 0.1 if self.training or self.always else 0.0
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p).squeeze(1)


class _MultiheadAttention(torch.nn.Module):
  def __init__(self, need_weights):
    super().__init__()
    self.attention = torch.nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)
    self.need_weights = need_weights

  def forward(self, x):
    return self.attention(x, x, x, need_weights=self.need_weights)[0]


_ATTENTION = {
  "scaled_dot_product_attention": (_SelfAttention, 4),
  "MultiheadAttention_need_weights_False": (lambda: _MultiheadAttention(False), 8),
  "TransformerEncoderLayer": (
    lambda: torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True),
    8,
  ),
}


@pytest.mark.parametrize("kind", sorted(_ATTENTION))
def test_attention_dropout_in_training_mode_runs_torch_and_translates_in_eval(kind, caplog):
  make, width = _ATTENTION[kind]
  module = tb.TorchModule(_seeded(make), name=f"attention_{kind}")
  x = tf.ones([2, 5, width])
  with caplog.at_level(logging.INFO, logger="torchbridge"):
    tf.function(lambda v: module(v, training=True))(x)
  assert _runners.choices()[f"attention_{kind}"]["runner"] == "torch"
  assert "attention dropout (dropout_p > 0)" in caplog.text
  tf.function(lambda v: module(v, training=False))(x)
  assert _runners.choices()[f"attention_{kind}"]["runner"] == "tf"
  strict = tb.TorchModule(_seeded(make), name=f"attention_{kind}_tf", run="tf")
  with pytest.raises(tb.UntranslatedOpsError, match=r"attention dropout \(dropout_p > 0\)"):
    tf.function(lambda v: strict(v, training=True))(x)


def test_multihead_attention_computing_its_weights_translates_its_dropout_in_training():
  module = tb.TorchModule(_seeded(lambda: _MultiheadAttention(True)), name="mha_weights")
  tf.function(lambda v: module(v, training=True))(tf.ones([2, 5, 8]))
  assert _runners.choices()["mha_weights"]["runner"] == "tf"


def test_attention_dropout_is_refused_in_eval_mode_too_and_by_translate():
  module = tb.TorchModule(_seeded(lambda: _SelfAttention(always=True)), name="attention_always")
  tf.function(lambda v: module(v, training=False))(tf.ones([2, 5, 4]))
  assert _runners.choices()["attention_always"]["runner"] == "torch"
  with pytest.raises(tb.UntranslatedOpsError, match=r"attention dropout \(dropout_p > 0\)"):
    tb.translate(module, [tf.TensorSpec([None, 5, 4], tf.float32)])


# --- keras-layer.md: fit on the default runner, training-mode layers ------------


def test_keras_fit_on_the_default_runner_runs_training_batchnorm_and_dropout_as_tf_ops():
  import keras  # pylint: disable=import-outside-toplevel

  def net():
    return torch.nn.Sequential(
      torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.25), torch.nn.Linear(8, 1)
    )

  layer = tb.keras.TorchLayer(_seeded(net), name="bn_dropout_fit")
  model = keras.Sequential([keras.Input((3,)), layer])
  model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
  rng = np.random.default_rng(0)
  x = rng.standard_normal((32, 3)).astype(np.float32)
  y = rng.standard_normal((32, 1)).astype(np.float32)
  model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
  assert _runners.choices()["bn_dropout_fit"]["runner"] == "tf"
  weights = layer.get_weights_by_name()
  assert weights["1.num_batches_tracked"] == 2  # two batches, two writes
  assert np.any(weights["1.running_mean"] != 0)


# --- devices.md: graph calls where TF sees a GPU --------------------------------


def test_where_tf_sees_a_gpu_graph_calls_that_run_torch_take_the_python_path(monkeypatch, caplog):
  from torchbridge._native import _loader  # pylint: disable=import-outside-toplevel

  if not _loader.has_torch_interop():
    pytest.skip("without the complete native op every such call takes the Python path")
  monkeypatch.delenv("TORCHBRIDGE_TORCH_RUNNER", raising=False)
  real = tf.config.list_logical_devices
  monkeypatch.setattr(
    tf.config,
    "list_logical_devices",
    lambda kind=None: (
      [tf.config.LogicalDevice("/device:GPU:0", "GPU")] if kind == "GPU" else real(kind)
    ),
  )
  module = tb.TorchModule(_seeded(_mlp), name="gpu_visible", run="torch")
  with caplog.at_level(logging.INFO, logger="torchbridge"):
    tf.function(lambda v: module(v))(tf.ones([2, 3]))
  assert _runners.choices()["gpu_visible"]["path"] == "Python"
  assert "a GPU is visible" in caplog.text


# --- api-overview.md and installation.md -------------------------------------


def _all_of(path):
  return re.search(r"__all__ = \[(.*?)\]", path.read_text(), re.S).group(1)


def test_the_public_names_page_lists_every_public_name():
  text = (DOCS / "guides" / "api-overview.md").read_text()
  names = {
    "tb": re.findall(r'"(\w+)"', _all_of(ROOT / "torchbridge" / "__init__.py")),
    "tb.keras": re.findall(r'"(\w+)"', _all_of(ROOT / "torchbridge" / "keras.py")),
    "tb.ray": re.findall(r'"(\w+)"', _all_of(ROOT / "torchbridge" / "ray" / "__init__.py")),
  }
  missing = [
    f"{prefix}.{name}"
    for prefix, listed in names.items()
    for name in listed
    if not re.search(rf"`{re.escape(prefix)}\.{name}\b", text)
  ]
  assert not missing, missing
  assert {"StaleCaptureError", "ParityError", "UntranslatedOpsError"} <= set(names["tb"])


def test_installation_and_the_public_names_install_the_extras_pyproject_declares():
  tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
  extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
  installation = (DOCS / "installation.md").read_text()
  for extra, requirements in extras.items():
    row = re.search(rf"^\| `{extra}` \| (.*?) \|", installation, re.M)
    assert row, f"installation.md's extras table has no row for {extra!r}"
    assert all(f"`{r}`" in row.group(1) for r in requirements), (extra, row.group(1))
  overview = (DOCS / "guides" / "api-overview.md").read_text()
  # Not on PyPI: a pip line names the extra on the clone (".[ray]"), never
  # "torchbridge[ray]" alone, which pip would look up on PyPI.
  for page, text in (("installation.md", installation), ("guides/api-overview.md", overview)):
    bare = re.findall(r"pip install \"?torchbridge\[[\w,]*\]\"?(?! @)", text)
    assert not bare, f"{page} installs torchbridge[...] from PyPI, where it is not"
  assert 'pip install ".[ray]"' in overview


# --- limitations.md -----------------------------------------------------------


def test_complex_tensors_cross_both_ways_and_only_real_floats_get_gradients():
  f = tb.torch_function(lambda z, x: (z * 2, x * 3))
  z = tf.constant([1 + 2j, 3 - 1j], tf.complex64)
  x = tf.constant([1.0, 2.0])
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([z, x])
    doubled, tripled = f(z, x)
    loss = tf.reduce_sum(tf.math.real(doubled)) + tf.reduce_sum(tripled)
  assert doubled.dtype == tf.complex64
  np.testing.assert_array_equal(doubled.numpy(), [2 + 4j, 6 - 2j])
  assert tape.gradient(loss, z) is None
  np.testing.assert_array_equal(tape.gradient(loss, x).numpy(), [3.0, 3.0])


def test_a_parameter_added_to_the_torch_module_after_wrapping_is_not_seen():
  net = torch.nn.Linear(3, 2)
  module = tb.TorchModule(net, name="added_later")
  names = [v.name for v in module.variables]
  net.extra = torch.nn.Parameter(torch.ones(2))
  assert [v.name for v in module.variables] == names
  assert "extra" not in module.get_weights()


class _WritesLater(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(3, 2)
    self.register_buffer("count", torch.zeros(()))
    self.calls = 0

  def forward(self, x):
    self.calls += 1
    if self.calls > 1:
      self.count.add_(1)
    return self.lin(x)


def test_a_buffer_written_only_on_a_later_call_needs_an_output_signature():
  module = tb.TorchModule(_seeded(_WritesLater), name="writes_later")
  module(tf.ones([1, 3]))
  with pytest.raises(RuntimeError, match="modified its tensor argument"):
    module(tf.ones([1, 3]))
  declared = tb.TorchModule(
    _seeded(_WritesLater),
    name="writes_later_declared",
    output_signature=tf.TensorSpec([None, 2], tf.float32),
  )
  for _ in range(3):
    declared(tf.ones([1, 3]))
  assert declared.get_weights()["count"] == 2.0


class _WithTarget(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.net = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Sigmoid())

  def forward(self, x, target):
    return torch.nn.functional.binary_cross_entropy(self.net(x), target)


def test_a_forward_that_refuses_the_checks_random_inputs_runs_torch_saying_why(caplog):
  # The check feeds normal floats: a target outside [0, 1] makes torch raise.
  module = tb.TorchModule(_seeded(_WithTarget), name="bce_auto")
  with caplog.at_level(logging.INFO, logger="torchbridge"):
    y = tf.function(lambda x, t: module(x, t))(tf.ones([4, 3]), tf.fill([4, 1], 0.5))
  assert np.isfinite(y.numpy())
  assert _runners.choices()["bce_auto"]["runner"] == "torch"
  assert _runners.choices()["bce_auto"].get("path") in ("Python", None)  # None: no native op
  assert "all elements of target should be between 0 and 1" in caplog.text


def test_a_module_that_writes_buffers_in_training_saves_when_called_in_eval_mode(tmp_path):
  # Its training-mode call cannot be saved (tests/test_module_checkpoint.py);
  # in eval mode the forward writes nothing, and the SavedModel runs.
  def net():
    return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))

  holder = tf.Module()
  holder.net = tb.TorchModule(_seeded(net), name="bn_eval")
  holder.serve = tf.function(
    lambda x: holder.net(x, training=False), input_signature=[tf.TensorSpec([None, 3])]
  )
  want = holder.serve(tf.ones([4, 3])).numpy()
  tf.saved_model.save(holder, str(tmp_path / "model"))
  loaded = tf.saved_model.load(str(tmp_path / "model"))
  np.testing.assert_allclose(loaded.serve(tf.ones([4, 3])).numpy(), want, rtol=1e-6)


def test_clone_model_of_a_torch_layer_fails_closed_and_from_config_opts_in():
  import keras  # pylint: disable=import-outside-toplevel

  layer = tb.keras.TorchLayer(_seeded(_mlp), name="cloned")
  model = keras.Sequential([keras.Input((3,)), layer])
  with pytest.raises(ValueError, match="safe_mode=False"):
    keras.models.clone_model(model)
  clone = tb.keras.TorchLayer.from_config(layer.get_config(), safe_mode=False)
  assert clone.torch_module is not layer.torch_module
