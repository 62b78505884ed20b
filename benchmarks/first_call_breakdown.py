"""Where a real model's first training step goes: BERT-base, one process.

`python benchmarks/first_call_breakdown.py [--run auto|torch|pure]
[--batch 8] [--length 128] [--layers 12]` builds BERT-base from its config
(random init, seed 0), wraps it in `tb.TorchModule` and times the first
and then steady training steps of a `tf.function` (Adam, the mean of the
last hidden state squared as the loss), with each part of the capture
timed where it runs: torch.export, its lowering (per runner), the
translation's op check, the parity check (its torch and its candidate's
side), and what is left (TF's tracing, graph optimisation, the first run).
`--run pure` times the same steps in torch alone, `--run tf-floor` the TF
side alone (Adam on the same variables, the loss their mean squares: no
model, no torch), `--run keras-hub` keras-hub's
TF-native `BertBackbone` of the same sizes (its sequence output for the
last hidden state). For the TF contenders the first step is split where
TF splits it: `get_concrete_function` (both of TF's traces: the first
creates Adam's slots, so TF traces again; the capture runs inside), then
the first run (TF's graph optimisation, the first execution). One JSON
line out.
"""

import argparse
import json
import time

import torch  # first: the recommended order
import tensorflow as tf
import transformers

import torchbridge as tb
from torchbridge._capture import _disk
from torchbridge._capture import _parity
from torchbridge._runners import _tf_runner
from torchbridge._runners import _torch_runner
from torchbridge._translate import _export
from torchbridge._translate import _fx_to_tf

PARTS: dict[str, float] = {}


def _timed(owner, name, label):
  real = getattr(owner, name)

  def timed(*args, **kwargs):
    start = time.perf_counter()
    try:
      return real(*args, **kwargs)
    finally:
      PARTS[label] = PARTS.get(label, 0.0) + time.perf_counter() - start

  setattr(owner, name, timed)


def _model(layers):
  torch.manual_seed(0)
  config = transformers.BertConfig(num_hidden_layers=layers, attn_implementation="sdpa")
  return transformers.BertModel(config, add_pooling_layer=False)


def _keras_hub_bert(layers):
  """keras-hub's BertBackbone at BERT-base's sizes (random init): the
  model, and its forward to the sequence output."""
  import keras_hub  # pylint: disable=import-outside-toplevel  (bench-real installs it)

  backbone = keras_hub.models.BertBackbone(
    vocabulary_size=30522,
    num_layers=layers,
    num_heads=12,
    hidden_dim=768,
    intermediate_dim=3072,
    max_sequence_length=512,
  )

  def forward(ids_tf):
    inputs = {
      "token_ids": ids_tf,
      "segment_ids": tf.zeros_like(ids_tf),
      "padding_mask": tf.ones_like(ids_tf),
    }
    return backbone(inputs, training=True)["sequence_output"]

  return backbone, forward


class _Hidden(torch.nn.Module):
  def __init__(self, bert):
    super().__init__()
    self.bert = bert

  def forward(self, ids):
    return self.bert(input_ids=ids).last_hidden_state


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument(
    "--run", default="auto", choices=["auto", "torch", "pure", "keras-hub", "tf-floor"]
  )
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--length", type=int, default=128)
  parser.add_argument("--layers", type=int, default=12)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument(
    "--build-optimizer",
    action="store_true",
    help="build Adam's slots before the first step (opt.build), outside its timing",
  )
  args = parser.parse_args()
  net = _Hidden(_model(args.layers)).train()
  ids = torch.randint(
    0, 30522, (args.batch, args.length), generator=torch.Generator().manual_seed(1)
  )
  steps = []
  if args.run == "pure":
    opt = torch.optim.Adam(net.parameters(), 1e-4)
    for _ in range(args.steps + 1):
      start = time.perf_counter()
      opt.zero_grad()
      loss = (net(ids) ** 2).mean()
      loss.backward()
      opt.step()
      steps.append(time.perf_counter() - start)
  else:
    if args.run == "keras-hub":
      module, forward = _keras_hub_bert(args.layers)
    else:
      _timed(_export, "export_program", "torch.export")
      _timed(_export, "lowered_export", "lowering")
      _timed(_disk, "load", "capture read from disk")
      _timed(_disk, "keep", "capture written to disk")
      _timed(_fx_to_tf, "untranslated", "op check")
      _timed(_parity, "check", "parity check")
      _timed(_tf_runner, "_translated_side", "parity check: its TF side")
      _timed(_torch_runner, "_cpp_side", "parity check: its C++ side")
      module = tb.TorchModule(net, name="bert", run="auto" if args.run == "tf-floor" else args.run)

      def forward(ids_tf):
        if args.run == "tf-floor":  # what TF's step costs with no model in it
          return tf.stack([tf.reduce_mean(v**2) for v in module.trainable_variables])
        return module(ids_tf, training=True)

    opt = tf.keras.optimizers.Adam(1e-4)
    if args.build_optimizer:
      opt.build(module.trainable_variables)
    ids_tf = tf.constant(ids.numpy())

    @tf.function
    def step(ids_tf):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(forward(ids_tf) ** 2)
      grads = tape.gradient(loss, module.trainable_variables)
      opt.apply_gradients(zip(grads, module.trainable_variables))
      return loss

    start = time.perf_counter()
    step.get_concrete_function(ids_tf)
    PARTS["TF: tracing (twice where Adam's slots are made)"] = time.perf_counter() - start
    for k in range(args.steps + 1):
      start = time.perf_counter()
      float(step(ids_tf))
      steps.append(time.perf_counter() - start)
      if k == 0:
        PARTS["TF: first run (graph optimisation, first execution)"] = steps[0]
        steps[0] += PARTS["TF: tracing (twice where Adam's slots are made)"]
  # The capture's parts run inside TF's tracing.
  capture = sum(v for k, v in PARTS.items() if ":" not in k)
  tracing = PARTS.get("TF: tracing (twice where Adam's slots are made)")
  print(
    json.dumps(
      {
        "run": args.run,
        "optimizer_built_first": args.build_optimizer,
        "batch": args.batch,
        "length": args.length,
        "layers": args.layers,
        "first_step_s": round(steps[0], 2),
        "steady_step_s": round(sorted(steps[1:])[len(steps[1:]) // 2], 3) if steps[1:] else None,
        "parts_s": {k: round(v, 2) for k, v in PARTS.items()},
        "capture_s": round(capture, 2),
        "tracing_besides_the_capture_s": None if tracing is None else round(tracing - capture, 2),
        "torch": torch.__version__,
        "tf": tf.__version__,
      }
    )
  )


if __name__ == "__main__":
  main()
