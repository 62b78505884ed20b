"""Every ```python block of README.md and of the docs runs as written.

The blocks are read from README.md and docs/**/*.md when the tests are
collected, never copied here, so an edit to the README or a page of the
documentation site is what gets tested (a block that appears twice, as the
quick start does in README.md and docs/index.md, runs once). Each block runs
in its own interpreter (a crash fails that block only) with a fresh
temporary directory as its working directory: the files a block writes
(checkpoints, `model.keras`) land there, and the installed torchbridge is
imported, not a copy shadowed by the current directory.
"""

import ast
import importlib.util
import os
from pathlib import Path
import re
import subprocess
import sys

import pytest

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCUMENTS = [README] + sorted((ROOT / "docs").rglob("*.md"))

# A fence opens with ``` and an info string, and closes with a bare ```.
_FENCE = re.compile(r"^```(.*)$")

# Seconds one block may run; the Ray block starts a local cluster and actors.
_TIMEOUT_S = 300

# Optional packages: a block that imports one is skipped when it is missing.
_OPTIONAL = ("ray", "keras", "transformers")

_TAIL_CHARS = 4000


def python_blocks(text):
  """The fenced blocks whose info string is exactly `python`.

  Args:
    text: the Markdown source.

  Returns:
    A list of `(line, code)`: the 1-based line number of the block's
    opening fence, and the code.
  """
  blocks = []
  lines = text.splitlines()
  i = 0
  while i < len(lines):
    match = _FENCE.match(lines[i])
    if match is None:
      i += 1
      continue
    info = match.group(1).strip()
    start = i + 1
    end = start
    while end < len(lines) and lines[end].rstrip() != "```":
      end += 1
    if info == "python":
      blocks.append((i + 1, "\n".join(lines[start:end]) + "\n"))
    i = end + 1
  return blocks


def _all_blocks():
  """(where, code) of every block of DOCUMENTS, the first of duplicates."""
  seen, blocks = set(), []
  for path in DOCUMENTS:
    for line, code in python_blocks(path.read_text(encoding="utf-8")):
      if code not in seen:
        seen.add(code)
        blocks.append((f"{path.relative_to(ROOT)}:{line}", code))
  return blocks


BLOCKS = _all_blocks()
_BLOCK_IDS = [where for where, _ in BLOCKS]


def _needs(code, package):
  """Whether `code` imports `package` (in any import form) or uses `tb.<package>`."""
  for node in ast.walk(ast.parse(code)):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      names = [node.module or ""]
    else:
      continue
    if any(name.split(".")[0] == package for name in names):
      return True
  return f"tb.{package}." in code


def _output(stdout, stderr):
  """The last characters of a block's stdout and stderr, for a failure."""

  def tail(text):
    if isinstance(text, bytes):  # what a timeout leaves, even with text=True
      text = text.decode(errors="replace")
    return text[-_TAIL_CHARS:] if text else "<empty>"

  return f"--- stdout (tail) ---\n{tail(stdout)}\n--- stderr (tail) ---\n{tail(stderr)}"


def test_readme_has_python_blocks():
  # Guards the extraction: a broken parser would otherwise test nothing.
  assert len(BLOCKS) >= 8, (
    f"found {len(BLOCKS)} ```python blocks in README.md and docs/, expected at least 8"
  )
  assert any(where.startswith("README.md:") for where, _ in BLOCKS)


@pytest.mark.parametrize("where, code", BLOCKS, ids=_BLOCK_IDS)
def test_readme_block_imports_torch_first(where, code):
  # torchbridge's rule: torch is imported before TensorFlow (or Keras).
  first = code.lstrip().splitlines()[0]
  assert re.match(r"import torch\b", first), (
    f"{where}: the block starts with {first!r}; each block "
    "starts with `import torch`, before TensorFlow is imported"
  )


@pytest.mark.parametrize("where, code", BLOCKS, ids=_BLOCK_IDS)
def test_readme_block_runs(where, code, tmp_path):
  needs = [package for package in _OPTIONAL if _needs(code, package)]
  for package in needs:
    if importlib.util.find_spec(package) is None:
      pytest.skip(f"{where}: the block needs {package}, which is not installed")
  if os.environ.get("TORCHBRIDGE_DOCS_BLOCKS") == "optional" and not needs:
    # CI: `make test-user` runs it where users' torch is; here only the
    # blocks that venv skips (they need a package it lacks).
    pytest.skip(f"{where}: runs in make test-user (TORCHBRIDGE_DOCS_BLOCKS=optional)")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  try:
    result = subprocess.run(
      [sys.executable, "-c", code],
      cwd=tmp_path,
      env=env,
      capture_output=True,
      text=True,
      timeout=_TIMEOUT_S,
      check=False,
    )
  except subprocess.TimeoutExpired as err:
    pytest.fail(f"{where}: the block ran past {_TIMEOUT_S} s\n{_output(err.stdout, err.stderr)}")
  output = _output(result.stdout, result.stderr)
  assert result.returncode >= 0, (
    f"{where}: the block was killed by signal {-result.returncode}\n{output}"
  )
  assert result.returncode == 0, f"{where}: the block exited with {result.returncode}\n{output}"


def test_optional_imports_are_found_in_every_import_form():
  # `import numpy as np, transformers` slipped past a regex once: CI's user
  # venv (no transformers) then ran the Hugging Face guide's blocks.
  assert _needs("import numpy as np, tensorflow as tf, transformers\n", "transformers")
  assert _needs("from transformers.models import bert\n", "transformers")
  assert _needs("import ray.util\n", "ray")
  assert _needs("x = tb.ray.remote\n", "ray")
  assert not _needs("import transformers_extra\nimport numpy as np\n", "transformers")
  needing = {w for w, code in BLOCKS if _needs(code, "transformers")}
  assert any(w.startswith("docs/guides/hugging-face.md") for w in needing)
