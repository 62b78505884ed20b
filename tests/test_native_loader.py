"""The native op's loader and build cache (_loader.load, _build).

Each test runs the loader in a Python process of its own, so these run
wherever the native op is unavailable too (no compiler,
TORCHBRIDGE_DISABLE_NATIVE=1, a failed build): that is where the fallback
matters. Only the tests that need a real library skip, and only where no
C++ compiler can build one.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf  # noqa: F401

from torchbridge._native import _loader
from torchbridge._native import _build
from torchbridge._native import _compiler

# The same in both passes of `make test`: run in the native pass only.
pytestmark = pytest.mark.one_pass

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_subprocess(code, env_update, timeout=300):
  """Runs `code` in a new Python; returns the JSON of its last stdout line.

  `records` holds what the "torchbridge" logger showed at INFO and above;
  `json`, `torch`, `tf` and the `_native` modules are imported.
  `env_update` sets (or, for None, removes) environment variables.
  """
  env = dict(os.environ)
  for key, value in env_update.items():
    if value is None:
      env.pop(key, None)
    else:
      env[key] = value
  env["PYTHONPATH"] = _ROOT + os.pathsep + env.get("PYTHONPATH", "")
  prologue = textwrap.dedent("""\
      import json, logging
      records = []
      class _Keep(logging.Handler):
        def emit(self, record):  # what users see: INFO and above
          if record.levelno >= logging.INFO:
            records.append((record.levelname, record.getMessage()))
      logging.getLogger("torchbridge").addHandler(_Keep())
      logging.getLogger("torchbridge").setLevel(logging.DEBUG)
      logging.getLogger("torchbridge").propagate = False
      import torch
      import tensorflow as tf
      from torchbridge._native import _build
      from torchbridge._native import _callbacks
      from torchbridge._native import _compiler
      from torchbridge._native import _loader
      from torchbridge._native import _op
      """)
  proc = subprocess.run(
    [sys.executable, "-c", prologue + textwrap.dedent(code)],
    env=env,
    cwd=_ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _real_library():
  """The built library of this set-up; skips only if no compiler exists to
  build it (a failed build with a compiler at hand fails the test)."""
  try:
    return _build.build_or_reuse()
  except _build.BuildError as err:
    try:
      _compiler.find_compiler()  # pylint: disable=protected-access
    except _build.BuildError:
      pytest.skip(f"needs a C++ compiler to build the op: {err}")
    raise


def _fake_compiler(path, on_link):
  """A stand-in for CXX: compile steps (`-c`) write an empty object; the
  link step (no `-c`) appends "build" to `path`.log and runs `on_link`
  (shell, with $out the output path)."""
  path.write_text(
    textwrap.dedent("""\
      #!/bin/sh
      out=""
      compile=0
      while [ $# -gt 0 ]; do
        if [ "$1" = "-o" ]; then out="$2"; fi
        if [ "$1" = "-c" ]; then compile=1; fi
        shift
      done
      if [ "$compile" = 1 ]; then : > "$out"; exit 0; fi
      echo build >> "{log}"
      """).format(log=f"{path}.log")
    + on_link
    + "\n"
  )
  path.chmod(0o755)
  return path


# ---------------------------------------------------------------------------
# Falling back: one log line, then the tf.py_function path


def test_disabled_by_environment_logs_one_line():
  result = _run_subprocess(
    """
      first = _loader.available()
      second = _loader.available()
      print(json.dumps({"available": [first, second], "records": records,
                        "builds": _build.build_count}))
      """,
    {_loader.DISABLE_ENV: "1"},
  )
  assert result["available"] == [False, False]
  assert result["builds"] == 0
  assert len(result["records"]) == 1
  level, message = result["records"][0]
  assert level == "INFO"
  assert _loader.DISABLE_ENV in message


def test_failed_build_logs_one_warning_and_falls_back(tmp_path):
  # A "compiler" that fails, and an empty cache: the build fails cleanly.
  result = _run_subprocess(
    """
      ok = _loader.available()
      print(json.dumps({"available": ok, "records": records,
                        "builds": _build.build_count}))
      """,
    {_loader.DISABLE_ENV: None, _build.CACHE_ENV: str(tmp_path), "CXX": "false"},
  )
  assert result["available"] is False
  assert result["builds"] == 1
  levels = [level for level, _ in result["records"]]
  # The build announces its start and its end at INFO; the fallback to
  # tf.py_function is the one warning.
  assert levels == ["INFO", "INFO", "WARNING"], result["records"]
  assert "building the native TF op" in result["records"][0][1]
  assert "did not build" in result["records"][1][1]
  assert "tf.py_function path" in result["records"][2][1]
  assert not list(tmp_path.glob("*.so")) and not list(tmp_path.glob("*.tmp"))


def test_no_compiler_logs_one_warning(tmp_path):
  empty_bin = tmp_path / "bin"
  empty_bin.mkdir()
  result = _run_subprocess(
    """
      ok = _loader.available()
      print(json.dumps({"available": ok, "records": records}))
      """,
    {
      _loader.DISABLE_ENV: None,
      _build.CACHE_ENV: str(tmp_path / "cache"),
      "CXX": None,
      "PATH": str(empty_bin),
    },
  )
  assert result["available"] is False
  assert len(result["records"]) == 1
  assert "no C++ compiler" in result["records"][0][1]


# ---------------------------------------------------------------------------
# The build cache


def test_cache_is_reused_without_recompiling():
  path = _real_library()
  mtime = os.stat(path).st_mtime_ns
  result = _run_subprocess(
    """
      ok = _loader.available()
      print(json.dumps({"available": ok, "builds": _build.build_count,
                        "status": _loader.status()}))
      """,
    {_loader.DISABLE_ENV: None, _build.CACHE_ENV: str(_build.cache_dir())},
  )
  assert result["available"] is True
  assert result["builds"] == 0
  assert str(path) in result["status"]
  assert os.stat(path).st_mtime_ns == mtime


def test_a_source_change_rebuilds_and_an_unchanged_source_reuses(tmp_path):
  # README: the cached library is keyed on the sources, so editing csrc/
  # builds a new one. A copy of csrc/ is edited; the stand-in compiler
  # writes a placeholder library (nothing is loaded), so no real compiler
  # is needed.
  csrc = tmp_path / "csrc"
  csrc.mkdir()
  for source in _build.source_dir().glob("*.[ch]*"):
    (csrc / source.name).write_bytes(source.read_bytes())
  compiler = _fake_compiler(tmp_path / "cxx", 'echo library > "$out"')
  result = _run_subprocess(
    f"""
      from pathlib import Path
      _build.source_dir = lambda: Path({str(csrc)!r})
      steps = []
      def build():
        steps.append([str(_build.build_or_reuse()),
                      _build.build_count])
      build()  # an empty cache: builds
      build()  # same sources: reuses
      with open({str(csrc / "torchbridge_op.cc")!r}, "a") as f:
        f.write("\\n// edited\\n")
      build()  # an edited .cc: builds again
      header = sorted(Path({str(csrc)!r}).glob("*.h"))[0]
      header.write_text(header.read_text() + "\\n// edited\\n")
      build()  # an edited header: builds again
      build()  # and reuses that
      print(json.dumps(steps))
      """,
    {_loader.DISABLE_ENV: None, _build.CACHE_ENV: str(tmp_path / "cache"), "CXX": str(compiler)},
  )
  paths = [path for path, _ in result]
  assert [count for _, count in result] == [1, 1, 2, 3, 3]
  assert paths[0] == paths[1] and paths[3] == paths[4]
  assert len({paths[0], paths[2], paths[3]}) == 3
  assert (tmp_path / "cxx.log").read_text().count("build") == 3
  assert sorted(p.name for p in (tmp_path / "cache").glob("*.so")) == sorted(
    os.path.basename(p) for p in {paths[0], paths[2], paths[3]}
  )


def test_concurrent_processes_build_once(tmp_path):
  # A stand-in compiler that takes its time and "links" by copying the
  # library this process already has; two processes start their first
  # load() together on an empty cache.
  real = _real_library()
  compiler = _fake_compiler(tmp_path / "slow-cxx", f'sleep 2\ncp "{real}" "$out"')
  go = tmp_path / "go"
  code = textwrap.dedent(f"""\
      import json, os, sys, time
      import torch
      import tensorflow as tf
      from torchbridge._native import _loader
      from torchbridge._native import _build
      open(sys.argv[1], "w").close()
      while not os.path.exists({str(go)!r}):
        time.sleep(0.01)
      print(json.dumps([_loader.available(), _build.build_count]))
      """)
  env = dict(os.environ, CXX=str(compiler), **{_build.CACHE_ENV: str(tmp_path / "cache")})
  env.pop(_loader.DISABLE_ENV, None)
  env["PYTHONPATH"] = _ROOT + os.pathsep + env.get("PYTHONPATH", "")
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", code, str(tmp_path / f"ready{i}")],
      env=env,
      cwd=_ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  deadline = time.time() + 240
  while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
    assert time.time() < deadline and all(p.poll() is None for p in procs)
    time.sleep(0.05)
  go.touch()
  results = []
  for proc in procs:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    results.append(json.loads(out.strip().splitlines()[-1]))
  assert [r[0] for r in results] == [True, True]
  assert sorted(r[1] for r in results) == [0, 1]
  assert (tmp_path / "slow-cxx.log").read_text().count("build") == 1
  assert len(list((tmp_path / "cache").glob("*.so"))) == 1
  assert not list((tmp_path / "cache").glob("*.tmp"))
