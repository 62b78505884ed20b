"""Real-size models, one contender per process: BERT-base, GPT-2 small and
ResNet-18, trained (and GPT-2 run for inference) in torch and from TF.

Usage:
  python -m benchmarks.real_models [--tiny] [--rounds 2] [--steps 5]
      [--tasks bert-train ...] [--contenders pure auto ...] [--out DIR]
  python -m benchmarks.real_models --one TASK CONTENDER [--tiny] [--steps 5]
  python -m benchmarks.real_models --table [benchmarks/results/real_models.json]

Tasks (full size; `--tiny` shrinks each to 2 layers, hidden 32, batch
2 x 16 tokens, a ResNet with one block a stage on 32 x 32 images, for smoke
runs):

- `bert-train`: BERT-base (`transformers.BertConfig` defaults, random init,
  sdpa attention, no pooler), batch 8 x 128 token ids, loss
  mean(last_hidden_state ** 2), Adam 1e-4.
- `gpt2-train`: GPT-2 small (`transformers.GPT2Config` defaults, sdpa
  attention, the LM head tied to the token embedding), batch 8 x 128, loss
  the next-token cross-entropy on the ids themselves, Adam 1e-4.
- `gpt2-infer`: the same GPT-2 forward with its causal mask, eval mode, no
  gradient; the figure recorded as "loss" is the same cross-entropy.
- `resnet18-train`: torchvision's ResNet-18 (its definition, copied here
  where torchvision cannot be imported: its PyPI wheel needs a CUDA
  torch), batch 16 x 3 x 224 x 224 (NCHW), cross-entropy on random labels
  over 1000 classes, SGD 0.01 with momentum 0.9.
- `resnet18-train-cl`: the same, channels-last: the images are NHWC (TF's
  own layout); the torch module permutes them to an NCHW view whose memory
  is channels-last and holds its weights channels-last
  (`memory_format=torch.channels_last`), so torch runs its channels-last
  kernels. For the Keras contender channels-last is Keras' default
  `data_format` (NHWC); `resnet18-train` gives it `channels_first`.

Contenders: `pure` (eager torch, torch's optimizer), `auto`
(`tb.TorchModule(net)`, the default runner, in a `tf.function` train step
with a Keras optimizer), `torch` (`run="torch"`), `keras-hub` (the
TF-native `keras_hub.models` backbone at the same sizes, the same loss
and a Keras optimizer in a `tf.function` step; its weights are its own
init, so its loss is not compared), and `auto-second`: `auto` again in a
new process sharing the first's `TORCHBRIDGE_CAPTURE_CACHE` directory (a
fresh one per task and round; `auto` runs first, `auto-second` right
after it). The torchbridge contenders wrap the torch module pure torch
trains, built from the same seed, so their first loss is pure torch's
(within dropout's noise where the model has dropout).

Per process: the first step's seconds (from just before its first call,
the model built), the median of `--steps` steady steps after it, resident
memory after building the model and the process's peak (ru_maxrss), which
runner each module took (`tb.timeline`'s `runners`), the parameter count
and every step's loss. The orchestrator runs each (task, contender) in a
process of its own, nothing else meanwhile, rounds alternated (every
contender of a task once per round, the order rotating from round to
round), and writes `results/real_models.json` (with the commit, the date
and the machine) and `results/real_models.md` (`markdown()`), which
docs/performance/real-models.md includes. `make bench-real` installs the
benchmark-only packages (keras-hub) and runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402

from benchmarks import harness  # noqa: E402

TASKS = {
  "bert-train": ("bert", "train", "BERT-base, training"),
  "gpt2-train": ("gpt2", "train", "GPT-2 small, training"),
  "gpt2-infer": ("gpt2", "infer", "GPT-2 small, inference (causal mask)"),
  "resnet18-train": ("resnet18", "train", "ResNet-18, training, NCHW"),
  "resnet18-train-cl": ("resnet18", "train", "ResNet-18, training, channels-last"),
}
CONTENDERS = ("pure", "auto", "auto-second", "torch", "keras-hub")
LABELS = {
  "pure": "pure torch",
  "auto": "torchbridge (default runner)",
  "auto-second": "torchbridge, second process (capture cache)",
  "torch": 'torchbridge, run="torch"',
  "keras-hub": "keras-hub (TF-native)",
}
SIZES = {
  "bert": {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072, "vocab": 30522},
  "gpt2": {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072, "vocab": 50257},
  "resnet18": {"blocks": [2, 2, 2, 2], "widths": [64, 128, 256, 512], "classes": 1000},
}
TINY_SIZES = {
  "bert": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64, "vocab": 1000},
  "gpt2": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 128, "vocab": 1000},
  # keras-hub's ResNet takes 64 filters in its first stage only.
  "resnet18": {"blocks": [1, 1, 1, 1], "widths": [64, 128, 256, 512], "classes": 10},
}
BATCH = {"bert": (8, 128), "gpt2": (8, 128), "resnet18": (16, 224)}
TINY_BATCH = {"bert": (2, 16), "gpt2": (2, 16), "resnet18": (2, 32)}
# A torchbridge contender's first loss against pure torch's, relative: the
# same weights and inputs; dropout's masks differ (training transformers).
LOSS_TOLERANCE = {"dropout": 2e-2, "deterministic": 1e-3}
SLOW_STEP = 1.10  # steady step / pure torch's above which the docs give the reason


# ---- the torch models ------------------------------------------------------


class _BasicBlock(torch.nn.Module):
  """torchvision's `BasicBlock` (torchvision/models/resnet.py)."""

  def __init__(self, inplanes, planes, stride=1, downsample=None):
    super().__init__()
    self.conv1 = torch.nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
    self.bn1 = torch.nn.BatchNorm2d(planes)
    self.relu = torch.nn.ReLU(inplace=True)
    self.conv2 = torch.nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
    self.bn2 = torch.nn.BatchNorm2d(planes)
    self.downsample = downsample
    self.stride = stride

  def forward(self, x):
    identity = x
    out = self.relu(self.bn1(self.conv1(x)))
    out = self.bn2(self.conv2(out))
    if self.downsample is not None:
      identity = self.downsample(x)
    out += identity
    return self.relu(out)


