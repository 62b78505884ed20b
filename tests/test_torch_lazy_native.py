"""Native code that torch loads lazily, loaded after TensorFlow.

torch loads some of its native code the first time it is used: dynamo and
inductor (and with them triton's library, where triton is installed, as it is
with every Linux torch wheel from PyPI), `torch.export`, and C++ extensions
built by `torch.utils.cpp_extension`. Inside a bridged call TensorFlow is
always loaded already, and TensorFlow >= 2.20 exports its symbols (LLVM
among them) globally, so each of these loads happens in the order that
crashed (`_load_order.py`).

Each case runs in a fresh Python process that imports TensorFlow before torch
and torchbridge (the hard order; the test process itself has both loaded
already), so that the lazy loads happen there, for the first time, inside or
around bridged calls. A crash shows as a signal, reported on its own. The
child prints its results as one JSON line; the comparisons happen here.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = [pytest.mark.slow, pytest.mark.one_pass]

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_PREFIX = "TORCHBRIDGE_TEST_RESULT "

slow = pytest.mark.slow  # registered in pytest.ini

# The start of every child: TensorFlow first, then torch and torchbridge.
CHILD_PRELUDE = f"""\
import json
import sys

import numpy as np
import tensorflow as tf
import torch
import torchbridge as tb


def report(**values):
  print({RESULT_PREFIX!r} + json.dumps(values), flush=True)
"""


def child_path():
  """The PATH of the children: this interpreter's bin first (venv tools)."""
  return os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)])


