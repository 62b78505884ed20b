"""A library of its own beside the op's, built from C++ files on first use.

The C++ torch runner's (`_exported`, csrc/exported/) and the XLA custom
call's (`_xla`, csrc/xla/) are two; the benchmarks' no-Python bridge builds
a third (`_exported.build_torch_library`). A `SideLibrary` says what its
library is built from and how it is loaded, and holds what its first use
found: the loaded library, or why it cannot be had. Like the op's, it is
cached in `_build.cache_dir()` under a name keyed by the set-up, the flags
and every file it is built from (headers too), built under a file lock
(`_build.build_once`) and announced through the "torchbridge" logger.
Nothing here runs at import.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torchbridge._native import _build
from torchbridge._native import _compiler

Flags = tuple[list[str], list[str]]  # (compile flags, link flags)


def _one_line(err: Exception) -> str:
  return " ".join(str(err).split())[:600]


class SideLibrary:
  """One library beside the op's: its files, its flags, its loading.

  Its sources are compiled as one unit, the first with the others included
  before it (`-include`, as gcc and clang take it): torch's and XLA's
  headers take about 15 s to parse, once per unit (the op's TF side is one
  unit for the same reason). The sources must therefore not define the
  same name twice at file scope, anonymous namespaces included.

  Args:
    stem: the cached file's name before its key (`{stem}-{key}.so`).
    sources: its .cc files, relative to csrc/ (or absolute); the first is
      the one compiled, the others included before it.
    headers: the other files they include, relative to csrc/ (or
      absolute): in the key, not compiled.
    flags: its (compile flags, link flags); raises BuildError where the
      framework's headers are missing.
    load: the loaded library, from the built file's path.
    requires: called before the first build or load; raises where the
      library cannot be had (what it needs is not loaded).
    what: how the build's messages name it (default: the first source).
    optimize: the optimization flag.
    takes: about how long a build takes, said when it starts.
    errors: what `unavailable()` takes for "cannot be had" (others raise).
    describe: `unavailable()`'s sentence for such an error.
  """

  def __init__(
    self,
    stem: str,
    sources: Sequence[str | os.PathLike[str]],
    *,
    flags: Callable[[], Flags],
    load: Callable[[Path], Any],
    headers: Sequence[str | os.PathLike[str]] = (),
    requires: Callable[[], None] | None = None,
    what: str | None = None,
    optimize: str = "-O2",
    takes: str = "10-30 s on 2 cores",
    errors: tuple[type[Exception], ...] = (Exception,),
    describe: Callable[[Exception], str] = _one_line,
  ) -> None:
    self._stem, self._sources, self._headers = stem, list(sources), list(headers)
    self._flags, self._load, self._requires = flags, load, requires
    self._what = what or Path(self._sources[0]).name
    self._optimize, self._takes = optimize, takes
    self._errors, self._describe = errors, describe
    self._lock = threading.Lock()
    self.loaded: Any = None  # the loaded library, once it is
    self.loaded_from: Path | None = None  # the file it was loaded from
    self._failure: str | None = None  # why it cannot be had, once tried

  def library(self) -> Any:
    """The loaded library, building it on first use.

    Raises:
      BuildError: its headers are missing, or the build failed (the message
        names the log); or what `requires` and `load` raise.
    """
    if self.loaded is not None:
      return self.loaded
    with self._lock:
      if self.loaded is None:
        if self._requires is not None:
          self._requires()
        path = self.build_or_reuse()
        self.loaded, self.loaded_from = self._load(path), path
    return self.loaded

  def unavailable(self) -> str | None:
    """Why the library cannot be had (built or loaded), or None once it is
    loaded; tried once per process."""
    if self.loaded is None and self._failure is None:
      try:
        self.library()
      except self._errors as err:
        self._failure = self._describe(err)
    return self._failure

  def path(self) -> Path:
    """Where this set-up's library is (or would be) cached; no build.

    Raises:
      BuildError: a file of it is missing, or the framework's headers are.
    """
    return self._target(*self._files(), self._flags())

  def build_or_reuse(self, force: bool = False) -> Path:
    """The library's path, built if not cached (or with `force`).

    Raises:
      BuildError: a file or the framework's headers are missing, or the
        build failed (the message names the log).
    """
    sources, headers = self._files()
    flags = self._flags()
    target = self._target(sources, headers, flags)

    def build(compiler: str, target: Path) -> None:
      self._build(compiler, target, sources, flags)

    return _build.build_once(target, build, force)

  def _files(self) -> tuple[list[Path], list[Path]]:
    csrc = _build.source_dir()
    sources = [csrc / s for s in self._sources]
    headers = [csrc / h for h in self._headers]
    for path in sources + headers:
      if not path.is_file():
        raise _compiler.BuildError(f"{path} not found (a file of {self._what})")
    return sources, headers

  def _target(self, sources: list[Path], headers: list[Path], flags: Flags) -> Path:
    """The cached library's path, keyed by the set-up, the flags and every
    file it is built from."""
    digest = hashlib.sha256()
    for part in (_build._versions(), " ".join([self._optimize, *flags[0], *flags[1]])):
      digest.update(part.encode() + b"\0")
    for path in sources + headers:
      digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return _build.cache_dir() / f"{self._stem}-{digest.hexdigest()[:20]}.so"

  def _build(self, compiler: str, target: Path, sources: list[Path], flags: Flags) -> None:
    _build._say(
      logging.INFO,
      "torchbridge: building %s into %s, once per set-up (%s)",
      self._what,
      target.parent,
      self._takes,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{self._stem}-") as work:
      output = Path(work, target.name)
      unit = [compiler, "-fPIC", self._optimize, "-I" + str(_build.source_dir()), *flags[0]]
      for source in sources[1:]:
        unit += ["-include", str(source)]
      plan = _compiler.Plan(
        files={},
        compiles=[unit + ["-c", str(sources[0]), "-o", f"{output}.o"]],
        link=[compiler, "-shared", "-o", str(output), f"{output}.o", *flags[1]],
      )
      failure = _compiler.run(plan, target.with_suffix(".log"))
      if failure:
        raise _compiler.BuildError(failure.replace("the native op", self._what, 1))
      os.chmod(output, 0o755)  # a shared cache reads it
      os.replace(output, target)
    _build._say(
      logging.INFO,
      "torchbridge: built %s in %.1f s: %s",
      self._what,
      time.monotonic() - started,
      target,
    )