class _ResNet(torch.nn.Module):
  """torchvision's `ResNet(BasicBlock, blocks)`: the same modules, built in
  the same order and initialised the same way, so a seed gives torchvision's
  weights (`widths` other than 64-512 for tiny runs only)."""

  def __init__(self, blocks, widths, classes):
    super().__init__()
    self.inplanes = widths[0]
    self.conv1 = torch.nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
    self.bn1 = torch.nn.BatchNorm2d(widths[0])
    self.relu = torch.nn.ReLU(inplace=True)
    self.maxpool = torch.nn.MaxPool2d(3, 2, 1)
    for k, (n, width) in enumerate(zip(blocks, widths)):
      setattr(self, f"layer{k + 1}", self._make_layer(width, n, 1 if k == 0 else 2))
    self.avgpool = torch.nn.AdaptiveAvgPool2d((1, 1))
    self.fc = torch.nn.Linear(widths[-1], classes)
    for m in self.modules():
      if isinstance(m, torch.nn.Conv2d):
        torch.nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
      elif isinstance(m, torch.nn.BatchNorm2d):
        torch.nn.init.constant_(m.weight, 1)
        torch.nn.init.constant_(m.bias, 0)

  def _make_layer(self, planes, blocks, stride):
    downsample = None
    if stride != 1 or self.inplanes != planes:
      downsample = torch.nn.Sequential(
        torch.nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), torch.nn.BatchNorm2d(planes)
      )
    layers = [_BasicBlock(self.inplanes, planes, stride, downsample)]
    self.inplanes = planes
    layers += [_BasicBlock(planes, planes) for _ in range(1, blocks)]
    return torch.nn.Sequential(*layers)

  def forward(self, x):
    x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
    x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
    return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet(sizes):
  """ResNet-18 (or the tiny one): torchvision's where it imports and the
  sizes are ResNet-18's, else the copy above. Returns (module, source)."""
  if sizes == SIZES["resnet18"]:
    try:
      import torchvision  # pylint: disable=import-outside-toplevel

      return torchvision.models.resnet18(), f"torchvision {torchvision.__version__}"
    except Exception:  # pylint: disable=broad-except  (its CUDA wheel on a CPU torch)
      pass
  return _ResNet(**sizes), "torchvision's ResNet definition, copied (benchmarks/real_models.py)"


