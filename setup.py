"""Installs torchbridge: `pip install .` (or `pip install -e .`)."""

import re
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

_ROOT = Path(__file__).parent


class _BuildPyWithOpSource(build_py):
  """Ships the native op's C++ sources inside the package (torchbridge/csrc).

  The op is compiled on first use, against the TensorFlow found at run time,
  and cached (see torchbridge/_native.py); an installed package therefore
  carries the source, not a binary tied to one TF build.
  """

  def run(self):
    super().run()
    target = Path(self.build_lib, "torchbridge", "csrc")
    target.mkdir(parents=True, exist_ok=True)
    for pattern in ("*.cc", "*.h"):
      for source in (_ROOT / "csrc").glob(pattern):
        shutil.copy(source, target / source.name)

_VERSION = re.search(r'__version__ = "([^"]+)"',
                     Path(__file__).with_name("torchbridge").joinpath(
                         "__init__.py").read_text()).group(1)

setup(
    name="torchbridge",
    version=_VERSION,
    description=("PyTorch models as TensorFlow 2 layers: zero-copy DLPack "
                 "exchange, TF gradients, TF optimizers and checkpoints."),
    long_description=Path(__file__).with_name("README.md").read_text()
    if Path(__file__).with_name("README.md").exists() else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["torchbridge", "torchbridge.*"]),
    python_requires=">=3.10",
    # Loose on purpose: GPU users bring their own CUDA builds. TensorFlow is
    # not required by name because it ships under several (`tensorflow`,
    # `tensorflow-cpu`, `tensorflow[and-cuda]`) and pip cannot tell that one
    # satisfies another; pick one with the extras below. The pinned CPU set
    # used for development and CI is requirements-dev.txt. The floors are
    # the oldest releases CI tests: torch 2.13 (the development venv)
    # and TensorFlow 2.21 (both); `make test-user` runs what `pip install
    # torch` gives today (requirements-user.txt).
    install_requires=[
        "numpy",
        "torch>=2.13",
    ],
    extras_require={
        "cpu": ["tensorflow-cpu>=2.21"],
        "gpu": ["tensorflow[and-cuda]>=2.21"],
        "tf_keras": ["tf_keras"],
        "ray": ["ray>=2.10"],
    },
    # `torchbridge info|build`, the same as `python -m torchbridge info|build`.
    entry_points={"console_scripts": ["torchbridge = torchbridge._cli:main"]},
    cmdclass={"build_py": _BuildPyWithOpSource},
    license="Apache-2.0",
)
