"""The C++ torch runner's check of a capture against the Python path.

Run once per capture (`_torch_runner.py`): the captured program as a
graph call runs it (its two ops, eagerly) against the module's forward on
the same random inputs and weights; outputs, written buffers and the
gradients of every floating input and trainable parameter must agree.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge import _call


class Refused(Exception):
  """Why a signature takes the Python path: `reason`, one sentence, and
  `detail`, torch's whole error where there is one."""

  def __init__(self, reason: str, detail: str = "") -> None:
    super().__init__(reason)
    self.reason = reason
    self.detail = detail


def check(captured: Any, state: Any, call: Any, specs: list[tf.TensorSpec]) -> None:
  """The C++ run against the Python path's forward on random inputs (a
  second size where a dimension is unknown): outputs, written buffers and
  the gradients of every floating input and trainable parameter. A forward
  that draws random numbers is run from the same seed both ways (the
  user's torch random state is put back after)."""
  from torchbridge._translate import _capture  # pylint: disable=import-outside-toplevel
  from torchbridge._translate import _export  # pylint: disable=import-outside-toplevel

  dynamic = any(d is None for s in specs for d in s.shape.as_list())
  names = state.param_names + state.buffer_names
  rng_state = torch.random.get_rng_state()
  try:
    for size in (0, 1) if dynamic else (0,):
      inputs_torch = _export.random_inputs(specs, size, seed=1)
      values_torch = {n: torch.from_numpy(np.array(state.variables[n].numpy())) for n in names}
      # The C++ runner, as a graph call runs it (its two ops, eagerly here).
      vars_tf = [tf.constant(values_torch[n].numpy()) for n in names]
      args_tf = [tf.constant(x.numpy()) for x in inputs_torch]
      trainable = [k for k, n in enumerate(state.param_names) if state.variables[n].trainable]
      leaves_tf = [vars_tf[k] for k in trainable] + [a for a in args_tf if a.dtype.is_floating]
      arguments, differentiable = captured.arguments(vars_tf, trainable_of(state), args_tf)
      torch.manual_seed(1234 + size)
      with tf.GradientTape(persistent=True) as tape:
        tape.watch(leaves_tf)
        outs_tf = _call.call_exported(
          captured.program, arguments, captured.out_specs, differentiable, state.name
        )
      n = len(captured.mutated)
      # The Python path: the module's forward on the same values, seeded alike.
      leaves_torch = {}
      for n_ in names:
        t = values_torch[n_].clone()
        if n_ in state.param_names and state.variables[n_].trainable:
          t.requires_grad_(True)
        leaves_torch[n_] = t
      inputs_leaves = [
        x.clone().requires_grad_(True) if x.is_floating_point() else x for x in inputs_torch
      ]
      tensors = {f"module.{k}": leaves_torch[c] for k, c in state.state_names.items()}
      tensors.update({f"module.{k}": v for k, v in leaves_torch.items()})
      flat = _capture.FlatCall(state.module, call.substitute)
      torch.manual_seed(1234 + size)
      try:
        result_torch = torch.func.functional_call(flat, tensors, tuple(inputs_leaves))
      except Exception as err:  # the user's forward on random inputs
        raise Refused(f"the forward raised on random inputs: {type(err).__name__}: {err}") from err
      by_index = _export.flatten_like(captured.structure, result_torch)
      outputs_torch = [by_index[i] for i in sorted(tf.nest.flatten(captured.structure))]
      where = f"random inputs of shapes {[list(x.shape) for x in inputs_torch]}"
      for k, (got, want) in enumerate(zip(outs_tf[n:], outputs_torch)):
        _compare(got, want, f"output {k}", where)
      for k, buffer in enumerate(captured.mutated):
        _compare(outs_tf[k], leaves_torch[buffer], f"buffer {buffer!r} written", where)
      differentiated = [
        k for k, o in enumerate(outputs_torch) if o.is_floating_point() and o.requires_grad
      ]
      if not differentiated or not leaves_tf:
        continue
      rng = np.random.default_rng(7 + size)
      cotangents = [
        rng.standard_normal(tuple(outputs_torch[k].shape)).astype(
          outputs_torch[k].detach().numpy().dtype
        )
        for k in differentiated
      ]
      grads_tf = tape.gradient(
        [outs_tf[n + k] for k in differentiated],
        leaves_tf,
        output_gradients=[tf.constant(c) for c in cotangents],
      )
      leaves = [leaves_torch[state.param_names[k]] for k in trainable] + [
        x for x in inputs_leaves if x.is_floating_point()
      ]
      grads_torch = torch.autograd.grad(
        [outputs_torch[k] for k in differentiated],
        leaves,
        [torch.from_numpy(c) for c in cotangents],
        allow_unused=True,
      )
      labels = [f"parameter {state.param_names[k]!r}" for k in trainable] + [
        f"input {k}" for k, a in enumerate(args_tf) if a.dtype.is_floating
      ]
      for label, g_tf, g_torch, leaf in zip(labels, grads_tf, grads_torch, leaves):
        _compare(
          tf.zeros_like(leaf.detach().numpy()) if g_tf is None else g_tf,
          torch.zeros_like(leaf) if g_torch is None else g_torch,
          f"gradient of {label}",
          where,
        )
  finally:
    torch.random.set_rng_state(rng_state)


