"""One process of tests/test_disk_captures.py: calls three modules in a
`tf.function` with the capture cache of `TORCHBRIDGE_CAPTURE_CACHE` and
prints, as one JSON line, how many exports ran, which runner each module
took, and each output against torch's.

`python tests/_disk_worker.py SCALE`: SCALE is an attribute of the scaled
module (a hyper-parameter the capture bakes in).
"""

import json
import sys

import numpy as np
import torch  # first: the recommended order
import tensorflow as tf

import torchbridge as tb
from torchbridge._capture import _parity
from torchbridge._capture import _shared_export
from torchbridge._runners import _record


class Scaled(torch.nn.Module):
  def __init__(self, scale):
    super().__init__()
    self.linear = torch.nn.Linear(4, 3)
    self.scale = scale

  def forward(self, x):
    return torch.tanh(self.linear(x)) * self.scale


class Spectrum(torch.nn.Module):
  """No TF translation: the TF runner refuses, the C++ runner runs it."""

  def __init__(self):
    super().__init__()
    self.weight = torch.nn.Parameter(torch.ones(4))

  def forward(self, x):
    return torch.fft.fft(x * self.weight).real


class Counting(torch.nn.Module):
  """Changes its own Python state: no capture holds it."""

  def __init__(self):
    super().__init__()
    self.linear = torch.nn.Linear(4, 3)
    self.calls = 0

  def forward(self, x):
    self.calls += 1
    return self.linear(x)


def main():
  checks = []
  real_check = _parity.check
  _parity.check = lambda *a, **k: checks.append(1) or real_check(*a, **k)
  torch.manual_seed(0)
  nets = {"scaled": Scaled(float(sys.argv[1])), "spectrum": Spectrum(), "counting": Counting()}
  x = tf.random.stateless_normal([2, 4], seed=[1, 2])
  report, calls = {}, {}
  for name, net in nets.items():
    module = tb.TorchModule(net, name=name)
    call = calls[name] = tf.function(lambda x, module=module: module(x))
    got = call(x).numpy()
    want = net(torch.from_numpy(x.numpy())).detach().numpy()
    choice = _record.choices()[name]
    report[name] = {
      "runner": choice["runner"],
      "path": choice.get("path"),
      "equal": bool(np.allclose(got, want, rtol=1e-6, atol=1e-6)),
    }
  report["counting"]["calls"] = nets["counting"].calls
  # The Python state a capture read is watched whether it was made here or
  # read from disk: a changed attribute is refused by name, never stale.
  nets["scaled"].scale += 1.0
  try:
    calls["scaled"](x)
    report["stale"] = "ran"
  except tb.StaleCaptureError as err:
    report["stale"] = "refused: scale" if "scale" in str(err) else f"refused: {err}"
  report["exports"] = _shared_export.SharedExport.exports
  report["checks"] = len(checks)
  print(json.dumps(report))


if __name__ == "__main__":
  main()
