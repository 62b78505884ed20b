"""Which runner models take by default, and whether they match torch.

Usage:
  python -m benchmarks.runner_coverage [--quick] [--run torch]
      [--out benchmarks/results/runner_coverage.json]
  python -m benchmarks.runner_coverage --render [--run torch] [--out ...]

Every module of torch's own `module_db` (its first float32 sample, as
`tests/_module_db_cases.py` enumerates them; `--quick`: the first 20
modules) and the tiny Hugging Face models of `tests/test_transformers.py`
(`--quick`: none) go through the default `tb.TorchModule` (`run="auto"`)
inside a `tf.function`, in inference (`training=False`) and training
(`training=True`, under a `GradientTape`). Per call it records the
runner the module took (`tf`: its exact TF translation; `torch`: through
the bridge, with the reason) and compares, independently of the capture's
own check, the outputs and the gradients of every floating input and
trainable parameter (for a fixed random cotangent) with torch autograd on
a copy of the module; a module whose torch output is random in that mode
(dropout) is compared by runner only. Outcomes: "tf, matches", "torch"
(the reason), "MISMATCH" (a bug: the call's result differs from torch),
"n/a" (torch itself fails, or no tensor input) and "error".

Writes the records (`--out`, with the commit) and the tally as markdown
beside them (`runner_coverage.md`, which docs/coverage/runners.md
includes); prints the tally. `--render` measures nothing: it writes the
markdown again from the committed records (`--out`), an older record's
torch.export refusal in the words the runners write today where the
record holds what they need (`_reason`).
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import logging
import os
import re
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402

import torchbridge as tb  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks import translate_coverage as tc  # noqa: E402
from torchbridge._runners import _record as _runners  # noqa: E402
from torchbridge._translate import _export_errors  # noqa: E402
from torchbridge._translate import _refusal  # noqa: E402

tf.get_logger().setLevel("ERROR")
logging.getLogger("torch._export").setLevel(logging.ERROR)
db_cases = tc.db_cases
RTOL, ATOL = 1e-4, 1e-5  # float32, atol scaled by the largest |torch value| above 1


def _weights(shape, seed):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _floating(t):
  return isinstance(t, torch.Tensor) and t.is_floating_point()


def compare(target, tensors, training, name, run="auto"):
  """((runner, reason, capture seconds, torch path), problem) of one call
  of `target` on `tensors` through `tb.TorchModule(run=run)`."""
  reference = copy.deepcopy(target)
  bridged = tb.TorchModule(target, name=name, run=run)
  args_tf = [tf.constant(t.detach().numpy()) for t in tensors]
  trainable = list(bridged.trainable_variables)

  @tf.function
  def call(*xs):
    with tf.GradientTape() as tape:
      tape.watch([x for x in xs if x.dtype.is_floating])
      outs = [o for o in tf.nest.flatten(bridged(*xs, training=training)) if o is not None]
      loss = tf.constant(0.0)
      for k, o in enumerate(outs):
        if o.dtype == tf.float32:
          loss += tf.reduce_sum(o * _weights(o.shape, k))
    leaves = [x for x in xs if x.dtype.is_floating] + trainable
    return outs, tape.gradient(loss, leaves)

  outs_tf, grads_tf = call(*args_tf)
  choice = _runners.choices().get(name, {})
  runner = (
    choice.get("runner", "?"),
    choice.get("reason", ""),
    choice.get("capture_s"),
    choice.get("path"),
    choice.get("path_reason", ""),
  )
  # torch: the same weights, the same mode, the same loss.
  reference.train(training)
  inputs = [
    t.detach().clone().requires_grad_(True) if _floating(t) else t.detach().clone() for t in tensors
  ]
  params = dict(reference.named_parameters())
  torch.manual_seed(0)
  try:
    outs_torch = [o for o in tc.tensor_leaves(reference(*inputs)) if o is not None]
  except RuntimeError as err:
    if "not differentiable with respect to argument" not in str(err):
      raise
    # A loss's target: torch takes no gradient for it (the bridge learns the
    # same), so only the first input is differentiated here.
    for x in inputs[1:]:
      if _floating(x):
        x.requires_grad_(False)
    torch.manual_seed(0)
    outs_torch = [o for o in tc.tensor_leaves(reference(*inputs)) if o is not None]
  random = _is_random(copy.deepcopy(target), tensors, training)
  if random:
    return runner, None
  loss = sum(
    (o * torch.from_numpy(_weights(tuple(o.shape), k))).sum()
    for k, o in enumerate(outs_torch)
    if o.dtype == torch.float32 and o.requires_grad
  )
  leaves = [x for x in inputs if _floating(x)]
  # TF's gradients of the inputs torch does not differentiate are not compared.
  grads_tf = [g for g, x in zip(grads_tf, leaves) if x.requires_grad] + list(
    grads_tf[len(leaves) :]
  )
  leaves = [x for x in leaves if x.requires_grad] + [
    params[v.name.split("/", 1)[1].rsplit(":", 1)[0]] for v in trainable
  ]
  grads_torch = (
    torch.autograd.grad(loss, leaves, allow_unused=True)
    if isinstance(loss, torch.Tensor)
    else [None] * len(leaves)
  )
  for k, (got, want) in enumerate(zip(outs_tf, outs_torch)):
    problem = _close(got, want, f"output {k}")
    if problem:
      return runner, problem
  for k, (got, want, leaf) in enumerate(zip(grads_tf, grads_torch, leaves)):
    got = np.zeros(leaf.shape, np.float32) if got is None else tf.convert_to_tensor(got).numpy()
    want = torch.zeros_like(leaf) if want is None else want
    problem = _close(got, want, f"gradient {k}")
    if problem:
      return runner, problem
  return runner, None


def _is_random(module, tensors, training):
  module.train(training)
  with torch.no_grad():
    torch.manual_seed(1)
    first = tc.tensor_leaves(module(*copy.deepcopy(tensors)))
    torch.manual_seed(2)
    second = tc.tensor_leaves(module(*copy.deepcopy(tensors)))
  return any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(first, second))


def _close(got, want, what):
  got = np.asarray(got.numpy() if hasattr(got, "numpy") else got, np.float64)
  want = want.detach().to(torch.float64).numpy()
  if got.shape != want.shape:
    return f"{what}: shape {list(got.shape)} vs torch's {list(want.shape)}"
  finite = np.isfinite(want)
  scale = max(1.0, float(np.max(np.abs(want[finite]), initial=0.0)))
  if not np.allclose(got, want, rtol=RTOL, atol=ATOL * scale, equal_nan=True):
    return f"{what}: differs by {float(np.nanmax(np.abs(got - want))):.3g}"
  return None


def run_sample(info, sample, training, name, run="auto"):
  fwd, cargs = sample.forward_input, sample.constructor_input
  try:
    torch.manual_seed(0)
    module = info.module_cls(*cargs.args, **cargs.kwargs).to(torch.float32)
    if info.is_lazy:
      with torch.no_grad():
        module(*copy.deepcopy(fwd.args), **copy.deepcopy(fwd.kwargs))
    module.train(training)
    with torch.no_grad():
      module(*copy.deepcopy(fwd.args), **copy.deepcopy(fwd.kwargs))
  except Exception as err:  # pylint: disable=broad-except
    return {"outcome": "n/a", "detail": tc._short(f"pure torch fails: {err}", 160)}  # pylint: disable=protected-access
  tensors = [t.detach().clone() for t in tc.tensor_leaves((fwd.args, fwd.kwargs))]
  if not tensors:
    return {"outcome": "n/a", "detail": "no tensor input"}
  target = tc._with_named_inputs(  # pylint: disable=protected-access
    tc.Bound, len(tensors), module, copy.deepcopy(fwd.args), copy.deepcopy(fwd.kwargs)
  )
  return _outcome(lambda: compare(target, tensors, training, name, run))


def _outcome(fn):
  start = time.perf_counter()
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      (runner, reason, capture_s, path, path_reason), problem = tc._with_timeout(  # pylint: disable=protected-access
        fn, tc.SAMPLE_TIMEOUT_S * 2
      )
  except Exception as err:  # pylint: disable=broad-except
    return {"outcome": "error", "detail": tc._short(f"{type(err).__name__}: {err}", 300)}  # pylint: disable=protected-access
  record = {"runner": runner, "seconds": round(time.perf_counter() - start, 2)}
  if path is not None:  # "torch": from C++, or on the Python path (and why)
    record["path"] = path
    if path_reason:
      record["path_reason"] = tc._short(path_reason, 300)  # pylint: disable=protected-access
  if capture_s is not None:
    record["capture_s"] = capture_s
  if problem:
    record.update(outcome="MISMATCH", detail=problem)
  elif runner == "tf":
    record.update(outcome="tf, matches")
  else:
    record.update(outcome="torch", detail=tc._short(reason, 300))  # pylint: disable=protected-access
  return record


def run_transformers(name, training, run="auto"):
  import test_transformers  # pylint: disable=import-outside-toplevel

  build, make_inputs = test_transformers._load(name)  # pylint: disable=protected-access
  inputs = make_inputs()
  torch.manual_seed(0)
  model = tc._with_named_inputs(tc._Keywords, len(inputs), build(), list(inputs))  # pylint: disable=protected-access
  tensors = [torch.from_numpy(a) for a in inputs.values()]
  return _outcome(lambda: compare(model, tensors, training, f"{name}_{training}", run))


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.runner_coverage", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("--quick", action="store_true")
  parser.add_argument(
    "--run",
    choices=("auto", "torch"),
    default="auto",
    help='the modules\' run= ("torch": the torch runner, from C++ or on its Python path)',
  )
  parser.add_argument("--out", default=None)
  parser.add_argument(
    "--render",
    action="store_true",
    help="write the markdown again from the records in --out, measuring nothing",
  )
  args = parser.parse_args(argv)
  stem = "runner_coverage" if args.run == "auto" else "torch_runner_coverage"
  args.out = args.out or os.path.join(harness.ROOT, "benchmarks", "results", f"{stem}.json")
  if args.render:
    with open(args.out) as f:
      text = markdown(json.load(f))
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
      f.write(text)
    print(text)
    return 0
  names = sorted(db_cases.MODULES)[: 20 if args.quick else None]
  records = []
  for k, name in enumerate(names):
    info = db_cases.MODULES[name]
    for training in (False, True):
      found = db_cases.samples(info, torch.float32, training)
      if not found:
        continue
      record = run_sample(info, found[0], training, f"m{k}_{int(training)}", args.run)
      record.update(model=name, source="module_db", training=training)
      records.append(record)
      print(name, training, record["outcome"], record.get("detail", ""), file=sys.stderr)
  if not args.quick:
    for name in tc.TRANSFORMERS_MODELS:
      for training in (False, True):
        record = run_transformers(name, training, args.run)
        record.update(model=name, source="transformers", training=training)
        records.append(record)
        print(name, training, record["outcome"], record.get("detail", ""), file=sys.stderr)
  data = {
    "source": harness.environment(2, "cpu")["source"],
    "torch": torch.__version__,
    "tensorflow": tf.__version__,
    "quick": args.quick,
    "run": args.run,
    "records": records,
  }
  with open(args.out, "w") as f:
    json.dump(data, f, indent=1)
    f.write("\n")
  text = markdown(data)
  with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
    f.write(text)
  print(text)
  return 0


_MODE = {False: "inference", True: "training"}
# The name the benchmark gave each module (`translate('m16_0'): ...`) means
# nothing to a reader; the reason is the same without it.
_OWN_NAME = re.compile(r"translate\('[^']*'\): ")
# The transformers models as their authors write them.
_MODEL_NAMES = {"gpt2": "GPT-2", "bert": "BERT", "llama": "Llama", "t5": "T5", "vit": "ViT"}
# A refusal of torch.export as records older than `Refusal.said()` hold it:
# `tb.translate`'s sentence (the input_signature, torch's error, then advice
# for translate's arguments, which a TorchModule takes none of).
_OLD_EXPORT = re.compile(
  r"(?:torch\.export could not capture the forward: )?"
  r"torch\.export could not export the module with input_signature \[[^\]]*\]: (?P<error>.*)$"
)
_OLD_ADVICE = (
  " Fixed sizes in place of None, or example_inputs closer to real data, may help; "
  "else keep calling the module through the bridge."
)
_PREDATES = "(this record is older than today's wording{})"


def _error_of(text):
  """(torch's error, whole?) from the tail of an old export refusal: the
  advice after it dropped; cut short ("...") where the record was."""
  at = text.find(_OLD_ADVICE[:20])
  if at >= 0:
    return text[:at].rstrip(), True
  if not text.endswith("..."):
    return text, True
  body = text[:-3]
  for k in range(len(_OLD_ADVICE), 3, -1):  # cut inside the advice: the error is whole
    if body.endswith(_OLD_ADVICE[:k]):
      return body[:-k].rstrip(), True
  return body.rstrip(), False


def _reason(text):
  """A recorded reason in the words the runners write today: an old
  export refusal becomes `Refusal.said()`'s "torch.export could not capture
  the forward: " and torch's error as `_export_errors.summary` says it,
  derived from the error the record holds; where the record cut that error
  short of its type, or of the words the summary needs, a note says the
  record predates today's wording."""
  text = _OWN_NAME.sub("", text)
  old = _OLD_EXPORT.search(text)
  if old is None:
    return text
  said = _refusal.WHAT["export"]
  error, whole = _error_of(old["error"])
  kind, colon, message = error.partition(": ")
  if not (colon and kind.isidentifier()):  # the type itself cut short
    return text[: old.start()] + said + " " + _PREDATES.format(" and cut torch's error short")
  summary = _export_errors.summary(type(kind, (Exception,), {})(message))
  # A data-dependent error is said from its type alone: today's line up to
  # its "at" (the line in the forward, which the record does not hold).
  if whole or summary.startswith("the code depends on tensor values"):
    return text[: old.start()] + f"{said}: {summary}"
  return text[: old.start()] + f"{said}: {summary}... " + _PREDATES.format("")


def _escaped(text):
  """Free text as Markdown shows it: no emphasis, code or HTML from it."""
  for char in "\\`*_[]":
    text = text.replace(char, "\\" + char)
  return text.replace("<", "&lt;")


def _why(record):
  """What a record says beyond its outcome, or "" (a call that matched)."""
  detail = _reason(record.get("detail") or "")
  if record.get("path"):
    path = f"from {record['path']}"
    if record.get("path_reason"):
      path += f" ({_reason(record['path_reason'])})"
    detail = f"{path}; {detail}" if detail else path
  return detail


def _version(name, version):
  """A version as the user pages write it: "torch 2.13 (CPU build)" for
  "2.13.0+cpu", "(CUDA build)" for "+cu...", the release alone without a
  local tag; "TensorFlow 2.21" for "2.21.0"."""
  release, _, local = version.partition("+")
  shown = f"{name} {'.'.join(release.split('.')[:2])}"
  if local == "cpu":
    shown += " (CPU build)"
  elif local.startswith("cu"):
    shown += " (CUDA build)"
  elif local:
    shown += f" ({local} build)"
  return shown


def markdown(data):
  """The tally by source and mode; each model's outcome in both modes, in
  a table narrow enough for a page; then, below it, why each call that did
  not run as a matching TF translation went as it did."""
  cpp_known = any(r.get("path") for r in data["records"])
  lines = [
    f"Measured at {data['source']['commit'][:10]} with {_version('torch', data['torch'])} "
    f"and {_version('TensorFlow', data['tensorflow'])}: each model "
    + (
      'in a `tf.function` through `tb.TorchModule(run="torch")` (torch from C++, '
      "or on the Python path), compared with torch."
      if data.get("run") == "torch"
      else "in a `tf.function` through the default `tb.TorchModule`, compared with torch."
    ),
    "",
    "| models | mode | tf, matches | torch (reason below) | "
    + ("of which from C++ | " if cpp_known else "")
    + "MISMATCH | error | n/a |",
    "|---|---|---|---|---|---|---|" + ("---|" if cpp_known else ""),
  ]
  for source in ("module_db", "transformers"):
    for training in (False, True):
      rows = [r for r in data["records"] if r["source"] == source and r["training"] == training]
      if not rows:
        continue
      count = collections.Counter(r["outcome"] for r in rows)
      cpp = sum(1 for r in rows if r["outcome"] == "torch" and r.get("path") == "C++")
      lines.append(
        f"| {source} | {_MODE[training]} | {count['tf, matches']} | {count['torch']} | "
        + (f"{cpp} | " if cpp_known else "")
        + f"{count['MISMATCH']} | {count['error']} | {count['n/a']} |"
      )
  by_model = {}
  for r in data["records"]:
    by_model.setdefault(r["model"], {})[r["training"]] = r
  lines += [
    "",
    "| model | inference | training | capture (s): inference / training |",
    "|---|---|---|---|",
  ]
  reasons = []  # (model, modes, why), in the table's order
  for model, modes in by_model.items():
    cells, captures, whys = [], [], {}
    for training in (False, True):
      r = modes.get(training)
      if r is None:
        cells.append("")
        captures.append("–")
        continue
      outcome = r["outcome"]
      if outcome == "torch" and r.get("path"):
        outcome = f"torch, {r['path']}"
      why = _why(r)
      if why:
        whys.setdefault(why, []).append(_MODE[training])
        outcome += " (below)"
      cells.append(outcome)
      # A call that took torch from its capture's refusal has no capture
      # time of the runner it took: "–" keeps each time under its mode.
      captures.append(f"{r['capture_s']:.2f}" if r.get("capture_s") is not None else "–")
    shown = " / ".join(captures) if any(c != "–" for c in captures) else ""
    model = _MODEL_NAMES.get(model, model)
    lines.append(f"| {model} | {cells[0]} | {cells[1]} | {shown} |")
    reasons += [(model, " and ".join(m), why) for why, m in whys.items()]
  if reasons:
    lines += ["", "Why each call that did not run as a matching TF translation went as it did:", ""]
    lines += [f"- **{model}**, {modes}: {_escaped(why)}" for model, modes, why in reasons]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  sys.exit(main())
