"""How much of torch.nn `tb.translate` covers: a table for the README.

Usage:
  python -m benchmarks.translate_coverage [--quick] [--samples N]
      [--out benchmarks/results/translate_coverage.json]

Over every module of torch's own `module_db`
(`torch.testing._internal.common_modules`, enumerated as
`tests/_module_db_cases.py` does) and the tiny Hugging Face models of
`tests/test_transformers.py` (GPT-2, BERT, Llama, T5, ViT from small
configs; nothing downloaded), each float32 eval sample is wrapped in a
`tb.TorchModule` and translated with `tb.translate`, whose built-in parity
check compares the TF graph with torch on the sample's own tensors.

Per sample:
  - the input signature has one `tf.TensorSpec` per tensor of the sample;
    the forward's keyword and non-tensor arguments are bound by a small
    wrapper module (tensors positional, everything else fixed), and Lazy
    modules are initialized by one torch call first, as the module_db
    tests do;
  - a dynamic batch (dimension 0 of every tensor of rank >= 1 is None) is
    tried first; if that fails in any way, the sample is retried with
    static shapes, and the record says which one worked;
  - the outcome is "match", or the failure kind: "untranslated" (with the
    op names `UntranslatedOpsError` lists), "parity" (`ParityError`),
    "export" (torch.export refused), "writes_buffers", "random" (a parity
    failure of a module whose torch output is random), "n/a" (torch itself
    fails on the sample, or it has no tensor input) or "error" (an op's
    translation raised, which translate reports as untranslated, or any
    other exception: a translate bug).

Samples: the first `--samples` (default 6) per module, which takes about 8
minutes on 2 busy cores (module_db lists ~1800 float32 samples in all, 857
of them for LinearCrossEntropyLoss alone); `--quick` is the first sample of
each module and no transformers models. `--samples 0` runs them all.

Writes the records as JSON (`--out`) and the markdown summary next to it
(`translate_coverage.md`), and prints the markdown.
"""

import argparse
import collections
import copy
import json
import logging
import os
import re
import signal
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402

import torchbridge as tb  # noqa: E402

tf.get_logger().setLevel("ERROR")  # retracing warnings: one trace per sample
logging.getLogger("torch._export").setLevel(logging.ERROR)  # 0/1 specialized

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TESTS = os.path.join(_ROOT, "tests")
if _TESTS not in sys.path:
  sys.path.insert(0, _TESTS)

import _module_db_cases as db_cases  # noqa: E402  pylint: disable=wrong-import-position

DEFAULT_SAMPLES = 6
SAMPLE_TIMEOUT_S = 120  # one translation; a slower one counts as "error"
OUTCOME_ORDER = (
  "match",
  "untranslated",
  "parity",
  "export",
  "writes_buffers",
  "random",
  "error",
  "n/a",
)


class _Timeout(Exception):
  pass


class Bound(torch.nn.Module):
  """`module(*args, **kwargs)` with every tensor of args/kwargs taken
  positionally (in flattening order) and everything else fixed.

  Its forward names each input (`x0, x1, ...`): torch.export binds inputs
  by the forward's parameters, and a `*tensors` forward is one parameter.
  """

  def __init__(self, module, args, kwargs):
    super().__init__()
    self.module = module
    self._count = 0
    self._template = self._slots((tuple(args), dict(kwargs)))

  def _slots(self, value):
    if isinstance(value, torch.Tensor):
      self._count += 1
      return _Slot(self._count - 1)
    if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
      return type(value)(self._slots(v) for v in value)
    if isinstance(value, dict):
      return {k: self._slots(v) for k, v in value.items()}
    return value

  def call(self, tensors):
    args, kwargs = _fill(self._template, tensors)
    return self.module(*args, **kwargs)


def _with_named_inputs(base, count, *init_args):
  """An instance of a subclass of `base` whose forward takes `count` named
  positional tensors and passes them, as a tuple, to `base.call`."""
  names = ", ".join(f"x{k}" for k in range(count))
  scope = {}
  exec(
    f"def forward(self, {names}):\n"  # pylint: disable=exec-used
    f"  return self.call(({names}{',' if count == 1 else ''}))\n",
    scope,
  )
  cls = type(base.__name__, (base,), {"forward": scope["forward"]})
  return cls(*init_args)


class _Slot:
  def __init__(self, index):
    self.index = index


def _fill(template, tensors):
  if isinstance(template, _Slot):
    return tensors[template.index]
  if isinstance(template, (tuple, list)) and not isinstance(template, torch.Size):
    return type(template)(_fill(v, tensors) for v in template)
  if isinstance(template, dict):
    return {k: _fill(v, tensors) for k, v in template.items()}
  return template


