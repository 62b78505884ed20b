"""`tb.keras.TorchLayer`: a torch module as a Keras 3 layer (TF backend).

Saving and loading are in test_keras_saving.py.
"""

import numpy as np
import pytest
import torch  # noqa: F401  (must come before tensorflow / keras)
from torch import nn
import keras
import tensorflow as tf

import torchbridge as tb
from torchbridge.keras import TorchLayer

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge


def mlp(sizes, seed=0, act=nn.Tanh):
  """A torch MLP `Linear -> act -> ... -> Linear`."""
  torch.manual_seed(seed)
  layers = []
  for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
    if i:
      layers.append(act())
    layers.append(nn.Linear(n_in, n_out))
  return nn.Sequential(*layers)


def regression_data(n=48, n_in=4, dtype="float32", seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, n_in)).astype(dtype)
  y = (np.sin(x).sum(axis=1, keepdims=True) + 0.5).astype(dtype)
  return x, y


@pytest.fixture
def floatx64():
  """Keras' default float is float64 for the test (loss trackers included).

  Layers take their default dtype from the global dtype policy, which Keras
  caches on first use, so it is set beside floatx.
  """
  saved = keras.config.floatx(), keras.config.dtype_policy()
  keras.config.set_floatx("float64")
  keras.config.set_dtype_policy("float64")
  yield
  keras.config.set_floatx(saved[0])
  keras.config.set_dtype_policy(saved[1])


class Recorder(nn.Module):
  """A linear map that records torch's mode at each real (non-meta) call."""

  def __init__(self, n_in=3, n_out=1):
    super().__init__()
    self.linear = nn.Linear(n_in, n_out)
    self.drop = nn.Dropout(0.0)
    self.modes = []

  def forward(self, x):
    if x.device.type != "meta":  # not the shape inference while tracing
      self.modes.append((self.training, self.drop.training))
    return self.drop(self.linear(x))


class BatchEnds(keras.callbacks.Callback):
  def __init__(self):
    super().__init__()
    self.losses = []

  def on_train_batch_end(self, batch, logs=None):
    self.losses.append(logs["loss"])


# ---------------------------------------------------------------- weights


def test_weights_are_keras_variables_named_after_torch_paths():
  module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
  module[2].weight.requires_grad_(False)
  layer = TorchLayer(module, name="net")

  assert all(isinstance(w, keras.Variable) for w in layer.weights)
  by_name = {w.name: w for w in layer.weights}
  assert set(by_name) == set(module.state_dict())
  assert {w.path for w in layer.weights} == {"net/" + n for n in module.state_dict()}
  assert {w.name for w in layer.trainable_weights} == {
    "0.weight",
    "0.bias",
    "1.weight",
    "1.bias",
    "2.bias",
  }
  assert {w.name for w in layer.non_trainable_weights} == {
    "2.weight",
    "1.running_mean",
    "1.running_var",
    "1.num_batches_tracked",
  }
  for n, t in module.state_dict().items():
    np.testing.assert_array_equal(by_name[n].numpy(), t.numpy())
  assert by_name["1.num_batches_tracked"].dtype == "int64"
  assert layer.dtype == "float32" and layer.built


def test_frozen_parameter_does_not_move_in_fit():
  module = mlp([3, 4, 1])
  module[0].weight.requires_grad_(False)
  frozen = module[0].weight.detach().clone()
  trained = module[2].weight.detach().clone()
  model = keras.Sequential([keras.Input((3,)), TorchLayer(module)])
  model.compile(keras.optimizers.SGD(0.1), "mse")
  x, y = regression_data(n_in=3)
  model.fit(x, y, epochs=1, batch_size=16, verbose=0)
  layer = model.layers[0]
  np.testing.assert_array_equal(layer.get_weights_by_name()["0.weight"], frozen.numpy())
  assert not np.allclose(layer.get_weights_by_name()["2.weight"], trained.numpy())


def test_dtype_defaults_to_the_module_dtype():
  assert TorchLayer(nn.Linear(2, 2).double()).dtype == "float64"
  layer = TorchLayer(nn.Linear(2, 2).double())
  assert all(w.dtype == "float64" for w in layer.weights)


def test_dtype_that_differs_from_the_module_is_refused():
  with pytest.raises(ValueError, match="float64") as info:
    TorchLayer(nn.Linear(2, 2).double(), dtype="float32", name="d")
  assert "'d'" in str(info.value) and "module.float()" in str(info.value)
  with pytest.raises(ValueError, match="mixed_float16"):
    TorchLayer(nn.Linear(2, 2), dtype="mixed_float16")
  assert TorchLayer(nn.Linear(2, 2), dtype="float32").dtype == "float32"


