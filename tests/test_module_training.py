"""Training a `tb.TorchModule` with TF optimizers, and parity with Keras and
with pure torch training."""

import copy

import numpy as np
import pytest
import torch
import tensorflow as tf
import tf_keras

import torchbridge as tb
from _module_helpers import MLP
from _module_helpers import SmallCNN
from _module_helpers import data
from _module_helpers import maybe_function
from _module_helpers import mode_param
from _module_helpers import seeded

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge

keras = tf.keras  # Keras 3 in TF 2.21

OPTIMIZERS = {
  "keras_adam": lambda: keras.optimizers.Adam(0.01),
  "keras_sgd": lambda: keras.optimizers.SGD(0.05),
  "keras_rmsprop": lambda: keras.optimizers.RMSprop(0.01),
  "tf_keras_adam": lambda: tf_keras.optimizers.Adam(0.01),
  "tf_keras_sgd": lambda: tf_keras.optimizers.SGD(0.05, momentum=0.9),
  "v1_sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.05),
  "v1_adam": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
  "v1_momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
}


def _problem():
  x = data([16, 4], seed=1, dtype=np.float64)
  y = np.sin(x[:, :2] * 2).astype(np.float64)
  return x, y


def _torch_grads(net, named, x, y):
  """Gradients of the MSE loss by torch autograd, for the given names."""
  params = dict(net.named_parameters())
  loss = ((net(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).mean()
  grads = torch.autograd.grad(loss, [params[n] for n in named])
  return float(loss.detach()), [g.numpy() for g in grads]


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@mode_param
def test_optimizer_updates_equal_the_same_optimizer_on_torch_gradients(mode, opt_name):
  """Each optimizer family trains the variables exactly as it trains plain
  tf.Variables fed with torch autograd's gradients."""
  net = seeded(0, MLP).double()
  actor = tb.TorchModule(net, name="actor")
  tvars = actor.trainable_variables
  names = [v.name[len("actor/") : -2] for v in tvars]
  x, y = _problem()
  opt = OPTIMIZERS[opt_name]()

  def step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((actor(x) - y) ** 2)
    opt.apply_gradients(zip(tape.gradient(loss, tvars), tvars))
    return loss

  step = maybe_function(mode, step)
  # The reference: the same optimizer on plain variables, gradients from a
  # copy of the torch module, run through torch alone.
  net_ref = copy.deepcopy(net)
  ref_vars = [tf.Variable(v.numpy()) for v in tvars]
  opt_ref = OPTIMIZERS[opt_name]()
  losses = []
  for _ in range(4):
    loss = float(step(tf.constant(x), tf.constant(y)))
    ref_loss, grads = _torch_grads(net_ref, names, x, y)
    opt_ref.apply_gradients(zip([tf.constant(g) for g in grads], ref_vars))
    with torch.no_grad():
      for n, v in zip(names, ref_vars):
        dict(net_ref.named_parameters())[n].copy_(torch.from_numpy(v.numpy()))
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
    for n, v, r in zip(names, tvars, ref_vars):
      np.testing.assert_allclose(v.numpy(), r.numpy(), rtol=1e-10, atol=1e-12, err_msg=n)
    losses.append(loss)
  for _ in range(16):
    losses.append(float(step(tf.constant(x), tf.constant(y))))
  assert losses[-1] < 0.9 * losses[0], losses


@mode_param
def test_one_sgd_step_is_w_minus_lr_times_torch_gradient(mode):
  net = seeded(0, MLP).double()
  actor = tb.TorchModule(net, name="actor")
  tvars = actor.trainable_variables
  names = [v.name[len("actor/") : -2] for v in tvars]
  x, y = _problem()
  lr = 0.125
  before = [v.numpy().copy() for v in tvars]
  _, grads = _torch_grads(copy.deepcopy(net), names, x, y)
  for opt in [
    keras.optimizers.SGD(lr),
    tf_keras.optimizers.SGD(lr),
    tf.compat.v1.train.GradientDescentOptimizer(lr),
  ]:
    for v, b in zip(tvars, before):
      v.assign(b)

    def step(x, y):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean((actor(x) - y) ** 2)
      opt.apply_gradients(zip(tape.gradient(loss, tvars), tvars))  # noqa: B023  (run in this iteration)

    maybe_function(mode, step)(tf.constant(x), tf.constant(y))
    for n, v, b, g in zip(names, tvars, before, grads):
      np.testing.assert_allclose(
        v.numpy(), b - lr * g, rtol=1e-14, atol=1e-15, err_msg=f"{type(opt)} {n}"
      )


# ------------------------------------------------------------------ parity


def _keras_mlp(net):
  """The Keras twin of `MLP`, with its weights."""
  layers = [keras.Input((net.hidden[0].in_features,), dtype="float64")]
  for lin in net.hidden:
    layers.append(keras.layers.Dense(lin.out_features, activation="tanh", dtype="float64"))
  layers.append(keras.layers.Dense(net.head.out_features, dtype="float64"))
  model = keras.Sequential(layers)
  for layer, lin in zip(model.layers, list(net.hidden) + [net.head]):
    layer.set_weights([lin.weight.detach().numpy().T, lin.bias.detach().numpy()])
  return model


def _keras_mlp_state(model):
  """The Keras MLP's weights under the torch state_dict names."""
  dense = model.layers
  names = [f"hidden.{k}" for k in range(len(dense) - 1)] + ["head"]
  state = {}
  for name, layer in zip(names, dense):
    kernel, bias = layer.get_weights()
    state[f"{name}.weight"], state[f"{name}.bias"] = kernel.T, bias
  return state


def _keras_cnn(net):
  """The Keras twin of `SmallCNN`, on NHWC images, with its weights.

  Keras convolves channels-last images; the torch kernels (out, in, kh, kw)
  become (kh, kw, in, out). Before flattening, the activations go back to
  channels-first so that the dense layer sees torch's (C, H, W) order.
  """
  c1, c2 = net.conv1, net.conv2
  model = keras.Sequential(
    [
      keras.Input((6, 6, c1.in_channels), dtype="float64"),
      keras.layers.Conv2D(c1.out_channels, 3, padding="same", activation="relu", dtype="float64"),
      keras.layers.Conv2D(c2.out_channels, 3, padding="valid", activation="relu", dtype="float64"),
      keras.layers.Permute((3, 1, 2), dtype="float64"),
      keras.layers.Flatten(dtype="float64"),
      keras.layers.Dense(net.fc.out_features, dtype="float64"),
    ]
  )
  conv1, conv2, _, _, dense = model.layers
  for layer, conv in [(conv1, c1), (conv2, c2)]:
    layer.set_weights(
      [conv.weight.detach().numpy().transpose(2, 3, 1, 0), conv.bias.detach().numpy()]
    )
  dense.set_weights([net.fc.weight.detach().numpy().T, net.fc.bias.detach().numpy()])
  return model


def _keras_cnn_state(model):
  conv1, conv2, _, _, dense = model.layers
  state = {}
  for name, layer in [("conv1", conv1), ("conv2", conv2)]:
    kernel, bias = layer.get_weights()
    state[f"{name}.weight"] = kernel.transpose(3, 2, 0, 1)
    state[f"{name}.bias"] = bias
  kernel, bias = dense.get_weights()
  state["fc.weight"], state["fc.bias"] = kernel.T, bias
  return state


def _parity_case(kind):
  """(torch module, Keras twin, state reader, torch inputs, Keras inputs, y)."""
  rng = np.random.default_rng(7)
  if kind == "mlp":
    net = seeded(0, MLP, n_in=4, n_hidden=(16, 8), n_out=2).double()
    x = rng.standard_normal([32, 4])
    y = np.stack([np.sin(2 * x[:, 0]), x[:, 1] * x[:, 2]], axis=1)
    return net, _keras_mlp(net), _keras_mlp_state, x, x, y
  net = seeded(0, SmallCNN, channels=2, size=6, n_out=3).double()
  x = rng.standard_normal([16, 2, 6, 6])
  y = np.stack(
    [x.mean(axis=(1, 2, 3)), x[:, 0].max(axis=(1, 2)), x[:, 1, 2:4, 2:4].sum(axis=(1, 2))], axis=1
  )
  return net, _keras_cnn(net), _keras_cnn_state, x, x.transpose(0, 2, 3, 1), y


def _train(model_call, tvars, opt, x, y, steps=50):
  x, y = tf.constant(x), tf.constant(y)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((model_call(x) - y) ** 2)
    opt.apply_gradients(zip(tape.gradient(loss, tvars), tvars))
    return loss

  return np.array([float(step()) for _ in range(steps)])


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_parity_with_the_same_model_in_keras_trained_by_keras_adam(kind):
  net, model, keras_state, x_torch_layout, x_keras_layout, y = _parity_case(kind)
  actor = tb.TorchModule(net, name="actor")
  # Same initial weights on both sides.
  for n, w in keras_state(model).items():
    np.testing.assert_array_equal(w, actor.get_weights()[n])
  losses_tb = _train(
    actor, actor.trainable_variables, keras.optimizers.Adam(0.01), x_torch_layout, y
  )
  losses_keras = _train(
    model, model.trainable_variables, keras.optimizers.Adam(0.01), x_keras_layout, y
  )
  assert losses_tb[-1] < 0.7 * losses_tb[0], losses_tb
  np.testing.assert_allclose(losses_tb, losses_keras, rtol=1e-9, atol=1e-12)
  weights_tb, weights_keras = actor.get_weights(), keras_state(model)
  assert sorted(weights_tb) == sorted(weights_keras)
  initial = _initial(kind)
  for n in weights_tb:
    np.testing.assert_allclose(weights_tb[n], weights_keras[n], rtol=1e-9, atol=1e-9, err_msg=n)
    assert not np.allclose(weights_tb[n], initial[n]), n


def _initial(kind):
  net, *_ = _parity_case(kind)
  return {n: t.detach().numpy() for n, t in net.state_dict().items()}


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_parity_with_pure_torch_sgd(kind):
  net, _, _, x, _, y = _parity_case(kind)
  net_torch = copy.deepcopy(net)
  actor = tb.TorchModule(net, name="actor")
  # Keras keeps the learning rate in a float32 variable: this one is exact
  # there, as in torch's float64 arithmetic.
  lr = 0.0625
  losses_tb = _train(actor, actor.trainable_variables, keras.optimizers.SGD(lr), x, y)
  opt_torch = torch.optim.SGD(net_torch.parameters(), lr=lr)
  x_t, y_t = torch.from_numpy(x), torch.from_numpy(y)
  losses_torch = []
  for _ in range(50):
    opt_torch.zero_grad()
    loss = ((net_torch(x_t) - y_t) ** 2).mean()
    loss.backward()
    opt_torch.step()
    losses_torch.append(float(loss.detach()))
  assert losses_tb[-1] < 0.9 * losses_tb[0], losses_tb
  np.testing.assert_allclose(losses_tb, losses_torch, rtol=1e-9, atol=1e-12)
  trained = actor.get_weights()
  initial = _initial(kind)
  for n, t in net_torch.state_dict().items():
    np.testing.assert_allclose(trained[n], t.numpy(), rtol=1e-9, atol=1e-9, err_msg=n)
    assert not np.array_equal(trained[n], initial[n]), n
