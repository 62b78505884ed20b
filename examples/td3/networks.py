"""Actor and twin-Q critic, 256-256 as in the TD3 reference code, in torch and Keras."""

import keras
import torch


class TorchActor(torch.nn.Module):
  def __init__(self, obs_dim, act_dim, max_action, hidden=256):
    super().__init__()
    self.l1 = torch.nn.Linear(obs_dim, hidden)
    self.l2 = torch.nn.Linear(hidden, hidden)
    self.l3 = torch.nn.Linear(hidden, act_dim)
    self.max_action = max_action

  def forward(self, obs):
    h = torch.relu(self.l1(obs))
    h = torch.relu(self.l2(h))
    return self.max_action * torch.tanh(self.l3(h))


class TorchCritic(torch.nn.Module):
  """Two Q heads, Q1 and Q2, on (obs, action)."""

  def __init__(self, obs_dim, act_dim, hidden=256):
    super().__init__()
    self.q1 = torch.nn.Sequential(
      torch.nn.Linear(obs_dim + act_dim, hidden),
      torch.nn.ReLU(),
      torch.nn.Linear(hidden, hidden),
      torch.nn.ReLU(),
      torch.nn.Linear(hidden, 1),
    )
    self.q2 = torch.nn.Sequential(
      torch.nn.Linear(obs_dim + act_dim, hidden),
      torch.nn.ReLU(),
      torch.nn.Linear(hidden, hidden),
      torch.nn.ReLU(),
      torch.nn.Linear(hidden, 1),
    )

  def forward(self, obs, action):
    sa = torch.cat([obs, action], dim=-1)
    return self.q1(sa), self.q2(sa)


def keras_actor(obs_dim, act_dim, max_action, hidden=256):
  """The actor in Keras, and its Dense layers in the torch Linear order."""
  dense = [
    keras.layers.Dense(hidden, activation="relu"),
    keras.layers.Dense(hidden, activation="relu"),
    keras.layers.Dense(act_dim, activation="tanh"),
  ]
  obs = keras.Input((obs_dim,))
  h = obs
  for layer in dense:
    h = layer(h)
  return keras.Model(obs, h * max_action), dense


def keras_critic(obs_dim, act_dim, hidden=256):
  """The twin-Q critic in Keras, and its Dense layers in the torch order."""
  dense = [
    layer
    for _ in range(2)
    for layer in (
      keras.layers.Dense(hidden, activation="relu"),
      keras.layers.Dense(hidden, activation="relu"),
      keras.layers.Dense(1),
    )
  ]
  obs, action = keras.Input((obs_dim,)), keras.Input((act_dim,))
  sa = keras.layers.Concatenate()([obs, action])
  heads = []
  for head in (dense[:3], dense[3:]):
    h = sa
    for layer in head:
      h = layer(h)
    heads.append(h)
  return keras.Model([obs, action], heads), dense