def test_non_trainable_layer_keeps_its_weights_in_fit():
  module = mlp([4, 3, 1])
  layer = TorchLayer(module, trainable=False)
  assert layer.trainable_weights == [] and len(layer.weights) == 4
  model = keras.Sequential([keras.Input((4,)), layer, keras.layers.Dense(1)])
  model.compile(keras.optimizers.SGD(0.1), "mse")
  before = layer.get_weights_by_name()
  x, y = regression_data()
  model.fit(x, y, epochs=1, verbose=0)
  for n, value in layer.get_weights_by_name().items():
    np.testing.assert_array_equal(value, before[n], err_msg=n)


def test_keras_get_and_set_weights_reach_the_torch_module():
  layer = TorchLayer(nn.Linear(2, 3))
  before = layer.get_weights()
  # Distinct values in every element, so a transposed or swapped weight shows.
  new = [
    np.arange(w.size, dtype=np.float32).reshape(w.shape) + 10.0 * (k + 1)
    for k, w in enumerate(before)
  ]
  for old_value, new_value in zip(before, new):
    assert not np.array_equal(old_value, new_value)
  expected = {w.name: value for w, value in zip(layer.weights, new)}
  assert sorted(expected) == ["bias", "weight"]
  layer.set_weights(new)
  for got, value in zip(layer.get_weights(), new):
    np.testing.assert_array_equal(got, value)
  for w in layer.weights:
    np.testing.assert_array_equal(w.numpy(), expected[w.name], err_msg=w.name)
  np.testing.assert_array_equal(layer.torch_module.weight.detach().numpy(), expected["weight"])
  np.testing.assert_array_equal(layer.torch_module.bias.detach().numpy(), expected["bias"])


# ------------------------------------------------------- models and modes


def build_model(kind, module):
  """A model around `TorchLayer(module)` built with the given Keras API."""
  if kind == "sequential":
    return keras.Sequential([keras.Input((4,)), TorchLayer(module)])
  if kind == "functional":
    inp = keras.Input((4,))
    return keras.Model(inp, TorchLayer(module)(inp))
  return Regressor(module)


def torch_layer_of(model):
  (layer,) = [x for x in model._flatten_layers() if isinstance(x, TorchLayer)]
  return layer


class Regressor(keras.Model):
  """A subclassed model that holds a TorchLayer as an attribute."""

  def __init__(self, module, **kwargs):
    super().__init__(**kwargs)
    self.torch_layer = TorchLayer(module)

  def call(self, x, training=None):
    return self.torch_layer(x, training=training)


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
@pytest.mark.parametrize("kind", ["sequential", "functional", "subclassed"])
def test_fit_evaluate_predict(kind, run_eagerly):
  module = mlp([4, 8, 1])
  model = build_model(kind, module)
  model.compile(keras.optimizers.Adam(0.02), "mse", run_eagerly=run_eagerly)
  assert model.run_eagerly == run_eagerly and model.jit_compile is False
  x, y = regression_data()
  batch_ends = BatchEnds()
  history = model.fit(x, y, epochs=4, batch_size=16, verbose=0, callbacks=[batch_ends])
  losses = history.history["loss"]
  assert len(losses) == 4 and losses[-1] < 0.8 * losses[0]
  assert len(batch_ends.losses) == 4 * 3
  # Subclassed models track the layer's weights like any Keras layer's.
  assert len(model.trainable_weights) == 4
  pred = model.predict(x, batch_size=16, verbose=0)
  assert pred.shape == (48, 1) and pred.dtype == np.float32
  with torch.no_grad():
    out = torch_layer_of(model).torch_module(torch.from_numpy(x))
    np.testing.assert_allclose(pred, out.numpy(), rtol=1e-5, atol=1e-6)
  loss = model.evaluate(x, y, batch_size=16, verbose=0)
  np.testing.assert_allclose(loss, np.mean((pred - y) ** 2), rtol=1e-5)


def test_early_stopping_and_validation_data():
  model = build_model("functional", mlp([4, 8, 1]))
  model.compile(keras.optimizers.SGD(0.0), "mse")  # no progress: stops
  x, y = regression_data()
  stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1)
  history = model.fit(x, y, validation_data=(x, y), epochs=20, verbose=0, callbacks=[stop])
  assert len(history.history["val_loss"]) == 2
  assert stop.stopped_epoch == 1


