"""A Hugging Face text classifier trained by Keras and served without torch.

A `transformers` BERT sequence classifier (a torch model: transformers 5
has no TF models) becomes a `tb.keras.TorchLayer` inside a Keras model, and
`model.fit` trains it on synthetic token ids fed by a `tf.data` pipeline
with dynamic padding (`padded_batch`: each batch padded to its own longest
sequence, an attention mask marking the padding). Then:

- the weights are saved and restored into a fresh, differently initialized
  model (`save_weights` / `load_weights`), equal to the last bit;
- `tb.translate` turns the trained model (eval mode) into TF ops that read
  the same variables, `tf.saved_model.save` writes them, and a fresh
  process that never imports torch loads and serves them; its logits are
  compared with the torch model's;
- the translation, made before training, scores a held-out set before and
  after it: it reads the variables `fit` trains;
- the summary says how often Keras traced the model and which call
  signatures torchbridge captured: `fit` traces its step with `[None,
  None]` token ids, so one trace and one capture, whatever the batch
  lengths.

The task: a sequence labelled 1 draws 80% of its tokens from the lower half
of the vocabulary, one labelled 0 draws 20% from it. Padding is id 0, in
the lower half, so a model that read the padding would be misled.

Run:
  .venv/bin/python examples/hf_text_classifier.py            # tiny BERT (the default)
  .venv/bin/python examples/hf_text_classifier.py --base     # BERT-base's size, random init
  .venv/bin/python examples/hf_text_classifier.py --pretrained DIR
      # a local checkpoint (a save_pretrained directory); nothing is downloaded

The tiny default builds a 2-layer BERT from a config (random weights,
nothing downloaded), small enough for a laptop's CPU.
`--save-pretrained DIR` writes the trained classifier as a Hugging Face
checkpoint, which `--pretrained DIR` (or `from_pretrained` in torch) loads.
`--json` ends the output with the summary as one line of JSON.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TF's C++ start-up logs

import torch  # first, the recommended order: docs/troubleshooting.md, "Does the import order matter?"
import keras
import numpy as np
import tensorflow as tf
import transformers

import torchbridge as tb

NUM_LABELS = 2
TINY = dict(
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=2,
  intermediate_size=64,
  vocab_size=100,
  max_position_embeddings=64,
)
HELD_OUT = 128  # sequences

# Run in a fresh interpreter: TensorFlow and numpy only, no torch, no torchbridge.
SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
served = tf.saved_model.load(sys.argv[1])
batch = np.load(sys.argv[2])
logits_tf = served(tf.constant(batch["input_ids"]), tf.constant(batch["attention_mask"]))
np.save(sys.argv[3], logits_tf.numpy())
print(json.dumps({"torch": "torch" in sys.modules, "torchbridge": "torchbridge" in sys.modules}))
"""


class LogitsOnly(torch.nn.Module):
  """A sequence classifier called with positional tensors, returning its
  logits: one tensor, as a Keras layer and `tb.translate` want (the
  classifier itself returns a `ModelOutput`)."""

  def __init__(self, classifier):
    super().__init__()
    self.classifier = classifier

  def forward(self, input_ids, attention_mask):
    return self.classifier(input_ids=input_ids, attention_mask=attention_mask).logits


class TextClassifier(keras.Model):
  """The torch classifier as a TorchLayer in a subclassed Keras model.

  `traces` lists the graphs Keras traced the model into, as (training,
  the token ids' shape)."""

  def __init__(self, classifier_torch, **kwargs):
    super().__init__(**kwargs)
    self.bert = tb.keras.TorchLayer(LogitsOnly(classifier_torch), name="bert")
    self.traces = []
    self.built = True  # every weight exists already: the TorchLayer made them

  def call(self, inputs, training=None):
    input_ids_tf, attention_mask_tf = inputs["input_ids"], inputs["attention_mask"]
    if not tf.executing_eagerly():
      self.traces.append((bool(training), input_ids_tf.shape.as_list()))
    return self.bert(input_ids_tf, attention_mask_tf, training=training)


def build_classifier(args, seed):
  """The torch classifier: from `--pretrained DIR`, or random from a config."""
  torch.manual_seed(seed)
  if args.pretrained:
    return transformers.AutoModelForSequenceClassification.from_pretrained(
      args.pretrained, num_labels=NUM_LABELS, local_files_only=True
    )
  sizes = {} if args.base else TINY  # BertConfig's defaults are BERT-base's
  return transformers.BertForSequenceClassification(
    transformers.BertConfig(num_labels=NUM_LABELS, **sizes)
  )


