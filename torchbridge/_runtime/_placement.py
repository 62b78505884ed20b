"""Where the bridge's torch work runs: the thread, the CUDA stream, the device.

The whole policy, for every kind of call, forward and backward alike:

| Call                              | Thread                        | CUDA stream                  |
|-----------------------------------|-------------------------------|------------------------------|
| eager                             | the caller's (the user's)     | torch's current one          |
| graph, native op, CPU kernel      | the C++ torch thread          | (none)                       |
| graph, native op, GPU kernel      | TF's thread running the op    | TF's stream for the op       |
| graph, `tf.py_function` path      | the Python torch thread       | torch's current one          |

Why these threads: torch keeps an OpenMP team per thread that starts a
parallel region, so graph calls on TF's many threads would multiply teams
and slow every torch op in the process; one torch thread (csrc/torch_thread.h
for the native op, `_torch_thread` for the `tf.py_function` path) keeps one
team, with the user's torch thread count (`remember_user_threads` on the
user's thread, `apply_user_threads` on the torch thread). Eager calls stay on
the caller's thread, where a hand-over would cost more than the call; while
graph calls are in use, the team an eager call makes there is released after
it (`eager_call_done`). GPU kernels use no OpenMP team and stay on TF's
thread, which holds TF's stream.

Why the order is right (no synchronization is missing or extra):
- CPU kernel: TF's executor starts a kernel only when its inputs are
  complete, and the kernel returns only when the torch thread has finished
  the call, so every op after it reads complete outputs.
- GPU kernel: torch's work is queued on TF's CUDA stream for the op
  (`on_tf_stream`): after the TF kernels that wrote the inputs, before the
  TF kernels that read the outputs, in stream order, without a wait.
- Eager, and the `tf.py_function` path: TF's DLPack export synchronizes its
  device before torch reads; TF's DLPack import does not, so torch's current
  stream is synchronized before TF sees a torch buffer (`ready_for_tf`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from torchbridge._runtime import _omp_team
from torchbridge._runtime import _torch_thread

# Set while a GPU kernel's callback runs on this thread: its CUDA device.
_gpu_call = threading.local()
# `runs_graph_calls` is set on a thread that runs graph calls' torch code.
_graph_thread = threading.local()

T = TypeVar("T")

# When the last graph call started (time.monotonic()), and how recent one
# must be for graph calls to count as in use (a graph call longer than this
# amortizes a second team: see `eager_call_done`).
_last_graph_call = float("-inf")
GRAPH_CALLS_IN_USE_S = 1.0


def remember_user_threads() -> None:
  """Records torch's thread count on the user's thread (the one that makes
  an eager call or traces a tf.function), for the torch threads to use."""
  _torch_thread.remember_threads()


def graph_call_ran() -> None:
  """A graph call is being made on this thread (TF's, running the
  `tf.py_function` path's op): graph calls are in use (see
  `eager_call_done`)."""
  global _last_graph_call
  _last_graph_call = time.monotonic()
  _graph_thread.runs_graph_calls = True


def eager_call_done() -> None:
  """On the calling thread, an eager call's torch code has run. On the
  user's thread it made the thread's OpenMP team again if tracing had
  released it (a batch-of-one MLP forward does: torch's GEMM runs a
  parallel region); while graph calls are in use, that team is a second
  one beside theirs, and libgomp throttles both: the TD3 example calling
  its policy eagerly and training in a `tf.function` took 12.96 ms a train
  step against 6.02 with its policy in the `tf.function` (2 cores). So the
  team is released again (the next eager call makes it: 0.2-0.3 ms more a
  call there) while a graph call started in the last
  `GRAPH_CALLS_IN_USE_S` seconds. Not on a thread that runs graph calls
  (an eager call nested in a graph call's torch code), whose team those
  calls use."""
  if time.monotonic() - _last_graph_call < GRAPH_CALLS_IN_USE_S and not (
    getattr(_graph_thread, "runs_graph_calls", False) or _torch_thread.on_torch_thread()
  ):
    _omp_team.release_user_team()


def graph_call_traced() -> None:
  """On the user's thread, a bridged call was traced into a graph: its
  calls will run on the torch thread, whose OpenMP team must not be a
  second one beside the user's idle team (see `_omp_team`)."""
  _omp_team.release_user_team()


def run_graph_call(fn: Callable[..., T], *args: Any) -> T:
  """Runs a graph call of the `tf.py_function` path on the torch thread."""
  graph_call_ran()
  return _torch_thread.run(fn, *args)


def prepare_native_call() -> None:
  """On the thread the native op runs its callback on: the C++ torch thread
  takes the user's torch thread count; a GPU kernel's thread is left as is."""
  global _last_graph_call
  if getattr(_gpu_call, "device", None) is None:  # current_gpu(), one frame less
    _torch_thread.apply_threads()
    _last_graph_call = time.monotonic()  # graph_call_ran(), one frame less
    _graph_thread.runs_graph_calls = True


@contextlib.contextmanager
def on_tf_stream(cuda_stream: int, cuda_device: int | None) -> Iterator[None]:
  """Within it, TF's CUDA stream for the running op is torch's current
  stream on `cuda_device` (the GPU kernel's callback)."""
  stream = torch.cuda.ExternalStream(cuda_stream, device=cuda_device)
  outer = getattr(_gpu_call, "device", None)
  _gpu_call.device = cuda_device
  try:
    with torch.cuda.device(cuda_device), torch.cuda.stream(stream):
      yield
  finally:
    _gpu_call.device = outer


def current_gpu() -> int | None:
  """The CUDA device index of the GPU kernel calling back on this thread,
  or None."""
  return getattr(_gpu_call, "device", None)


def ready_for_tf(x_torch: torch.Tensor) -> None:
  """Waits for the torch work that writes `x_torch` before TF reads it
  through DLPack (which does no synchronization); a no-op on the CPU."""
  if x_torch.is_cuda:
    torch.cuda.current_stream(x_torch.device).synchronize()