def test_compiled_and_eager_fit_agree(floatx64):
  histories = []
  for run_eagerly in (False, True):
    model = build_model("sequential", mlp([4, 8, 1]).double())
    model.compile(keras.optimizers.Adam(0.02), "mse", run_eagerly=run_eagerly)
    x, y = regression_data(dtype="float64")
    histories.append(
      model.fit(x, y, epochs=3, batch_size=16, verbose=0, shuffle=False).history["loss"]
    )
  np.testing.assert_allclose(histories[0], histories[1], rtol=1e-12)


def test_layer_does_not_support_xla(monkeypatch):
  from torchbridge._native import _xla  # where its library cannot be had

  monkeypatch.setattr(_xla, "available", lambda: False)
  monkeypatch.setattr(_xla, "unavailable", lambda: "no compiler (test)")
  layer = TorchLayer(nn.Linear(4, 1))
  assert layer.supports_jit is False
  model = keras.Sequential([keras.Input((4,)), layer])
  # Keras' jit_compile="auto" consults supports_jit (on a GPU it would
  # otherwise pick XLA); on this CPU machine it picks False anyway.
  from keras.src.trainers import trainer  # no public accessor

  assert not trainer.model_supports_jit(model)
  model.compile("sgd", "mse")
  assert model.jit_compile is False


def test_explicit_jit_compile_falls_back_with_a_warning(monkeypatch):
  from torchbridge._native import _xla  # where its library cannot be had

  monkeypatch.setattr(_xla, "available", lambda: False)
  monkeypatch.setattr(_xla, "unavailable", lambda: "no compiler (test)")
  model = keras.Sequential([keras.Input((4,)), TorchLayer(nn.Linear(4, 1))])
  with pytest.warns(UserWarning, match="jit_compile=False"):
    model.compile("sgd", "mse", jit_compile=True)
  assert model.jit_compile is False
  x, y = regression_data()
  model.fit(x, y, epochs=1, verbose=0)


def test_xla_compiled_step_raises_naming_jit_compile(monkeypatch):
  from torchbridge._native import _xla  # where its library cannot be had

  monkeypatch.setattr(_xla, "available", lambda: False)
  monkeypatch.setattr(_xla, "unavailable", lambda: "no compiler (test)")
  model = keras.Sequential([keras.Input((4,)), TorchLayer(nn.Linear(4, 1))])
  model.compile("sgd", "mse")
  model._jit_compile = True  # as if Keras had not consulted supports_jit
  x, y = regression_data()
  with pytest.raises(NotImplementedError, match="XLA") as info:
    model.fit(x, y, epochs=1, verbose=0)
  assert "jit_compile=False" in str(info.value)
  step = tf.function(lambda x: model(x), jit_compile=True)
  with pytest.raises(NotImplementedError, match="jit_compile"):
    step(x)


def test_evaluate_and_predict_under_xla_match_without():
  # Keras traces evaluate's and predict's steps with an unknown batch too
  # (47 samples in batches of 16: the last has 15); the layer's output
  # shapes are found when XLA compiles each batch size (the Python path
  # here, the C++ runner in test_xla.py).
  from torchbridge._native import _xla

  reason = _xla.unavailable()  # builds it on first use
  if reason is not None:
    pytest.skip(f"the XLA custom call is unavailable: {reason}")
  x, y = regression_data(n=47)
  results = []
  for jit in (False, True):
    layer = TorchLayer(mlp([4, 8, 1], act=nn.ReLU), run="torch")
    model = keras.Sequential([keras.Input((4,)), layer])
    model.compile("sgd", "mse", jit_compile=jit)
    calls = _xla.calls()
    loss = model.evaluate(x, y, batch_size=16, verbose=0)
    y_predicted = model.predict(x, batch_size=16, verbose=0)
    assert (_xla.calls() - calls) == (6 if jit else 0)  # 3 batches, twice
    results.append((loss, y_predicted))
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
  assert results[1][1].shape == (47, 1)
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5, atol=1e-6)


# ------------------------------------------------- the Keras Dense twin


