"""TD3 agents: one for TF modules (torchbridge or Keras), one in pure torch.

Both follow the reference implementation (sfujim/TD3): target policy
smoothing (clipped Gaussian noise on the target action), clipped double-Q
learning (the minimum of two target Q heads), and delayed policy and target
updates (every `policy_freq` critic updates, Polyak averaging with `tau`).
"""

import copy
import dataclasses

import numpy as np
import tensorflow as tf
import torch

import torchbridge as tb
from td3 import networks
from td3 import replay


@dataclasses.dataclass
class Hyper:
  gamma: float = 0.99
  tau: float = 0.005
  lr: float = 3e-4
  batch_size: int = 256
  policy_noise: float = 0.2  # times max_action
  noise_clip: float = 0.5  # times max_action
  policy_freq: int = 2
  expl_noise: float = 0.1  # times max_action


def torch_networks(obs_dim, act_dim, max_action, seed):
  """The initial torch networks; every backend starts from these weights."""
  torch.manual_seed(seed)
  return (networks.TorchActor(obs_dim, act_dim, max_action), networks.TorchCritic(obs_dim, act_dim))


class TFAgent:
  """TD3 on TF modules: `tb.TorchModule`s or Keras models, Keras Adam."""

  def __init__(
    self,
    backend,
    obs_dim,
    act_dim,
    max_action,
    seed,
    hyper,
    run="auto",
    jit_compile=False,
    capacity=None,
    policy_call="auto",
  ):
    self.hyper, self.max_action = hyper, max_action
    actor_torch, critic_torch = torch_networks(obs_dim, act_dim, max_action, seed)
    if backend == "torchbridge":
      # Declared output signatures: tracing needs no run of the torch code
      # to find them (finding them runs it on meta tensors, and torch's meta
      # kernels for matmuls import torch._dynamo, ~1 s once per process).
      actor_out = tf.TensorSpec([None, act_dim], tf.float32)
      critic_out = (tf.TensorSpec([None, 1], tf.float32),) * 2  # the twin Q heads
      # The default (run="auto"): graph calls run each module's exact TF
      # translation; run="torch": torch through the bridge (from C++, a
      # torch.export capture of each module).
      ts = {"run": run}
      self.actor = tb.TorchModule(actor_torch, name="actor", output_signature=actor_out, **ts)
      self.critic = tb.TorchModule(critic_torch, name="critic", output_signature=critic_out, **ts)
      self.actor_target = tb.TorchModule(
        copy.deepcopy(actor_torch), name="actor_target", output_signature=actor_out, **ts
      )
      self.critic_target = tb.TorchModule(
        copy.deepcopy(critic_torch), name="critic_target", output_signature=critic_out, **ts
      )
      self._critic_call = lambda m, o, a: m(o, a)
    elif backend == "tf":
      models = []
      for _ in range(2):  # online and target, both from the torch weights
        actor, actor_dense = networks.keras_actor(obs_dim, act_dim, max_action)
        critic, critic_dense = networks.keras_critic(obs_dim, act_dim)
        _copy_linear_weights(actor_torch, actor_dense)
        _copy_linear_weights(critic_torch, critic_dense)
        models.append((actor, critic))
      (self.actor, self.critic), (self.actor_target, self.critic_target) = models
      self._critic_call = lambda m, o, a: m([o, a])
    else:
      raise ValueError(f"TFAgent backend must be 'torchbridge' or 'tf', got {backend!r}")
    if run != "auto" and backend != "torchbridge":
      raise ValueError(f"run={run!r} is for the torchbridge backend, not {backend!r}")
    self.actor_opt = tf.keras.optimizers.Adam(hyper.lr)
    self.critic_opt = tf.keras.optimizers.Adam(hyper.lr)
    # Slots exist before the first step, so a restore can match them all.
    self.actor_opt.build(self.actor.trainable_variables)
    self.critic_opt.build(self.critic.trainable_variables)
    self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
    # The train steps' random numbers (target policy noise, a burst's
    # batches), checkpointed with the run.
    self.rng_tf = tf.random.Generator.from_seed(seed)
    # Training bursts (`train_burst`): the replay buffer's rows in TF
    # variables, the batches drawn in the graph.
    self.replay = replay.TFReplay(obs_dim, act_dim, capacity) if capacity else None
    self.train_burst = tf.function(self._train_burst, jit_compile=jit_compile or None)
    # jit_compile=True: the train step compiled by XLA (the Keras port, or
    # torch modules whose graph calls run as their TF translation).
    self.train_step = tf.function(self._train_step, jit_compile=jit_compile or None)
    # The policy's call each environment step too (XLA's dispatch of a
    # small compiled function is cheaper than the graph executor's).
    self.act = tf.function(self._act, jit_compile=jit_compile or None)
    # Called each environment step as its concrete function (traced on the
    # first call): that skips tf.function's argument binding and trace
    # lookup, a third of the call here (the Keras port's and the default
    # TorchModule's alike; torchbridge's check of the Python state a capture
    # read runs on concrete calls too).
    self._act_concrete = None
    # policy_call "torch" (torchbridge's default): the policy's call, one
    # observation at a time, is the torch actor's own eager call
    # (`actor.torch_module`, its tensors viewing the variables the train
    # steps update): torch's cost. "function": through `act`.
    if policy_call == "auto":
      policy_call = "torch" if backend == "torchbridge" else "function"
    if policy_call == "torch" and backend != "torchbridge":
      raise ValueError(f"policy_call='torch' is for the torchbridge backend, not {backend!r}")
    self.policy_call = policy_call

  def checkpoint_items(self):
    return dict(
      actor=self.actor,
      critic=self.critic,
      actor_target=self.actor_target,
      critic_target=self.critic_target,
      actor_opt=self.actor_opt,
      critic_opt=self.critic_opt,
      updates=self.updates,
      rng=self.rng_tf,
    )

  def _act(self, obs):
    return self.actor(obs[None])[0]

  def policy(self, obs_np):
    if self.policy_call == "torch":
      with torch.no_grad():
        return self.actor.torch_module(torch.from_numpy(obs_np)[None])[0].numpy()
    obs = tf.constant(obs_np, tf.float32)
    if self._act_concrete is None:
      self._act_concrete = self.act.get_concrete_function(tf.TensorSpec(obs.shape, tf.float32))
    return self._act_concrete(obs).numpy()

  def _train_step(self, obs, action, reward, next_obs, not_done):
    h = self.hyper
    noise = tf.clip_by_value(
      self.rng_tf.normal(tf.shape(action)) * h.policy_noise * self.max_action,
      -h.noise_clip * self.max_action,
      h.noise_clip * self.max_action,
    )
    next_action = tf.clip_by_value(
      self.actor_target(next_obs) + noise, -self.max_action, self.max_action
    )
    target_q1, target_q2 = self._critic_call(self.critic_target, next_obs, next_action)
    target_q = tf.stop_gradient(reward + not_done * h.gamma * tf.minimum(target_q1, target_q2))
    with tf.GradientTape() as tape:
      q1, q2 = self._critic_call(self.critic, obs, action)
      critic_loss = tf.reduce_mean((q1 - target_q) ** 2) + tf.reduce_mean((q2 - target_q) ** 2)
    critic_vars = self.critic.trainable_variables
    self.critic_opt.apply_gradients(zip(tape.gradient(critic_loss, critic_vars), critic_vars))
    self.updates.assign_add(1)

    def update_actor():
      actor_vars = self.actor.trainable_variables
      with tf.GradientTape() as tape:
        q1, _ = self._critic_call(self.critic, obs, self.actor(obs))
        actor_loss = -tf.reduce_mean(q1)
      self.actor_opt.apply_gradients(zip(tape.gradient(actor_loss, actor_vars), actor_vars))
      for online, target in ((self.actor, self.actor_target), (self.critic, self.critic_target)):
        for v, t in zip(online.variables, target.variables):
          t.assign(h.tau * v + (1 - h.tau) * t)
      return actor_loss

    actor_loss = tf.cond(
      self.updates % h.policy_freq == 0, update_actor, lambda: tf.constant(np.nan, tf.float32)
    )
    return critic_loss, actor_loss

  def _train_burst(self, steps):
    """`steps` train steps in one graph call (a `tf.while_loop`), each on a
    batch drawn from `self.replay`; returns the last critic loss and the
    last actor loss."""

    def step(i, critic_loss, actor_loss):
      batch = self.replay.sample(self.rng_tf, self.hyper.batch_size)
      critic_loss, new_actor_loss = self._train_step(*batch)
      actor_loss = tf.where(tf.math.is_nan(new_actor_loss), actor_loss, new_actor_loss)
      return i + 1, critic_loss, actor_loss

    nan = tf.constant(np.nan, tf.float32)
    _, critic_loss, actor_loss = tf.while_loop(
      lambda i, *_: i < steps, step, (tf.constant(0), tf.constant(0.0), nan)
    )
    return critic_loss, actor_loss


