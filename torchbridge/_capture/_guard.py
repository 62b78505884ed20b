"""The check before each call of a graph that holds captured or traced
Python state: `StaleCaptureError` once what it read has changed.

A capture (the TF translation, torch from C++) bakes in the module's plain
Python attributes (`_watch.Snapshot`), and a graph traced with
`training=None` the train/eval flag of every submodule (`_watch.Modes`).
`add_guard` makes every call of such a graph (its outermost `tf.function`,
XLA's included) compare them with what is there now, in Python, before the
graph runs: a change raises `StaleCaptureError` naming it, so no runner
ever computes with a stale value.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)

from torchbridge._capture import _watch
from torchbridge._state import _before_calls

_STALE = """\
{name}: {change}.
A graph traced before that change runs this module from a capture (its TF
translation, or torch from C++) with the old value baked in, so it refuses
to run rather than compute with a stale value. Trace again to capture the
new value (a new tf.function, or new input shapes); for a value that
changes during training, pass it as a tensor argument or keep it in a
buffer (register_buffer), which graph calls read at run time; or set
TORCHBRIDGE_TORCH_RUNNER=python and construct the module with run="torch",
which runs the forward's Python on every call."""


_MODES = """\
{name}: torch's train/eval mode changed since this graph was traced: {change}.
The graph called the module with training=None, so it runs the module in
the modes it had then; it refuses rather than compute in the old mode
(dropout, BatchNorm's statistics). Pass the mode explicitly,
`{name}(x, training=training)` with a Python bool (as an argument of your
tf.function it traces one graph per mode, as Keras does), or trace again
after switching (a new tf.function)."""


class StaleCaptureError(RuntimeError):
  """A graph call would compute with Python state that changed since it was traced.

  Raised, before the graph runs and writing nothing, by a call of a
  `tf.function` whose graph holds a `TorchModule` or `TorchLayer` call:
  when a plain Python attribute the captured forward read has changed
  (`scale: 2.0 when captured, 3.0 now`), or when torch's train/eval mode of
  a module called with `training=None` was switched since the trace
  (`training was True when traced, False now`). A new trace (a new
  `tf.function`) runs the new value; the message names the fix. A
  `RuntimeError`.

  Examples:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Dropout(0.5))
    >>> actor = tb.TorchModule(net, name="actor")
    >>> act = tf.function(lambda x: actor(x))  # training=None: torch's own mode
    >>> _ = act(tf.ones([4, 3]))
    >>> _ = net.eval()  # an evaluation episode
    >>> try:
    ...   act(tf.ones([4, 3]))
    ... except tb.StaleCaptureError as err:
    ...   print(str(err).splitlines()[0])
    actor: torch's train/eval mode changed since this graph was traced: training was True when traced, False now.
    >>> tf.function(lambda x: actor(x))(tf.ones([4, 3])).shape  # traced again: eval
    TensorShape([4, 2])
  """


def check(entries: Iterable[tuple[_watch.Snapshot | _watch.Modes, str, Any]]) -> None:
  """What `add_guard`'s check runs before each call of a graph, for the
  graph's `(snapshot, module name, before_call)` entries: each module's
  views taken back, then a `StaleCaptureError` naming the first change."""
  for watched, module_name, before in entries:
    before()
    change = watched.first_change()
    if change is not None:
      template = _MODES if isinstance(watched, _watch.Modes) else _STALE
      raise StaleCaptureError(template.format(name=module_name, change=change))


def add_guard(
  snapshot: _watch.Snapshot | _watch.Modes, name: str, before_call: Any, key: Any = None
) -> None:
  """Makes every call of the graph being traced check, in Python, that the
  state the capture read (or the modes a `training=None` call took) is
  unchanged (`_before_calls.before_each_call`: before each call of the
  outermost `tf.function`, XLA's included), and run `before_call()`
  (taking the torch module's views back, as a bridged call does) first.
  `key` (default: the snapshot) makes one check of several calls."""
  entry = [(snapshot, name, before_call)]
  _before_calls.before_each_call(
    ("check", id(snapshot) if key is None else key), lambda: check(entry)
  )


def hold_to_modes(module: torch.nn.Module, name: str, before_call: Any) -> None:
  """Makes every call of the graph being traced (a `training=None` call of
  `module`, which takes its modes as they are now) refuse, naming the
  switch, once a train/eval flag of it or a submodule differs; one check
  per module and modes a graph."""
  modes = _watch.Modes(list(module.named_modules()))
  add_guard(modes, name, before_call, key=("modes", id(module), tuple(modes.captured)))