def dense_twin(module):
  """Keras Dense layers with the weights of a torch MLP of Linear + Tanh."""
  linears = [m for m in module if isinstance(m, nn.Linear)]
  layers = [keras.Input((linears[0].in_features,), dtype="float64")]
  for i, lin in enumerate(linears):
    act = "tanh" if i < len(linears) - 1 else None
    dense = keras.layers.Dense(lin.out_features, activation=act, dtype="float64")
    layers.append(dense)
  model = keras.Sequential(layers)
  for dense, lin in zip(model.layers, linears):
    dense.set_weights([lin.weight.detach().numpy().T, lin.bias.detach().numpy()])
  return model


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_fit_matches_keras_dense_twin_in_float64(floatx64, run_eagerly):
  module = mlp([4, 16, 8, 1], seed=3).double()
  twin = dense_twin(module)
  layer = TorchLayer(module, name="torch_mlp")
  model = keras.Sequential([keras.Input((4,), dtype="float64"), layer])
  x, y = regression_data(n=64, dtype="float64")
  histories, batch_losses = [], []
  for m in (model, twin):
    m.compile(keras.optimizers.Adam(0.01), "mse", run_eagerly=run_eagerly)
    batch_ends = BatchEnds()
    histories.append(
      m.fit(
        x, y, epochs=5, batch_size=16, shuffle=False, verbose=0, callbacks=[batch_ends]
      ).history["loss"]
    )
    batch_losses.append(batch_ends.losses)
  torch_losses, keras_losses = histories
  assert all(isinstance(v, float) for v in torch_losses)
  assert torch_losses[-1] < 0.5 * torch_losses[0]  # it did train
  np.testing.assert_allclose(torch_losses, keras_losses, rtol=1e-9, atol=0)
  np.testing.assert_allclose(batch_losses[0], batch_losses[1], rtol=1e-9)
  trained = layer.get_weights_by_name()
  linear_names = [n for n, m in module.named_children() if isinstance(m, nn.Linear)]
  for n, dense in zip(linear_names, twin.layers):
    kernel, bias = dense.get_weights()
    np.testing.assert_allclose(trained[n + ".weight"], kernel.T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(trained[n + ".bias"], bias, rtol=1e-9, atol=1e-12)
  np.testing.assert_allclose(
    model.predict(x, verbose=0), twin.predict(x, verbose=0), rtol=1e-9, atol=1e-12
  )


# ------------------------------------------------------------- training


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_training_follows_keras_in_fit_evaluate_predict(run_eagerly):
  module = Recorder(4, 1)
  module.eval()  # Keras' training flag wins over torch's own mode
  model = build_model("functional", module)
  model.compile("sgd", "mse", run_eagerly=run_eagerly)
  x, y = regression_data()
  model.fit(x, y, epochs=1, batch_size=16, verbose=0)
  assert module.modes == [(True, True)] * 3
  assert not module.training and not module.drop.training
  module.modes.clear()
  module.train()
  model.evaluate(x, y, batch_size=16, verbose=0)
  model.predict(x, batch_size=16, verbose=0)
  assert module.modes == [(False, False)] * 6
  assert module.training and module.drop.training


@pytest.mark.parametrize("torch_mode", ["train", "eval"])
def test_direct_call_without_training_keeps_torch_mode(torch_mode):
  module = Recorder(3, 1)
  getattr(module, torch_mode)()
  layer = TorchLayer(module)
  x = tf.ones((2, 3))
  layer(x)
  tf.function(layer)(x)
  own = torch_mode == "train"
  assert module.modes == [(own, own)] * 2
  module.modes.clear()
  layer(x, training=not own)
  assert module.modes == [(not own, not own)]
  assert module.training == own and module.drop.training == own


def test_dropout_is_active_only_in_fit():
  torch.manual_seed(0)
  module = nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5), nn.Linear(64, 1))
  model = build_model("sequential", module)
  model.compile(keras.optimizers.SGD(0.0), "mse")
  x, y = regression_data()
  fit_loss = model.fit(x, y, batch_size=48, verbose=0).history["loss"][0]
  eval_loss = model.evaluate(x, y, batch_size=48, verbose=0)
  np.testing.assert_allclose(
    model.evaluate(x, y, batch_size=48, verbose=0), eval_loss
  )  # deterministic outside fit
  assert abs(fit_loss - eval_loss) > 1e-4  # dropout was on in fit


# ---------------------------------------------------------- mixed models