class _Hidden(torch.nn.Module):
  def __init__(self, bert):
    super().__init__()
    self.bert = bert

  def forward(self, ids):
    return self.bert(input_ids=ids).last_hidden_state


class _Logits(torch.nn.Module):
  def __init__(self, lm):
    super().__init__()
    self.lm = lm

  def forward(self, ids):
    return self.lm(input_ids=ids).logits


class _Images(torch.nn.Module):
  """A classifier on NCHW images, or on NHWC ones viewed as NCHW (the view's
  memory is channels-last)."""

  def __init__(self, net, nhwc):
    super().__init__()
    self.net = net
    self.nhwc = nhwc

  def forward(self, images):
    return self.net(images.permute(0, 3, 1, 2) if self.nhwc else images)


def torch_model(task, tiny):
  """(module, inputs, labels, info): the task's torch module built from seed
  0 and its inputs from seed 1, as torch tensors (labels: see
  `torch_loss`)."""
  model = TASKS[task][0]
  sizes = (TINY_SIZES if tiny else SIZES)[model]
  batch, length = (TINY_BATCH if tiny else BATCH)[model]
  inputs = torch.Generator().manual_seed(1)
  torch.manual_seed(0)
  info, labels = {}, None
  if model != "resnet18":
    import transformers  # pylint: disable=import-outside-toplevel

    info["transformers"] = transformers.__version__
  if model == "bert":
    config = transformers.BertConfig(
      vocab_size=sizes["vocab"],
      hidden_size=sizes["hidden"],
      num_hidden_layers=sizes["layers"],
      num_attention_heads=sizes["heads"],
      intermediate_size=sizes["intermediate"],
      attn_implementation="sdpa",
    )
    net = _Hidden(transformers.BertModel(config, add_pooling_layer=False))
    x = torch.randint(0, sizes["vocab"], (batch, length), generator=inputs)
  elif model == "gpt2":
    config = transformers.GPT2Config(
      vocab_size=sizes["vocab"],
      n_embd=sizes["hidden"],
      n_layer=sizes["layers"],
      n_head=sizes["heads"],
      n_inner=sizes["intermediate"],
      attn_implementation="sdpa",
    )
    net = _Logits(transformers.GPT2LMHeadModel(config))
    x = torch.randint(0, sizes["vocab"], (batch, length), generator=inputs)
    labels = x
  else:
    channels_last = task.endswith("-cl")
    body, info["resnet"] = resnet(sizes)
    net = _Images(body, nhwc=channels_last)
    if channels_last:
      net = net.to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, length, length, generator=inputs)
    if channels_last:  # the same values, held NHWC
      x = x.permute(0, 2, 3, 1).contiguous()
    labels = torch.randint(0, sizes["classes"], (batch,), generator=inputs)
  return net, x, labels, info


def torch_loss(task, out, labels):
  """The task's loss in torch; `labels`: the class labels (ResNet), the
  token ids (GPT-2: the next token's), None (BERT)."""
  model = TASKS[task][0]
  if model == "bert":
    return (out**2).mean()
  if model == "gpt2":
    return torch.nn.functional.cross_entropy(
      out[:, :-1].reshape(-1, out.shape[-1]), labels[:, 1:].reshape(-1)
    )
  return torch.nn.functional.cross_entropy(out, labels)


