"""Keras 3 layers (TensorFlow backend) that run torch modules."""

from torchbridge._wrappers._keras_layer import TorchLayer

__all__ = ["TorchLayer"]
