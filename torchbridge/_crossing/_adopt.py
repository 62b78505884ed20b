"""What TF can adopt from torch as it is, else one counted copy.

The one Python definition of the rule (csrc/adopt_rules.h is its C++ twin;
the loader compares the two when it loads the library, through
`check_native_constants`): the 64-byte alignment TF's kernels need, the
dtypes DLPack carries between the two frameworks, and the layout TF accepts
(dense row-major, no lazy conjugation or negation). `tf_viewable` applies it,
making one aligned copy (counted in `torchbridge.exchange_stats()`) when a
tensor fails it; `viewable_capsule` does the same for the native op.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch  # before TensorFlow, as everywhere in torchbridge
import torch.utils.dlpack as torch_dlpack
import tensorflow as tf

from torchbridge._crossing import _stats

# TF's CPU kernels assume EIGEN_MAX_ALIGN_BYTES=64. TF accepts a misaligned
# DLPack buffer without complaint and a later kernel aborts the whole process
# (`Check failed: IsAligned()`), so every buffer handed to TF is checked here.
TF_ALIGNMENT = 64

# Dtypes that DLPack carries between the two frameworks (measured on TF 2.21 /
# torch 2.13: every one round-trips without a copy).
_TORCH_DTYPE_FROM_TF = {
  tf.float16: torch.float16,
  tf.bfloat16: torch.bfloat16,
  tf.float32: torch.float32,
  tf.float64: torch.float64,
  tf.int8: torch.int8,
  tf.int16: torch.int16,
  tf.int32: torch.int32,
  tf.int64: torch.int64,
  tf.uint8: torch.uint8,
  tf.uint16: torch.uint16,
  tf.uint32: torch.uint32,
  tf.uint64: torch.uint64,
  tf.bool: torch.bool,
  tf.complex64: torch.complex64,
  tf.complex128: torch.complex128,
}
_TF_DTYPE_FROM_TORCH = {v: k for k, v in _TORCH_DTYPE_FROM_TF.items()}


def torch_dtype(dtype_tf: tf.DType) -> torch.dtype:
  """The torch dtype of a TF dtype (KeyError where torch has none)."""
  return _TORCH_DTYPE_FROM_TF[tf.as_dtype(dtype_tf)]


def tf_dtype(dtype_torch: torch.dtype) -> tf.DType:
  """The TF dtype of a torch dtype (KeyError where TF has none)."""
  return _TF_DTYPE_FROM_TORCH[dtype_torch]


def torch_dtype_or_none(dtype_tf: tf.DType) -> torch.dtype | None:
  """The torch dtype of a TF dtype, or None where torch has none."""
  return _TORCH_DTYPE_FROM_TF.get(tf.as_dtype(dtype_tf))


def tf_dtype_names() -> str:
  """The TF dtypes that cross, as text for error messages."""
  return _dtype_names(_TORCH_DTYPE_FROM_TF)


def has_torch_dtype(dtype_tf: tf.DType) -> bool:
  """Whether torch has a dtype for this TF dtype."""
  return tf.as_dtype(dtype_tf) in _TORCH_DTYPE_FROM_TF


def has_tf_dtype(dtype_torch: torch.dtype) -> bool:
  """Whether TF has a dtype for this torch dtype."""
  return dtype_torch in _TF_DTYPE_FROM_TORCH


def can_adopt_as_is(x_torch: torch.Tensor) -> bool:
  """Whether TF can use `x_torch`'s memory as it is (no copy).

  A plain strided tensor of a dtype TF has, with no lazy conjugation or
  negation, dense row-major (size-1 dimensions may carry any stride, as in
  torch's own definition of contiguous) and 64-byte aligned unless empty.
  (The device is the caller's business.)
  """
  if (
    x_torch.layout is not torch.strided
    or x_torch.is_quantized
    or x_torch.dtype not in _TF_DTYPE_FROM_TORCH
    or x_torch.is_conj()
    or x_torch.is_neg()
    or not x_torch.is_contiguous()
  ):
    return False
  return x_torch.numel() == 0 or x_torch.data_ptr() % TF_ALIGNMENT == 0


def tf_viewable(
  x_torch: torch.Tensor, copied: bool = False, device: torch.device | None = None
) -> torch.Tensor:
  """`x_torch` as TF can adopt it through DLPack, counted in the stats.

  Detached, with lazy conjugation or negation resolved, dense row-major and
  64-byte aligned, and on `device` when one is given; the tensor itself
  when it already is all that, else one copy.
  """
  if (
    x_torch.dtype not in _TF_DTYPE_FROM_TORCH
    or x_torch.layout is not torch.strided
    or x_torch.device.type not in ("cpu", "cuda")
  ):
    _check_torch_kind(x_torch)  # raises the error that names the kind
  if x_torch.requires_grad:
    x_torch = x_torch.detach()
  if x_torch.is_conj() or x_torch.is_neg():
    # A lazily conjugated or negated view: its memory holds other values.
    x_torch = x_torch.resolve_conj().resolve_neg()
    copied = True
  if device is not None and x_torch.device != device:
    x_torch = x_torch.to(device)
    copied = True
  if not can_adopt_as_is(x_torch):
    x_torch = x_torch.clone(memory_format=torch.contiguous_format)
    copied = True
  _stats.count(x_torch.numel() * x_torch.element_size() if copied else None)
  return x_torch


def _check_torch_kind(x_torch: torch.Tensor) -> None:
  problem = None
  if x_torch.layout != torch.strided:
    problem = (
      f"a sparse torch tensor (layout {x_torch.layout})",
      "convert it to a dense tensor first (`x.to_dense()`)",
    )
  elif x_torch.is_quantized:
    problem = (
      f"a quantized torch tensor (dtype {x_torch.dtype})",
      "dequantize it first (`x.dequantize()`), or pass "
      "`x.int_repr()` with its scale and zero point",
    )
  elif x_torch.is_meta:
    problem = (
      "a meta torch tensor (no data, only shape and dtype)",
      "materialize it on a real device first, e.g. `torch.empty_like(x, device='cpu')`",
    )
  elif x_torch.dtype not in _TF_DTYPE_FROM_TORCH:
    problem = (
      f"a torch tensor of dtype {x_torch.dtype}, which TF lacks",
      "cast it to a dtype TF has first, e.g. `x.to(torch.float32)`; "
      f"supported: {_dtype_names(_TF_DTYPE_FROM_TORCH)}",
    )
  elif x_torch.device.type not in ("cpu", "cuda"):
    problem = (
      f"a torch tensor on device {x_torch.device}",
      "move it to the CPU or a CUDA device first (`x.cpu()`)",
    )
  if problem:
    what, fix = problem
    raise TypeError(
      f"to_tf() received {what}, shape {tuple(x_torch.shape)}; TF can "
      f"only hold dense CPU or CUDA tensors. To pass it, {fix}."
    )


def _dtype_names(dtype_map: Iterable[Any]) -> str:
  return ", ".join(
    str(d).replace("torch.", "").replace("<dtype: ", "").strip(">'") for d in dtype_map
  )


def export_output(out_torch: object, index: int | None, gpu: int | None) -> Any:
  """Output `index` of a native op's torch callback as a DLPack capsule TF
  can adopt (see `viewable_capsule`); the C++ kernel calls it for outputs it
  cannot adopt as they are. Raises the error that says what is wrong."""
  where = "the torch callback" if index is None else (f"output {index} of the torch callback")
  if out_torch is None:
    raise TypeError(f"{where} is None, but the graph uses it; return a torch.Tensor")
  if not isinstance(out_torch, torch.Tensor):
    raise TypeError(
      f"{where} is a {type(out_torch).__name__}, not a torch.Tensor; "
      "return it as a tensor, e.g. torch.tensor(value)"
    )
  return viewable_capsule(out_torch, gpu)


def viewable_capsule(x_torch: torch.Tensor, gpu: int | None) -> Any:
  """A DLPack capsule of `x_torch` as TF can adopt it (one counted copy if
  need be), for the native op's kernel on CUDA device `gpu` (None: the CPU
  kernel)."""
  device = None
  if gpu is not None:
    # The GPU kernel wants its outputs in GPU memory, except int32, which TF
    # keeps in host memory on GPUs.
    device = torch.device("cpu") if x_torch.dtype == torch.int32 else torch.device("cuda", gpu)
  return torch_dlpack.to_dlpack(tf_viewable(x_torch, device=device))


# DLPack's type codes (dlpack.h), to compare with the library's table.
_DLPACK_CODE = {"int": 0, "uint": 1, "float": 2, "bfloat": 4, "complex": 5, "bool": 6}


def _dlpack_code(dtype_torch: torch.dtype) -> int:
  if dtype_torch is torch.bool:
    return _DLPACK_CODE["bool"]
  if dtype_torch is torch.bfloat16:
    return _DLPACK_CODE["bfloat"]
  if dtype_torch.is_complex:
    return _DLPACK_CODE["complex"]
  if dtype_torch.is_floating_point:
    return _DLPACK_CODE["float"]
  return _DLPACK_CODE["int" if dtype_torch.is_signed else "uint"]


def native_dtype_table() -> str:
  """This side's dtype table as the native library writes it
  ("name:code:bits,..." in TF's names)."""
  return ",".join(
    f"{dtype_tf.name}:{_dlpack_code(dtype_torch)}:{dtype_torch.itemsize * 8}"
    for dtype_tf, dtype_torch in _TORCH_DTYPE_FROM_TF.items()
  )


def check_native_constants(alignment: int, dtype_table: str) -> None:
  """Raises if the native library's alignment or dtype table (what
  csrc/adopt_rules.h says) differs from this module's."""
  if alignment != TF_ALIGNMENT:
    raise RuntimeError(
      f"the native op library aligns to {alignment} bytes, torchbridge's "
      f"Python side to {TF_ALIGNMENT}: csrc/adopt_rules.h and "
      "torchbridge/_crossing/_adopt.py disagree; make them equal"
    )
  ours = native_dtype_table()
  if sorted(dtype_table.split(",")) != sorted(ours.split(",")):
    raise RuntimeError(
      f"the native op library's dtype table ({dtype_table}) differs from "
      f"torchbridge's Python side ({ours}): csrc/adopt_rules.h and "
      "torchbridge/_crossing/_adopt.py disagree; make them equal"
    )