def synthetic_texts(n, vocab_size, max_length, seed):
  """`n` sequences of token ids in [1, vocab_size) and their labels. Most
  sequences are short and a few long (4 tokens and more, at most
  `max_length`), as in text, so that batch lengths vary."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, NUM_LABELS, n)
  lengths = np.minimum(3 + rng.geometric(1 / 6, n), max_length)
  half = vocab_size // 2
  texts = []
  for label, size in zip(labels, lengths):
    low = rng.random(size) < (0.8 if label else 0.2)
    texts.append(np.where(low, rng.integers(1, half, size), rng.integers(half, vocab_size, size)))
  return texts, labels


def padded_batches(texts, labels, batch_size, shuffle_seed=None):
  """A tf.data pipeline with dynamic padding: each batch is padded with
  id 0 to its own longest sequence; the mask is 0 on the padding."""
  dataset = tf.data.Dataset.from_tensor_slices((tf.ragged.constant(texts, tf.int64), labels))
  if shuffle_seed is not None:
    dataset = dataset.shuffle(len(texts), seed=shuffle_seed)
  dataset = dataset.map(
    lambda ids, label: ({"input_ids": ids, "attention_mask": tf.ones_like(ids)}, label)
  )
  return dataset.padded_batch(batch_size).prefetch(tf.data.AUTOTUNE)


def captures(layer):
  """The call signatures the layer's graph calls captured, and the runner
  each took. torchbridge has no public count of them: this reads its
  stores, as its tests do (`tb.timeline()`'s `runners` says the latest
  runner only)."""
  runners = layer._runners  # pylint: disable=protected-access
  stores = {}
  if runners.tf_runner is not None:
    stores["tf"] = runners.tf_runner.captures.entries
  if "torch_runner" in vars(runners):  # made by the first call that runs torch
    stores["torch (C++)"] = runners.torch_runner.captures.entries
  found = []
  for key in sorted({k for entries in stores.values() for k in entries}, key=str):
    mode, _, shapes, _ = key
    ran = [runner for runner, entries in stores.items() if isinstance(entries.get(key), tuple)]
    refusal = stores.get("tf", {}).get(key)
    found.append(
      {
        "mode": {"True": "train", "False": "eval"}.get(mode, "torch's own"),
        "shapes": [list(shape) for shape, _ in shapes],
        "runner": ran[0] if ran else "torch (Python)",
        "why_not_tf": "" if isinstance(refusal, tuple) or refusal is None else refusal.said(),
      }
    )
  return found


def restores_exactly(model, classifier_torch, seed):
  """Whether `save_weights` / `load_weights` carry `model`'s weights into
  a fresh, differently initialized model, every value equal."""
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "classifier.weights.h5")
    model.save_weights(path)
    torch.manual_seed(seed)
    restored = TextClassifier(type(classifier_torch)(classifier_torch.config))
    trained = model.bert.get_weights_by_name()
    fresh = restored.bert.get_weights_by_name()
    differed = any(not np.array_equal(fresh[k], v) for k, v in trained.items())
    restored.load_weights(path)
    fresh = restored.bert.get_weights_by_name()
    return differed and all(np.array_equal(fresh[k], v) for k, v in trained.items())


def score(served, dataset):
  """The mean cross-entropy and the accuracy of `served` on `dataset`."""
  losses_tf, correct_tf = [], []
  for inputs_tf, labels_tf in dataset:
    logits_tf = served(inputs_tf["input_ids"], inputs_tf["attention_mask"])
    losses_tf.append(tf.nn.sparse_softmax_cross_entropy_with_logits(labels_tf, logits_tf))
    correct_tf.append(tf.cast(tf.argmax(logits_tf, -1) == labels_tf, tf.float32))
  loss_tf = tf.reduce_mean(tf.concat(losses_tf, 0))
  return float(loss_tf), float(tf.reduce_mean(tf.concat(correct_tf, 0)))


def serve_without_torch(served, batch_np, tmp):
  """Saves `served`, and runs it on `batch_np` in a process that imports
  TensorFlow and numpy only: (its logits, {"torch": imported?, ...})."""
  path, batch_path, logits_path = (os.path.join(tmp, n) for n in ("served", "batch.npz", "out.npy"))
  tf.saved_model.save(served, path)
  np.savez(batch_path, **batch_np)
  process = subprocess.run(
    [sys.executable, "-c", SERVE, path, batch_path, logits_path],
    capture_output=True,
    text=True,
    check=False,
  )
  if process.returncode != 0:
    raise RuntimeError(f"the serving process failed:\n{process.stderr[-3000:]}")
  return np.load(logits_path), json.loads(process.stdout.strip().splitlines()[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  size = parser.add_mutually_exclusive_group()
  size.add_argument("--tiny", action="store_true", help="a tiny BERT from a config (the default)")
  size.add_argument("--base", action="store_true", help="BERT-base's size from a config")
  size.add_argument("--pretrained", metavar="DIR", help="a local save_pretrained directory")
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--examples", type=int, default=384, help="training sequences")
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument(
    "--learning-rate", type=float, help="default: 2e-3 tiny, 5e-5 --base and --pretrained"
  )
  parser.add_argument("--max-length", type=int, default=32, help="the longest sequence")
  parser.add_argument("--save-pretrained", metavar="DIR", help="write the trained classifier")
  parser.add_argument("--json", action="store_true", help="end with the summary as JSON")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  start = time.perf_counter()
  keras.utils.set_random_seed(args.seed)  # Python's, numpy's and TF's
  transformers.utils.logging.disable_progress_bar()
  if args.learning_rate is None:
    args.learning_rate = 5e-5 if args.base or args.pretrained else 2e-3

  classifier_torch = build_classifier(args, args.seed)
  vocab_size = classifier_torch.config.vocab_size
  model = TextClassifier(classifier_torch)
  model.compile(
    optimizer=keras.optimizers.Adam(args.learning_rate),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
  )
  # Adam's slots made now, not in the first trace of the training step
  # (TF traces a function again when its first trace made variables).
  model.optimizer.build(model.trainable_variables)
  train = padded_batches(
    *synthetic_texts(args.examples, vocab_size, args.max_length, args.seed),
    args.batch_size,
    shuffle_seed=args.seed,
  )
  held_out_texts, held_out_labels = synthetic_texts(
    HELD_OUT, vocab_size, args.max_length, args.seed + 1
  )
  held_out = padded_batches(held_out_texts, held_out_labels, args.batch_size)
  batch_lengths = sorted({int(inputs_tf["input_ids"].shape[1]) for inputs_tf, _ in train})
  print(f"{type(classifier_torch).__name__}: {classifier_torch.num_parameters():,} parameters")
  print(f"training batches: token ids {train.element_spec[0]['input_ids'].shape}, ", end="")
  print(f"padded to lengths {batch_lengths}")

  # The eval-mode model as TF ops reading the same variables that fit trains:
  # made once, it scores the held-out set before and after training.
  signature = [
    tf.TensorSpec([None, None], tf.int64, name="input_ids"),
    tf.TensorSpec([None, None], tf.int64, name="attention_mask"),
  ]
  batch_np = {k: v.numpy() for k, v in next(iter(held_out))[0].items()}
  served = tb.translate(
    model.bert,
    input_signature=signature,
    example_inputs=[batch_np["input_ids"], batch_np["attention_mask"]],  # ids in the vocabulary
  )
  loss_before, _ = score(served, held_out)
  losses = model.fit(train, epochs=args.epochs, verbose=0).history["loss"]
  loss_after, accuracy = score(served, held_out)
  print(f"held-out loss: {loss_before:.4f} before training, {loss_after:.4f} after", end="")
  print(f" (accuracy {accuracy:.3f}; scored by the translation)")
  print("training loss by epoch: " + ", ".join(f"{v:.4f}" for v in losses))
  print(f"graphs Keras traced the model into: {len(model.traces)} (training, token ids' shape)")
  for training, shape in model.traces:
    print(f"  {training!s:5} {shape}")
  found = captures(model.bert)
  print(f"call signatures torchbridge captured: {len(found)} (mode, shapes: runner)")
  for c in found:
    why = f" ({c['why_not_tf']})" if c["why_not_tf"] else ""
    print(f"  {c['mode']:5} {c['shapes']}: {c['runner']}{why}")

  weights_equal = restores_exactly(model, classifier_torch, args.seed + 1)
  print(f"weights restored into a fresh model: equal = {weights_equal}")
  if args.save_pretrained:  # the torch module holds what TF trained
    model.bert.torch_module.classifier.save_pretrained(args.save_pretrained)
    print(f"Hugging Face checkpoint written to {args.save_pretrained}")

  # Serving: the translation saved, and loaded where torch is not.
  with tempfile.TemporaryDirectory() as tmp:
    logits_served, imported = serve_without_torch(served, batch_np, tmp)
  with torch.no_grad():
    trained_torch = model.bert.torch_module.eval()  # the torch model, holding what TF trained
    logits_torch = trained_torch(
      torch.from_numpy(batch_np["input_ids"]), torch.from_numpy(batch_np["attention_mask"])
    ).numpy()
  served_diff = float(np.max(np.abs(logits_served - logits_torch)))
  print(
    f"served {list(batch_np['input_ids'].shape)} in a process without torch "
    f"(torch imported there: {imported['torch']}): largest |served - torch| = {served_diff:.2e}"
  )
  seconds = time.perf_counter() - start
  print(f"{seconds:.1f} s in all, the imports left out")
  if args.json:
    summary = {
      "batch_lengths": batch_lengths,
      "losses": losses,
      "held_out_loss_before": loss_before,
      "held_out_loss_after": loss_after,
      "held_out_accuracy": accuracy,
      "traces": model.traces,
      "captures": found,
      "weights_restored_equal": weights_equal,
      "served_shape": list(batch_np["input_ids"].shape),
      "served_batch": {k: v.tolist() for k, v in batch_np.items()},
      "served_max_diff": served_diff,
      "served_logits": logits_served.tolist(),
      "torch_logits": logits_torch.tolist(),
      "serving_process_imported": imported,
      "seconds": seconds,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
  main()
