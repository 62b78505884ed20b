"""A timeline of every bridged call, phase by phase; opt-in, free when off.

Each phase of a bridged call is a span. The native op's kernel marks its own
(csrc/timeline.h: kernel entered to left, the wait for and the run on the
torch thread, wrapping the inputs, acquiring the GIL, the callback with the
GIL held, adopting the outputs) as TraceMe events, which TF's profiler
(TensorBoard's trace viewer) records whenever it runs. The Python side marks
the rest (`PHASES`: binding the arguments, torch's forward and backward,
checking the outputs, saving the state for the backward; on the
`tf.py_function` path also the hand-over to the torch thread and both
crossings) when annotation is on:

  - `TORCHBRIDGE_TIMELINE=1` in the environment: every span is also a
    `tf.profiler.experimental.Trace` (TF's profiler) and a
    `torch.profiler.record_function` (torch's profiler), for the whole
    process;
  - `torchbridge.timeline()`: the same while the block runs, and a
    recording of both sides' spans in one list, with threads and
    `time.perf_counter_ns()` times, that saves as a Chrome / Perfetto trace.

Off, a span costs one call returning a shared no-op context manager; the
per-call path skips even that (`on`).

Examples:
  >>> import tensorflow as tf
  >>> import torch
  >>> import torchbridge as tb
  >>> f = tb.torch_function(lambda x: x * 2)
  >>> with tb.timeline() as trace:
  ...   _ = tf.function(f)(tf.ones([3]))
  >>> "torchbridge/torch forward" in {e["name"] for e in trace.events}
  True
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf


ENV = "TORCHBRIDGE_TIMELINE"

# Which runner each module took (`_runners/_record.py` hands its report over
# when imported: graph calls import it before any runs).
_runners_report: Callable[[], dict[str, dict[str, Any]]] = dict


def report_runners(report: Callable[[], dict[str, dict[str, Any]]]) -> None:
  """Sets what a timeline's `runners` holds: `report()` when it stops."""
  global _runners_report
  _runners_report = report


# The Python side's phases.
CALL = "torchbridge/python call"
BIND = "torchbridge/bind arguments"
FORWARD = "torchbridge/torch forward"
BACKWARD = "torchbridge/torch backward"
CHECK = "torchbridge/check outputs"
SAVE = "torchbridge/save state"
HAND_OFF = "torchbridge/hand off to torch thread"
TO_TORCH = "torchbridge/inputs to torch"
TO_TF = "torchbridge/outputs to TF"
PHASES = (CALL, BIND, FORWARD, BACKWARD, CHECK, SAVE, HAND_OFF, TO_TORCH, TO_TF)

# None: spans are off; "annotate": spans are TF's and torch's profiler
# annotations too; "record": recorded only (cheapest, for measuring steps).
_mode: str | None = "annotate" if os.environ.get(ENV, "").strip() not in ("", "0") else None
# Whether spans are on (`_mode` is not None). The per-call path reads it to
# skip `span()` altogether when off:
#   phase = _timeline.span(_timeline.CHECK) if _timeline.on else None
on: bool = _mode is not None
_recording: Timeline | None = None  # the Timeline being recorded, if any
_lock = threading.Lock()
_library: ctypes.CDLL | None = None  # ctypes handle of the native op, once connected


class _Off:
  __slots__ = ()

  def __enter__(self) -> _Off:
    return self

  def __exit__(self, *exc: object) -> Literal[False]:
    return False

  def stop(self) -> None:
    pass


_OFF = _Off()


class _Span:
  """One phase on this thread: TF's and torch's annotations, and a record."""

  __slots__ = ("_name", "_tf", "_torch", "_begin", "_stopped")

  def __init__(self, name: str, annotate: bool) -> None:
    self._name = name
    self._tf: Any = None
    self._torch: Any = None
    if annotate:
      self._tf = tf.profiler.experimental.Trace(name)
      self._torch = torch.profiler.record_function(name)
      self._tf.__enter__()
      self._torch.__enter__()
    self._stopped = False
    self._begin = time.perf_counter_ns()

  def __enter__(self) -> _Span:
    return self

  def __exit__(self, *exc: object) -> Literal[False]:
    self.stop()
    return False

  def stop(self) -> None:
    if self._stopped:
      return
    self._stopped = True
    end = time.perf_counter_ns()
    if self._tf is not None:
      self._torch.__exit__(None, None, None)
      self._tf.__exit__(None, None, None)
    recording = _recording
    if recording is not None:
      recording.add(self._name, threading.get_native_id(), self._begin, end, "python")


if TYPE_CHECKING:
  Span: TypeAlias = _Off | _Span  # what `span` returns


def span(name: str) -> Span:
  """A context manager (or `.stop()`) marking phase `name` on this thread."""
  mode = _mode
  if mode is None:
    return _OFF
  return _Span(name, mode == "annotate")


def connect(library_path: str | os.PathLike[str]) -> None:
  """Called by the loader: the native op's recorder, for `timeline()`."""
  global _library
  handle = ctypes.CDLL(str(library_path))
  handle.torchbridge_timeline_set.argtypes = [ctypes.c_int]
  handle.torchbridge_timeline_phase_name.restype = ctypes.c_char_p
  handle.torchbridge_timeline_drain.restype = ctypes.c_int64
  handle.torchbridge_timeline_drain.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
  _library = handle
  if _recording is not None:
    handle.torchbridge_timeline_set(1)