def tf_loss(task, out, labels):
  """`torch_loss` in TF."""
  model = TASKS[task][0]
  if model == "bert":
    return tf.reduce_mean(out**2)
  if model == "gpt2":
    return tf.reduce_mean(
      tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels[:, 1:], logits=out[:, :-1])
    )
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=out))


# ---- one process: one contender's steps ------------------------------------


def _torch_optimizer(task, params):
  if TASKS[task][0] == "resnet18":
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)
  return torch.optim.Adam(params, 1e-4)


def _keras_optimizer(task):
  if TASKS[task][0] == "resnet18":
    return tf.keras.optimizers.SGD(0.01, momentum=0.9)
  return tf.keras.optimizers.Adam(1e-4)


def _pure_step(task, tiny):
  net, x, labels, info = torch_model(task, tiny)
  if TASKS[task][1] == "infer":
    net.eval()

    def step():
      with torch.no_grad():
        return float(torch_loss(task, net(x), labels))

    return step, net, info
  net.train()
  opt = _torch_optimizer(task, net.parameters())

  def step():
    opt.zero_grad()
    loss = torch_loss(task, net(x), labels)
    loss.backward()
    opt.step()
    return loss.item()

  return step, net, info


def _tf_step(task, forward, variables, optimizer, x, labels):
  """A `tf.function` step: the forward, the loss, and (training) the
  gradients applied by `optimizer`; variables without a gradient (a
  pooler the loss does not read) are left out."""
  if TASKS[task][1] == "infer":

    @tf.function
    def infer(x, labels):
      return tf_loss(task, forward(x, False), labels)

    return lambda: float(infer(x, labels))

  @tf.function
  def train(x, labels):
    with tf.GradientTape() as tape:
      loss = tf_loss(task, forward(x, True), labels)
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
    return loss

  return lambda: float(train(x, labels))


def _bridged_step(task, tiny, run):
  import torchbridge as tb  # pylint: disable=import-outside-toplevel

  net, x, labels, info = torch_model(task, tiny)
  module = tb.TorchModule(net, name=TASKS[task][0], run=run)
  x_tf = tf.constant(x.numpy())
  labels_tf = tf.zeros([0], tf.int64) if labels is None else tf.constant(labels.numpy())
  variables = module.trainable_variables
  step = _tf_step(
    task,
    lambda x, training: module(x, training=training),
    variables,
    _keras_optimizer(task),
    x_tf,
    labels_tf,
  )
  return step, net, info


