"""TD3 (Fujimoto et al., 2018) for the Pendulum example, in three backends.

- `torchbridge`: torch actor and critic wrapped in `tb.TorchModule`, trained
  by Keras Adam inside a `tf.function` train step.
- `torch`: the same torch networks and algorithm in plain PyTorch.
- `tf`: the same architecture built from Keras layers.
"""