class Timeline:
  """What `timeline()` recorded: `events`, a list of dicts with `name`,
  `thread` (the native thread id), `begin_ns`, `end_ns`
  (`time.perf_counter_ns()`) and `source` ("python", or "kernel" for the
  native op's own phases); and `runners`, which runner each module's graph
  calls took (`{module: {"runner": "tf" | "torch", "reason": ...}}`):
  a module whose calls run as TF ops has no bridge phases, its ops are
  TF's own in TF's profiler."""

  def __init__(self) -> None:
    self.events: list[dict[str, Any]] = []
    self.runners: dict[str, dict[str, Any]] = {}

  def add(self, name: str, thread: int, begin_ns: int, end_ns: int, source: str) -> None:
    self.events.append(
      {"name": name, "thread": thread, "begin_ns": begin_ns, "end_ns": end_ns, "source": source}
    )

  def totals_us(self) -> dict[str, list[float]]:
    """{phase name: [number of spans, total microseconds]}."""
    totals: dict[str, list[float]] = {}
    for e in self.events:
      entry = totals.setdefault(e["name"], [0, 0.0])
      entry[0] += 1
      entry[1] += (e["end_ns"] - e["begin_ns"]) / 1e3
    return totals

  def chrome_trace(self) -> dict[str, Any]:
    """The events in Chrome's trace format (chrome://tracing, Perfetto)."""
    origin = min((e["begin_ns"] for e in self.events), default=0)
    return {
      "traceEvents": [
        {
          "name": e["name"],
          "cat": e["source"],
          "ph": "X",
          "pid": os.getpid(),
          "tid": e["thread"],
          "ts": (e["begin_ns"] - origin) / 1e3,
          "dur": (e["end_ns"] - e["begin_ns"]) / 1e3,
        }
        for e in sorted(self.events, key=lambda e: e["begin_ns"])
      ],
      "displayTimeUnit": "ms",
      "metadata": {"torchbridge runners": self.runners},
    }

  def save(self, path: str | os.PathLike[str]) -> None:
    """Writes `chrome_trace()` as JSON to `path` (open it in Perfetto)."""
    with open(path, "w", encoding="utf-8") as f:
      json.dump(self.chrome_trace(), f)


@contextlib.contextmanager
def timeline(annotate: bool = True) -> Iterator[Timeline]:
  """Records every bridged call's phases while the block runs.

  A context manager: each phase of every bridged call made in the block
  (binding the arguments, torch's forward and backward, checking the
  outputs, and the native op's own phases) is recorded with its thread and
  times. One recording at a time per process.

  Args:
    annotate: also annotate the Python phases for TF's and torch's
      profilers meanwhile, as `TORCHBRIDGE_TIMELINE=1` does (about 10 us a
      phase on a small CPU). False: record only (about 1 us a phase), for
      timing steps as they run unobserved.

  Yields:
    A `Timeline`, filled when the block ends: `events`, a list of dicts
      (`name`, `thread`, `begin_ns`, `end_ns` in `time.perf_counter_ns()`
      time, `source`: "python" or "kernel"); `runners`, which runner each
      module's graph calls took (`{module: {"runner": "tf" | "torch",
      ...}}`); `totals_us()`, `{phase: [spans, total microseconds]}`;
      `chrome_trace()` and `save(path)`, the events as a Chrome / Perfetto
      trace.

  Raises:
    RuntimeError: if a recording is already running.

  Examples:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> net = tb.TorchModule(torch.nn.Linear(3, 1), name="net", run="torch")
    >>> step = tf.function(lambda x: net(x))
    >>> _ = step(tf.ones([2, 3]))
    >>> with tb.timeline(annotate=False) as trace:
    ...   _ = step(tf.ones([2, 3]))
    >>> any(phase.startswith("torchbridge/") for phase in trace.totals_us())
    True
    >>> trace.runners["net"]["runner"], trace.runners["net"]["path"] in ("C++", "Python")
    ('torch', True)

  """
  global _recording, _mode, on
  with _lock:
    if _recording is not None:
      raise RuntimeError(
        "torchbridge.timeline(): a recording is already running in this "
        "process; end it before starting another (recordings do not nest)"
      )
    recording = Timeline()
    outer_mode = _mode
    _mode = "annotate" if annotate or outer_mode == "annotate" else "record"
    on = True
    _recording = recording
    if _library is not None:
      _library.torchbridge_timeline_set(1)
  try:
    yield recording
  finally:
    with _lock:
      if _library is not None:
        _library.torchbridge_timeline_set(0)
        _drain_kernel(_library, recording)
      recording.runners = _runners_report()
      _recording = None
      _mode = outer_mode
      on = _mode is not None


def _drain_kernel(library: ctypes.CDLL, recording: Timeline) -> None:
  buffer = (ctypes.c_int64 * (4 * 4096))()
  while True:
    n = library.torchbridge_timeline_drain(buffer, 4096)
    for k in range(n):
      phase, thread, begin, end = buffer[4 * k : 4 * k + 4]
      name = library.torchbridge_timeline_phase_name(phase).decode()
      recording.add(name, thread, begin, end, "kernel")
    if n < 4096:
      return
