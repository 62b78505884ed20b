"""`python -m torchbridge info|build` and what a user sees of the op's build.

Every case runs in processes of its own, on the torchbridge this Python
imports (the checkout in the development venv, the installed package in
`make test-user`'s). One case builds the real op into an empty cache; the
others use the shared cache or a stand-in compiler whose "link" copies the
real library, so they take seconds.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf  # noqa: F401

from torchbridge._native import _loader
from torchbridge._native import _build

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = [pytest.mark.slow, pytest.mark.one_pass]

DISABLED = os.environ.get(_loader.DISABLE_ENV, "").strip() not in ("", "0")


def run(args, tmp_path, env=None, timeout=600):
  """`python -P args` in `tmp_path` (so the package is what Python finds
  installed), with `env` applied (None removes a variable)."""
  full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  full_env.pop("PYTHONPATH", None)
  for key, value in (env or {}).items():
    if value is None:
      full_env.pop(key, None)
    else:
      full_env[key] = value
  return subprocess.run(
    [sys.executable, "-P"] + args,
    cwd=tmp_path,
    env=full_env,
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )


def cli(args, tmp_path, env=None):
  return run(["-m", "torchbridge"] + args, tmp_path, env)


def real_library():
  """The real library of this set-up (built into the shared cache once);
  skips only where no C++ compiler exists."""
  try:
    return _build.build_or_reuse()
  except _build.BuildError as err:
    if "no C++ compiler" in str(err):
      pytest.skip(f"needs a C++ compiler: {err}")
    raise


def stand_in_compiler(tmp_path, fail_interop=False, fail_exported=False):
  """A CXX whose compile steps write empty objects (or fail, for
  torch_interop.cc with `fail_interop`, for the C++ torch runner's
  exported_call.cc with `fail_exported`), and whose link copies the real
  op's library (an empty file for the C++ torch runner's, whose loading
  then fails, and for the XLA custom call's) and appends a line to
  `cxx.log`."""
  real = real_library()
  path = tmp_path / "cxx"
  path.write_text(
    textwrap.dedent(f"""\
      #!/bin/sh
      out=""; compile=0; interop=0; exported=0
      for arg in "$@"; do
        case "$arg" in
          -c) compile=1 ;;
          *torch_interop.cc) interop=1 ;;
          *exported_call.cc) exported=1 ;;
        esac
      done
      while [ $# -gt 0 ]; do
        if [ "$1" = "-o" ]; then out="$2"; fi
        shift
      done
      if [ "$compile" = 1 ]; then
        if [ "$interop" = 1 ] && [ "{int(fail_interop)}" = 1 ]; then
          echo "torch_interop.cc:1: error: stand-in failure" >&2; exit 1
        fi
        if [ "$exported" = 1 ] && [ "{int(fail_exported)}" = 1 ]; then
          echo "exported_call.cc:1: error: stand-in failure" >&2; exit 1
        fi
        : > "$out"; exit 0
      fi
      echo link >> "{tmp_path}/cxx.log"
      case "$out" in
        *torchbridge_exported*) : > "$out"; exit 0 ;;  # loading it fails: Python path
        *torchbridge_xla*) : > "$out"; exit 0 ;;  # the XLA custom call's (not loaded)
      esac
      cp "{real}" "$out"
      """)
  )
  path.chmod(0o755)
  return path


def links(tmp_path):
  log = tmp_path / "cxx.log"
  return log.read_text().count("link") if log.exists() else 0


# The README's first example in TF-first order, timing its first graph call.
# The README example on the torch runner: its first graph call builds or
# loads the native op (the default runner's translation needs none).
FIRST_CALL = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "first_call.py"
)


def last_json(out):
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  try:
    return json.loads(out.stdout)  # info --json: the whole output
  except ValueError:
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# info


@pytest.mark.skipif(DISABLED, reason="the native op is disabled here")
def test_info_reports_the_complete_op_and_the_set_up(tmp_path):
  path = real_library()
  info = last_json(cli(["info", "--json"], tmp_path))
  op = info["native_op"]
  # The fast path, not the fallback: this fails where torch_interop.cc did
  # not build (e.g. torch's headers compiled with the wrong C++ standard).
  assert op["active"] is True and op["complete"] is True, op
  assert op["kind"] == "complete" and op["fallback_reason"] is None
  assert op["library"] == str(path) and op["call_path"] == "native op"
  versions = info["versions"]
  assert versions["torch"] == torch.__version__
  assert versions["tensorflow"] == tf.__version__
  assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
  assert "g++" in versions["compiler"] or "clang" in versions["compiler"]
  import importlib.util  # pylint: disable=import-outside-toplevel

  if importlib.util.find_spec("triton") is None:
    assert versions["triton"] is None
    assert info["import_order"]["preload"].startswith("not needed")
  else:
    assert versions["triton"]
    assert info["import_order"]["preload"].startswith("active")
  assert info["threads"]["torch_intra_op"] >= 1
  assert set(info["gpus"]) >= {"torch", "tensorflow"}


def test_info_text_names_each_section(tmp_path):
  out = cli(["info", "--no-build"], tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  for heading in ("versions", "native op", "import order", "threads", "gpus"):
    assert f"\n{heading}\n" in f"\n{out.stdout}", out.stdout
  assert re.search(rf"^  torch +{re.escape(torch.__version__)}$", out.stdout, re.MULTILINE), (
    out.stdout
  )


def test_info_no_build_on_an_empty_cache_builds_nothing(tmp_path):
  cache = tmp_path / "cache"
  out = cli(
    ["info", "--json", "--no-build"],
    tmp_path,
    {_build.CACHE_ENV: str(cache), _loader.DISABLE_ENV: None},
  )
  op = last_json(out)["native_op"]
  assert op["active"] is False and op["library"] is None
  assert "not built yet" in op["status"]
  assert "python -m torchbridge build" in op["status"]
  assert not list(cache.glob("*.so")) if cache.exists() else True
  assert "building" not in out.stderr


def test_info_says_when_the_op_is_disabled(tmp_path):
  op = last_json(cli(["info", "--json"], tmp_path, {_loader.DISABLE_ENV: "1"}))["native_op"]
  assert op["active"] is False and op["call_path"] == "tf.py_function"
  assert op["disabled_by"] == f"{_loader.DISABLE_ENV}=1"
  assert _loader.DISABLE_ENV in op["status"]


# ---------------------------------------------------------------------------
# build, and the first call after it


def test_build_ahead_of_time_then_the_first_graph_call_does_not_build(tmp_path):
  real_library()  # skips where no compiler exists
  env = {_build.CACHE_ENV: str(tmp_path / "cache"), _loader.DISABLE_ENV: None}
  built = cli(["build"], tmp_path, env)
  assert built.returncode == 0, built.stderr[-3000:]
  assert "built and complete" in built.stdout
  assert "building the native TF op" in built.stderr  # announced
  # The op, and the C++ torch runner's library beside it.
  libraries = list((tmp_path / "cache").glob("torchbridge_op*.so"))
  [runner] = (tmp_path / "cache").glob("torchbridge_exported-*.so")
  assert len(libraries) == 1
  assert f"the C++ torch runner is built: {runner}" in built.stdout
  [xla] = (tmp_path / "cache").glob("torchbridge_xla-*.so")
  assert f"the XLA custom call (jit_compile=True) is built: {xla}" in built.stdout
  record = _build.build_record(libraries[0])
  assert record["complete"] is True and record["seconds"] > 0

  first = run([FIRST_CALL, "--run", "torch"], tmp_path, env)
  result = last_json(first)
  assert result["builds"] == 0 and "building" not in first.stderr
  assert result["native"] and result["complete"], result["status"]
  assert str(libraries[0]) in result["status"]
  print(
    f"first graph call after `python -m torchbridge build`: "
    f"{result['first_call_s']} s (imports {result['import_s']} s)"
  )

  again = cli(["build"], tmp_path, env)  # cached: nothing to do
  assert again.returncode == 0 and "building" not in again.stderr
  # info names the C++ torch runner's library; a run="torch" graph call
  # loads it, building nothing.
  info = last_json(cli(["info", "--json", "--no-build"], tmp_path, env))["native_op"]
  assert str(runner) in info["torch_runner_library"]
  first = run(["-c", TORCH_RUNNER_CALL], tmp_path, env)
  result = last_json(first)
  assert result == {"cpp": True, "loaded_from": str(runner)}, first.stderr[-3000:]
  assert "building" not in first.stderr


# One run="torch" graph call; whether it ran in C++, and from where.
TORCH_RUNNER_CALL = """
import json, torch, tensorflow as tf, torchbridge as tb
from torchbridge._native import _exported
m = tb.TorchModule(torch.nn.Linear(3, 2), run="torch")
with tb.timeline(annotate=False) as trace:
  y = tf.function(m)(tf.ones([4, 3]))
