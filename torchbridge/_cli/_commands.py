"""The command line: `python -m torchbridge info` and `... build`.

Installed as the `torchbridge` command too (setup.py's console script).

  python -m torchbridge info [--json] [--no-build]
      versions, the native op (loaded or not, from which file, complete or
      fallback and why), the import-order fix, threads, GPUs. Exit 0
      whenever it can report.
  python -m torchbridge build [--force]
      builds the native op into the cache ahead of time (for Dockerfiles
      and clusters), and the C++ torch runner's library beside it; exit 1
      with the reason when either
      cannot be built, or when only the op's fallback builds
      (`--allow-fallback` accepts both).

Examples:
  >>> from torchbridge._cli import _commands
  >>> _commands.main(["info", "--json", "--no-build"])  # doctest: +ELLIPSIS
  {...
  0
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the command line with `argv` (default: sys.argv[1:]); the exit
  status."""
  parser = argparse.ArgumentParser(
    prog="python -m torchbridge"
    if argv is None and sys.argv[0].endswith("__main__.py")
    else "torchbridge",
    description="torchbridge's set-up: what is installed and active, and "
    "the native TF op built ahead of time.",
  )
  commands = parser.add_subparsers(dest="command", required=True)
  info = commands.add_parser("info", help="versions, the active native op and why, threads, GPUs")
  info.add_argument("--json", action="store_true", help="one JSON object")
  info.add_argument(
    "--no-build",
    action="store_true",
    help="do not load or build the native op; report what the cache holds",
  )
  build = commands.add_parser(
    "build", help="build the native TF op (and the C++ torch runner) into the cache now"
  )
  build.add_argument("--force", action="store_true", help="build again even if a library is cached")
  build.add_argument(
    "--allow-fallback",
    action="store_true",
    help="exit 0 when only the op without torch's side builds, or the C++ torch "
    "runner cannot be built (graph calls that run torch then take the Python path)",
  )
  args = parser.parse_args(argv)
  if args.command == "info":
    return _info(args)
  return _build(args)


def _info(args: argparse.Namespace) -> int:
  # Imported here: the parser answers --help without loading TF and torch.
  from torchbridge._cli import _report  # pylint: disable=import-outside-toplevel

  info = _report.report(load_native=not args.no_build)
  print(json.dumps(info, indent=2) if args.json else _report.format_text(info))
  return 0


def _build(args: argparse.Namespace) -> int:
  # pylint: disable=import-outside-toplevel
  from torchbridge._native import _loader
  from torchbridge._native import _build
  from torchbridge._native import _exported

  if os.environ.get(_loader.DISABLE_ENV, "").strip() not in ("", "0"):
    print(
      f"torchbridge build: note: {_loader.DISABLE_ENV} is set, so "
      "processes with it will not load what this builds",
      file=sys.stderr,
    )
  try:
    path = _build.build_or_reuse(force=args.force)
  except _build.BuildError as err:
    print(f"torchbridge build: failed: {err}", file=sys.stderr)
    return 1
  record = _build.build_record(path)
  if record.get("complete") is False:
    print(
      f"torchbridge build: built {path} WITHOUT torch's side (fallback): {record.get('reason')}",
      file=sys.stderr,
    )
    return 0 if args.allow_fallback else 1
  print(f"torchbridge build: the native op is built and complete: {path}")
  try:
    runner = _exported.build_or_reuse(force=args.force)
  except _build.BuildError as err:
    print(
      f"torchbridge build: the C++ torch runner failed to build (graph calls that "
      f"run torch take the Python path): {err}",
      file=sys.stderr,
    )
    return 0 if args.allow_fallback else 1
  print(f"torchbridge build: the C++ torch runner is built: {runner}")
  from torchbridge._native import _xla  # pylint: disable=import-outside-toplevel

  try:
    xla = _xla.build_or_reuse(force=args.force)
  except _build.BuildError as err:
    print(
      f"torchbridge build: the XLA custom call failed to build (bridged calls "
      f"under jit_compile=True are refused): {err}",
      file=sys.stderr,
    )
    return 0 if args.allow_fallback else 1
  print(f"torchbridge build: the XLA custom call (jit_compile=True) is built: {xla}")
  return 0
