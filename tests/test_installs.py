"""Every import order works with what users install, triton included.

Each case runs in a fresh interpreter, so a crash (a signal) fails one test
instead of the run. On these machines' development venv triton is absent;
`make test-user` runs this module again in a venv holding the torch wheel
from the package index, which brings triton (see README, "Installs").

The fake-triton cases build a tiny stand-in `triton/_C/libtriton.so` with the
C compiler, so the preload's logic and the linker behaviour it relies on are
tested in every environment.
"""

import importlib.util
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchbridge._frameworks import _load_order

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = [pytest.mark.slow, pytest.mark.one_pass]

TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(
  not TRITON_INSTALLED, reason="triton is not installed here (`make test-user` installs it)"
)
needs_cc = pytest.mark.skipif(
  shutil.which("gcc") is None, reason="needs gcc to build a stand-in library"
)


def run_python(code, cwd, env=None, timeout=300):
  """Runs `code` in a fresh interpreter; returns the CompletedProcess."""
  full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  full_env.update(env or {})
  return subprocess.run(
    [sys.executable, "-c", textwrap.dedent(code)],
    cwd=cwd,
    env=full_env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def describe(out):
  if out.returncode < 0:
    how = f"died on signal {signal.Signals(-out.returncode).name}"
  else:
    how = f"exited with {out.returncode}"
  return f"{how}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}"


def assert_ran(out):
  assert out.returncode >= 0, "crashed: " + describe(out)
  assert out.returncode == 0, describe(out)


# A TorchModule(nn.Linear) eagerly and inside tf.function (forward, gradient,
# an optimizer step), after the imports in the order given.
_LINEAR_CHILD = """
{imports}
import json
import numpy as np
import tensorflow as tf
import torch
import torchbridge as tb

torch.manual_seed(0)
linear_torch = torch.nn.Linear(3, 2)
layer = tb.TorchModule(linear_torch, name="linear")
x_tf = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
y_eager = layer(x_tf).numpy()

opt = tf.keras.optimizers.SGD(0.1)

@tf.function
def step(x):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(layer(x) ** 2)
  grads = tape.gradient(loss, layer.trainable_variables)
  opt.apply_gradients(zip(grads, layer.trainable_variables))
  return loss

# The reference before the step: the torch module shows the variables'
# current values, which the step changes.
x_torch = torch.as_tensor(x_tf.numpy())
y_torch = linear_torch(x_torch)
loss_tf = float(step(x_tf))
print(json.dumps({{
    "eager_error": float(np.abs(y_eager - y_torch.detach().numpy()).max()),
    "loss_error": abs(loss_tf - float((y_torch ** 2).sum())),
    "modules": sorted(m for m in ("triton", "torch._dynamo")
                      if m in __import__("sys").modules),
}}))
"""

ORDERS = list(itertools.permutations(["torch", "tensorflow", "torchbridge"]))


@pytest.mark.parametrize("order", ORDERS, ids=["-".join(o) for o in ORDERS])
def test_torch_module_works_in_every_import_order(order, tmp_path):
  imports = "\n".join(f"import {name}" for name in order)
  out = run_python(_LINEAR_CHILD.format(imports=imports), tmp_path)
  if out.returncode != 0 and "ImportError" in out.stderr:
    # The documented refusal is the only acceptable failure (it happens only
    # where RTLD_DEEPBIND is missing, never on glibc).
    assert "Import torchbridge (or torch, then `import triton`)" in out.stderr
    assert not hasattr(os, "RTLD_DEEPBIND"), describe(out)
    return
  assert_ran(out)
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["eager_error"] < 1e-6
  assert result["loss_error"] < 1e-4


@needs_triton
def test_torchbridge_loads_triton_library_before_anything_imports_triton(tmp_path):
  out = run_python(
    """
      import sys
      import tensorflow
      import torchbridge
      from torchbridge._frameworks import _load_order
      path = _load_order.triton_library_path()
      maps = open("/proc/self/maps").read()
      assert "triton" not in sys.modules, "triton's Python code ran"
      assert path in maps, "libtriton was not loaded"
      import triton          # binds to the library already loaded
      import torch._dynamo   # what a bridged call imports lazily
      import torch
      print("ok", triton.__version__)
      """,
    tmp_path,
  )
  assert_ran(out)
  assert "ok" in out.stdout


@needs_triton
def test_without_the_preload_triton_after_tensorflow_crashes(tmp_path):
  """The control: proves the crash the preload prevents is real here."""
  out = run_python(
    "import tensorflow\nimport triton\nprint('survived')",
    tmp_path,
    env={_load_order.PRELOAD_ENV: "0"},
  )
  if out.returncode == 0:
    pytest.skip("this TensorFlow/triton pair no longer crashes in this order")
  # triton 3.8 dies with SIGSEGV (an LLVM static initializer on TF's
  # objects); triton 3.9 with SIGABRT ("LLVM ERROR: inconsistency in
  # registered CommandLine options"): the same clash.
  assert out.returncode in (-signal.SIGSEGV, -signal.SIGABRT), describe(out)


# ----------------------------------------------------- a stand-in triton

_FAKE_LIB = r"""
int probe_owner(void) { return 1; }          /* also defined by "TF" */
int which_probe(void) { return probe_owner(); }
"""
_FAKE_GLOBAL_LIB = r"""
int probe_owner(void) { return 2; }
"""


@pytest.fixture
def fake_triton(tmp_path):
  """A package `triton` whose `_C/libtriton.so` calls a symbol that a
  globally loaded library (playing TensorFlow's part) also defines."""
  root = tmp_path / "site"
  lib_dir = root / "triton" / "_C"
  lib_dir.mkdir(parents=True)
  (root / "triton" / "__init__.py").write_text(
    "raise RuntimeError('the stand-in triton must not be imported')\n"
  )
  for name, source in (("libtriton.so", _FAKE_LIB), ("libglobal.so", _FAKE_GLOBAL_LIB)):
    c_file = tmp_path / (name + ".c")
    c_file.write_text(source)
    target = lib_dir / name if name == "libtriton.so" else tmp_path / name
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(target), str(c_file)], check=True)
  return {
    "site": str(root),
    "lib": str(lib_dir / "libtriton.so"),
    "global": str(tmp_path / "libglobal.so"),
  }