def tensor_leaves(value):
  """The tensors of a nest of args/kwargs, in `Bound`'s order."""
  return db_cases._flat_tensors(value)  # pylint: disable=protected-access


def signature_of(tensors, dynamic_batch):
  """One `tf.TensorSpec` per tensor; dimension 0 None if `dynamic_batch`."""
  specs = []
  for t in tensors:
    shape = list(t.shape)
    if dynamic_batch and shape:
      shape[0] = None
    specs.append(tf.TensorSpec(shape, tf.as_dtype(t.detach().numpy().dtype)))
  return specs


def untranslated_ops(err):
  """The ops a `tb.UntranslatedOpsError` lists (its `ops`): an op without a
  translation by its name; one whose translation refused these arguments
  as `refused: <op>: <reason>`."""
  ops = []
  for where, why in err.ops.items():
    op = where.split(" (node ")[0]
    ops.append(op if why == "no TensorFlow translation" else f"refused: {op}: {why}")
  return ops


def _short(text, limit=300):
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[: limit - 3] + "..."


def classify(err):
  """(kind, detail, ops) of an exception `tb.translate` raised."""
  if isinstance(err, tb.UntranslatedOpsError):
    return "untranslated", _short(err, 400), untranslated_ops(err)
  if isinstance(err, RuntimeError) and "the translation of an op raised" in str(err):
    # translate's own bug: the op and the exception, from the message.
    return "error", _short(str(err).splitlines()[1], 400), []
  if isinstance(err, tb.ParityError):
    diffs = re.findall(r"output (\d+): (\S+) .*<- over tolerance", str(err))
    detail = ", ".join(f"output {i}: {d}" for i, d in diffs)
    return "parity", "largest |tf - torch| " + detail, []
  text = str(err)
  if isinstance(err, ValueError):
    if "torch.export could not export" in text:
      # torch's exception: after the specs, up to translate's advice.
      inner = text.split("\nFixed sizes")[0]
      inner = inner.split("]: ", 1)[-1] if "]: " in inner else inner
      return "export", _short(inner, 250), []
    if "writes tensors in eval mode" in text:
      return "writes_buffers", _short(text, 200), []
    if "specialized it to" in text:  # only with a dynamic size
      return "specialized", _short(text, 200), []
  if isinstance(err, _Timeout):
    return "error", f"slower than {SAMPLE_TIMEOUT_S} s", []
  return "error", _short(f"{type(err).__name__}: {text}", 400), []


def _with_timeout(fn, seconds):
  if not hasattr(signal, "SIGALRM"):
    return fn()

  def on_alarm(signum, frame):
    raise _Timeout()

  previous = signal.signal(signal.SIGALRM, on_alarm)
  signal.alarm(seconds)
  try:
    return fn()
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _torch_outputs(module, args, kwargs, seed):
  torch.manual_seed(seed)
  with torch.no_grad():
    out = module(*copy.deepcopy(args), **copy.deepcopy(kwargs))
  return [t.detach().clone() for t in tensor_leaves(out)]


def _is_random(module, args, kwargs):
  """Whether two torch calls with other seeds give other outputs."""
  first = _torch_outputs(module, args, kwargs, 1)
  second = _torch_outputs(module, args, kwargs, 2)
  return any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(first, second))


def _attempt(target, tensors, dynamic_batch, name):
  specs = signature_of(tensors, dynamic_batch)
  bridged = tb.TorchModule(target, name=name)
  examples = [t.detach().numpy() for t in tensors]
  tb.translate(bridged, specs, example_inputs=examples)


