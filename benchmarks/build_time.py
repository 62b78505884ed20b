"""The native op's build, old against new, side by side in one run.

`python -m benchmarks.build_time [--rounds N] [--out DIR]` times, in
alternating order, into empty directories:
  - "per file, C++17" (the build before issue 25): each csrc/*.cc compiled
    in a process of its own, side by side, all with `-std=c++17` and TF's
    flags, torch_interop.cc with torch's headers too; when that fails (torch
    >= 2.14 needs C++20), built again without torch_interop.cc, as it did;
  - "two units" (today's `_native/_build.py`): TF's side as one unit (C++17),
    torch_interop.cc alone with C++20, side by side, then the link;
and then, in processes of their own, the README's first example
(benchmarks/first_call.py): its first graph call with an empty cache (the
build included), and again with the library cached (the warm start: how
long loading the op takes). Writes build_time.json and build_time.md.
"""

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf

from torchbridge._native import _build
from torchbridge._native import _compiler

_ROOT = Path(__file__).resolve().parent.parent
_FIRST_CALL = _ROOT / "benchmarks" / "first_call.py"


def old_plan(compiler, sources, output, with_interop):
  """The build as the native op's build ran it before: a process per .cc file."""
  interop = _compiler.torch_interop_flags(sources) if with_interop else None  # pylint: disable=protected-access
  common = [
    compiler,
    "-std=c++17",
    "-fPIC",
    "-O2",
    "-I" + sysconfig.get_paths()["include"],
    "-I" + str(sources),
  ]
  common += tf.sysconfig.get_compile_flags()
  define = f"-DTORCHBRIDGE_TORCH_INTEROP={int(bool(interop))}"
  compiles, objects = [], []
  for source in sorted(sources.glob("*.cc")):
    if source.name == "torch_interop.cc" and not interop:
      continue
    flags = []
    if source.name == "torch_interop.cc":
      # As before: torch's flags after TF's, C++17 with a warning silenced.
      flags = ["-Wno-c++20-extensions"] + [f for f in interop[0] if not f.startswith("-std=")]
    obj = f"{output}.{source.stem}.o"
    compiles.append(common + [define] + flags + ["-c", str(source), "-o", obj])
    objects.append(obj)
  # The link is today's, with these objects: it did not change.
  new = _compiler.plan(compiler, sources, output, interop)  # pylint: disable=protected-access
  link = (
    [compiler, "-shared", "-o", str(output)]
    + objects
    + [a for a in new.link[4:] if not a.endswith(".o")]
  )
  return _compiler.Plan(files={}, compiles=compiles, link=link)  # pylint: disable=protected-access


def time_build(kind, work):
  """Seconds to build into `work`, and whether the result is complete."""
  compiler = _compiler.find_compiler()  # pylint: disable=protected-access
  sources = _build.source_dir()
  output = Path(work, "lib.so")
  log = Path(work, "build.log")
  start = time.perf_counter()
  interop = _compiler.torch_interop_flags(sources)  # pylint: disable=protected-access

  def plan(with_interop):
    if kind == "old":
      return old_plan(compiler, sources, output, with_interop)
    return _compiler.plan(
      compiler,
      sources,
      output,  # pylint: disable=protected-access
      interop if with_interop else None,
    )

  # Both fall back the same way: built again without torch_interop.cc.
  failure = _compiler.run(plan(True), log)  # pylint: disable=protected-access
  complete = failure is None
  if failure:
    failure = _compiler.run(plan(False), log)  # pylint: disable=protected-access
  seconds = time.perf_counter() - start
  if failure:
    raise RuntimeError(failure)
  return {"seconds": round(seconds, 2), "complete": complete, "bytes": output.stat().st_size}


def first_call(cache):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **{_build.CACHE_ENV: str(cache)})
  env.pop("TORCHBRIDGE_DISABLE_NATIVE", None)
  out = subprocess.run(
    [sys.executable, str(_FIRST_CALL), "--run", "torch"],  # the op's build
    env=env,
    capture_output=True,
    text=True,
    check=True,
    timeout=900,
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


LABELS = {"old": "per file, C++17 (before)", "new": "two units, C++20 for torch's"}


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.build_time", description=__doc__)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--out", default=str(_ROOT / "benchmarks" / "results"))
  parser.add_argument(
    "--markdown-only", action="store_true", help="rewrite the .md files from the .json files"
  )
  args = parser.parse_args(argv)
  if args.markdown_only:
    for path in Path(args.out).glob("build_time_torch*.json"):
      path.with_suffix(".md").write_text(markdown(json.loads(path.read_text())))
    return 0
  builds = {"old": [], "new": []}
  for r in range(args.rounds):
    for kind in ("old", "new") if r % 2 == 0 else ("new", "old"):
      with tempfile.TemporaryDirectory(prefix=f"tb_build_{kind}_") as work:
        builds[kind].append(time_build(kind, work))
      print(f"round {r + 1}: {LABELS[kind]}: {builds[kind][-1]}", flush=True)
  calls = []
  for r in range(args.rounds):
    with tempfile.TemporaryDirectory(prefix="tb_first_call_") as cache:
      cold, warm = first_call(cache), first_call(cache)
    calls.append({"cold": cold, "warm": warm})
    print(
      f"round {r + 1}: cold first call {cold['first_call_s']} s "
      f"(built: {cold['builds']}), warm first call "
      f"{warm['first_call_s']} s, warm load {warm['load_s']} s",
      flush=True,
    )
  results = {
    "torch": torch.__version__,
    "tensorflow": tf.__version__,
    "compiler": _compiler.compiler_version(),
    "cpus": os.cpu_count(),
    "builds": builds,
    "first_calls": calls,
  }
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  stem = f"build_time_torch{torch.__version__.split('+')[0]}"
  (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
  (out / f"{stem}.md").write_text(markdown(results))
  print(markdown(results))
  return 0


def markdown(results):
  lines = [
    f"Native op build, torch {results['torch']}, TF "
    f"{results['tensorflow']}, {results['compiler']}, "
    f"{results['cpus']} CPUs; alternated, one run.",
    "",
    "| build | seconds per round | complete op |",
    "|---|---|---|",
  ]
  for kind, runs in results["builds"].items():
    lines.append(
      f"| {LABELS[kind]} | "
      + ", ".join(f"{r['seconds']:.1f}" for r in runs)
      + " | "
      + ", ".join("yes" if r["complete"] else "no (fallback)" for r in runs)
      + " |"
    )
  lines += ["", "| README example, first graph call | seconds per round |", "|---|---|"]
  calls = results["first_calls"]
  for label, key, field in (
    ("cold cache (build included)", "cold", "first_call_s"),
    ("warm cache", "warm", "first_call_s"),
    ("warm cache: loading the op (in it)", "warm", "load_s"),
  ):
    lines.append(f"| {label} | " + ", ".join(f"{c[key][field]:.3f}" for c in calls) + " |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  sys.exit(main())