def run_child(tmp_path, body, timeout):
  """Runs CHILD_PRELUDE + `body` in a fresh interpreter; its report()."""
  code = CHILD_PRELUDE + textwrap.dedent(body)
  # No PYTHONPATH of ours: the child imports the torchbridge this
  # interpreter has installed (editable in the development venv, the
  # non-editable package in `make test-user`'s venv).
  env = dict(
    os.environ,
    TF_CPP_MIN_LOG_LEVEL="3",
    PATH=child_path(),
    # Cold caches of its own: each run compiles and loads for real, and
    # leaves nothing behind.
    TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor_cache"),
    TORCH_EXTENSIONS_DIR=str(tmp_path / "torch_extensions"),
  )
  proc = subprocess.run(
    [sys.executable, "-c", code],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  output = (
    f"--- stdout (tail) ---\n{proc.stdout[-3000:]}\n--- stderr (tail) ---\n{proc.stderr[-6000:]}"
  )
  if proc.returncode < 0:
    try:
      name = signal.Signals(-proc.returncode).name
    except ValueError:
      name = f"signal {-proc.returncode}"
    pytest.fail(
      f"the child process died on {name} (TensorFlow imported "
      f"before torch and torchbridge):\n{output}"
    )
  assert proc.returncode == 0, f"the child process exited with status {proc.returncode}:\n{output}"
  results = [
    line[len(RESULT_PREFIX) :]
    for line in proc.stdout.splitlines()
    if line.startswith(RESULT_PREFIX)
  ]
  assert len(results) == 1, f"expected one result line:\n{output}"
  return json.loads(results[0])


def assert_close(actual, expected, what, tol=1e-5):
  """Asserts that two nests of numbers (JSON lists) agree within `tol`."""
  np.testing.assert_allclose(
    np.asarray(actual), np.asarray(expected), rtol=tol, atol=tol, err_msg=what
  )


@slow
def test_compiled_module_in_torch_module_matches_uncompiled_torch(tmp_path):
  """A `torch.compile`d MLP (inductor) as a `tb.TorchModule`: eager calls,
  a gradient in `tf.function`, and Keras SGD steps give what the uncompiled
  module gives in torch, and dynamo compiled both the inference and the
  training forward."""
  got = run_child(
    tmp_path,
    """
      import copy
      import importlib.util

      from torch._dynamo.utils import counters

      torch.manual_seed(0)
      net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 3))
      net_ref = copy.deepcopy(net)  # never compiled, the same weights
      mlp = tb.TorchModule(torch.compile(net), name="mlp")
      tvars = mlp.trainable_variables
      # "mlp/_orig_mod.0.weight:0" -> "0.weight"
      names = [v.name[len("mlp/"):-len(":0")].removeprefix("_orig_mod.")
               for v in tvars]
      params_ref = dict(net_ref.named_parameters())

      rng = np.random.default_rng(0)
      x_np = rng.standard_normal((8, 4)).astype(np.float32)
      y_np = rng.standard_normal((8, 3)).astype(np.float32)
      x_tf, y_tf = tf.constant(x_np), tf.constant(y_np)
      x_torch, y_torch = torch.from_numpy(x_np), torch.from_numpy(y_np)

      # (a) Eagerly. The first call in a mode also learns which buffers the
      # forward writes (run uncompiled); the second runs compiled code.
      eager_tf = [mlp(x_tf, training=False).numpy().tolist()
                  for _ in range(2)]
      frames_after_eager = dict(counters["frames"])

      # (b) A gradient inside tf.function.
      @tf.function
      def loss_and_grads(x_tf, y_tf):
        with tf.GradientTape() as tape:
          out_tf = mlp(x_tf, training=True)
          loss_tf = tf.reduce_mean((out_tf - y_tf) ** 2)
        return out_tf, loss_tf, tape.gradient(loss_tf, tvars)

      out_tf, loss_tf, grads_tf = loss_and_grads(x_tf, y_tf)
      frames_after_training = dict(counters["frames"])

      net_ref.eval()
      with torch.no_grad():
        eager_torch = net_ref(x_torch)
      net_ref.train()
      out_torch = net_ref(x_torch)
      loss_torch = ((out_torch - y_torch) ** 2).mean()
      grads_torch = torch.autograd.grad(loss_torch,
                                        [params_ref[n] for n in names])

      # Keras SGD steps in tf.function, and the same steps in torch.
      opt = tf.keras.optimizers.SGD(0.1)

      @tf.function
      def train_step(x_tf, y_tf):
        with tf.GradientTape() as tape:
          loss_tf = tf.reduce_mean((mlp(x_tf, training=True) - y_tf) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss_tf, tvars), tvars))
        return loss_tf

      opt_torch = torch.optim.SGD(net_ref.parameters(), lr=0.1)
      losses_tf, losses_torch = [], []
      for _ in range(3):
        losses_tf.append(float(train_step(x_tf, y_tf)))
        opt_torch.zero_grad()
        loss_step_torch = ((net_ref(x_torch) - y_torch) ** 2).mean()
        loss_step_torch.backward()
        opt_torch.step()
        losses_torch.append(float(loss_step_torch))

      report(
          names=names,
          eager_tf=eager_tf,
          eager_torch=eager_torch.tolist(),
          out_tf=out_tf.numpy().tolist(),
          out_torch=out_torch.detach().tolist(),
          loss_tf=float(loss_tf),
          loss_torch=float(loss_torch),
          grads_tf=[g.numpy().tolist() for g in grads_tf],
          grads_torch=[g.tolist() for g in grads_torch],
          losses_tf=losses_tf,
          losses_torch=losses_torch,
          weights_tf=[v.numpy().tolist() for v in tvars],
          weights_torch=[params_ref[n].detach().tolist() for n in names],
          frames_after_eager=frames_after_eager,
          frames_after_training=frames_after_training,
          frames_final=dict(counters["frames"]),
          triton_installed=importlib.util.find_spec("triton") is not None,
          triton_loaded="triton" in sys.modules,
      )
      """,
    timeout=300,
  )

  assert sorted(got["names"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]
  for i, eager_tf in enumerate(got["eager_tf"]):
    assert_close(eager_tf, got["eager_torch"], f"eager call {i}")
  assert_close(got["out_tf"], got["out_torch"], "output in tf.function")
  assert_close(got["loss_tf"], got["loss_torch"], "loss in tf.function")
  for name, grad_tf, grad_torch in zip(got["names"], got["grads_tf"], got["grads_torch"]):
    assert_close(grad_tf, grad_torch, f"gradient of {name}")
  assert_close(got["losses_tf"], got["losses_torch"], "SGD step losses")
  for name, weight_tf, weight_torch in zip(got["names"], got["weights_tf"], got["weights_torch"]):
    assert_close(weight_tf, weight_torch, f"{name} after 3 SGD steps")
  # Dynamo compiled the inference forward on the second eager call, and the
  # training forward (other grad mode and train flag: a new frame) inside the
  # tf.function; code it had marked "skip" would not be counted again.
  frames_eager = got["frames_after_eager"].get("ok", 0)
  frames_training = got["frames_after_training"].get("ok", 0)
  assert frames_eager >= 1, got["frames_after_eager"]
  assert frames_training > frames_eager, got["frames_after_training"]
  assert got["frames_final"].get("ok", 0) >= frames_training
  # Where triton is installed, compiling loaded it after TensorFlow: the
  # clash this process survived.
  assert got["triton_loaded"] == got["triton_installed"], got


@slow
def test_compiled_function_in_torch_function_matches_uncompiled(tmp_path):
  """A `torch.compile`d plain function as a `tb.torch_function`, eagerly and
  in `tf.function` (value and gradient)."""
  got = run_child(
    tmp_path,
    """
      from torch._dynamo.utils import counters

      def f(a_torch, b_torch):
        return torch.sin(a_torch) * b_torch + a_torch ** 2

      f_bridged = tb.torch_function(torch.compile(f))

      rng = np.random.default_rng(1)
      a_np = rng.standard_normal((5, 3)).astype(np.float32)
      b_np = rng.standard_normal((5, 3)).astype(np.float32)
      a_tf, b_tf = tf.constant(a_np), tf.constant(b_np)

      eager_tf = f_bridged(a_tf, b_tf)
      frames_after_eager = dict(counters["frames"])

      @tf.function
      def value_and_grad(a_tf, b_tf):
        with tf.GradientTape() as tape:
          tape.watch(a_tf)
          y_tf = f_bridged(a_tf, b_tf)
          sum_tf = tf.reduce_sum(y_tf)
        return y_tf, tape.gradient(sum_tf, a_tf)

      y_tf, grad_tf = value_and_grad(a_tf, b_tf)

      a_torch = torch.from_numpy(a_np).requires_grad_()
      y_torch = f(a_torch, torch.from_numpy(b_np))
      (grad_torch,) = torch.autograd.grad(y_torch.sum(), a_torch)
      report(
          eager_tf=eager_tf.numpy().tolist(),
          y_tf=y_tf.numpy().tolist(),
          grad_tf=grad_tf.numpy().tolist(),
          y_torch=y_torch.detach().tolist(),
          grad_torch=grad_torch.tolist(),
          frames_after_eager=frames_after_eager,
          frames_final=dict(counters["frames"]),
      )
      """,
    timeout=240,
  )

  assert_close(got["eager_tf"], got["y_torch"], "eager value")
  assert_close(got["y_tf"], got["y_torch"], "value in tf.function")
  assert_close(got["grad_tf"], got["grad_torch"], "gradient in tf.function")
  assert got["frames_after_eager"].get("ok", 0) >= 1, got
  assert got["frames_final"].get("ok", 0) >= 1, got


def test_torch_export_inside_torch_function(tmp_path):
  """`torch.export.export` run inside an eager `tb.torch_function` call: the
  exported program computes what the module computes."""
  got = run_child(
    tmp_path,
    """
      torch.manual_seed(0)
      net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(),
                                torch.nn.Linear(6, 2))

      @tb.torch_function
      def export_and_run(x_torch):
        program = torch.export.export(net, (x_torch,))
        return program.module()(x_torch), net(x_torch)

      x_np = np.random.default_rng(2).standard_normal((3, 4))
      exported_tf, module_tf = export_and_run(
          tf.constant(x_np.astype(np.float32)))
      report(exported=exported_tf.numpy().tolist(),
             module=module_tf.numpy().tolist())
      """,
    timeout=180,
  )

  assert np.shape(got["exported"]) == (3, 2)
  assert_close(got["exported"], got["module"], "exported program's output")


def cpp_extension_skip_reason():
  """Why `cpp_extension.load_inline` cannot build here, or None."""
  if shutil.which("ninja", path=child_path()) is None:
    return (
      "torch.utils.cpp_extension needs the ninja build tool, which is "
      "neither installed in this venv (pip install ninja) nor on PATH"
    )
  if shutil.which(os.environ.get("CXX", "c++"), path=child_path()) is None:
    return "torch.utils.cpp_extension needs a C++ compiler (c++) on PATH"
  return None


CPP_EXTENSION_SKIP_REASON = cpp_extension_skip_reason()


@slow
@pytest.mark.skipif(CPP_EXTENSION_SKIP_REASON is not None, reason=str(CPP_EXTENSION_SKIP_REASON))
def test_load_inline_extension_in_torch_function(tmp_path):
  """A C++ extension built by `load_inline` after TensorFlow is loaded, called
  by a `tb.torch_function` eagerly and in `tf.function` (with a gradient)."""
  got = run_child(
    tmp_path,
    """
      from torch.utils import cpp_extension

      # Built under TORCH_EXTENSIONS_DIR (in tmp_path, set by run_child).
      ext = cpp_extension.load_inline(
          name="torchbridge_test_add_one",
          cpp_sources=(
              "torch::Tensor add_one(torch::Tensor x) { return x + 1; }"),
          functions=["add_one"])

      @tb.torch_function
      def add_one(x_torch):
        return ext.add_one(x_torch)

      @tf.function
      def value_and_grad(x_tf):
        with tf.GradientTape() as tape:
          tape.watch(x_tf)
          y_tf = add_one(x_tf)
          square_sum_tf = tf.reduce_sum(y_tf * y_tf)
        return y_tf, tape.gradient(square_sum_tf, x_tf)

      x_tf = tf.constant([[-1.5, 0.0, 2.0]])
      y_tf, grad_tf = value_and_grad(x_tf)
      report(eager=add_one(x_tf).numpy().tolist(),
             y_tf=y_tf.numpy().tolist(),
             grad_tf=grad_tf.numpy().tolist())
      """,
    timeout=300,
  )

  assert_close(got["eager"], [[-0.5, 1.0, 3.0]], "eager value")
  assert_close(got["y_tf"], [[-0.5, 1.0, 3.0]], "value in tf.function")
  assert_close(got["grad_tf"], [[-1.0, 2.0, 6.0]], "gradient (2 * (x + 1))")
