"""The examples in torchbridge's docstrings run and print what they show."""

import doctest
import importlib
import pkgutil
import sys

import pytest

import torchbridge

# The same in both passes of `make test`: run in the native pass only.
pytestmark = pytest.mark.one_pass

_MODULES = sorted(info.name for info in pkgutil.walk_packages(torchbridge.__path__, "torchbridge."))
# tb.ray's examples start Ray (a minute or more each on 2 cores): with the
# Ray suites, in `make test-long`.
_CASES = [
  pytest.param(name, marks=pytest.mark.slow) if name.startswith("torchbridge.ray") else name
  for name in _MODULES
]


@pytest.mark.parametrize("name", _CASES)
def test_docstring_examples(name):
  module = importlib.import_module(name)
  try:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=True)
  finally:
    _shut_down_ray()  # tb.ray's examples start Ray; test_ray starts its own
  assert result.failed == 0, f"{result.failed} docstring examples failed in {name}"


def _shut_down_ray():
  ray = sys.modules.get("ray")
  if ray is not None and ray.is_initialized():
    ray.shutdown()
