"""`torchscript=True`: a module's graph calls traced to TorchScript and run
from the native op's kernel in C++, with no Python per call.

On the first graph call of each signature (the argument shapes and dtypes,
the torch modes), the forward is run once for real on the variables'
current values and stand-in inputs (which finds the outputs' specs and any
buffer or argument it writes; where TF leaves a dimension unknown, once
more at a second size, as output specs are inferred, and the trace is
checked against it), then traced with `torch.jit.trace`, its
parameters and buffers arguments before its inputs as in every call, and
loaded into C++ (`_native._traced`). Graph calls then run it there; see
`TorchModule` for what falls back to the Python path, and why.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge import _call
from torchbridge._native import _loader
from torchbridge._native import _traced
from torchbridge._runtime import _placement
from torchbridge._state import _distribute

_LOG = logging.getLogger("torchbridge")


class TorchScriptCalls:
  """The traced signatures of one module, and the fallbacks said once."""

  def __init__(self, owner_name: str) -> None:
    self._name = owner_name
    # (torch modes, argument specs) -> (TracedModule, out specs, result kind)
    self._traced: dict[Any, tuple[_traced.TracedModule, list[tf.TensorSpec], str]] = {}
    self._said: set[str] = set()

  def why_not(self, args_tf: Sequence[tf.Tensor], in_replica: bool) -> str | None:
    """Why this graph call takes the Python path, or None (it can run in C++)."""
    if in_replica:
      return "it runs in a replica of a tf.distribute strategy"
    if not _loader.has_torch_interop():
      return f"the complete native op is not loaded ({_loader.status()})"
    if tf.config.list_logical_devices("GPU"):
      return "a GPU is visible (the C++ path runs in the op's CPU kernel only)"
    for arg in args_tf:
      if arg.shape.rank is None:
        return (
          "an argument has an unknown rank while tracing; give the tf.function "
          "an input_signature with known ranks"
        )
    return _traced.unavailable()  # builds the library on first use

  def say_python_path(self, reason: str) -> None:
    if reason not in self._said:
      self._said.add(reason)
      _LOG.warning(
        "torchbridge: TorchModule %r has torchscript=True, but this graph call takes "
        "the Python path: %s.",
        self._name,
        reason,
      )

  def call_or_none(
    self,
    mode_key: str,
    args_tf: Sequence[tf.Tensor],
    stand_ins: Sequence[Callable[[], torch.Tensor]],
    run: Callable[[list[torch.Tensor]], _call.Outputs],
    differentiable: Sequence[bool],
    mutated_buffers: dict[str, frozenset[str]],
  ) -> Any:
    """The graph call's result, its op running the traced forward in C++;
    None where the call takes the Python path (said once, at WARNING).

    `args_tf` are the variables' values then the call's tensors;
    `stand_ins` give the variables' current values as torch tensors, for
    the one real run; `run` is the module's call on flat torch arguments,
    as the Python path runs it; `mutated_buffers` the state's record of the
    buffers each mode writes (none, once traced).
    """
    why_not = self.why_not(args_tf, _distribute.in_replica_of_several())
    if why_not is not None:
      self.say_python_path(why_not)
      return None
    key = (mode_key, tuple((tuple(a.shape), a.dtype.name) for a in args_tf))
    if key not in self._traced:
      specs = [tf.TensorSpec(a.shape, a.dtype) for a in args_tf]
      padded = list(stand_ins) + [None] * (len(specs) - len(stand_ins))
      # One example per stand-in size: two where a dimension is unknown.
      examples = [_call.stand_in_args(specs, size, padded) for size in _call.probe_sizes(specs)]
      self._traced[key] = self._trace(examples, run, mutated_buffers, mode_key)
    traced, out_specs, kind = self._traced[key]
    outs_tf = _call.call_traced(traced, args_tf, out_specs, differentiable, self._name)
    if kind == "tensor":
      return outs_tf[0]
    return tuple(outs_tf) if kind == "tuple" else list(outs_tf)

  def _trace(
    self,
    examples: list[list[torch.Tensor]],
    run: Callable[[list[torch.Tensor]], _call.Outputs],
    mutated_buffers: dict[str, frozenset[str]],
    mode_key: str,
  ) -> tuple[_traced.TracedModule, list[tf.TensorSpec], str]:
    example = examples[0]
    versions = [a._version for a in example]
    mutated_buffers.pop(mode_key, None)  # the run below finds them
    outputs = run(list(example))
    if outputs.extra:
      raise ValueError(
        f"TorchModule {self._name!r}: torchscript=True, but its forward writes the "
        f"buffers {sorted(outputs.extra)} in this mode (BatchNorm's running statistics "
        "in training, counters); a traced forward would write them into TF's memory. "
        "Call it in eval mode (training=False), or use torchscript=False, which "
        "writes them back to their variables."
      )
    for k, (a, v) in enumerate(zip(example, versions)):
      if a._version != v:
        raise ValueError(
          f"TorchModule {self._name!r}: torchscript=True, but its forward writes its "
          f"argument {k} in place; use out-of-place ops, or torchscript=False."
        )
    # Known now: the traced run copies no buffer and records no writes.
    mutated_buffers[mode_key] = frozenset()
    result = outputs.result
    kind = _result_kind(result, self._name)
    outs_by_size = [_flat(result, kind)]
    outs_by_size += [_flat(run(list(other)).result, kind) for other in examples[1:]]
    out_specs = _call.specs_of_runs(outs_by_size, f"TorchModule {self._name!r}")

    class Traced(torch.nn.Module):
      def forward(self, *args: torch.Tensor) -> Any:
        out = run(list(args)).result
        return out if kind == "tensor" else tuple(out)

    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      script = torch.jit.trace(Traced(), tuple(example), check_trace=False)
    tracer_warnings = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    if tracer_warnings:
      raise ValueError(
        f"TorchModule {self._name!r}: torchscript=True, but torch.jit.trace warns that "
        f"the trace may not match the forward on other inputs: "
        f"{str(tracer_warnings[0].message).strip()} Its Python decides something from "
        "the values of its tensors, which a trace freezes. Use torchscript=False."
      )
    # Traced at one size of the unknown dimensions: the trace must give the
    # forward's results at the other too (a size read as a number is frozen).
    for other, outs in zip(examples[1:], outs_by_size[1:]):
      with torch.no_grad():
        again = script(*other)
      if not all(
        a.shape == b.shape and torch.allclose(a, b, equal_nan=True)
        for a, b in zip(_flat(again, "tensor" if kind == "tensor" else "tuple"), outs)
      ):
        raise ValueError(
          f"TorchModule {self._name!r}: torchscript=True, but its trace gives other "
          "results than its forward when the dimensions TF leaves unknown change size "
          "(the forward reads a size as a Python number, which a trace freezes). Give "
          "the tf.function an input_signature with known shapes, or use torchscript=False."
        )
    # Tracing ran torch on this (the user's) thread, as the Python path's
    # tracing does: its idle OpenMP team is released the same way.
    _placement.remember_user_threads()
    _placement.graph_call_traced()
    return _traced.TracedModule(script, torch.get_num_threads()), out_specs, kind


def _flat(result: Any, kind: str) -> list[torch.Tensor]:
  return [result] if kind == "tensor" else list(result)


def _result_kind(result: Any, name: str) -> str:
  """ "tensor", "tuple" or "list": the forward results the C++ path hands back."""
  if isinstance(result, torch.Tensor):
    return "tensor"
  if isinstance(result, (tuple, list)) and all(isinstance(r, torch.Tensor) for r in result):
    return "tuple" if isinstance(result, tuple) else "list"
  raise ValueError(
    f"TorchModule {name!r}: torchscript=True needs a forward returning a tensor or a "
    f"flat tuple or list of tensors; it returned {type(result).__name__}. Use "
    "torchscript=False for nested results, dicts, numbers or None."
  )