def test_keras_layers_around_two_torch_layers():
  torch.manual_seed(0)
  inp = keras.Input((5,))
  h = keras.layers.Dense(4, activation="relu", name="dense_in")(inp)
  h = TorchLayer(nn.Sequential(nn.Linear(4, 3), nn.Tanh()), name="t1")(h)
  h = keras.layers.Dense(2, name="dense_mid")(h)
  out = TorchLayer(nn.Linear(2, 1), name="t2")(h)
  model = keras.Model(inp, out)
  assert len(model.trainable_weights) == 8
  before = {w.path: w.numpy() for w in model.trainable_weights}
  model.compile(keras.optimizers.SGD(0.05), "mse")
  x, y = regression_data(n_in=5)
  model.fit(x, y, epochs=1, batch_size=48, verbose=0)
  for w in model.trainable_weights:  # gradient reached every layer
    assert not np.array_equal(w.numpy(), before[w.path]), w.path
  assert {w.path for w in model.weights} >= {"t1/0.weight", "t2/weight"}


def test_shared_layer_weights_count_once_and_gradients_add(floatx64):
  torch.manual_seed(0)
  module = nn.Linear(3, 3).double()
  layer = TorchLayer(module)
  inp = keras.Input((3,))
  out = layer(keras.layers.Activation("tanh")(layer(inp)))
  model = keras.Model(inp, out)
  assert len(model.weights) == 2 and len(model.trainable_weights) == 2
  x = np.random.default_rng(0).normal(size=(5, 3))
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(x, training=True) ** 2)
  grads = tape.gradient(loss, model.trainable_weights)

  ref = nn.Linear(3, 3).double()
  ref.load_state_dict(module.state_dict())
  ref_loss = (ref(torch.tanh(ref(torch.from_numpy(x)))) ** 2).sum()
  ref_loss.backward()
  np.testing.assert_allclose(loss.numpy(), ref_loss.item(), rtol=1e-12)
  by_name = dict(zip([w.name for w in model.trainable_weights], grads))
  np.testing.assert_allclose(by_name["weight"], ref.weight.grad.numpy(), rtol=1e-12, atol=1e-14)
  np.testing.assert_allclose(by_name["bias"], ref.bias.grad.numpy(), rtol=1e-12, atol=1e-14)
  model.compile("sgd", "mse")
  model.fit(x, x, epochs=1, verbose=0)


# ------------------------------------------------------------ batch norm


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_batch_norm_statistics_update_in_fit_only(run_eagerly):
  torch.manual_seed(0)
  module = nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 1))
  layer = TorchLayer(module, name="bn")
  model = keras.Sequential([keras.Input((3,)), layer])
  model.compile(keras.optimizers.SGD(0.01), "mse", run_eagerly=run_eagerly)
  rng = np.random.default_rng(0)
  x = rng.normal(loc=[1.0, -2.0, 3.0], scale=[1.0, 2.0, 0.5], size=(40, 3)).astype(np.float32)
  y = x[:, :1]
  model.fit(x, y, epochs=1, batch_size=10, shuffle=False, verbose=0)

  # The input goes straight into the BatchNorm: the running statistics
  # depend on the data only, so numpy can predict them.
  mean, var = np.zeros(3), np.ones(3)
  for batch in np.split(x.astype(np.float64), 4):
    mean = 0.9 * mean + 0.1 * batch.mean(axis=0)
    var = 0.9 * var + 0.1 * batch.var(axis=0, ddof=1)
  variables = {w.name: w for w in layer.weights}
  np.testing.assert_allclose(variables["0.running_mean"].numpy(), mean, rtol=1e-5)
  np.testing.assert_allclose(variables["0.running_var"].numpy(), var, rtol=1e-5)
  assert variables["0.num_batches_tracked"].numpy() == 4
  after_fit = layer.get_weights_by_name()

  pred = model.predict(x, batch_size=10, verbose=0)
  model.evaluate(x, y, batch_size=10, verbose=0)
  after_predict = layer.get_weights_by_name()
  for n, value in after_fit.items():
    np.testing.assert_array_equal(after_predict[n], value, err_msg=n)
  with torch.no_grad():  # eval mode uses the running statistics
    ref = layer.torch_module.eval()(torch.from_numpy(x))
  np.testing.assert_allclose(pred, ref.numpy(), rtol=1e-5, atol=1e-6)


def test_training_call_never_writes_into_tf_buffers():
  layer = TorchLayer(nn.BatchNorm1d(3))
  running_mean = {w.name: w for w in layer.weights}["running_mean"]
  x = tf.constant(np.random.default_rng(0).normal(1.0, size=(8, 3)), tf.float32)
  for _ in range(3):
    read = tf.convert_to_tensor(running_mean)  # may share the buffer
    snapshot = read.numpy().copy()
    layer(x, training=True)
    # TF values are immutable: torch updated a copy, assigned to the variable.
    np.testing.assert_array_equal(read.numpy(), snapshot)
    assert not np.array_equal(running_mean.numpy(), snapshot)


