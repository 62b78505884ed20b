"""The benchmark models, each in torch and in Keras with the same architecture."""

import keras
import torch

# name -> (layer widths or "cnn", batch size)
MODELS = {
  "small_mlp": ((32, 256, 256, 8), 64),
  "large_mlp": ((1024, 4096, 4096, 1024), 256),
  "cnn": ("cnn", 64),
  # The critic-sized MLP of keras.io's DDPG on Pendulum (3 inputs).
  "ddpg_mlp": ((3, 256, 256, 1), 64),
}


def torch_model(name):
  widths, _ = MODELS[name]
  if widths == "cnn":
    return torch.nn.Sequential(
      torch.nn.Conv2d(3, 32, 3, padding=1),
      torch.nn.ReLU(),
      torch.nn.MaxPool2d(2),
      torch.nn.Conv2d(32, 64, 3, padding=1),
      torch.nn.ReLU(),
      torch.nn.MaxPool2d(2),
      torch.nn.Flatten(),
      torch.nn.Linear(64 * 8 * 8, 128),
      torch.nn.ReLU(),
      torch.nn.Linear(128, 10),
    )
  layers = []
  for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
    layers.append(torch.nn.Linear(n_in, n_out))
    if i < len(widths) - 2:
      layers.append(torch.nn.ReLU())
  return torch.nn.Sequential(*layers)


def keras_model(name):
  """The same architecture in Keras; the CNN takes NHWC images (TF's CPU
  convolutions support only NHWC), the torch CNN NCHW."""
  widths, _ = MODELS[name]
  if widths == "cnn":
    return keras.Sequential(
      [
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
      ]
    )
  layers = [keras.Input((widths[0],))]
  for i, n_out in enumerate(widths[1:]):
    last = i == len(widths) - 2
    layers.append(keras.layers.Dense(n_out, activation=None if last else "relu"))
  return keras.Sequential(layers)


def batch_shapes(name):
  """(torch input shape, Keras input shape, target shape)."""
  widths, batch = MODELS[name]
  if widths == "cnn":
    return (batch, 3, 32, 32), (batch, 32, 32, 3), (batch, 10)
  return (batch, widths[0]), (batch, widths[0]), (batch, widths[-1])
