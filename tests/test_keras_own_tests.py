"""`tb.keras.TorchLayer` under Keras' own layer test (code nobody here wrote).

`keras.src.testing.TestCase.run_layer_test` is the check Keras runs on its
own layers: construction from `init_kwargs`, `get_config` / `from_config`
round trips, symbolic and eager calls against the expected shapes, the
weight counts, `fit` on random data (the training check), and saving and
loading the layer in a model. A `TorchLayer` subclass that builds its torch
module in `__init__` (the safe-mode way the Keras guide describes) passes
it as Keras' layers do; mixed precision is refused with the fix.
"""

import os

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# pylint: disable=wrong-import-position
import torch

import torchbridge.keras as tbk

keras_testing = pytest.importorskip("keras.src.testing.test_case")

# No path-specific code: Keras' graph calls take the default runner.
pytestmark = [
  pytest.mark.one_pass,
  # Keras' own training check feeds a generator to fit(shuffle=True).
  pytest.mark.filterwarnings("ignore:`shuffle=True` was passed:UserWarning"),
]


class MLP(tbk.TorchLayer):
  """Linear-ReLU-Linear, built from its config alone."""

  def __init__(self, units=3, **kwargs):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, units))
    super().__init__(module, **kwargs)
    self.units = units

  def get_config(self):  # no `module` argument: TorchLayer pickles nothing
    return {**super().get_config(), "units": self.units}


class NormDrop(tbk.TorchLayer):
  """BatchNorm and Dropout: buffers as non-trainable weights, a training
  mode that differs from inference."""

  def __init__(self, **kwargs):
    torch.manual_seed(0)
    module = torch.nn.Sequential(
      torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Dropout(0.25), torch.nn.Linear(6, 2)
    )
    super().__init__(module, **kwargs)


class KerasOwnLayerTest(keras_testing.TestCase):
  def test_an_mlp_passes_keras_layer_test(self):
    self.run_layer_test(
      MLP,
      init_kwargs={"units": 3},
      input_shape=(2, 4),
      expected_output_shape=(2, 3),
      expected_num_trainable_weights=4,
      expected_num_non_trainable_weights=0,
      custom_objects={"MLP": MLP},
      run_mixed_precision_check=False,
    )

  def test_batchnorm_and_dropout_pass_keras_layer_test(self):
    self.run_layer_test(
      NormDrop,
      init_kwargs={},
      input_shape=(5, 4),
      expected_output_shape=(5, 2),
      expected_num_trainable_weights=6,
      # running_mean, running_var, num_batches_tracked
      expected_num_non_trainable_weights=3,
      custom_objects={"NormDrop": NormDrop},
      run_mixed_precision_check=False,
    )

  def test_keras_mixed_precision_check_is_refused_with_the_fix(self):
    with self.assertRaisesRegex(ValueError, r"got dtype='mixed_float16'.*module\.float\(\)"):
      self.run_layer_test(
        MLP,
        init_kwargs={"units": 3},
        input_shape=(2, 4),
        expected_output_shape=(2, 3),
        custom_objects={"MLP": MLP},
        run_training_check=False,
        run_mixed_precision_check=True,
      )