def translate_sample(info, sample, name="m"):
  """The record of one module_db sample: outcome, batch mode, detail."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch's and TF's own chatter
    return _translate_sample(info, sample, name)


def _translate_sample(info, sample, name):
  record = {"outcome": None, "batch": None}
  fwd = sample.forward_input
  cargs = sample.constructor_input
  try:
    torch.manual_seed(0)
    module = info.module_cls(*cargs.args, **cargs.kwargs).to(torch.float32)
    if info.is_lazy:  # materialize the weights, as the module_db tests do
      with torch.no_grad():
        module(*copy.deepcopy(fwd.args), **copy.deepcopy(fwd.kwargs))
    module.eval()
    random = _is_random(module, fwd.args, fwd.kwargs)
  except Exception as err:  # pylint: disable=broad-except
    record.update(
      outcome="n/a", detail=_short(f"pure torch fails: {type(err).__name__}: {err}", 200)
    )
    return record
  tensors = [t.detach().clone() for t in tensor_leaves((fwd.args, fwd.kwargs))]
  if not tensors:
    record.update(outcome="n/a", detail="no tensor input")
    return record
  plain = not fwd.kwargs and all(isinstance(a, torch.Tensor) for a in fwd.args)
  if not plain:
    record["bound"] = True  # kwargs / non-tensor args fixed by `Bound`
  attempts = ([True] if any(t.dim() for t in tensors) else []) + [False]
  first_failure = None
  for dynamic_batch in attempts:
    target = copy.deepcopy(module)
    if not plain:
      target = _with_named_inputs(
        Bound, len(tensors), target, copy.deepcopy(fwd.args), copy.deepcopy(fwd.kwargs)
      )
    try:
      # Called at once, in this iteration.
      _with_timeout(
        lambda: _attempt(target, tensors, dynamic_batch, name),  # noqa: B023
        SAMPLE_TIMEOUT_S,
      )
    except Exception as err:  # pylint: disable=broad-except
      kind, detail, ops = classify(err)
      if kind == "parity" and random:
        kind, detail = "random", "torch's output is random: " + detail
      failure = {
        "outcome": kind,
        "detail": detail,
        "ops": ops,
        "batch": "dynamic" if dynamic_batch else "static",
      }
      if dynamic_batch:
        first_failure = failure
        continue
      record.update(failure)
      break
    record.update(outcome="match", batch="dynamic" if dynamic_batch else "static")
    break
  if first_failure is not None and (
    record["outcome"] == "match" or first_failure["outcome"] != record["outcome"]
  ):
    record["dynamic_failure"] = {k: first_failure[k] for k in ("outcome", "detail", "ops")}
  if "ops" in record and not record["ops"]:
    del record["ops"]
  return record


def module_samples(name, limit):
  """The float32 eval samples of a module_db module: (all, first limit)."""
  found = db_cases.samples(db_cases.MODULES[name], torch.float32, False)
  return len(found), (found[:limit] if limit else found)


def run_module(name, limit=DEFAULT_SAMPLES):
  """The coverage record of one module_db module."""
  start = time.perf_counter()
  total, chosen = module_samples(name, limit)
  info = db_cases.MODULES[name]
  samples = []
  for index, sample in enumerate(chosen):
    record = translate_sample(info, sample)
    record["sample"] = index
    samples.append(record)
  counts = collections.Counter(r["outcome"] for r in samples)
  applicable = len(samples) - counts["n/a"]
  if not applicable:
    status = "n/a"
  elif counts["match"] == applicable:
    status = "all"
  elif counts["match"]:
    status = "partial"
  else:
    status = "none"
  ops = sorted({op for r in samples for op in r.get("ops", ())})
  return {
    "module": name,
    "samples_available": total,
    "samples_tried": len(samples),
    "matched": counts["match"],
    "dynamic_batch": sum(r["outcome"] == "match" and r["batch"] == "dynamic" for r in samples),
    "outcomes": dict(counts),
    "status": status,
    "missing_ops": ops,
    "seconds": round(time.perf_counter() - start, 2),
    "samples": samples,
  }


# Tiny Hugging Face models: tests/test_transformers.py's configs, with the
# positional inputs `translate` needs (their order in `inputs()`).
TRANSFORMERS_MODELS = ("gpt2", "bert", "llama", "t5", "vit")
HF_VARIANTS = ("batch and sequence", "batch", "static")  # the None dims


class _Keywords(torch.nn.Module):
  """A transformers model called with keyword inputs, returning the
  tuple of its outputs (see `_with_named_inputs`)."""

  def __init__(self, model, names):
    super().__init__()
    self.model = model
    self.names = tuple(names)

  def call(self, tensors):
    out = self.model(**dict(zip(self.names, tensors)))
    return out.to_tuple() if hasattr(out, "to_tuple") else out


def run_transformers_model(name):
  """The coverage record of one tiny transformers model: static shapes,
  a dynamic batch, and dynamic batch and sequence length are each tried."""
  import test_transformers  # pylint: disable=import-outside-toplevel

  start = time.perf_counter()
  build, make_inputs = test_transformers._load(name)  # pylint: disable=protected-access
  inputs = make_inputs()
  torch.manual_seed(0)
  model = _with_named_inputs(_Keywords, len(inputs), build().eval(), list(inputs))
  examples = list(inputs.values())
  variants = {
    "batch and sequence": lambda a: [None] * min(a.ndim, 2) + list(a.shape[2:]),
    "batch": lambda a: [None] + list(a.shape[1:]),
    "static": lambda a: list(a.shape),
  }
  if name == "vit":  # the image size is fixed by the position embeddings
    del variants["batch and sequence"]
  record = {"model": name, "inputs": list(inputs), "shapes": {}}
  for variant, shape_of in variants.items():
    specs = [tf.TensorSpec(shape_of(a), tf.as_dtype(a.dtype)) for a in examples]
    try:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        served = _with_timeout(
          lambda: tb.translate(  # called at once
            tb.TorchModule(copy.deepcopy(model), name=name),
            specs,  # noqa: B023
            example_inputs=examples,
          ),
          SAMPLE_TIMEOUT_S * 3,
        )
      result = {"outcome": "match", "parity": float(max(served.parity, default=0.0))}
    except Exception as err:  # pylint: disable=broad-except
      kind, detail, ops = classify(err)
      result = {"outcome": kind, "detail": detail}
      if ops:
        result["ops"] = ops
    record["shapes"][variant] = result
  outcomes = [r["outcome"] for r in record["shapes"].values()]
  record["matched"] = "match" in outcomes
  record["dynamic"] = next(
    (v for v, r in record["shapes"].items() if r["outcome"] == "match"), None
  )
  record["missing_ops"] = sorted({op for r in record["shapes"].values() for op in r.get("ops", ())})
  record["seconds"] = round(time.perf_counter() - start, 2)
  return record


def _failure_text(record):
  """'kind: detail' per distinct failure of a module, shortest first."""
  seen = collections.OrderedDict()
  for r in record["samples"]:
    if r["outcome"] == "match":
      continue
    if r["outcome"] == "untranslated":
      text = "untranslated: " + ", ".join(f"`{o}`" for o in r["ops"])
    else:
      text = f"{r['outcome']}: {_short(r['detail'], 160)}"
    seen.setdefault(text, []).append(r["sample"])
  parts = []
  for text, which in seen.items():
    parts.append(f"{text} (sample{'s' if len(which) > 1 else ''} {', '.join(map(str, which))})")
  return "; ".join(parts).replace("|", "\\|")


def markdown(results):
  """The README's coverage section."""
  modules = results["module_db"]
  limit = results["samples_per_module"]
  by_status = collections.defaultdict(list)
  for m in modules:
    by_status[m["status"]].append(m["module"])
  tried = sum(m["samples_tried"] for m in modules)
  matched = sum(m["matched"] for m in modules)
  dynamic = sum(m["dynamic_batch"] for m in modules)
  hf_version = f", transformers {results['transformers']}" if results.get("transformers") else ""
  lines = [
    f"Generated by `python -m benchmarks.translate_coverage` "
    f"(torch {results['torch']}, TensorFlow {results['tensorflow']}"
    f"{hf_version}"
    f"; {results['seconds']:.0f} s).",
    "",
    f"**torch `module_db`** ({len(modules)} modules; "
    f"{'every' if not limit else f'the first {limit}'} float32 eval "
    f"sample{'s' if limit != 1 else ''} of each, {tried} in all; a "
    f"dynamic batch where torch.export keeps it, else static shapes): "
    f"**{len(by_status['all'])} translate and match on every sample**, "
    f"{len(by_status['partial'])} on some, {len(by_status['none'])} on "
    f"none"
    + (f", {len(by_status['n/a'])} not applicable" if by_status["n/a"] else "")
    + f". Samples: {matched} of {tried} match ({dynamic} of them with a "
    f"dynamic batch).",
    "",
  ]
  hf = results.get("transformers_models") or []
  if hf:
    ok = [r["model"] for r in hf if r["matched"]]
    lines += [
      f"**Tiny `transformers` models** (tests/test_transformers.py's "
      f"configs, random weights, all outputs compared): {len(ok)} of "
      f"{len(hf)} translate and match ({', '.join(ok) or 'none'}), "
      "by which dimensions are dynamic:",
      "",
      "| model | " + " | ".join(HF_VARIANTS) + " |",
      "|---|" + "---|" * len(HF_VARIANTS),
    ]
    for r in hf:
      cells = []
      for variant in HF_VARIANTS:
        got = r["shapes"].get(variant)
        if got is None:
          cells.append("-")
        elif got["outcome"] == "match":
          cells.append(f"match ({got['parity']:.1g})")
        elif got.get("ops"):
          cells.append("untranslated: " + ", ".join(f"`{o}`" for o in got["ops"]))
        else:
          cells.append(f"{got['outcome']}: {_short(got['detail'], 140)}".replace("|", "\\|"))
      lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    lines.append("")
  failing = [m for m in modules if m["status"] != "all"]
  if failing:
    lines += [
      "Modules that do not match on every sample:",
      "",
      "| module | match / tried | why not |",
      "|---|---|---|",
    ]
    for m in failing:
      lines.append(
        f"| `{m['module']}` | {m['matched']} / {m['samples_tried']} | {_failure_text(m)} |"
      )
    lines.append("")
  need = collections.defaultdict(list)
  for m in modules:
    for op in m["missing_ops"]:
      need[op].append(f"`{m['module']}`")
  for r in hf:
    for op in r["missing_ops"]:
      need[op].append(r["model"])
  if need:
    lines += [
      "Missing ops (ATen ops without a TF translation), by the number of modules that need them:",
      "",
      "| op | modules | which |",
      "|---|---|---|",
    ]
    for op, who in sorted(need.items(), key=lambda kv: (-len(kv[1]), kv[0])):
      lines.append(f"| `{op}` | {len(who)} | {', '.join(who)} |")
    lines.append("")
  static_only = [
    m["module"] for m in modules if m["status"] == "all" and m["dynamic_batch"] < m["matched"]
  ]
  if static_only:
    lines += [
      "Match, but with static shapes on some samples (torch.export "
      "specialized dimension 0: batch-1 samples, unbatched inputs, "
      "the time dimension of RNNs): " + ", ".join(f"`{n}`" for n in static_only) + ".",
      "",
    ]
  dynamic_only = collections.defaultdict(list)
  for m in modules:
    for r in m["samples"]:
      failure = r.get("dynamic_failure")
      if failure and failure["outcome"] != "specialized":
        text = ", ".join(f"`{o}`" for o in failure["ops"]) or _short(failure["detail"], 160)
        dynamic_only[f"`{m['module']}`"].append(
          f"{failure['outcome']} {text} (sample {r['sample']})"
        )
  if dynamic_only:
    lines += [
      "Fail with a dynamic batch for another reason than torch.export "
      "specializing it: "
      + "; ".join(f"{k}: {', '.join(v)}" for k, v in dynamic_only.items())
      + ".",
      "",
    ]
  lines += [
    "Translate and match on every sample: " + ", ".join(f"`{n}`" for n in by_status["all"]) + ".",
    "",
  ]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.translate_coverage", description=__doc__.split("\n\n", 1)[0]
  )
  parser.add_argument(
    "--quick", action="store_true", help="the first sample per module, no transformers"
  )
  parser.add_argument(
    "--samples",
    type=int,
    default=None,
    help=f"samples per module (default {DEFAULT_SAMPLES}; 0: all)",
  )
  parser.add_argument(
    "--modules", nargs="*", default=None, help="only these module_db names (e.g. nn.Linear)"
  )
  parser.add_argument(
    "--out", default=os.path.join(_ROOT, "benchmarks", "results", "translate_coverage.json")
  )
  args = parser.parse_args(argv)
  limit = args.samples if args.samples is not None else (1 if args.quick else DEFAULT_SAMPLES)
  start = time.perf_counter()
  names = args.modules or sorted(db_cases.MODULES)
  modules = []
  for name in names:
    record = run_module(name, limit)
    modules.append(record)
    print(
      f"[{time.perf_counter() - start:6.0f} s] {name}: "
      f"{record['matched']}/{record['samples_tried']} "
      f"{dict(record['outcomes'])} {record['missing_ops'] or ''}",
      file=sys.stderr,
      flush=True,
    )
  hf_models, hf_version = [], None
  if not args.quick and args.modules is None:
    try:
      import transformers  # pylint: disable=import-outside-toplevel

      hf_version = transformers.__version__
    except ImportError:
      print("transformers is not installed: no transformers models", file=sys.stderr)
    else:
      for name in TRANSFORMERS_MODELS:
        record = run_transformers_model(name)
        hf_models.append(record)
        print(
          f"[{time.perf_counter() - start:6.0f} s] {name}: "
          f"{ {v: r['outcome'] for v, r in record['shapes'].items()} }",
          file=sys.stderr,
          flush=True,
        )
  results = {
    "torch": torch.__version__,
    "tensorflow": tf.__version__,
    "transformers": hf_version,
    "quick": args.quick,
    "samples_per_module": limit,
    "seconds": round(time.perf_counter() - start, 1),
    "module_db": modules,
    "transformers_models": hf_models,
  }
  text = markdown(results)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  md_path = os.path.splitext(args.out)[0] + ".md"
  with open(md_path, "w", encoding="utf-8") as f:
    f.write(text)
  print(text)
  return results


if __name__ == "__main__":
  main()