class TorchAgent:
  """The same TD3 in plain PyTorch with torch Adam (the reference backend)."""

  def __init__(self, obs_dim, act_dim, max_action, seed, hyper):
    self.hyper, self.max_action = hyper, max_action
    self.actor, self.critic = torch_networks(obs_dim, act_dim, max_action, seed)
    self.actor_target = copy.deepcopy(self.actor)
    self.critic_target = copy.deepcopy(self.critic)
    self.actor_opt = torch.optim.Adam(self.actor.parameters(), hyper.lr)
    self.critic_opt = torch.optim.Adam(self.critic.parameters(), hyper.lr)
    self.updates = 0

  def state_dict(self):
    return {
      name: getattr(self, name).state_dict()
      for name in ("actor", "critic", "actor_target", "critic_target", "actor_opt", "critic_opt")
    } | {"updates": self.updates}

  def load_state_dict(self, state):
    for name, value in state.items():
      if name == "updates":
        self.updates = value
      else:
        getattr(self, name).load_state_dict(value)

  @torch.no_grad()
  def policy(self, obs_np):
    return self.actor(torch.as_tensor(obs_np)[None])[0].numpy()

  def train_step(self, obs, action, reward, next_obs, not_done):
    h = self.hyper
    obs, action, reward, next_obs, not_done = (
      torch.as_tensor(a) for a in (obs, action, reward, next_obs, not_done)
    )
    with torch.no_grad():
      noise = (torch.randn_like(action) * h.policy_noise * self.max_action).clamp(
        -h.noise_clip * self.max_action, h.noise_clip * self.max_action
      )
      next_action = (self.actor_target(next_obs) + noise).clamp(-self.max_action, self.max_action)
      target_q1, target_q2 = self.critic_target(next_obs, next_action)
      target_q = reward + not_done * h.gamma * torch.min(target_q1, target_q2)
    q1, q2 = self.critic(obs, action)
    critic_loss = ((q1 - target_q) ** 2).mean() + ((q2 - target_q) ** 2).mean()
    self.critic_opt.zero_grad()
    critic_loss.backward()
    self.critic_opt.step()
    self.updates += 1
    actor_loss = float("nan")
    if self.updates % h.policy_freq == 0:
      loss = -self.critic(obs, self.actor(obs))[0].mean()
      self.actor_opt.zero_grad()
      loss.backward()
      self.actor_opt.step()
      actor_loss = loss.item()
      with torch.no_grad():
        for online, target in ((self.actor, self.actor_target), (self.critic, self.critic_target)):
          for p, t in zip(online.state_dict().values(), target.state_dict().values()):
            t.mul_(1 - h.tau).add_(h.tau * p)
    return critic_loss.item(), actor_loss


def _copy_linear_weights(module_torch, denses):
  """Copies torch Linear weights into Keras Dense layers, in order."""
  linears = [m for m in module_torch.modules() if isinstance(m, torch.nn.Linear)]
  if len(linears) != len(denses):
    raise ValueError(f"{len(linears)} torch Linear layers vs {len(denses)} Keras Dense layers")
  for linear, dense in zip(linears, denses):
    dense.set_weights([linear.weight.detach().numpy().T, linear.bias.detach().numpy()])
