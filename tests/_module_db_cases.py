"""torch's own module test database, run through `tb.TorchModule`.

`torch.testing._internal.common_modules.module_db` holds, for each
`torch.nn` module, the samples torch's `test_modules.py` runs: constructor
arguments and forward inputs. Each sample here runs through a `TorchModule`
and through a deep copy of the same module in pure torch, in float32 and
float64, train and eval mode, eagerly and inside `tf.function`, with and
without a `tf.GradientTape`; outputs, buffers, and (under a tape) the
gradients of the floating inputs and of every trainable parameter are
compared. `run_module` returns, per case, None (equal) or the reason it
failed; `python tests/_module_db_cases.py` prints the README's table.
"""

import copy
import dataclasses
import sys

import numpy as np
import torch  # before tensorflow
import tensorflow as tf

import warnings

with warnings.catch_warnings():
  # torch's test utilities warn when hypothesis is missing (not needed here).
  warnings.simplefilter("ignore", ImportWarning)
  from torch.testing._internal.common_modules import module_db  # noqa: E402

import torchbridge as tb

# Samples per module (None: every one torch lists).
SAMPLES_PER_MODULE = None  # all of them
DTYPES = (torch.float32, torch.float64)
TOLERANCE = {torch.float32: dict(rtol=2e-4, atol=2e-5), torch.float64: dict(rtol=1e-9, atol=1e-10)}

# Modules whose failures are understood: name -> (a regex every failure
# message of the module matches, why). The README's table shows them. A
# module listed here that passes fails the test, so the list cannot go
# stale.
KNOWN_FAILURES = {
  "nn.CTCLoss": (
    r"Declare the outputs",
    "inside tf.function only, with 1-d concatenated targets and tensor "
    "lengths: meta tensors have no CTC kernel, and stand-in ones break "
    "the rule that the target lengths add up to the targets' size; "
    "pass output_signature= (eagerly it works)",
  ),
  "nn.MultiLabelMarginLoss": (
    r"has shape \(\), but \(1,\) was declared .*by running it on "
    r"meta tensors|Torch's meta kernel",
    "inside tf.function only, reduction='none' on a 1-d input: torch's "
    "meta kernel says shape (1,) where its CPU kernel returns (); the "
    "call fails with an error that says so and names output_signature",
  ),
}


@dataclasses.dataclass(frozen=True)
class Case:
  dtype: torch.dtype
  training: bool
  mode: str  # "eager" or "graph"
  tape: bool

  def __str__(self):
    return (
      f"{str(self.dtype).replace('torch.', '')}/"
      f"{'train' if self.training else 'eval'}/{self.mode}/"
      f"{'tape' if self.tape else 'no tape'}"
    )


CASES = [
  Case(d, t, m, g)
  for d in DTYPES
  for t in (True, False)
  for m in ("eager", "graph")
  for g in (True, False)
]

MODULES = {info.name: info for info in module_db}


def samples(info, dtype, training):
  try:
    inputs = info.module_inputs_func(
      info, device="cpu", dtype=dtype, requires_grad=False, training=training
    )
  except Exception:  # pylint: disable=broad-except
    return []
  return [s for s in inputs if s.forward_input is not None][:SAMPLES_PER_MODULE]


def _map(fn, value):
  if isinstance(value, torch.Tensor):
    return fn(value)
  if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
    return type(value)(_map(fn, v) for v in value)
  if isinstance(value, dict):
    return {k: _map(fn, v) for k, v in value.items()}
  return value


def _flat_tensors(value):
  out = []
  _map(out.append, value)
  return out


def _to_tf(t):
  return tf.constant(t.detach().numpy())


def _weights_like(outs, seed):
  gen = torch.Generator().manual_seed(seed)
  return [
    torch.randn(o.shape, generator=gen, dtype=o.dtype) if o.is_floating_point() else None
    for o in outs
  ]


def _check_close(what, got, want, dtype):
  got = np.asarray(got)
  want = np.asarray(want)
  if got.shape != want.shape:
    return f"{what}: shape {got.shape}, pure torch {want.shape}"
  if not np.allclose(got, want, equal_nan=True, **TOLERANCE[dtype]):
    diff = np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64)))
    return f"{what}: differs from pure torch by {diff:.3g}"
  return None


