"""The examples in torchbridge's docstrings run and print what they show."""

import doctest
import importlib
import pkgutil

import pytest

import torchbridge

_MODULES = sorted(
    info.name for info in pkgutil.walk_packages(torchbridge.__path__,
                                                "torchbridge."))


@pytest.mark.parametrize("name", _MODULES)
def test_docstring_examples(name):
  module = importlib.import_module(name)
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS,
                           verbose=False, report=True)
  assert result.failed == 0, f"{result.failed} docstring examples failed in {name}"
