"""Saving and loading Keras models that hold `tb.keras.TorchLayer`s.

The fresh-process tests run a script in a new Python process that imports
this file (for the registered classes below) and writes its predictions.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch  # noqa: F401  (must come before tensorflow / keras)
from torch import nn
import keras

from torchbridge.keras import TorchLayer

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

# Saving and loading go through the variables and the pickled module, the
# same on both paths (graph calls take the default TF runner): native pass only.
pytestmark = pytest.mark.one_pass


def make_mlp(hidden=8, seed=0):
  """A torch MLP with a BatchNorm, so that buffers travel too."""
  torch.manual_seed(seed)
  return nn.Sequential(
    nn.Linear(4, hidden), nn.BatchNorm1d(hidden), nn.Tanh(), nn.Linear(hidden, 1)
  )


def data(n=32, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 4)).astype(np.float32)
  return x, np.cos(x).sum(axis=1, keepdims=True).astype(np.float32)


def pickled_model(seed=0):
  """Keras layers around a TorchLayer that carries its module in the file."""
  torch.manual_seed(seed)
  return keras.Sequential(
    [
      keras.Input((4,)),
      keras.layers.Dense(4, name="dense_in"),
      TorchLayer(make_mlp(seed=seed), name="torch_mlp"),
      keras.layers.Dense(1, name="dense_out"),
    ]
  )


@keras.saving.register_keras_serializable(package="torchbridge_tests")
class CodeBuiltMLP(TorchLayer):
  """A TorchLayer whose code builds its torch module: loads in safe mode."""

  def __init__(self, hidden=8, **kwargs):
    super().__init__(make_mlp(hidden, seed=7), **kwargs)
    self.hidden = hidden

  def get_config(self):
    return {**super().get_config(), "hidden": self.hidden}


@keras.saving.register_keras_serializable(package="torchbridge_tests")
class CodeBuiltModel(keras.Model):
  """A subclassed model that builds its TorchLayer in `__init__`."""

  def __init__(self, hidden=8, **kwargs):
    super().__init__(**kwargs)
    self.hidden = hidden
    self.body = TorchLayer(make_mlp(hidden, seed=11), name="body")
    self.head = keras.layers.Dense(1, name="head")

  def call(self, x, training=None):
    return self.head(self.body(x, training=training))

  def get_config(self):
    return {**super().get_config(), "hidden": self.hidden}


def code_built_sequential():
  return keras.Sequential([keras.Input((4,)), CodeBuiltMLP(6, name="mlp")])


def trained(model, epochs=2):
  model.compile(keras.optimizers.Adam(0.01), "mse")
  x, y = data()
  model.fit(x, y, epochs=epochs, batch_size=8, verbose=0)
  return model


def torch_layer(model):
  (layer,) = [x for x in model._flatten_layers() if isinstance(x, TorchLayer)]
  return layer


def run_fresh_process(tmp_path, body):
  """Runs `body` in a new Python; `np`, `keras`, `helpers`, `tmp` defined."""
  script = textwrap.dedent("""\
      import sys
      import numpy as np
      import torch
      import keras
      sys.path.insert(0, {tests_dir!r})
      import test_keras_saving as helpers
      tmp = {tmp!r}
      """).format(tests_dir=TESTS_DIR, tmp=str(tmp_path))
  path = tmp_path / "fresh.py"
  path.write_text(script + textwrap.dedent(body))
  proc = subprocess.run(
    [sys.executable, str(path)], capture_output=True, text=True, timeout=240, cwd=str(tmp_path)
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc


# ----------------------------------------------------------- weights file


def test_weights_file_round_trip_into_a_fresh_model(tmp_path):
  model = trained(pickled_model(seed=0))
  x, _ = data(seed=1)
  expected = model.predict(x, verbose=0)
  path = str(tmp_path / "x.weights.h5")
  model.save_weights(path)

  fresh = pickled_model(seed=5)  # other initial values
  assert not np.array_equal(fresh.predict(x, verbose=0), expected)
  fresh.load_weights(path)
  np.testing.assert_array_equal(fresh.predict(x, verbose=0), expected)
  saved_state = torch_layer(model).get_weights_by_name()
  loaded_module = torch_layer(fresh).torch_module
  for n, t in loaded_module.state_dict().items():  # BatchNorm stats too
    np.testing.assert_array_equal(t.numpy(), saved_state[n], err_msg=n)
  assert saved_state["1.num_batches_tracked"] == 8


# ------------------------------------------------- pickled torch modules


def test_keras_file_with_pickled_module_is_refused_in_safe_mode(tmp_path, monkeypatch):
  model = trained(pickled_model(), epochs=1)
  path = str(tmp_path / "m.keras")
  model.save(path)

  def no_torch_load(*args, **kwargs):
    raise AssertionError("torch.load must not run in safe mode")

  monkeypatch.setattr(torch, "load", no_torch_load)
  with pytest.raises(ValueError) as info:
    keras.models.load_model(path)
  message = str(info.value)
  assert "'torch_mlp'" in message
  assert "torch.load" in message and "arbitrary code" in message
  assert "safe_mode=False" in message


def test_direct_from_config_fails_closed_and_opts_in_with_safe_mode():
  layer = TorchLayer(make_mlp(), name="t")
  config = layer.get_config()
  with pytest.raises(ValueError, match="safe_mode=False"):
    TorchLayer.from_config(config)
  serialized = keras.saving.serialize_keras_object(layer)
  with pytest.raises(ValueError, match="arbitrary code"):
    keras.saving.deserialize_keras_object(serialized)
  clone = keras.saving.deserialize_keras_object(serialized, safe_mode=False)
  assert isinstance(clone, TorchLayer)
  assert clone.torch_module is not layer.torch_module
  for n, value in layer.get_weights_by_name().items():
    np.testing.assert_array_equal(clone.get_weights_by_name()[n], value)


def test_from_config_takes_safe_mode_as_keras_torch_wrapper_does():
  # Keras' TorchModuleWrapper.from_config(config, custom_objects=None,
  # safe_mode=None): an explicit argument wins over the ambient scope.
  layer = TorchLayer(make_mlp(), name="t")
  config = layer.get_config()
  clone = TorchLayer.from_config(config, safe_mode=False)
  assert isinstance(clone, TorchLayer) and "module" in config
  for n, value in layer.get_weights_by_name().items():
    np.testing.assert_array_equal(clone.get_weights_by_name()[n], value)
  clone = TorchLayer.from_config(config, custom_objects={}, safe_mode=False)
  assert isinstance(clone, TorchLayer)
  with pytest.raises(ValueError, match="arbitrary code execution"):
    TorchLayer.from_config(config, safe_mode=True)
  with pytest.raises(ValueError, match="safe_mode=False"):
    TorchLayer.from_config(config, safe_mode=None)  # no scope: fails closed
  keras.config.enable_unsafe_deserialization()
  try:
    assert isinstance(TorchLayer.from_config(config), TorchLayer)
    with pytest.raises(ValueError, match="arbitrary code execution"):
      TorchLayer.from_config(config, safe_mode=True)
  finally:
    from keras.src.saving import serialization_lib

    serialization_lib.global_state.set_global_attribute("safe_mode_saving", None)


@pytest.mark.slow  # a fresh process (~20 s): make test-long
def test_load_model_unpickles_after_enable_unsafe_deserialization(tmp_path):
  # README: load_model refuses the pickled module "unless safe_mode=False is
  # given (or keras.config.enable_unsafe_deserialization())". The global
  # switch is process-wide, so a fresh process flips it.
  model = trained(pickled_model(seed=0), epochs=1)
  x, _ = data(seed=1)
  np.save(tmp_path / "x.npy", x)
  np.save(tmp_path / "expected.npy", model.predict(x, verbose=0))
  model.save(str(tmp_path / "m.keras"))

  run_fresh_process(
    tmp_path,
    """
      x = np.load(tmp + "/x.npy")
      try:
        keras.models.load_model(tmp + "/m.keras")
        raise AssertionError("loaded in safe mode")
      except ValueError as err:
        assert "safe_mode=False" in str(err), err
      keras.config.enable_unsafe_deserialization()
      model = keras.models.load_model(tmp + "/m.keras")  # no safe_mode arg
      np.save(tmp + "/loaded.npy", model.predict(x, verbose=0))
      """,
  )
  np.testing.assert_array_equal(
    np.load(tmp_path / "loaded.npy"), np.load(tmp_path / "expected.npy")
  )


@pytest.mark.slow  # a fresh process (~20 s): make test-long
def test_keras_file_round_trip_in_a_fresh_process(tmp_path):
  model = trained(pickled_model(seed=0))
  x, y = data(seed=1)
  np.save(tmp_path / "x.npy", x)
  np.save(tmp_path / "y.npy", y)
  np.save(tmp_path / "expected.npy", model.predict(x, verbose=0))
  model.save(str(tmp_path / "m.keras"))
  model.save_weights(str(tmp_path / "x.weights.h5"))
  iterations = int(model.optimizer.iterations.numpy())

  run_fresh_process(
    tmp_path,
    """
      x = np.load(tmp + "/x.npy")
      y = np.load(tmp + "/y.npy")
      model = keras.models.load_model(tmp + "/m.keras", safe_mode=False)
      np.save(tmp + "/loaded.npy", model.predict(x, verbose=0))
      np.save(tmp + "/iterations.npy", model.optimizer.iterations.numpy())
      layer = helpers.torch_layer(model)
      with torch.no_grad():  # the unpickled module holds the saved values
        np.save(tmp + "/module_state.npy", {
            n: t.numpy() for n, t in layer.torch_module.state_dict().items()})
      history = model.fit(x, y, epochs=2, verbose=0)  # it trains on
      assert history.history["loss"][1] < history.history["loss"][0]

      fresh = helpers.pickled_model(seed=5)
      fresh.load_weights(tmp + "/x.weights.h5")
      np.save(tmp + "/from_weights.npy", fresh.predict(x, verbose=0))
      """,
  )
  expected = np.load(tmp_path / "expected.npy")
  np.testing.assert_array_equal(np.load(tmp_path / "loaded.npy"), expected)
  np.testing.assert_array_equal(np.load(tmp_path / "from_weights.npy"), expected)
  assert np.load(tmp_path / "iterations.npy") == iterations
  module_state = np.load(tmp_path / "module_state.npy", allow_pickle=True).item()
  for n, value in torch_layer(model).get_weights_by_name().items():
    np.testing.assert_array_equal(module_state[n], value, err_msg=n)


# ------------------------------------------------- torch modules from code


@keras.saving.register_keras_serializable(package="torchbridge_tests")
class UnpicklableMLP(TorchLayer):
  """Its torch module holds a lambda, which pickle cannot store."""

  def __init__(self, **kwargs):
    module = make_mlp()
    module.postprocess = lambda t: t
    super().__init__(module, **kwargs)


def test_code_built_layers_skip_the_pickle(monkeypatch):
  monkeypatch.setattr(torch, "save", None)  # no pickling at all
  layer = CodeBuiltMLP(5, name="mlp")
  config = layer.get_config()
  assert "module" not in config and config["hidden"] == 5
  clone = CodeBuiltMLP.from_config(config)  # no opt-in needed
  assert clone.get_weights_by_name().keys() == layer.get_weights_by_name().keys()
  assert "module" not in UnpicklableMLP().get_config()


def test_unpicklable_code_built_layer_saves_and_loads(tmp_path):
  model = keras.Sequential([keras.Input((4,)), UnpicklableMLP(name="u")])
  # Loading rebuilds the layer from code (make_mlp's fixed seed) and then
  # restores the saved values: move every value away from what that code
  # builds, so a load that restored nothing cannot pass.
  layer = model.get_layer("u")
  saved = {n: (value + 1).astype(value.dtype) for n, value in layer.get_weights_by_name().items()}
  layer.set_weights_by_name(saved)
  x, _ = data()
  expected = model.predict(x, verbose=0)
  model.save(str(tmp_path / "u.keras"))

  rebuilt = keras.Sequential([keras.Input((4,)), UnpicklableMLP(name="u")])
  assert not np.array_equal(rebuilt.predict(x, verbose=0), expected)
  for n, value in rebuilt.get_layer("u").get_weights_by_name().items():
    assert not np.array_equal(value, saved[n]), n

  loaded = keras.models.load_model(str(tmp_path / "u.keras"))
  np.testing.assert_array_equal(loaded.predict(x, verbose=0), expected)
  loaded_layer = loaded.get_layer("u")
  for n, value in loaded_layer.get_weights_by_name().items():
    np.testing.assert_array_equal(value, saved[n], err_msg=n)
  for n, t in loaded_layer.torch_module.state_dict().items():
    np.testing.assert_array_equal(t.numpy(), saved[n], err_msg=n)


@pytest.mark.slow  # a fresh process (~20 s): make test-long
def test_code_built_models_load_in_safe_mode_in_a_fresh_process(tmp_path):
  x, y = data(seed=2)
  np.save(tmp_path / "x.npy", x)
  sequential = trained(code_built_sequential())
  subclassed = trained(CodeBuiltModel(hidden=6))
  np.save(tmp_path / "expected_sequential.npy", sequential.predict(x, verbose=0))
  np.save(tmp_path / "expected_subclassed.npy", subclassed.predict(x, verbose=0))
  sequential.save(str(tmp_path / "sequential.keras"))
  subclassed.save(str(tmp_path / "subclassed.keras"))

  run_fresh_process(
    tmp_path,
    """
      def no_torch_load(*args, **kwargs):
        raise AssertionError("torch.load must not run in safe mode")

      torch.load = no_torch_load
      x = np.load(tmp + "/x.npy")
      for kind in ("sequential", "subclassed"):
        model = keras.models.load_model(tmp + f"/{kind}.keras")  # safe mode
        np.save(tmp + f"/loaded_{kind}.npy", model.predict(x, verbose=0))
        assert isinstance(helpers.torch_layer(model), keras.layers.Layer)
      """,
  )
  for kind in ("sequential", "subclassed"):
    np.testing.assert_array_equal(
      np.load(tmp_path / f"loaded_{kind}.npy"),
      np.load(tmp_path / f"expected_{kind}.npy"),
      err_msg=kind,
    )