def _keras_hub_model(task, tiny):
  """(forward(x, training), variables, x, labels, info), or a str: why not."""
  try:
    import keras  # pylint: disable=import-outside-toplevel
    import keras_hub  # pylint: disable=import-outside-toplevel
  except ImportError as error:
    return f"keras-hub not importable ({error}); `make bench-real` installs it"
  model = TASKS[task][0]
  sizes = (TINY_SIZES if tiny else SIZES)[model]
  batch, length = (TINY_BATCH if tiny else BATCH)[model]
  keras.utils.set_random_seed(0)
  info = {"keras_hub": keras_hub.__version__, "keras": keras.__version__}
  common = {
    "vocabulary_size": sizes.get("vocab"),
    "num_layers": sizes.get("layers"),
    "num_heads": sizes.get("heads"),
    "hidden_dim": sizes.get("hidden"),
    "intermediate_dim": sizes.get("intermediate"),
    "dropout": 0.1,
  }
  ids = tf.random.stateless_uniform(
    [batch, length], [1, 0], 0, sizes.get("vocab") or 1, dtype=tf.int32
  )
  mask = tf.ones([batch, length], tf.int32)
  labels = ids
  if model == "bert":
    backbone = keras_hub.models.BertBackbone(**common)
    x = {"token_ids": ids, "segment_ids": tf.zeros_like(ids), "padding_mask": mask}

    def forward(x, training):
      return backbone(x, training=training)["sequence_output"]

  elif model == "gpt2":
    backbone = keras_hub.models.GPT2Backbone(**common)
    x = {"token_ids": ids, "padding_mask": mask}

    def forward(x, training):
      hidden = backbone(x, training=training)
      return backbone.token_embedding(hidden, reverse=True)

  else:
    channels_last = task.endswith("-cl")
    data_format = "channels_last" if channels_last else "channels_first"
    shape = (length, length, 3) if channels_last else (3, length, length)
    body = keras_hub.models.ResNetBackbone(
      input_conv_filters=[sizes["widths"][0]],
      input_conv_kernel_sizes=[7],
      stackwise_num_filters=sizes["widths"],
      stackwise_num_blocks=sizes["blocks"],
      stackwise_num_strides=[1, 2, 2, 2],
      block_type="basic_block",
      use_pre_activation=False,
      image_shape=shape,
      data_format=data_format,
    )
    images = keras.Input(shape)
    pooled = keras.layers.GlobalAveragePooling2D(data_format=data_format)(body(images))
    backbone = keras.Model(images, keras.layers.Dense(sizes["classes"])(pooled))
    x = tf.random.stateless_normal([batch, *shape], [1, 0])
    labels = tf.random.stateless_uniform([batch], [1, 1], 0, sizes["classes"], dtype=tf.int32)
    info["data_format"] = data_format

    def forward(x, training):
      return backbone(x, training=training)

  variables = backbone.trainable_variables
  info["parameters"] = int(sum(v.shape.num_elements() for v in variables))
  return forward, variables, x, labels, info


def _keras_hub_step(task, tiny):
  built = _keras_hub_model(task, tiny)
  if isinstance(built, str):
    return built
  forward, variables, x, labels, info = built
  return _tf_step(task, forward, variables, _keras_optimizer(task), x, labels), None, info


def _rss_mb():
  with open("/proc/self/status") as f:
    line = next(line for line in f if line.startswith("VmRSS:"))
  return int(line.split()[1]) / 1024


def _runners():
  """Which runner each module's graph calls took (`tb.timeline`'s record,
  read by an empty recording)."""
  import torchbridge as tb  # pylint: disable=import-outside-toplevel

  with tb.timeline(annotate=False) as trace:
    pass
  return trace.runners


def one(task, contender, tiny, steps, threads):
  """Builds and times one contender on one task; returns its JSON record."""
  harness.configure_threads(threads)
  record = {"task": task, "contender": contender, "tiny": tiny, "pid": os.getpid()}
  if contender == "pure":
    built = _pure_step(task, tiny)
  elif contender == "keras-hub":
    built = _keras_hub_step(task, tiny)
  else:
    built = _bridged_step(task, tiny, "torch" if contender == "torch" else "auto")
  if isinstance(built, str):
    return record | {"skipped": built}
  step, net, info = built
  if net is not None:
    info["parameters"] = sum(p.numel() for p in net.parameters() if p.requires_grad)
  record["rss_built_mb"] = round(_rss_mb(), 1)
  times, losses = [], []
  for _ in range(steps + 1):
    start = time.perf_counter()
    losses.append(step())
    times.append(time.perf_counter() - start)
  return record | {
    "first_step_s": round(times[0], 3),
    "steady_step_s": round(statistics.median(times[1:]), 4) if steps else None,
    "steps_s": [round(t, 4) for t in times[1:]],
    "first_loss": losses[0],
    "losses": losses,
    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    "runners": _runners() if contender not in ("pure", "keras-hub") else {},
    "capture_cache": os.environ.get("TORCHBRIDGE_CAPTURE_CACHE"),
    "torch": torch.__version__,
    "tensorflow": tf.__version__,
    **info,
  }


# ---- the orchestrator --------------------------------------------------------