# ------------------------------------------------------------ bad input


def test_lazy_module_is_refused_with_the_fix():
  with pytest.raises(ValueError, match="not initialized") as info:
    TorchLayer(nn.Sequential(nn.LazyLinear(3)), name="lazy")
  message = str(info.value)
  assert "'lazy'" in message and "'0.weight'" in message
  assert "once on an example input" in message


def test_module_without_state_is_refused_with_the_fix():
  with pytest.raises(ValueError, match="no parameters") as info:
    TorchLayer(nn.ReLU())
  message = str(info.value)
  assert "ModuleList" in message and "torch_function" in message
  assert "ReLU" in message


def test_non_module_is_refused():
  with pytest.raises(TypeError, match="torch.nn.Module") as info:
    TorchLayer(torch.sin)
  assert "torch_function" in str(info.value)


def int_input_model():
  inp = keras.Input((4,), dtype="int32")
  model = keras.Model(inp, TorchLayer(mlp([4, 3, 1]), name="float_mlp")(inp))
  return model


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_wrong_input_dtype_error_names_dtypes_and_fix(run_eagerly):
  model = int_input_model()
  model.compile("sgd", "mse", run_eagerly=run_eagerly)
  x, y = regression_data()
  with pytest.raises(Exception) as info:
    model.fit(x.astype(np.int32), y, epochs=1, verbose=0)
  message = str(info.value)
  assert "float_mlp" in message
  assert "int32" in message and "float32" in message
  assert "tf.cast" in message
  assert "must have the same dtype" in message  # torch's own words too
  # Nothing was lost: the same model runs on the right input.
  good = keras.Sequential([keras.Input((4,)), model.layers[-1]])
  assert good(x).shape == (48, 1)


def test_wrong_input_dtype_in_direct_call():
  layer = TorchLayer(mlp([4, 3, 1]).double(), name="double_mlp")
  with pytest.raises(RuntimeError) as info:
    layer(tf.ones((2, 4), tf.int64))
  message = str(info.value)
  assert "int64" in message and "float64" in message
  # Floating inputs are cast by Keras to the layer's dtype, as for any layer.
  assert layer(tf.ones((2, 4), tf.float32)).dtype == tf.float64


def test_integer_inputs_still_reach_embeddings():
  layer = TorchLayer(nn.Embedding(10, 3))
  ids = tf.constant([[1, 2], [3, 9]], tf.int64)
  out = layer(ids)
  assert out.shape == (2, 2, 3)
  np.testing.assert_array_equal(
    out.numpy(), layer.torch_module.weight.detach().numpy()[ids.numpy()]
  )


# ----------------------------------------------------------- torch_module


def test_torch_module_holds_trained_values():
  module = mlp([4, 8, 1])
  layer = TorchLayer(module)
  model = keras.Sequential([keras.Input((4,)), layer])
  model.compile(keras.optimizers.Adam(0.05), "mse")
  x, y = regression_data()
  before = {n: t.detach().clone() for n, t in module.state_dict().items()}
  model.fit(x, y, epochs=2, batch_size=16, verbose=0)
  trained = layer.torch_module
  assert trained is module
  variables = {w.name: w.numpy() for w in layer.weights}
  for n, t in trained.state_dict().items():
    np.testing.assert_array_equal(t.numpy(), variables[n], err_msg=n)
    assert not torch.equal(t, before[n]), n
  with torch.no_grad():
    pure_torch = trained(torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(model.predict(x, verbose=0), pure_torch, rtol=1e-6, atol=1e-6)
  # Bridged calls (predict) took the views back; reading again lends them.
  assert torch.isnan(trained[0].weight).all()
  np.testing.assert_array_equal(
    layer.get_weights_by_name()["0.weight"], layer.torch_module[0].weight.detach().numpy()
  )


def test_set_weights_by_name_round_trip():
  layer = TorchLayer(mlp([2, 3, 1]))
  weights = layer.get_weights_by_name()
  weights["0.weight"] = weights["0.weight"] + 1.0
  layer.set_weights_by_name(weights)
  np.testing.assert_array_equal(layer.torch_module[0].weight.detach().numpy(), weights["0.weight"])
  with pytest.raises(ValueError, match="missing names"):
    layer.set_weights_by_name({"0.weight": weights["0.weight"]})


def test_tb_keras_is_the_public_module():
  assert tb.keras.TorchLayer is TorchLayer
  assert issubclass(TorchLayer, keras.layers.Layer)
