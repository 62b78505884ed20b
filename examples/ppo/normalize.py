"""Reward scaling as SB3's `VecNormalize` does it (the RL Zoo's `normalize`).

Each reward is divided by the running standard deviation of the discounted
return of its environment, then clipped: the critic regresses on targets
of about unit size whatever the task's reward scale, so its gradient does
not swamp the policy's under the shared global-norm clip.
"""

import numpy as np


class RewardScale:
  """Running reward scaling over `n_envs` environments."""

  def __init__(self, n_envs, gamma, clip=10.0, epsilon=1e-8):
    self.gamma, self.clip, self.epsilon = gamma, clip, epsilon
    self.returns = np.zeros(n_envs)
    self.mean, self.var, self.count = 0.0, 1.0, 1e-4

  def __call__(self, rewards, dones):
    """The scaled rewards of one step of every environment; `dones`: which
    episodes ended with it (their running return starts again)."""
    self.returns = self.returns * self.gamma + rewards
    self._update(self.returns)
    scaled = np.clip(rewards / np.sqrt(self.var + self.epsilon), -self.clip, self.clip)
    self.returns[dones] = 0.0
    return scaled.astype(np.float32)

  def _update(self, values):
    # The parallel-variance merge of SB3's RunningMeanStd.
    batch_mean, batch_var, batch_count = values.mean(), values.var(), values.size
    delta, total = batch_mean - self.mean, self.count + batch_count
    self.mean += delta * batch_count / total
    m2 = self.var * self.count + batch_var * batch_count
    self.var = (m2 + delta**2 * self.count * batch_count / total) / total
    self.count = total

  def state(self):
    return {
      "returns": self.returns.tolist(),
      "mean": self.mean,
      "var": self.var,
      "count": self.count,
    }

  def load(self, state):
    self.returns = np.array(state["returns"])
    self.mean, self.var, self.count = state["mean"], state["var"], state["count"]