@contextlib.contextmanager
def _environment(**values):
  """os.environ with `values` set (None: unset) meanwhile: what a process
  started inside inherits."""
  saved = {k: os.environ.get(k) for k in values}
  try:
    for k, v in values.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    yield
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


def _units(contenders, rotation):
  """The contenders as units run back to back (`auto` then `auto-second`,
  which reads what `auto` left in the cache), rotated by `rotation`."""
  units = []
  for name in contenders:
    if name == "auto-second" and "auto" in contenders:
      continue
    units.append(
      ["auto", "auto-second"] if name == "auto" and "auto-second" in contenders else [name]
    )
  k = rotation % len(units) if units else 0
  return units[k:] + units[:k]


def measure(tasks, contenders, rounds, steps, tiny, threads, quiet_wait, log=print):
  """Every (task, contender) in a process of its own, `rounds` rounds:
  per task, each contender once a round, the order rotating; returns
  ({task: {contender: [records, one a round]}}, the processes that failed
  twice, each as {"task", "contender", "round", "error"})."""
  results = {task: {c: [] for c in contenders} for task in tasks}
  failures = []
  args = ["--steps", steps, "--threads", threads] + (["--tiny"] if tiny else [])
  timeout = 600 if tiny else 3600
  for r in range(rounds):
    for task in tasks:
      cache = tempfile.mkdtemp(prefix=f"capture_cache_{task}_")
      try:
        for unit in _units(contenders, r):
          for name in unit:
            log(f"round {r + 1}/{rounds}: {task} {name}")
            cached = cache if name in ("auto", "auto-second") else None
            variable = "TORCHBRIDGE_CAPTURE_CACHE"
            try:
              with _environment(**{variable: cached}):
                record = harness.run_process(
                  "benchmarks.real_models",
                  ["--one", task, name, *args],
                  timeout=timeout,
                  quiet_wait=quiet_wait,
                  retries=1,
                )
            except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as error:
              failures.append(
                {"task": task, "contender": name, "round": r + 1, "error": str(error)[-3000:]}
              )
              said = [line for line in str(error).splitlines() if line.strip()]
              record = {"task": task, "contender": name, "failed": said[-1] if said else ""}
            record["round"] = r + 1
            results[task][name].append(record)
      finally:
        shutil.rmtree(cache, ignore_errors=True)
  return results, failures


def _median(records, key):
  values = [r[key] for r in records if r.get(key) is not None]
  return statistics.median(values) if values else None


def _runner_text(runners):
  """`tf`, `torch (C++)`, ... for each module (one module: its runner)."""
  shown = []
  for entry in runners.values():
    text = entry["runner"]
    if entry.get("path"):
      text += f" ({entry['path']})"
    shown.append(text)
  return ", ".join(sorted(set(shown))) or "-"


def summarize(results):
  """Per task and contender: the medians over rounds, the ratio of the
  steady step to pure torch's, the runner, and whether the first loss
  matches pure torch's."""
  out = {}
  for task, by_contender in results.items():
    summary = {}
    for name, records in by_contender.items():
      done = [r for r in records if "first_step_s" in r]
      row = {"processes": records}
      if not done:
        row["skipped" if any("skipped" in r for r in records) else "failed"] = next(
          (r.get("skipped") or r.get("failed") for r in records), "not run"
        )
        summary[name] = row
        continue
      row.update(
        first_step_s=_median(done, "first_step_s"),
        steady_step_s=_median(done, "steady_step_s"),
        peak_rss_mb=_median(done, "peak_rss_mb"),
        rss_built_mb=_median(done, "rss_built_mb"),
        first_loss=_median(done, "first_loss"),
        parameters=done[0].get("parameters"),
        runners=done[-1].get("runners", {}),
        runner=_runner_text(done[-1].get("runners", {})),
      )
      summary[name] = row
    pure = summary.get("pure", {})
    dropout = TASKS[task][1] == "train" and TASKS[task][0] != "resnet18"
    tolerance = LOSS_TOLERANCE["dropout" if dropout else "deterministic"]
    for name, row in summary.items():
      if "steady_step_s" not in row:
        continue
      if pure.get("steady_step_s"):
        row["ratio_to_pure"] = row["steady_step_s"] / pure["steady_step_s"]
      if name not in ("pure", "keras-hub") and pure.get("first_loss") is not None:
        diff = abs(row["first_loss"] - pure["first_loss"]) / max(abs(pure["first_loss"]), 1e-12)
        row["first_loss_rel_diff"] = diff
        row["first_loss_matches_pure"] = diff <= tolerance
        row["loss_tolerance"] = tolerance
    out[task] = summary
  return out


