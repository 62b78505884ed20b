"""A bridged module, and what its graph calls captured, die with the
program's last reference to them.

In a graph, `tf.custom_gradient` registers its gradient function in TF's
process-wide registry, and the native op's callbacks are registered by id:
both reach the graph that called the module and, through it, the module
(its state, a C++ torch runner's captured program). Each case runs in a
child process: a module, a `tf.function` that calls it (and differentiates
it), both deleted, then `gc.collect()`; the torch module must be gone.
"""

import pytest

from torchbridge._native import _loader

from test_native_loader import _run_subprocess

# After _run_subprocess's prologue (json, torch, tf, _callbacks imported).
_CHILD = """
import gc, weakref
import torchbridge as tb


class Net(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.linear = torch.nn.Linear(3, 2)

  def forward(self, x):
    return torch.tanh(self.linear(x))


def make(case):
  net = Net()
  alive = weakref.ref(net)
  module = tb.TorchModule(net, name="lifetime", run="torch")
  x = tf.ones([2, 3])
  if case == "forward":
    f = tf.function(lambda v: module(v))
  elif case == "gradient":
    @tf.function
    def f(v):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(module(v))
      return tape.gradient(loss, module.trainable_variables)
  else:  # a tape outside the tf.function: TF traces its backward function
    g = tf.function(lambda v: module(v))
    def f(v):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(g(v))
      return tape.gradient(loss, module.trainable_variables)
  f(x)
  f(x)
  return alive, _callbacks.registered_count()


case = {case!r}
before = _callbacks.registered_count()
alive, during = make(case)
gc.collect()
gc.collect()
print(json.dumps({{
  "freed": alive() is None,
  "registered_during": during - before,
  "registered_after": _callbacks.registered_count() - before,
}}))
"""


@pytest.mark.parametrize("case", ["forward", "gradient", "outer_tape"])
@pytest.mark.parametrize("runner", ["C++", "python", "py_function"])
def test_a_module_and_its_capture_die_with_the_last_reference(case, runner):
  if runner != "py_function" and not _loader.available():
    pytest.skip("needs the native op")
  result = _run_subprocess(
    _CHILD.format(case=case),
    {
      "TORCHBRIDGE_TORCH_RUNNER": "python" if runner == "python" else None,
      # No native op: graph calls through tf.py_function.
      _loader.DISABLE_ENV: "1" if runner == "py_function" else None,
    },
  )
  if runner != "py_function":
    assert result["registered_during"] > 0, result  # the calls went through the native op
  assert result["freed"], result
  assert result["registered_after"] == 0, result  # their callbacks released