def run_case(info, sample, case):
  """None when the bridged module matches pure torch, else why not."""
  torch.manual_seed(0)
  cargs = sample.constructor_input
  module = info.module_cls(*cargs.args, **cargs.kwargs).to(case.dtype)
  fwd = sample.forward_input
  if info.is_lazy:
    with torch.no_grad():
      module(*copy.deepcopy(fwd.args), **copy.deepcopy(fwd.kwargs))
  module.train(case.training)
  reference = copy.deepcopy(module)
  args_torch = copy.deepcopy(fwd.args)
  kwargs_torch = copy.deepcopy(fwd.kwargs)

  # Pure torch.
  leaves = [t for t in _flat_tensors((args_torch, kwargs_torch)) if t.is_floating_point()]
  for t in leaves:
    t.requires_grad_(case.tape)
  torch.manual_seed(1)
  with torch.set_grad_enabled(case.tape):
    while True:
      try:
        out_ref = reference(*args_torch, **kwargs_torch)
        break
      except RuntimeError as err:  # e.g. a loss's target: no requires_grad
        left = [t for t in leaves if t.requires_grad]
        if "is not differentiable with respect to" not in str(err) or not left:
          raise
        left[-1].requires_grad_(False)
        torch.manual_seed(1)
  outs_ref = _flat_tensors(out_ref)
  weights = _weights_like(outs_ref, seed=2)
  params_ref = [p for p in reference.parameters() if p.requires_grad]
  grads_ref = None
  if case.tape:
    loss = sum(
      (o * w).sum() for o, w in zip(outs_ref, weights) if w is not None and o.requires_grad
    )
    targets = leaves + params_ref
    grads_ref = [None] * len(targets)
    if isinstance(loss, torch.Tensor):
      # One at a time: a target torch cannot differentiate (a loss's
      # target) gets None, as through the bridge.
      for k, target in enumerate(targets):
        if not target.requires_grad:
          continue
        try:
          grads_ref[k] = torch.autograd.grad(loss, [target], allow_unused=True, retain_graph=True)[
            0
          ]
        except RuntimeError as err:
          if "not differentiable" not in str(err) and "not implemented" not in str(err):
            raise

  # Through the bridge.
  bridged = tb.TorchModule(module, name="m")
  # One TF tensor per torch tensor: a sample that passes one tensor twice
  # (KLDivLoss's scalar case) passes one TF tensor twice.
  converted = {}

  def to_tf_once(t):
    if id(t) not in converted:
      converted[id(t)] = _to_tf(t)
    return converted[id(t)]

  args_tf = _map(to_tf_once, fwd.args)
  kwargs_tf = _map(to_tf_once, fwd.kwargs)
  inputs_tf = [t for t in _flat_tensors((fwd.args, fwd.kwargs))]
  float_positions = [k for k, t in enumerate(inputs_tf) if t.is_floating_point()]
  trainable = [v for v in bridged.trainable_variables]
  by_name = {v.name[len("m/") : -2]: v for v in bridged.variables}
  param_vars = [by_name[n] for n, p in reference.named_parameters() if p.requires_grad]
  del trainable
  weights_tf = [None if w is None else _to_tf(w) for w in weights]

  def step(args, kwargs):
    if not case.tape:
      return bridged(*args, **kwargs, training=case.training), None
    flat_in = [t for t in tf.nest.flatten((args, kwargs)) if isinstance(t, tf.Tensor)]
    watched = [flat_in[k] for k in float_positions]
    with tf.GradientTape() as tape:
      tape.watch(watched)
      out = bridged(*args, **kwargs, training=case.training)
      outs = [o for o in tf.nest.flatten(out) if o is not None]
      terms = [tf.reduce_sum(o * w) for o, w in zip(outs, weights_tf) if w is not None]
      loss = tf.add_n(terms) if terms else tf.constant(0.0, tf.float64)
    return out, tape.gradient(loss, watched + param_vars)

  if case.mode == "graph":
    step = tf.function(step)
  torch.manual_seed(1)
  try:
    out_tf, grads_tf = step(args_tf, kwargs_tf)
  except Exception as err:  # pylint: disable=broad-except
    return f"{type(err).__name__}: {_first_line(err)}"

  outs_tf = [o for o in tf.nest.flatten(out_tf) if o is not None]
  if len(outs_tf) != len(outs_ref):
    return f"{len(outs_tf)} outputs, pure torch {len(outs_ref)}"
  for k, (o_tf, o_ref) in enumerate(zip(outs_tf, outs_ref)):
    problem = _check_close(f"output {k}", o_tf.numpy(), o_ref.detach().numpy(), case.dtype)
    if problem:
      return problem
  state = bridged.torch_module.state_dict()
  for n, b in reference.named_buffers():
    problem = _check_close(f"buffer {n}", state[n].numpy(), b.numpy(), case.dtype)
    if problem:
      return problem
  if case.tape:
    grads_tf = list(grads_tf)
    if case.mode == "graph":
      # tf.function gives a tensor passed twice two placeholders, each with
      # its part of the gradient; pure torch's one leaf gets their sum.
      sources = [id(t) for t in inputs_tf if t.is_floating_point()]
      summed = list(grads_tf)
      for k, source in enumerate(sources):
        same = [j for j, s in enumerate(sources) if s == source]
        if len(same) > 1 and all(grads_tf[j] is not None for j in same):
          summed[k] = tf.add_n([tf.convert_to_tensor(grads_tf[j]) for j in same])
      grads_tf = summed
    for k, (g_tf, g_ref) in enumerate(zip(grads_tf, grads_ref)):
      if g_ref is None and g_tf is None:
        continue
      want = np.zeros(tuple(g_tf.shape)) if g_ref is None else g_ref.numpy()
      if g_tf is None:
        if np.any(want):
          return f"gradient {k}: None, pure torch nonzero"
        continue
      problem = _check_close(f"gradient {k}", tf.convert_to_tensor(g_tf).numpy(), want, case.dtype)
      if problem:
        return problem
  return None