_FAKE_CHILD = """
import ctypes, os, sys
sys.path.insert(0, {site!r})
# Plays TensorFlow's part: a library loaded first with RTLD_GLOBAL that
# defines a symbol the stand-in libtriton also defines.
ctypes.CDLL({glob!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
{before}
import torchbridge
from torchbridge._frameworks import _load_order
handle = _load_order._loaded.get("triton")
print("loaded", handle is not None and {lib!r} in open("/proc/self/maps").read())
if handle is not None:
  print("owner", handle.which_probe())
print("imported", "triton" in sys.modules)
"""


def run_fake(fake_triton, tmp_path, before="", env=None):
  code = _FAKE_CHILD.format(
    site=fake_triton["site"], glob=fake_triton["global"], lib=fake_triton["lib"], before=before
  )
  return run_python(code, tmp_path, env=env, timeout=120)


@needs_cc
def test_preload_binds_the_library_to_its_own_symbols(fake_triton, tmp_path):
  out = run_fake(fake_triton, tmp_path, before="import tensorflow")
  assert_ran(out)
  assert "loaded True" in out.stdout
  # RTLD_DEEPBIND: the library's own definition wins over the global one.
  assert "owner 1" in out.stdout
  assert "imported False" in out.stdout  # triton's Python code never ran


@needs_cc
def test_a_plain_load_would_bind_to_the_global_definition(fake_triton, tmp_path):
  """The control for the test above: without RTLD_DEEPBIND, the symbol
  binds to the globally loaded library, as libtriton's LLVM did to TF's."""
  out = run_python(
    f"""
      import ctypes, os
      ctypes.CDLL({fake_triton["global"]!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
      lib = ctypes.CDLL({fake_triton["lib"]!r}, mode=os.RTLD_NOW)
      print("owner", lib.which_probe())
      """,
    tmp_path,
  )
  assert_ran(out)
  assert "owner 2" in out.stdout


@needs_cc
def test_preload_can_be_turned_off(fake_triton, tmp_path):
  out = run_fake(fake_triton, tmp_path, env={_load_order.PRELOAD_ENV: "0"})
  assert_ran(out)
  assert "loaded False" in out.stdout


@needs_cc
def test_without_deepbind_after_tensorflow_the_import_names_the_order(fake_triton, tmp_path):
  out = run_fake(fake_triton, tmp_path, before="import tensorflow\ndel os.RTLD_DEEPBIND")
  assert out.returncode == 1, describe(out)
  assert "ImportError" in out.stderr
  flat = " ".join(out.stderr.split())
  assert "TensorFlow is already imported" in flat
  assert "this C library has no RTLD_DEEPBIND" in flat
  assert fake_triton["lib"] in out.stderr
  assert "import torch\n    import torchbridge\n    import tensorflow" in (out.stderr)


@needs_cc
def test_without_deepbind_before_tensorflow_loads_plainly(fake_triton, tmp_path):
  out = run_fake(fake_triton, tmp_path, before="del os.RTLD_DEEPBIND")
  assert_ran(out)
  assert "loaded True" in out.stdout


@needs_cc
def test_a_broken_triton_library_does_not_stop_the_import(fake_triton, tmp_path):
  with open(fake_triton["lib"], "wb") as f:
    f.write(b"not an ELF file")
  out = run_fake(fake_triton, tmp_path, before="import tensorflow")
  assert_ran(out)
  assert "loaded False" in out.stdout


@pytest.mark.skipif(
  os.environ.get("TORCHBRIDGE_USER_INSTALL") != "1",
  reason="only in the user-install venv (make test-user)",
)
def test_user_install_runs_the_installed_package_beside_triton():
  import torchbridge  # pylint: disable=import-outside-toplevel

  assert "site-packages" in torchbridge.__file__, torchbridge.__file__
  assert TRITON_INSTALLED
  # The op's C++ sources ship inside the package (built on first use).
  # Every .cc/.h of the checkout's csrc/ ships (the C++ torch runner's
  # in csrc/exported/, the XLA custom call's in csrc/xla/), and nothing else.
  csrc = Path(torchbridge.__file__).parent / "csrc"
  checkout_csrc = Path(__file__).resolve().parents[1] / "csrc"

  expected = sorted(
    str(p.relative_to(checkout_csrc))
    for p in checkout_csrc.rglob("*")
    if p.is_file() and p.suffix in (".cc", ".h")
  )
  assert "torch_thread.h" in expected and "torchbridge_op.cc" in expected
  assert "exported/exported_call.cc" in expected and "xla/xla_call.cc" in expected
  shipped = sorted(str(p.relative_to(csrc)) for p in csrc.rglob("*") if p.is_file())
  assert shipped == expected
