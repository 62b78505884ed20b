"""Checks the torch side of the native op's GPU path on a machine with CUDA.

The GPU kernel of `csrc/torchbridge_op.cc` hands its Python callback TF's
CUDA stream and device (`_native.dispatch(..., cuda_stream, cuda_device)`).
This script plays the kernel's part with a CUDA stream of its own and checks
what torch does with it: the callback runs on that stream and device, inputs
arrive zero-copy, outputs leave as DLPack tensors in GPU memory (int32 in host
memory, as TF keeps it on GPUs), misaligned or strided outputs are copied,
and work queued on the stream before the call is seen by the callback with
no synchronization.

It needs torch with CUDA, not TensorFlow: where TF is missing (the lent GPU
machines have none), a stand-in module takes its name so that
`torchbridge/_crossing/` and `torchbridge/_native/_callbacks.py` import; nothing here
calls TF. Run: `python tests/cuda_torch_side.py` (exit status 1 on a
failure, 0 with "skipped" when CUDA is absent). The pytest suite does not
collect it; the GPU tests there need TF built with CUDA.
"""

import importlib.util
import pathlib
import sys
import types

import torch
import torch.utils.dlpack as torch_dlpack

_ROOT = pathlib.Path(__file__).resolve().parent.parent


class _Stub:
  """Any attribute path; calling it decorates (returns the function)."""

  def __init__(self, path):
    self._path = path

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return _Stub(f"{self._path}.{name}")

  def __call__(self, *args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
      return args[0]
    return _Stub(f"{self._path}()")

  def __hash__(self):
    return hash(self._path)

  def __eq__(self, other):
    return isinstance(other, _Stub) and other._path == self._path

  def __repr__(self):
    return f"<stand-in {self._path}>"


def _load_torchbridge_modules():
  """The exchange's counts and alignment, and the native op's callbacks,
  without the package's TF-heavy __init__."""
  try:
    import tensorflow  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
  except ImportError:
    stand_in = types.ModuleType("tensorflow")
    stand_in.__getattr__ = lambda name: _Stub(f"tf.{name}")
    sys.modules["tensorflow"] = stand_in
  package = types.ModuleType("torchbridge")
  package.__path__ = [str(_ROOT / "torchbridge")]
  sys.modules["torchbridge"] = package
  # The layers' own __init__ files import nothing: only these modules and
  # what they import run.
  loaded = {
    name: importlib.import_module(f"torchbridge.{path}")
    for name, path in (
      ("_adopt", "_crossing._adopt"),
      ("_stats", "_crossing._stats"),
      ("_native", "_native._callbacks"),
    )
  }
  # What the checks below use of them (`tests/test_native.py` checks these
  # names exist, so the script cannot fall behind the package unseen on a
  # machine without CUDA).
  exchange = types.SimpleNamespace(
    exchange_stats=loaded["_stats"].exchange_stats, TF_ALIGNMENT=loaded["_adopt"].TF_ALIGNMENT
  )
  return exchange, loaded["_native"]


def _dispatch(native, fn, inputs_torch, stream, device, torch_tensors=False):
  """Runs `fn` the way the GPU kernel does; returns the output capsules.

  With `torch_tensors`, as for an op built with torch_tensors=True (the
  kernel hands Python torch tensors, made in C++); otherwise as for a
  capsule op running `torch_callback(fn)` (its inputs are capsules).
  """
  if torch_tensors:
    callback_id = native.register(fn, None)  # pylint: disable=protected-access
    args = list(inputs_torch)
  else:
    callback_id = native.register(native.torch_callback(fn), None)  # pylint: disable=protected-access
    args = [torch_dlpack.to_dlpack(t) for t in inputs_torch]
  try:
    return native.dispatch(
      callback_id,
      args,
      None,
      stream.cuda_stream,  # pylint: disable=protected-access
      device,
      torch_tensors,
    )
  finally:
    native.release([callback_id])  # pylint: disable=protected-access


def main():
  if not torch.cuda.is_available():
    print("skipped: no CUDA device")
    return 0
  exchange, native = _load_torchbridge_modules()
  device = torch.cuda.device_count() - 1  # the last GPU: not the default one
  gpu = torch.device("cuda", device)
  failures = []

  def check(condition, what):
    print(("ok      " if condition else "FAILED  ") + what)
    if not condition:
      failures.append(what)

  tf_stream = torch.cuda.Stream(device=gpu)  # stands in for TF's stream
  x = torch.arange(1024, dtype=torch.float32, device=gpu)
  seen = {}

  def fn(args, unused=None):
    (a,) = args
    seen.update(
      stream=torch.cuda.current_stream().cuda_stream,
      device=torch.cuda.current_device(),
      gpu=native._placement.current_gpu(),
      input_ptr=a.data_ptr(),
      input_device=a.device,
    )
    misaligned = torch.zeros(1025, device=gpu)[1:]
    return [a * 2, a.to(torch.int32), a.cpu(), a.reshape(32, 32).t(), misaligned, a]

  for torch_tensors in (False, True):
    mode = "torch tensors" if torch_tensors else "capsules"
    print(f"-- {mode}")
    _check_outputs(native, exchange, fn, seen, x, tf_stream, device, gpu, check, torch_tensors)
  _check_ordering(native, tf_stream, device, gpu, check)
  print(f"{len(failures)} failed" if failures else "all passed")
  return 1 if failures else 0


def _check_outputs(native, exchange, fn, seen, x, tf_stream, device, gpu, check, torch_tensors):
  """Stream, device, zero-copy input, output placement and copies."""
  stats_before = exchange.exchange_stats()
  outs = _dispatch(native, fn, [x], tf_stream, device, torch_tensors)
  stats_after = exchange.exchange_stats()
  check(
    seen["stream"] == tf_stream.cuda_stream, "the callback runs on the stream the kernel passes"
  )
  check(
    seen["device"] == device and seen["gpu"] == device,
    f"the callback runs on the kernel's device (cuda:{device})",
  )
  check(
    seen["input_ptr"] == x.data_ptr() and seen["input_device"] == gpu,
    "the input is a zero-copy view in GPU memory",
  )
  check(native._placement.current_gpu() is None, "current_gpu() is None after the call")
  torch.cuda.synchronize(gpu)
  outs_torch = [torch_dlpack.from_dlpack(c) for c in outs]
  doubled, as_int, moved, strided, aligned, same = outs_torch
  check(
    doubled.device == gpu and torch.equal(doubled, x * 2),
    "a float output stays in GPU memory with the right values",
  )
  check(
    as_int.device.type == "cpu"
    and as_int.dtype == torch.int32
    and torch.equal(as_int, x.cpu().to(torch.int32)),
    "an int32 output goes to host memory, as TF keeps int32 on GPUs",
  )
  check(
    moved.device == gpu and torch.equal(moved.cpu(), x.cpu()),
    "a host output is moved to the kernel's GPU",
  )
  check(
    strided.is_contiguous() and torch.equal(strided, x.reshape(32, 32).t()),
    "a strided output is copied to dense row-major memory",
  )
  check(
    aligned.data_ptr() % exchange.TF_ALIGNMENT == 0
    and torch.equal(aligned, torch.zeros(1024, device=gpu)),
    "a misaligned output is copied to an aligned buffer",
  )
  check(same.data_ptr() == x.data_ptr(), "an output that is the input crosses back without a copy")
  copies = stats_after["copied"] - stats_before["copied"]
  check(copies == 4, f"exactly the 4 copies are counted (got {copies})")


def _check_ordering(native, tf_stream, device, gpu, check):
  """Work queued on TF's stream is seen by the callback, without a sync."""

  # Ordering: work queued on TF's stream before the call (a delay, then the
  # values) is visible to the callback's torch work without any sync, because
  # that work is queued on the same stream after it.
  src = torch.zeros(1 << 20, device=gpu)
  with torch.cuda.stream(tf_stream):
    torch.cuda._sleep(50_000_000)  # pylint: disable=protected-access
    src.fill_(3.0)
  outs = _dispatch(native, lambda args, unused=None: [args[0] + 1], [src], tf_stream, device)
  tf_stream.synchronize()
  result = torch_dlpack.from_dlpack(outs[0])
  check(
    bool((result == 4.0).all()), "the callback's work is ordered after what TF queued on its stream"
  )
  # The control: handed another stream, the callback does not wait, so the
  # check above can tell ordered from unordered work.
  src.zero_()
  torch.cuda.synchronize(gpu)
  with torch.cuda.stream(tf_stream):
    torch.cuda._sleep(50_000_000)  # pylint: disable=protected-access
    src.fill_(3.0)
  other_stream = torch.cuda.Stream(device=gpu)
  outs = _dispatch(native, lambda args, unused=None: [args[0] + 1], [src], other_stream, device)
  torch.cuda.synchronize(gpu)
  result = torch_dlpack.from_dlpack(outs[0])
  check(
    not bool((result == 4.0).all()),
    "control: on another stream the callback does not wait for TF's work",
  )


if __name__ == "__main__":
  sys.exit(main())
