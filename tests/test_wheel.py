"""`python -m build` makes an sdist and a wheel that install and work.

The wheel is built as a release would be (the sdist first, the wheel from
it), installed with pip into a fresh venv, and used from a directory outside
the repository: the README's quick start runs on the installed package, the
`torchbridge` console script reports, and the native op builds from the C++
sources the wheel ships (into an empty cache), complete. torch and
TensorFlow come from the running environment through a `.pth` line, so the
venv downloads nothing.
"""

import importlib.util
import json
import os
from pathlib import Path
import re
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = Path(__file__).parents[1]

pytestmark = [
  pytest.mark.slow,
  pytest.mark.one_pass,
  pytest.mark.skipif(
    importlib.util.find_spec("build") is None,
    reason="needs the `build` package (requirements-dev.txt)",
  ),
]


def _run(args, **kwargs):
  out = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
  assert out.returncode == 0, (
    f"{args} exited with {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
  )
  return out


def _quick_start():
  text = (ROOT / "README.md").read_text()
  return re.search(r"^```python\n(.*?)^```", text, re.S | re.M).group(1)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
  out = tmp_path_factory.mktemp("dist")
  _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)])
  return out


def test_the_wheel_ships_the_package_its_sources_and_its_types(dist):
  [wheel] = dist.glob("torchbridge-*.whl")
  [sdist] = dist.glob("torchbridge-*.tar.gz")
  names = zipfile.ZipFile(wheel).namelist()
  sources = sorted(
    str(p.relative_to(ROOT / "csrc"))
    for p in (ROOT / "csrc").rglob("*")
    if p.suffix in (".cc", ".h")
  )
  shipped = sorted(
    n[len("torchbridge/csrc/") :] for n in names if n.startswith("torchbridge/csrc/")
  )
  # The C++ torch runner (csrc/exported/) and the XLA custom call (csrc/xla/)
  # too, each built apart from the op.
  assert "exported/exported_call.cc" in sources
  assert "xla/xla_call.cc" in sources  # the XLA custom call's, too
  assert shipped == sources
  assert "torchbridge/py.typed" in names
  assert "torchbridge/__init__.py" in names and "torchbridge/ray/_ray.py" in names
  assert sdist.stat().st_size > 0


def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_quick_start(dist, tmp_path):
  [wheel] = dist.glob("torchbridge-*.whl")
  venv = tmp_path / "venv"
  _run([sys.executable, "-m", "venv", str(venv)])
  python = venv / "bin" / "python"
  site = _run(
    [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
  ).stdout.strip()
  # torch, TensorFlow and numpy from this environment, after the venv's own.
  Path(site, "host_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
  _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)])
  work = tmp_path / "work"
  work.mkdir()
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TORCHBRIDGE_CACHE_DIR=str(tmp_path / "cache"))
  # The installed package's native op is what is tested, on either pass.
  env.pop("TORCHBRIDGE_DISABLE_NATIVE", None)
  where = _run(
    [str(python), "-P", "-c", "import torch, torchbridge; print(torchbridge.__file__)"],
    cwd=work,
    env=env,
  )
  assert where.stdout.strip().startswith(site), where.stdout
  _run([str(venv / "bin" / "torchbridge"), "build"], cwd=work, env=env)
  info = json.loads(
    _run(
      [str(venv / "bin" / "torchbridge"), "info", "--json", "--no-build"], cwd=work, env=env
    ).stdout
  )
  assert info["native_op"]["complete"] is True, info["native_op"]
  _run([str(python), "-P", "-c", _quick_start()], cwd=work, env=env)
  assert (work / "ckpt").is_dir()  # the quick start's checkpoint
