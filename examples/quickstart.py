"""Quick start: a torch model trained inside a TF training loop.

A torch MLP becomes a `tb.TorchModule`; a Keras Adam optimizer trains its
parameters (held as TF variables) in a `tf.function` train step; a TF
checkpoint saves it; and `tb.exchange_stats()` shows what crossed the
boundary between the frameworks, and that nothing was copied.

Run: `.venv/bin/python examples/quickstart.py`.
"""

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TF's C++ start-up logs

import torch  # first, the recommended order: docs/troubleshooting.md, "Does the import order matter?"
import numpy as np
import tensorflow as tf

import torchbridge as tb


def main(steps=300, seed=0):
  torch.manual_seed(seed)
  tf.random.set_seed(seed)
  rng = np.random.default_rng(seed)

  # A regression task: y = sin(3 x0) + x1 * x2, learnt by a torch MLP.
  x_np = rng.uniform(-1, 1, size=(2048, 3)).astype(np.float32)
  y_np = (np.sin(3 * x_np[:, :1]) + x_np[:, 1:2] * x_np[:, 2:3]).astype(np.float32)
  dataset = (
    tf.data.Dataset.from_tensor_slices((x_np, y_np)).shuffle(2048, seed=seed).batch(64).repeat()
  )

  net_torch = torch.nn.Sequential(
    torch.nn.Linear(3, 64),
    torch.nn.Tanh(),
    torch.nn.Linear(64, 64),
    torch.nn.Tanh(),
    torch.nn.Linear(64, 1),
  )
  model = tb.TorchModule(net_torch, name="regressor")
  optimizer = tf.keras.optimizers.Adam(3e-3)

  @tf.function
  def train_step(x_tf, y_tf):
    with tf.GradientTape() as tape:
      loss_tf = tf.reduce_mean((model(x_tf, training=True) - y_tf) ** 2)
    grads_tf = tape.gradient(loss_tf, model.trainable_variables)
    optimizer.apply_gradients(zip(grads_tf, model.trainable_variables))
    return loss_tf

  print("torchbridge demo: a torch MLP trained by a Keras Adam in a tf.function")
  print("TF variables:", ", ".join(v.name for v in model.trainable_variables))
  tb.reset_exchange_stats()
  for step, (x_tf, y_tf) in enumerate(dataset.take(steps)):
    loss = float(train_step(x_tf, y_tf))
    if step % 50 == 0 or step == steps - 1:
      print(f"  step {step:4d}  loss {loss:.5f}")
  stats = tb.exchange_stats()

  # The torch module holds what TF trained; a TF checkpoint saved it too.
  x_test = tf.constant(x_np[:256])
  with torch.no_grad():
    y_torch = model.torch_module(torch.from_numpy(x_np[:256]))
  assert np.allclose(model(x_test).numpy(), y_torch.numpy(), atol=1e-6)
  with tempfile.TemporaryDirectory() as tmp:
    path = tf.train.Checkpoint(model=model).save(f"{tmp}/ckpt")
    torch.manual_seed(seed + 1)  # a fresh, differently initialized copy
    restored = tb.TorchModule(
      torch.nn.Sequential(
        torch.nn.Linear(3, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 1),
      ),
      name="regressor",
    )
    tf.train.Checkpoint(model=restored).restore(path).assert_consumed()
    same = np.array_equal(restored(x_test).numpy(), model(x_test).numpy())
    print(f"TF checkpoint restored into a fresh TorchModule: outputs identical = {same}")

  print(f"\nwhat crossed the boundary in {steps} train steps (forward + backward + Adam update):")
  print(
    f"  tensors shared zero-copy:   {stats['zero_copy']}"
    f"  ({stats['zero_copy'] / steps:.0f} per step)"
  )
  print(f"  tensors copied:             {stats['copied']}")
  print(f"  bytes copied:               {stats['bytes_copied']}")
  final = float(tf.reduce_mean((model(tf.constant(x_np)) - y_np) ** 2))
  print(f"final training-set MSE: {final:.5f} (predicting 0 gives {float(np.mean(y_np**2)):.5f})")


if __name__ == "__main__":
  main()
