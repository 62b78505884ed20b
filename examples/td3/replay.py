"""A numpy replay buffer that can be saved and restored with the run."""

import numpy as np


class ReplayBuffer:
  """Fixed-size ring buffer of (obs, action, reward, next_obs, not_done)."""

  def __init__(self, obs_dim, act_dim, capacity):
    self.capacity = capacity
    self.obs = np.zeros((capacity, obs_dim), np.float32)
    self.action = np.zeros((capacity, act_dim), np.float32)
    self.reward = np.zeros((capacity, 1), np.float32)
    self.next_obs = np.zeros((capacity, obs_dim), np.float32)
    self.not_done = np.zeros((capacity, 1), np.float32)
    self.size = 0
    self.pos = 0

  def add(self, obs, action, reward, next_obs, terminated):
    i = self.pos
    self.obs[i], self.action[i], self.reward[i] = obs, action, reward
    self.next_obs[i], self.not_done[i] = next_obs, 1.0 - float(terminated)
    self.pos = (self.pos + 1) % self.capacity
    self.size = min(self.size + 1, self.capacity)

  def sample(self, rng, batch_size):
    idx = rng.integers(0, self.size, size=batch_size)
    return (
      self.obs[idx],
      self.action[idx],
      self.reward[idx],
      self.next_obs[idx],
      self.not_done[idx],
    )

  def save(self, path):
    n = self.size
    np.savez(
      path,
      obs=self.obs[:n],
      action=self.action[:n],
      reward=self.reward[:n],
      next_obs=self.next_obs[:n],
      not_done=self.not_done[:n],
      pos=self.pos,
    )

  def load(self, path):
    data = np.load(path)
    n = len(data["obs"])
    for key in ("obs", "action", "reward", "next_obs", "not_done"):
      getattr(self, key)[:n] = data[key]
    self.size, self.pos = n, int(data["pos"])
