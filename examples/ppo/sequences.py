"""A PPO rollout cut into padded sequences, as recurrent PPO trains on them.

Each environment's rollout is cut where an episode starts and every
`max_seq_len` steps; each piece becomes one row of a `[N, max_seq_len]`
batch, zero-padded after its length, with the recurrent state the policy had
at the piece's first step (zeros where an episode starts). This is RLlib's
and SB3-contrib's layout; the loss must then average over the real steps
only, `tf.sequence_mask(seq_lens, max_seq_len)`.
"""

import collections

import numpy as np

from ppo import networks

SequenceBatch = collections.namedtuple(
  "SequenceBatch", "obs actions old_logp advantages returns seq_lens state"
)


class Rollout:
  """`n_steps` steps of `n_envs` environments, time-major."""

  def __init__(self, n_steps, n_envs, obs_dim):
    self.n_steps, self.n_envs = n_steps, n_envs
    shape = (n_steps, n_envs)
    self.obs = np.zeros(shape + (obs_dim,), np.float32)
    self.actions = np.zeros(shape, np.int64)
    self.logp = np.zeros(shape, np.float32)
    self.values = np.zeros(shape, np.float32)
    self.rewards = np.zeros(shape, np.float32)
    self.dones = np.zeros(shape, np.float32)  # the episode ended after this step
    self.starts = np.zeros(shape, bool)  # this step begins an episode
    # The state before each step: ((h_pi, c_pi), (h_vf, c_vf)), [T, E, H] each.
    self.states = [np.zeros(shape + (networks.HIDDEN,), np.float32) for _ in range(4)]

  def store_state(self, t, state):
    (h_pi, c_pi), (h_vf, c_vf) = state
    for stored, value in zip(self.states, (h_pi, c_pi, h_vf, c_vf)):
      stored[t] = value[0]

  def advantages(self, last_values, gamma, gae_lambda):
    """GAE(lambda) advantages and the returns the critic regresses on."""
    advantages = np.zeros_like(self.rewards)
    running = np.zeros(self.n_envs, np.float32)
    for t in reversed(range(self.n_steps)):
      next_values = last_values if t == self.n_steps - 1 else self.values[t + 1]
      alive = 1.0 - self.dones[t]
      delta = self.rewards[t] + gamma * next_values * alive - self.values[t]
      running = delta + gamma * gae_lambda * alive * running
      advantages[t] = running
    return advantages, advantages + self.values

  def sequences(self, max_seq_len):
    """(env, first step, length) of every piece, in rollout order."""
    pieces = []
    for env in range(self.n_envs):
      first = 0
      for t in range(1, self.n_steps + 1):
        if t == self.n_steps or self.starts[t, env] or t - first == max_seq_len:
          pieces.append((env, first, t - first))
          first = t
    return np.array(pieces, np.int64)

  def padded(self, pieces, advantages, returns, max_seq_len):
    """The pieces as one zero-padded `SequenceBatch` of numpy arrays."""
    env, first, length = pieces[:, 0], pieces[:, 1], pieces[:, 2]
    offsets = np.arange(max_seq_len)
    valid = offsets[None, :] < length[:, None]  # [N, L]
    steps = np.where(valid, first[:, None] + offsets[None, :], 0)
    envs = np.broadcast_to(env[:, None], steps.shape)

    def gather(values):
      out = values[steps, envs]
      return np.where(valid.reshape(valid.shape + (1,) * (out.ndim - 2)), out, np.zeros_like(out))

    h_pi, c_pi, h_vf, c_vf = (s[first, env][None] for s in self.states)
    return SequenceBatch(
      obs=gather(self.obs),
      actions=gather(self.actions),
      old_logp=gather(self.logp),
      advantages=gather(advantages),
      returns=gather(returns),
      seq_lens=length.astype(np.int64),
      state=((h_pi, c_pi), (h_vf, c_vf)),
    )
