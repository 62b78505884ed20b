"""Installs torchbridge: `pip install .` (or `pip install -e .`).

The metadata is in pyproject.toml; this file adds the build step that ships
the native op's C++ sources inside the package.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

_ROOT = Path(__file__).parent


class _BuildPyWithOpSource(build_py):
  """Ships the native op's C++ sources inside the package (torchbridge/csrc).

  The op is compiled on first use, against the TensorFlow found at run time,
  and cached (see torchbridge/_native/_loader.py); an installed package therefore
  carries the source, not a binary tied to one TF build.
  """

  def run(self):
    super().run()
    # Every .cc and .h under csrc/, its folders kept: the op's, the C++
    # torch runner's (csrc/exported/) and the XLA custom call's (csrc/xla/),
    # each built apart.
    csrc = _ROOT / "csrc"
    for source in sorted(csrc.rglob("*")):
      if source.suffix in (".cc", ".h"):
        target = Path(self.build_lib, "torchbridge", "csrc", source.relative_to(csrc))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)


setup(cmdclass={"build_py": _BuildPyWithOpSource})
