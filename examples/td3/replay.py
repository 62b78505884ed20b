"""A numpy replay buffer that can be saved and restored with the run, and
its mirror in TF variables for training bursts inside one graph call."""

import numpy as np
import tensorflow as tf


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
    self.added = 0  # rows added since the buffer was made or loaded

  def add(self, obs, action, reward, next_obs, terminated):
    i = self.pos
    self.obs[i], self.action[i], self.reward[i] = obs, action, reward
    self.next_obs[i], self.not_done[i] = next_obs, 1.0 - float(terminated)
    self.pos = (self.pos + 1) % self.capacity
    self.size = min(self.size + 1, self.capacity)
    self.added += 1

  def columns(self):
    return (self.obs, self.action, self.reward, self.next_obs, self.not_done)

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
    self.added = n


class TFReplay(tf.Module):
  """The replay buffer's rows mirrored in TF variables, for training bursts
  sampled inside one graph call (`agents.TFAgent.train_burst`).

  The numpy `ReplayBuffer` stays the record (it is what a checkpoint
  saves); `sync_from` copies the rows added since the last sync, once per
  episode, and a fresh `TFReplay` after a restore copies them all.
  """

  def __init__(self, obs_dim, act_dim, capacity):
    super().__init__(name="replay")
    self.capacity = capacity
    dims = {"obs": obs_dim, "action": act_dim, "reward": 1, "next_obs": obs_dim, "not_done": 1}
    self.columns = [
      tf.Variable(tf.zeros([capacity, dim]), trainable=False, name=name)
      for name, dim in dims.items()
    ]
    self.size = tf.Variable(0, dtype=tf.int32, trainable=False, name="size")
    self._synced = 0  # rows of the numpy buffer's `added` copied so far
    rows = [tf.TensorSpec([None, dim], tf.float32) for dim in dims.values()]
    self._write = tf.function(
      self._write_rows,
      input_signature=[tf.TensorSpec([None], tf.int32), rows, tf.TensorSpec([], tf.int32)],
    )

  def _write_rows(self, index, rows, size):
    for column, values in zip(self.columns, rows):
      column.scatter_nd_update(index[:, None], values)
    self.size.assign(size)

  def sync_from(self, buffer):
    """Copies the rows `buffer` gained since the last sync."""
    new = min(buffer.added - self._synced, buffer.capacity)
    if new > 0:
      index = (buffer.pos - new + np.arange(new)) % buffer.capacity
      rows = [column[index] for column in buffer.columns()]
      self._write(index.astype(np.int32), rows, np.int32(buffer.size))
    self._synced = buffer.added

  def sample(self, rng_tf, batch_size):
    """A batch of rows drawn uniformly, in the graph (`rng_tf`: a
    `tf.random.Generator`)."""
    index = rng_tf.uniform([batch_size], 0, self.size.read_value(), dtype=tf.int32)
    return tuple(tf.gather(column, index) for column in self.columns)