def _first_line(err):
  text = " ".join(str(err).split())
  return text[-400:]  # the end holds the error itself


# The test's cap: at most about this many samples a module and case,
# spread evenly over all of them (the first always in). 106 of the 114
# modules give 32 or fewer; the other eight (nn.LinearCrossEntropyLoss 857,
# every combination of its options; the Transformer family, attention, the
# losses with many targets) took 9 of the test's 13 minutes on 2 cores.
# The test runs every sample of the modules in KNOWN_FAILURES.
# `main()` (the coverage page's table) runs all.
SPREAD_TO = 32


def spread(found, spread_to):
  """Every k-th of `found`, k such that at most about `spread_to` remain."""
  return found[:: -(-len(found) // spread_to) or 1] if spread_to else found


def run_module(name, spread_to=None):
  """{(sample index, case): None or the reason it failed}; every sample, or
  about `spread_to` of them spread over all."""
  info = MODULES[name]
  results = {}
  for case in CASES:
    for k, sample in enumerate(spread(samples(info, case.dtype, case.training), spread_to)):
      try:
        results[(k, str(case))] = run_case(info, sample, case)
      except Exception as err:  # pylint: disable=broad-except
        # The pure-torch reference itself failed: not the bridge's case.
        results[(k, str(case))] = f"(pure torch: {type(err).__name__})"
  return results


def main():
  rows = []
  for name in sorted(MODULES):
    results = run_module(name)
    failed = {r for r in results.values() if r is not None}
    n_fail = sum(r is not None for r in results.values())
    why = KNOWN_FAILURES.get(name, (None, "; ".join(sorted(failed))[:160]))[1]
    rows.append((name, len(results), len(results) - n_fail, n_fail, why if n_fail else ""))
    print(name, rows[-1][1:4], file=sys.stderr)
  print("| module | cases | pass | fail | why |")
  print("|---|---|---|---|---|")
  for row in rows:
    print("| " + " | ".join(str(c) for c in row) + " |")


if __name__ == "__main__":
  main()