def _machine(env):
  try:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  except (ValueError, OSError):
    memory = float("nan")
  return f"{env['cpu_count']} cores ({env['cpu']}), {memory:.0f} GiB memory, no GPU"


def model_sizes(tiny):
  """Each model's sizes and its batch: {"batch", "length"} (token ids) or
  {"batch", "image"} (square images)."""
  out = {}
  for model, sizes in (TINY_SIZES if tiny else SIZES).items():
    batch, length = (TINY_BATCH if tiny else BATCH)[model]
    out[model] = sizes | {"batch": batch, "image" if model == "resnet18" else "length": length}
  return out


def results_data(results, failures, args):
  env = harness.environment(args.threads, "cpu")
  what = (
    "Each (task, contender) in a process of its own, nothing else run meanwhile, "
    f"{args.rounds} round(s) alternated (each contender of a task once a round, the "
    f"order rotating); first step from just before its first call (model built), "
    f"steady step the median of {args.steps} steps after it; medians over rounds "
    "(benchmarks/real_models.py)"
  )
  return {
    "what": ("TINY SMOKE RUN (--tiny: not real sizes). " if args.tiny else "") + what,
    "tiny": args.tiny,
    "commit": (env["source"]["commit"] or "")[:10],
    "source": env["source"],
    "date": datetime.date.today().isoformat(),
    "machine": _machine(env),
    "environment": env,
    "rounds": args.rounds,
    "steps": args.steps,
    "threads": args.threads,
    "sizes": model_sizes(args.tiny),
    "tasks": summarize(results),
    "failures": failures,
    # Processes that failed and were started again (harness.run_process).
    "retried": harness.FAILURES,
  }


def _sizes_text(sizes):
  parts = []
  for model, z in sizes.items():
    if "image" in z:
      blocks = "-".join(map(str, z["blocks"]))
      parts.append(
        f"{model}: blocks {blocks}, {z['classes']} classes, batch {z['batch']} x 3 x "
        f"{z['image']} x {z['image']}"
      )
    else:
      parts.append(
        f"{model}: {z['layers']} layers, hidden {z['hidden']}, vocabulary {z['vocab']}, "
        f"batch {z['batch']} x {z['length']}"
      )
  return "; ".join(parts)


def _fmt(value, digits=2):
  return "-" if value is None else f"{value:.{digits}f}"


def _rounds_text(rounds):
  """The rounds a results file records, in words: 2 -> "2 alternated
  rounds"; a run that gave some rows fewer records its rounds as text,
  "2 (pure torch, ...; 1 for ...)" -> "2 alternated rounds (pure torch,
  ...; 1 for ...)"."""
  count, _, rest = str(rounds).partition(" ")
  if not count.isdigit():
    return f"alternated rounds: {rounds}"
  words = f"{count} alternated round{'' if count == '1' else 's'}"
  return f"{words} {rest}" if rest else words