def _compare(got_tf: Any, want_torch: torch.Tensor, what: str, where: str) -> None:
  got = np.asarray(got_tf.numpy() if hasattr(got_tf, "numpy") else got_tf)
  want = want_torch.detach().cpu().numpy()
  if got.shape != want.shape:
    raise Refused(
      f"check: {what} has shape {list(got.shape)}, torch's {list(want.shape)} ({where})"
    )
  if got.dtype.kind in "fc":
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    tol = {np.float64: 1e-9, np.float32: 1e-5, np.float16: 1e-2}.get(got.dtype.type, 2e-2)
    ok = np.allclose(got, want, rtol=tol, atol=tol * scale, equal_nan=True)
  else:
    ok = np.array_equal(got, want)
  if not ok:
    diff = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))) if got.size else 0
    raise Refused(f"check: {what} differs from the Python path's by up to {diff:.3g} ({where})")


def torch_message(message: str) -> str:
  """torch's own words in the op's error (not TF's function names, not
  torch's C++ stack)."""
  marker = "its C++ callback failed: "
  if marker in message:
    message = message[message.index(marker) + len(marker) :]
  for end in ("\nException raised from", "Exception raised from", " [Op:"):
    if end in message:
      message = message[: message.index(end)]
  return message.strip()


def trainable_of(state: Any) -> list[bool]:
  """Per variable (parameters, then buffers): whether it gets a gradient."""
  return [state.variables[n].trainable for n in state.param_names] + [False] * len(
    state.buffer_names
  )


def spec_of(node: Any, name: str) -> tf.TensorSpec:
  from torch.fx.experimental import symbolic_shapes  # pylint: disable=import-outside-toplevel

  value = node.meta.get("val") if hasattr(node, "meta") else None
  if not isinstance(value, torch.Tensor):
    raise Refused(f"the forward returns {value!r}, not a tensor")
  shape = [int(d) if symbolic_shapes.is_concrete_int(d) else None for d in value.shape]
  try:
    dtype = tf.as_dtype(torch.empty((), dtype=value.dtype).numpy().dtype)
  except TypeError as err:
    raise Refused(f"{name} returns a {value.dtype} tensor, which TF has no dtype for") from err
  return tf.TensorSpec(shape, dtype)


def signature_mismatch(output_signature: Any, captured: Any) -> str | None:
  declared = tf.nest.flatten(output_signature)
  outputs = captured.out_specs[len(captured.mutated) :]
  if len(declared) != len(outputs) or any(
    d.dtype != o.dtype or not d.shape.is_compatible_with(o.shape) for d, o in zip(declared, outputs)
  ):
    return (
      f"the capture's outputs {outputs} do not match output_signature "
      f"{output_signature} (the Python path checks each call against it)"
    )
  return None
