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
from typing import Callable, Dict

import pytest
import torch  # noqa: F401  (before tensorflow / keras)

import torchbridge as tb


def _torch_module_variables(wrapper):
  prefix = wrapper.name + "/"
  out = {}
  for v in wrapper.variables:
    name = v.name
    assert name.startswith(prefix) and name.endswith(":0"), name
    out[name[len(prefix):-2]] = v
  return out


def _torch_layer_variables(wrapper):
  prefix = wrapper.name + "/"
  out = {}
  for v in wrapper.weights:
    assert v.path.startswith(prefix), v.path
    out[v.path[len(prefix):]] = v
  return out


# tf.train.Checkpoint / tf.saved_model find a Keras 3 layer's variables
# through its attributes. TorchLayer keeps its keras.Variables only inside
# `self._torch_state` (a plain Python object, not trackable) and in Keras'
# own untracked weight lists, so the layer has no trackable children.
_TORCH_LAYER_UNTRACKED = (
    "torchbridge bug: TorchLayer's variables are not trackable children of "
    "the layer (they live only in the untracked `_torch_state`), so {what}")

_TORCH_MODULE_RLOCK = (
    "torchbridge bug: {what} a TorchModule raises `TypeError: cannot pickle "
    "'_thread.RLock' object` (TorchState holds a threading.RLock and defines "
    "no __deepcopy__ / __reduce__), where a plain tf.Module and a "
    "TorchLayer copy fine; the README documents no other policy")


@dataclasses.dataclass(frozen=True)
class WrapperFactory:
  """How the suite builds and inspects one kind of wrapper."""
  name: str
  wrap: Callable  # wrap(torch_module, name) -> wrapper
  variables_by_name: Callable  # wrapper -> {state_dict name: variable}
  known_bugs: Dict[str, str] = dataclasses.field(default_factory=dict)

  def __repr__(self):
    return self.name


WRAPPERS = [
    WrapperFactory(
        "TorchModule", lambda m, name: tb.TorchModule(m, name=name),
        _torch_module_variables,
        known_bugs={
            "deepcopy": _TORCH_MODULE_RLOCK.format(what="copy.deepcopy of"),
            "pickle": _TORCH_MODULE_RLOCK.format(what="pickle.dumps of"),
        }),
    WrapperFactory(
        "TorchLayer", lambda m, name: tb.keras.TorchLayer(m, name=name),
        _torch_layer_variables,
        known_bugs={
            "checkpoint": _TORCH_LAYER_UNTRACKED.format(
                what="tf.train.Checkpoint(model=layer).write() saves no "
                "variable at all and a restore 'consumes' nothing, silently "
                "(the same inside a keras.Sequential)"),
            "saved_model": _TORCH_LAYER_UNTRACKED.format(
                what="tf.saved_model.save of a tf.Module holding the layer "
                "and a tf.function calling it fails with \"AssertionError: "
                "Tried to export a function which references an 'untracked' "
                "resource\" (a keras.layers.Dense saves the same way)"),
            "release_in_graph": (
                "torchbridge bug: when a TorchLayer is garbage collected "
                "while a tf.Graph is the default (e.g. during "
                "tf.saved_model.save), its finalizer `_copy_back` fails "
                "with \"RuntimeError: resource: Attempting to capture an "
                "EagerTensor without building a function\" (converting a "
                "keras.Variable under tf.init_scope() in a v1 graph), so "
                "the torch module keeps its NaN placeholders instead of the "
                "last values; a TorchModule's tf.Variables convert fine"),
        }),
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
