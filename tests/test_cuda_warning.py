"""The "CUDA initialization" warning with TensorFlow first is torch's own.

Reported: with the full `tensorflow` package and a CUDA build of torch on a
machine without a GPU driver, imported TF first, the first bridged backward
printed `UserWarning: CUDA initialization: Unexpected error from
cudaGetDeviceCount() ... Error 302`. Found (gdb on `cudaGetDeviceCount`,
`LD_DEBUG=bindings`): `libtensorflow_framework.so.2`, which TF puts in the
global symbol scope (it loads `_pywrap_tensorflow_internal.so` with
RTLD_GLOBAL), exports an unversioned CUDA runtime stub (399 `cuda*`
functions in the CUDA build of TF, none in `tensorflow-cpu`) that forwards
to TF's `libcudart.so.12`. torch's CUDA libraries, loaded after it, bind
their `cudaGetDeviceCount@libcudart.so.13` to that stub instead of torch's
own runtime. Without TF's CUDA libraries the stub returns 302
(cudaErrorSharedObjectSymbolNotFound); torch's own runtime without a driver
returns 35, which torch treats as "no GPU", silently. torch's autograd
engine counts devices on the first backward of the process
(`Engine::start_device_threads` -> `c10::cuda::device_count`), so any
backward warns: `import tensorflow; import torch` then a plain
`loss.backward()` prints the same warning; the bridge's `_vjp.py` is only
the Python frame that calls the engine. torchbridge makes no CUDA query of
its own on CPU tensors. Importing torch (or torchbridge) before TensorFlow
avoids it (torch's runtime is then bound first). See the README, "Installs
and import order".

These cases pin that down: the bridged backward warns exactly when plain
torch's does in the same order, and never initializes CUDA. Each runs in a
fresh interpreter (the import order is the point); they need a CUDA build
of torch (with `tensorflow-cpu` neither warns).
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [
  pytest.mark.slow,
  pytest.mark.skipif(torch.version.cuda is None, reason="torch is not a CUDA build"),
  pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the symbol clash is a Linux dynamic-linker one"
  ),
]

_BRIDGED = textwrap.dedent("""
    import warnings
    warnings.simplefilter("always")   # print every warning, once each

    import tensorflow as tf           # the reporter's order: TF first
    import torchbridge as tb
    import torch

    layer = tb.TorchModule(torch.nn.Linear(3, 2))
    x = tf.ones([4, 3])

    with tf.GradientTape() as tape:   # eager: the first bridged backward
      loss = tf.reduce_sum(layer(x))
    eager = tape.gradient(loss, layer.trainable_variables)

    @tf.function
    def step(x):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x))
      return tape.gradient(loss, layer.trainable_variables)

    graph = step(x)
    assert all(g is not None for g in eager + graph)
    print("cuda initialized", torch.cuda.is_initialized())
    print("ok")
    """)

_PURE_TORCH = textwrap.dedent("""
    import warnings
    warnings.simplefilter("always")

    import tensorflow as tf           # the same order, no torchbridge
    import torch

    torch.nn.Linear(3, 2)(torch.ones(4, 3)).sum().backward()
    print("ok")
    """)


def _run(code, tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("PYTHONWARNINGS", None)
  out = subprocess.run(
    [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
  )
  report = (
    f"exited with {out.returncode}\n--- stdout\n{out.stdout[-3000:]}"
    f"\n--- stderr\n{out.stderr[-3000:]}"
  )
  assert out.returncode == 0, report
  assert "ok" in out.stdout.split(), report
  return out, report


def test_the_bridge_warns_exactly_when_plain_torch_does(tmp_path):
  bridged, report = _run(_BRIDGED, tmp_path)
  pure, pure_report = _run(_PURE_TORCH, tmp_path)
  assert ("CUDA initialization" in bridged.stderr) == ("CUDA initialization" in pure.stderr), (
    report + pure_report
  )
  # The bridge itself never starts CUDA for CPU tensors.
  assert "cuda initialized False" in bridged.stdout, report