assert y.shape == (4, 2)
loaded = _exported.loaded_from()
print(json.dumps({
  "cpp": "torchbridge/C++ callback" in {e["name"] for e in trace.events},
  "loaded_from": None if loaded is None else str(loaded),
}))
"""


def test_a_torch_runner_library_that_cannot_build_fails_build_and_its_calls_take_python(
  tmp_path,
):
  compiler = stand_in_compiler(tmp_path, fail_exported=True)
  env = {_build.CACHE_ENV: str(tmp_path / "cache"), _loader.DISABLE_ENV: None, "CXX": str(compiler)}
  out = cli(["build"], tmp_path, env)
  assert out.returncode == 1
  assert "built and complete" in out.stdout  # the op itself
  assert "the C++ torch runner failed to build" in out.stderr
  assert "exported_call.cc" in out.stderr and "stand-in failure" in out.stderr
  assert cli(["build", "--allow-fallback"], tmp_path, env).returncode == 0
  info = last_json(cli(["info", "--json", "--no-build"], tmp_path, env))["native_op"]
  assert "not built yet" in info["torch_runner_library"]
  # A run="torch" module then runs on the Python path, said once with the
  # reason; its results are right.
  call = run(["-c", TORCH_RUNNER_CALL], tmp_path, env)
  assert last_json(call) == {"cpp": False, "loaded_from": None}
  assert call.stderr.count("graph calls run torch on the Python path") == 1
  assert "its C++ library could not be built or loaded" in call.stderr
  assert "stand-in failure" in call.stderr


def test_a_cold_first_call_announces_the_build_on_stderr(tmp_path):
  compiler = stand_in_compiler(tmp_path)
  env = {_build.CACHE_ENV: str(tmp_path / "cache"), _loader.DISABLE_ENV: None, "CXX": str(compiler)}
  out = run([FIRST_CALL, "--run", "torch"], tmp_path, env)
  result = last_json(out)
  # The op, then the C++ torch runner (the graph call runs torch).
  assert result["builds"] == 1 and links(tmp_path) == 2
  # No logging configured, as in the README's example: the lines reach
  # stderr, saying what, where, about how long, and how to build ahead.
  start = next(line for line in out.stderr.splitlines() if "building the native TF op" in line)
  assert str(tmp_path / "cache") in start and str(compiler) in start
  assert "takes" in start and " s" in start
  assert "python -m torchbridge build" in start
  assert "built the native TF op in" in out.stderr


def test_the_build_lines_follow_the_torchbridge_logger(tmp_path):
  compiler = stand_in_compiler(tmp_path)
  env = {_build.CACHE_ENV: str(tmp_path / "cache"), _loader.DISABLE_ENV: None, "CXX": str(compiler)}
  silenced = run(
    [
      "-c",
      "import logging, runpy, sys\n"
      "logging.getLogger('torchbridge').setLevel(logging.WARNING)\n"
      "sys.argv[1:] = ['--run', 'torch']\n"
      f"runpy.run_path({FIRST_CALL!r})",
    ],
    tmp_path,
    env,
  )
  assert last_json(silenced)["builds"] == 1
  assert "building the native TF op" not in silenced.stderr
  # A user's own configuration (here: INFO to stdout) gets the lines.
  configured = run(
    [
      "-c",
      "import logging, runpy, sys\nlogging.basicConfig("
      "stream=sys.stdout, level=logging.INFO, "
      "format='LOG %(name)s %(message)s')\n"
      "sys.argv[1:] = ['--run', 'torch']\n"
      f"runpy.run_path({FIRST_CALL!r})",
    ],
    tmp_path,
    dict(env, **{_build.CACHE_ENV: str(tmp_path / "cache2")}),
  )
  last_json(configured)
  assert "LOG torchbridge torchbridge: building the native TF op" in (configured.stdout)
  assert "building the native TF op" not in configured.stderr


def test_build_force_builds_again(tmp_path):
  compiler = stand_in_compiler(tmp_path)
  env = {_build.CACHE_ENV: str(tmp_path / "cache"), "CXX": str(compiler)}
  assert cli(["build"], tmp_path, env).returncode == 0
  assert cli(["build"], tmp_path, env).returncode == 0
  # The op, the C++ torch runner's library, the XLA custom call's.
  assert links(tmp_path) == 3
  assert cli(["build", "--force"], tmp_path, env).returncode == 0
  assert links(tmp_path) == 6


def test_build_fails_with_the_reason_and_a_nonzero_exit(tmp_path):
  out = cli(["build"], tmp_path, {_build.CACHE_ENV: str(tmp_path / "cache"), "CXX": "false"})
  assert out.returncode == 1
  assert "torchbridge build: failed:" in out.stderr
  assert "compiling the native op failed" in out.stderr
  assert "full log:" in out.stderr
  assert not list((tmp_path / "cache").glob("*.so"))


def test_build_that_must_fall_back_says_why_and_fails_unless_allowed(tmp_path):
  compiler = stand_in_compiler(tmp_path, fail_interop=True)
  env = {_build.CACHE_ENV: str(tmp_path / "cache"), _loader.DISABLE_ENV: None, "CXX": str(compiler)}
  out = cli(["build"], tmp_path, env)
  assert out.returncode == 1
  assert "WITHOUT torch's side" in out.stderr
  assert "torch_interop.cc" in out.stderr and "stand-in failure" in out.stderr
  [library] = (tmp_path / "cache").glob("*.so")
  record = _build.build_record(library)
  assert record["complete"] is False
  assert "-std=c++20" in record["reason"]
  with open(record["log"], encoding="utf-8") as log:
    assert "stand-in failure" in log.read()
  allowed = cli(["build", "--allow-fallback"], tmp_path, env)
  assert allowed.returncode == 0, allowed.stderr
  info = last_json(cli(["info", "--json", "--no-build"], tmp_path, env))
  assert info["native_op"]["kind"] == "fallback"
  assert "stand-in failure" in info["native_op"]["fallback_reason"]


@pytest.mark.parametrize("args", [[], ["nonsense"], ["info", "--bogus"]])
def test_bad_arguments_print_usage_and_exit_2(args, tmp_path):
  out = cli(args, tmp_path)
  assert out.returncode == 2
  assert "usage: python -m torchbridge" in out.stderr
  assert "Traceback" not in out.stderr
