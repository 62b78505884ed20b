"""Captures kept on disk, so a second process of a script starts without
capturing again.

Each runner's capture of a signature is written once made: the program it
lowered (torch.export's serialization, the module's weights left out) or
the refusal it met. A later process that makes the same call finds it by
a digest of everything the program could depend on:

- the versions of Python and of every installed distribution (torch,
  TensorFlow, transformers and torchbridge among them);
- the source of every module loaded from outside the Python installation
  (the user's own files, wherever the forward's code lives);
- the module: each submodule's class, the names, shapes, dtypes and
  trainability of its parameters and buffers, and every other attribute
  of its instance by value (plain tensors by content);
- the call signature (modes, shapes, dtypes, non-tensor arguments) and
  the runner.

A module that cannot be described so (an attribute shown with a memory
address, a forward hook of the user's, a class defined where no file
holds it, as in a notebook) is never kept. A capture read back was
checked against torch in the process that made it and is not checked
again; anything that differs gives another digest, and a capture again.

`TORCHBRIDGE_CAPTURE_CACHE`: the directory (by default
`$XDG_CACHE_HOME/torchbridge/captures`, `~/.cache/...` without it), or
`off`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
import json
import logging
import os
import pathlib
import re
import sys
import sysconfig
import tempfile
from typing import Any

import torch  # before TensorFlow, as everywhere in torchbridge

from torchbridge._frameworks import _compat
from torchbridge._state import _torch_state
from torchbridge._translate import _refusal

ENV = "TORCHBRIDGE_CAPTURE_CACHE"
_FORMAT = "torchbridge captures 1"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_TORCH_OWN = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")
LOG = logging.getLogger("torchbridge")


def directory() -> pathlib.Path | None:
  """Where captures are kept, or None (`TORCHBRIDGE_CAPTURE_CACHE=off`)."""
  chosen = os.environ.get(ENV, "")
  if chosen.lower() in ("off", "0", "false", "no"):
    return None
  if chosen:
    return pathlib.Path(chosen)
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "torchbridge" / "captures"


def digest(state: _torch_state.TorchState, signature: Any) -> str | None:
  """The digest of one signature's captures, or None where the module
  cannot be described (nothing is kept)."""
  module = _describe_module(state)
  sources = _user_sources()
  described = _stable_repr(signature)
  if module is None or sources is None or described is None:
    return None
  text = "\n".join([_FORMAT, _installation(), sources, module, described])
  return hashlib.sha256(text.encode()).hexdigest()[:40]


def load(
  key: str, runner: str
) -> tuple[torch.export.ExportedProgram | None, dict[str, Any]] | None:
  """`(program, facts)` kept for `runner` (program None: its refusal is
  in `facts`), or None: nothing kept, or unreadable (said at DEBUG)."""
  where = directory()
  if where is None:
    return None
  facts_path = where / f"{key}-{runner}.json"
  try:
    facts = json.loads(facts_path.read_text())
    if facts.get("refusal") is not None:
      return None, facts
    with open(where / f"{key}-{runner}.pt2", "rb") as f:
      return torch.export.load(f), facts
  except FileNotFoundError:
    return None
  except Exception as err:  # pylint: disable=broad-except  (a file from elsewhere)
    LOG.debug("torchbridge: capture %s-%s on disk not read: %s", key, runner, err)
    return None


def keep(
  key: str,
  runner: str,
  program: torch.export.ExportedProgram | None,
  facts: dict[str, Any],
) -> None:
  """Writes a capture (`program`, its weights left out) or a refusal (in
  `facts`), atomically; a directory that cannot be written is said at
  DEBUG and left."""
  where = directory()
  if where is None:
    return
  try:
    where.mkdir(parents=True, exist_ok=True)
    if program is not None:
      buffer = io.BytesIO()  # the weights live in the TF variables
      _compat.export_saved_without_weights(program, buffer)
      _write(where / f"{key}-{runner}.pt2", buffer.getvalue())
    _write(where / f"{key}-{runner}.json", json.dumps(facts).encode())
  except Exception as err:  # pylint: disable=broad-except  (disk full, read-only)
    LOG.debug("torchbridge: capture %s-%s not kept on disk: %s", key, runner, err)


def refusal_facts(refusal: _refusal.Refusal) -> dict[str, Any]:
  return {"refusal": [refusal.what, refusal.reason, refusal.detail]}


def refusal_of(facts: dict[str, Any]) -> _refusal.Refusal:
  what, reason, detail = facts["refusal"]
  return _refusal.Refusal(what, reason, detail)


def _write(path: pathlib.Path, data: bytes) -> None:
  handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".writing-")
  try:
    with os.fdopen(handle, "wb") as f:
      f.write(data)
    os.replace(temporary, path)
  except BaseException:
    os.unlink(temporary)
    raise


@functools.cache
def _installation() -> str:
  """Python's version, every installed distribution's, and torchbridge's
  own source (a build from a changed checkout keeps its version)."""
  dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
  package = pathlib.Path(__file__).parents[1]
  own = hashlib.sha256()
  for path in sorted(package.rglob("*.py")):
    own.update(path.read_bytes())
  return "\n".join([sys.version, *dists, own.hexdigest()])


_SOURCES: dict[tuple[str, int, int], str] = {}  # (path, mtime, size) -> sha256


def _user_sources() -> str | None:
  """The digests of the source files of modules loaded from outside the
  installation (the user's), or None where one cannot be read."""
  roots = {
    os.path.realpath(p)
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (p := sysconfig.get_paths().get(key))
  }
  roots.add(os.path.realpath(sys.base_prefix))
  roots.add(os.path.realpath(sys.prefix))
  found = []
  for name, module in sorted(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py") or not os.path.isabs(path):
      continue  # built in, or a name only (torch.ops' "_ops.py")
    if name.startswith("__autograph_generated_file"):
      continue  # AutoGraph's conversions of functions, named at random
    real = os.path.realpath(path)
    if any(real.startswith(root + os.sep) for root in roots):
      continue
    try:
      stat = os.stat(real)
      marker = (real, stat.st_mtime_ns, stat.st_size)
      if marker not in _SOURCES:
        _SOURCES[marker] = hashlib.sha256(pathlib.Path(real).read_bytes()).hexdigest()
    except OSError:
      return None
    found.append(f"{name} {_SOURCES[marker]}")
  return "\n".join(found)


def _describe_module(state: _torch_state.TorchState) -> str | None:
  own = state.own_hooks()
  lines = []
  for path, module in state.module.named_modules():
    cls = type(module)
    if not getattr(sys.modules.get(cls.__module__), "__file__", None):
      return None  # defined where no file holds it (a notebook's cell)
    lines.append(f"[{path}] {cls.__module__}.{cls.__qualname__}")
    for attr, value in sorted(vars(module).items()):
      if attr in _HOOKS:
        if any(id(hook) not in own for hook in value.values()):
          return None
      elif attr in ("_parameters", "_buffers"):
        for name, t in value.items():
          kind = None if t is None else (tuple(t.shape), str(t.dtype), t.requires_grad)
          lines.append(f"{attr} {name} {kind}")
      elif attr in _TORCH_OWN:
        lines.append(f"{attr} {sorted(value)}")
      elif "hook" in attr or attr.startswith("_is_full_backward"):
        continue  # state-dict hooks and their flags: not the forward's
      else:
        described = _stable_repr(value)
        if described is None:
          return None
        lines.append(f"{attr}={described}")
  return "\n".join(lines)


def _stable_repr(value: Any) -> str | None:
  """`value` as text that is the same in every process, or None."""
  if isinstance(value, torch.Tensor):
    data = value.detach().cpu().contiguous()
    raw = data.view(torch.int16) if data.dtype == torch.bfloat16 else data
    content = hashlib.sha256(raw.numpy(force=True).tobytes()).hexdigest()
    return f"tensor {data.dtype} {tuple(data.shape)} {content}"
  if isinstance(value, (set, frozenset, list, tuple)):
    parts = _all_stable(value)
    if parts is None:
      return None
    if isinstance(value, (set, frozenset)):
      parts.sort()  # a set's order changes with the process's hash seed
    return f"{type(value).__name__}({', '.join(parts)})"
  if isinstance(value, dict):
    keys, values = _all_stable(value.keys()), _all_stable(value.values())
    if keys is None or values is None:
      return None
    return "{" + ", ".join(f"{k}: {v}" for k, v in zip(keys, values)) + "}"
  text = repr(value)
  return None if _ADDRESS.search(text) else text


def _all_stable(values: Any) -> list[str] | None:
  parts = []
  for value in values:
    part = _stable_repr(value)
    if part is None:
      return None
    parts.append(part)
  return parts
