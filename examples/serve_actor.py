"""Serves a translated actor SavedModel in a process where torch is absent.

  python examples/serve_actor.py SAVEDMODEL OBS.npy

Blocks `import torch` before anything else (as on a serving machine without
torch), loads the SavedModel with TensorFlow alone, and prints one JSON
line: the actions for the observations in OBS.npy and whether torch could
be imported. Written for examples/td3/export.py (`make demo`'s last step).
"""

import json
import os
import sys

sys.modules["torch"] = None  # `import torch` now raises ImportError
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main(savedmodel, obs_path):
  try:
    import torch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import

    torch_importable = True
  except ImportError:
    torch_importable = False
  actor = tf.saved_model.load(savedmodel)
  actions = actor(tf.constant(np.load(obs_path))).numpy()
  print(json.dumps({"actions": actions.tolist(), "torch_importable": torch_importable}))


if __name__ == "__main__":
  main(*sys.argv[1:3])
