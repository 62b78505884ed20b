"""PPO agents: a torch actor-critic through torchbridge, and its pure-torch twin.

`BridgeAgent` wraps the torch network in `tb.TorchModule` and trains it
with Keras Adam in a `tf.function` update over padded sequence minibatches
(`losses.ppo_loss_tf`). `TorchAgent` is the same algorithm in pure torch
(`losses.ppo_loss_torch`, `torch.optim.Adam`). Both start from the same
initial weights (`networks.initial_network`) and clip the gradients' global
norm the same way; actions are sampled outside the agents, from one numpy
stream, so both backends see the same random numbers.
"""

import dataclasses

import numpy as np
import tensorflow as tf
import torch

import torchbridge as tb
from ppo import losses
from ppo import networks
from ppo import sequences


@dataclasses.dataclass
class Hyper:
  """rl-baselines3-zoo's RecurrentPPO settings for CartPoleNoVel-v1."""

  n_envs: int = 8
  n_steps: int = 32  # per environment and rollout
  max_seq_len: int = 32  # pieces are cut at episode starts and at this length
  epochs: int = 20
  minibatches: int = 1
  gamma: float = 0.98
  gae_lambda: float = 0.8
  lr: float = 1e-3  # decays linearly to 0 over the run
  clip_range: float = 0.2  # decays linearly to 0 over the run
  max_grad_norm: float = 0.5
  adam_eps: float = 1e-5


def _numpy(structure):
  return tf.nest.map_structure(lambda t: t.numpy(), structure)


class BridgeAgent:
  """The torch actor-critic as a `tb.TorchModule`, trained by Keras Adam."""

  def __init__(self, policy, obs_dim, n_actions, seed, hyper, masked=True):
    self.hyper, self.masked = hyper, masked
    network = networks.initial_network(policy, obs_dim, n_actions, seed)
    self.model = tb.TorchModule(network, name="actor_critic")
    self.optimizer = tf.keras.optimizers.Adam(hyper.lr, epsilon=hyper.adam_eps)
    # Built now, so a checkpoint restores its slots before the first update.
    self.optimizer.build(self.model.trainable_variables)
    state = tf.TensorSpec([1, None, networks.HIDDEN], tf.float32)
    length = hyper.max_seq_len
    batch = sequences.SequenceBatch(
      obs=tf.TensorSpec([None, length, obs_dim], tf.float32),
      actions=tf.TensorSpec([None, length], tf.int64),
      old_logp=tf.TensorSpec([None, length], tf.float32),
      advantages=tf.TensorSpec([None, length], tf.float32),
      returns=tf.TensorSpec([None, length], tf.float32),
      seq_lens=tf.TensorSpec([None], tf.int64),
      state=((state, state), (state, state)),
    )
    self._update = tf.function(
      self._update_step, input_signature=[batch, tf.TensorSpec([], tf.float32)]
    )
    # Every epoch of one rollout's minibatch in one graph call (a
    # tf.while_loop): `update_epochs`.
    self._update_epochs = tf.function(
      self._update_epoch_loop,
      input_signature=[batch, tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32)],
    )

  def loss(self, batch, clip_range):
    """(loss, stats) of a padded minibatch: the bridged forward, then the loss."""
    logits, values, _ = self.model(batch.obs, batch.seq_lens, batch.state)
    return losses.ppo_loss_tf(logits, values, batch, clip_range, self.masked)

  def _update_step(self, batch, clip_range):
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      loss, stats = self.loss(batch, clip_range)
    grads = tape.gradient(loss, variables)
    grads, grad_norm = tf.clip_by_global_norm(grads, self.hyper.max_grad_norm)
    self.optimizer.apply_gradients(zip(grads, variables))
    return dict(stats, loss=loss, grad_norm=grad_norm)

  def _update_epoch_loop(self, batch, clip_range, epochs):
    stats = self._update_step(batch, clip_range)  # the first epoch fixes the structure

    def epoch(i, stats):
      del stats
      return i + 1, self._update_step(batch, clip_range)

    _, stats = tf.while_loop(lambda i, _: i < epochs, epoch, (tf.constant(1), stats))
    return stats

  def act(self, obs, state):
    """(logits, values, next state) for one step of each environment; numpy.

    The torch network's own eager call (`torch_module`, its tensors viewing
    the variables the updates train): what acting costs in pure torch."""
    return _torch_act(self.model.torch_module, obs, state)

  def update(self, batch, clip_range, lr):
    self.optimizer.learning_rate = lr
    return _numpy(self._update(batch, np.float32(clip_range)))

  def update_epochs(self, batch, clip_range, lr, epochs):
    """`epochs` updates on one minibatch in one graph call; the last's stats."""
    self.optimizer.learning_rate = lr
    return _numpy(self._update_epochs(batch, np.float32(clip_range), np.int32(epochs)))

  def get_weights(self):
    return self.model.get_weights()

  def checkpoint(self):
    return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)


class TorchAgent:
  """The same agent in pure PyTorch: the `--backend torch` twin."""

  def __init__(self, policy, obs_dim, n_actions, seed, hyper, masked=True):
    self.hyper, self.masked = hyper, masked
    self.model = networks.initial_network(policy, obs_dim, n_actions, seed)
    self.optimizer = torch.optim.Adam(self.model.parameters(), lr=hyper.lr, eps=hyper.adam_eps)

  def loss(self, batch, clip_range):
    logits, values, _ = self.model(batch.obs, batch.seq_lens, batch.state)
    return losses.ppo_loss_torch(logits, values, batch, clip_range, self.masked)

  def act(self, obs, state):
    return _torch_act(self.model, obs, state)

  def update_epochs(self, batch, clip_range, lr, epochs):
    for _ in range(epochs):
      stats = self.update(batch, clip_range, lr)
    return stats

  def update(self, batch, clip_range, lr):
    for group in self.optimizer.param_groups:
      group["lr"] = lr
    batch_torch = tf.nest.map_structure(torch.from_numpy, batch)
    loss, stats = self.loss(batch_torch, clip_range)
    self.optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.hyper.max_grad_norm)
    self.optimizer.step()
    return {k: v.item() for k, v in dict(stats, loss=loss, grad_norm=grad_norm).items()}

  def get_weights(self):
    return {k: v.detach().numpy().copy() for k, v in self.model.state_dict().items()}

  def state_dict(self):
    return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

  def load_state_dict(self, state):
    self.model.load_state_dict(state["model"])
    self.optimizer.load_state_dict(state["optimizer"])


def _torch_act(model_torch, obs, state):
  """One step of each environment through the torch network; numpy."""
  with torch.no_grad():
    state_torch = tf.nest.map_structure(torch.from_numpy, state)
    ones = torch.ones(obs.shape[0], dtype=torch.int64)
    logits, values, state_torch = model_torch(torch.from_numpy(obs)[:, None], ones, state_torch)
  return (
    logits[:, 0].numpy(),
    values[:, 0].numpy(),
    tf.nest.map_structure(lambda t: t.numpy(), state_torch),
  )


def make_agent(backend, *args, **kwargs):
  return (TorchAgent if backend == "torch" else BridgeAgent)(*args, **kwargs)
