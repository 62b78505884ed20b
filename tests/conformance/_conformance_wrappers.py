"""The public wrappers that the conformance suite runs every case on.

In the manner of Sonnet's `src/conformance/`: one set of tests
(`test_wrapper_conformance.py`), parametrized over this registry. A new
wrapper joins the suite with one `WrapperFactory(...)` line in `WRAPPERS`.

A factory knows three things about its wrapper: how to wrap a torch module,
how to find the wrapper's variables by torch `state_dict` name, and which
conformance cases it is known to fail (`known_bugs`: case name -> reason;
those cases run as `xfail(strict=True)`, so fixing the bug makes the suite
say so).
"""

import dataclasses
from collections.abc import Callable

import pytest
import torch  # noqa: F401  (before tensorflow / keras)

import torchbridge as tb


def _torch_module_variables(wrapper):
  prefix = wrapper.name + "/"
  out = {}
  for v in wrapper.variables:
    name = v.name
    assert name.startswith(prefix) and name.endswith(":0"), name
    out[name[len(prefix) : -2]] = v
  return out


def _torch_layer_variables(wrapper):
  prefix = wrapper.name + "/"
  out = {}
  for v in wrapper.weights:
    assert v.path.startswith(prefix), v.path
    out[v.path[len(prefix) :]] = v
  return out


@dataclasses.dataclass(frozen=True)
class WrapperFactory:
  """How the suite builds and inspects one kind of wrapper."""

  name: str
  wrap: Callable  # wrap(torch_module, name) -> wrapper
  variables_by_name: Callable  # wrapper -> {state_dict name: variable}
  known_bugs: dict[str, str] = dataclasses.field(default_factory=dict)
  # The runner its graph calls take: "default" (run="auto"), "C++" (the C++
  # torch runner) or "Python" (the torch runner's Python path).
  runner: str = "default"

  def __repr__(self):
    return self.name


def _python_path(wrapper):
  """`wrapper` with the C++ torch runner turned off: graph calls run the
  forward's Python (what TORCHBRIDGE_TORCH_RUNNER=python does process-wide)."""
  wrapper._runners.torch_runner.enabled = False  # pylint: disable=protected-access
  return wrapper


WRAPPERS = [
  WrapperFactory(
    "TorchModule", lambda m, name: tb.TorchModule(m, name=name), _torch_module_variables
  ),
  WrapperFactory(
    "TorchLayer", lambda m, name: tb.keras.TorchLayer(m, name=name), _torch_layer_variables
  ),
  WrapperFactory(
    "TorchModule-torch-C++",
    lambda m, name: tb.TorchModule(m, name=name, run="torch"),
    _torch_module_variables,
    runner="C++",
  ),
  WrapperFactory(
    "TorchLayer-torch-C++",
    lambda m, name: tb.keras.TorchLayer(m, name=name, run="torch"),
    _torch_layer_variables,
    runner="C++",
  ),
  WrapperFactory(
    "TorchModule-torch-Python",
    lambda m, name: _python_path(tb.TorchModule(m, name=name, run="torch")),
    _torch_module_variables,
    runner="Python",
  ),
]


def wrappers(case):
  """`pytest.param`s of every wrapper for conformance case `case`."""
  params = []
  for factory in WRAPPERS:
    marks = ()
    if case in factory.known_bugs:
      marks = pytest.mark.xfail(strict=True, reason=factory.known_bugs[case])
    params.append(pytest.param(factory, id=factory.name, marks=marks))
  return params
