"""The torch actor-critics and the partially observed CartPole.

`RecurrentActorCritic` is the usual recurrent policy of RLlib's and
SB3-contrib's PPO: an actor LSTM and a critic LSTM over
`pack_padded_sequence(obs, seq_lens, enforce_sorted=False)`, each with its
`(h, c)` state in and out, outputs padded back to the input's length so they
line up with a TF-side `tf.sequence_mask(seq_lens, T)`; a 64-unit ReLU layer
and a linear head on each. `FeedForwardActorCritic` is the same without the
LSTMs (it carries the state through unchanged), the policy that cannot
infer the velocities.

Both take `(obs [B, T, obs_dim], seq_lens [B] int64, state)` and return
`(logits [B, T, n_actions], values [B, T], state)`, with
`state = ((h_pi, c_pi), (h_vf, c_vf))`, each `[1, B, hidden]`.
"""

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn.utils import rnn

HIDDEN = 64
VISIBLE = (0, 2)  # cart position, pole angle: CartPole without its velocities
# CartPole's termination bounds on those two (2.4 m, 12 degrees): the
# observation is divided by them, so both lie in [-1, 1].
BOUNDS = np.array([2.4, 12 * np.pi / 180], np.float32)


class VelocityFree(gym.ObservationWrapper):
  """CartPole-v1 observing position and angle only (not their velocities).

  Scaled by `BOUNDS` into [-1, 1] (the angle alone spans +-0.21 rad).
  """

  def __init__(self, env):
    super().__init__(env)
    self.observation_space = gym.spaces.Box(-1.0, 1.0, (len(VISIBLE),), np.float32)

  def observation(self, observation):
    return (observation[list(VISIBLE)] / BOUNDS).astype(np.float32)


def make_env(full_observation=False):
  env = gym.make("CartPole-v1")
  return env if full_observation else VelocityFree(env)


def _head(n_in, n_out):
  return nn.Sequential(nn.Linear(n_in, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, n_out))


class RecurrentActorCritic(nn.Module):
  """Actor and critic LSTMs over packed padded sequences."""

  def __init__(self, obs_dim, n_actions):
    super().__init__()
    self.lstm_pi = nn.LSTM(obs_dim, HIDDEN, batch_first=True)
    self.lstm_vf = nn.LSTM(obs_dim, HIDDEN, batch_first=True)
    self.pi = _head(HIDDEN, n_actions)
    self.vf = _head(HIDDEN, 1)

  def forward(self, obs, seq_lens, state):
    state_pi, state_vf = state
    packed = rnn.pack_padded_sequence(obs, seq_lens, batch_first=True, enforce_sorted=False)
    total_length = obs.shape[1]
    out_pi, state_pi = self.lstm_pi(packed, state_pi)
    out_vf, state_vf = self.lstm_vf(packed, state_vf)
    # Padded back to T: zeros at the padding, where the loss mask is 0.
    feat_pi, _ = rnn.pad_packed_sequence(out_pi, batch_first=True, total_length=total_length)
    feat_vf, _ = rnn.pad_packed_sequence(out_vf, batch_first=True, total_length=total_length)
    return self.pi(feat_pi), self.vf(feat_vf).squeeze(-1), (state_pi, state_vf)


class FeedForwardActorCritic(nn.Module):
  """The same heads on the current observation alone: no memory."""

  def __init__(self, obs_dim, n_actions):
    super().__init__()
    self.pi = _head(obs_dim, n_actions)
    self.vf = _head(obs_dim, 1)

  def forward(self, obs, seq_lens, state):
    del seq_lens  # each step on its own
    return self.pi(obs), self.vf(obs).squeeze(-1), state


POLICIES = {"lstm": RecurrentActorCritic, "mlp": FeedForwardActorCritic}


def initial_network(policy, obs_dim, n_actions, seed):
  """The initial torch network; every backend starts from these weights."""
  torch.manual_seed(seed)
  return POLICIES[policy](obs_dim, n_actions)


def zero_state(batch):
  """The state at the start of an episode, as numpy arrays."""
  zeros = lambda: np.zeros((1, batch, HIDDEN), np.float32)  # noqa: E731
  return ((zeros(), zeros()), (zeros(), zeros()))