def markdown(data):
  """The table of a results file's `tasks` (what the docs page includes)."""
  tiny = data.get("tiny")
  lines = []
  if tiny:
    lines += [
      "**Tiny smoke run (`--tiny`), not real sizes: these figures say nothing "
      "about real models. `make bench-real` writes the real ones.**",
      "",
    ]
  lines += [
    f"Measured at {data['commit']} on {data['date']}, {data['machine']}; "
    f"{_rounds_text(data['rounds'])}, {data['threads']} threads, one process per "
    f"row and round; steady step: the median of {data['steps']} steps.",
    "",
    f"Sizes: {_sizes_text(data['sizes'])}.",
    "",
    "| model, task | contender | first step (s) | steady step (s) | / pure torch "
    "| peak RSS (MB) | RSS built (MB) | runner | first loss |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  slow, notes = [], []
  for task, summary in data["tasks"].items():
    label = TASKS[task][2] if task in TASKS else task
    for name, row in summary.items():
      contender = LABELS.get(name, name)
      if "steady_step_s" not in row:
        why = str(row.get("skipped") or row.get("failed")).replace("|", "/")
        state = "skipped" if "skipped" in row else "failed"
        lines.append(f"| {label} | {contender} | {state}: {why} | | | | | | |")
        continue
      ratio = row.get("ratio_to_pure")
      loss = f"{row['first_loss']:.5g}"
      if row.get("first_loss_matches_pure") is False:
        loss += " (differs from pure torch's)"
      lines.append(
        f"| {label} | {contender} | {_fmt(row['first_step_s'])} | "
        f"{_fmt(row['steady_step_s'], 3)} | "
        f"{'-' if ratio is None else f'{ratio:.2f}x'} | {_fmt(row['peak_rss_mb'], 0)} | "
        f"{_fmt(row['rss_built_mb'], 0)} | {row['runner']} | {loss} |"
      )
      if ratio is not None and ratio > SLOW_STEP and name != "keras-hub":
        slow.append(f"{label}, {contender}: {ratio:.2f}x")
      for module, entry in row.get("runners", {}).items():
        if entry.get("reason") and name == "auto":
          notes.append(f"{label}, {module}: {entry['runner']}: {entry['reason']}")
  lines.append("")
  lines.append(
    f"Steady steps over {SLOW_STEP:.2f}x pure torch's (torchbridge contenders): "
    + ("; ".join(slow) if slow else "none")
    + "."
  )
  if notes:
    lines += ["", "Why the default runner took the runner it did:", ""]
    lines += [f"- {note}" for note in notes]
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.real_models", description=__doc__)
  parser.add_argument("--one", nargs=2, metavar=("TASK", "CONTENDER"))
  parser.add_argument("--table", nargs="?", const="benchmarks/results/real_models.json")
  parser.add_argument("--tiny", action="store_true", help="tiny configs, for smoke runs")
  parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
  parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--steps", type=int, default=5, help="steady steps timed after the first")
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument(
    "--quiet-wait",
    type=float,
    default=None,
    help="seconds to wait for a quiet machine before each process "
    f"(default {harness.QUIET_MAX_WAIT}, 0 with --tiny)",
  )
  parser.add_argument("--out", default=str(Path(harness.ROOT) / "benchmarks" / "results"))
  args = parser.parse_args(argv)
  if args.one:
    if args.one[0] not in TASKS or args.one[1] not in CONTENDERS:
      parser.error(f"--one TASK CONTENDER: tasks {list(TASKS)}, contenders {list(CONTENDERS)}")
    print(json.dumps(one(*args.one, args.tiny, args.steps, args.threads)))
    return 0
  if args.table:
    print(markdown(json.loads(Path(harness.ROOT, args.table).read_text())), end="")
    return 0
  quiet_wait = (
    args.quiet_wait if args.quiet_wait is not None else (0 if args.tiny else harness.QUIET_MAX_WAIT)
  )
  results, failures = measure(
    args.tasks, args.contenders, args.rounds, args.steps, args.tiny, args.threads, quiet_wait
  )
  data = results_data(results, failures, args)
  harness.write_results(args.out, "real_models", data, markdown(data))
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
