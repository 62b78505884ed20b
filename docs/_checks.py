"""Checks `make docs` runs on every page (docs/_hooks.py calls them).

- `run_on_lists(html)`: list items the site would show run together in one
  paragraph. Python-Markdown starts a list only after a blank line, and nests
  one only at 4 spaces, so "text\\n- item" renders as "text - item".
- `jargon(markdown)`: words about this repository's workings that mean
  nothing to a user (commit hashes, issue numbers, "this machine"). Pages
  under contributing/ are exempt: they are about the repository.
- `unsourced_figures(markdown, read)`: a decimal figure with a unit (ms, us,
  s, x, %) that none of the page's declared results files holds. A page
  declares them with `<!-- figures from PATH[, PATH...] -->`; a figure is
  held when the results file's own Markdown writes it, or its JSON has a
  number that rounds to it. Generated tables (`<!-- include PATH -->`) are
  checked where they are written, so the check reads the page before its
  includes.

Example:
  >>> run_on_lists("<p>Two kinds:\\n- one\\n- two</p>")
  ['Two kinds: / - one / - two']
  >>> jargon("fixed in 3301fe3 (issue 40)")
  ['3301fe3', 'issue 40']
"""

from collections.abc import Callable
import json
from pathlib import Path
import re

_PRE = re.compile(r"<pre\b.*?</pre>|<code\b.*?</code>|<script\b.*?</script>", re.S)
_TEXT_LINE_ITEM = re.compile(r"\n[ \t]*(?:[-*+]|\d+\.)[ \t]+[^\s<]")
_BLOCK = re.compile(r"<(p|li|td|th|dd)\b[^>]*>(.*?)</\1>", re.S)


def run_on_lists(html: str) -> list[str]:
  """The paragraphs of a built page that hold list items run together.

  Args:
    html: a page's HTML as MkDocs built it.

  Returns:
    Each offending paragraph's text, its lines joined by " / ".
  """
  text = _PRE.sub("", html)
  found = []
  for match in _BLOCK.finditer(text):
    body = match.group(2)
    if _TEXT_LINE_ITEM.search(body):
      plain = re.sub(r"<[^>]+>", "", body).strip()
      found.append(" / ".join(line.strip() for line in plain.splitlines() if line.strip()))
  return found


_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_JARGON = re.compile(
  r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"  # a commit
  r"|\bissues? #?\d+\b"
  r"|\bth(?:is|ese) machines?\b"
  r"|\blent\b",
  re.I,
)


def _prose(markdown: str) -> str:
  """The page's text without code blocks, inline code and HTML comments."""
  markdown = _FENCE.sub("", markdown)
  markdown = re.sub(r"<!--.*?-->", "", markdown, flags=re.S)
  return _INLINE_CODE.sub("", markdown)


def jargon(markdown: str) -> list[str]:
  """Repository jargon in a page's prose (code is not prose).

  Args:
    markdown: the page's Markdown source.

  Returns:
    Each match, in order.
  """
  found = []
  for match in _JARGON.finditer(_prose(markdown)):
    word = match.group(0)
    # A hex run of letters and digits with capitals is no commit (an
    # address, a name); commits are written in lower case.
    if re.fullmatch(r"[0-9a-fA-F]{7,40}", word) and word != word.lower():
      continue
    found.append(word)
  return found


FIGURES_FROM = re.compile(r"<!-- figures from (.+?) -->")
_UNIT = r"\s?(?:ms|us|µs|s|x|%)(?!\w)"
# A decimal with a unit, or the first end of a range whose second has one.
_FIGURE = re.compile(rf"(?<![\w.])(\d+\.\d+)(?:{_UNIT}|(?=[-–]\d+(?:\.\d+)?{_UNIT}))")


def _numbers(value, out: list[float]) -> None:
  if isinstance(value, bool):
    return
  if isinstance(value, int | float):
    out.append(float(value))
  elif isinstance(value, dict):
    for item in value.values():
      _numbers(item, out)
  elif isinstance(value, list):
    for item in value:
      _numbers(item, out)


def _held(figure: str, texts: list[str], numbers: list[float]) -> bool:
  if any(re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", text) for text in texts):
    return True
  decimals = len(figure.split(".")[1])
  target = float(figure)
  # A number written in ms, us or s may be stored in another of them.
  scales = (1.0, 1e3, 1e-3, 1e6, 1e-6, 100.0)
  return any(round(n * k, decimals) == target for n in numbers for k in scales)


def repository_reader(root: Path) -> Callable[[str], str]:
  """`read` for `unsourced_figures`: a path under `root` to its text,
  `FileNotFoundError` when it is missing."""

  def read(path: str) -> str:
    file = root / path
    if not file.is_file():
      raise FileNotFoundError(path)
    return file.read_text()

  return read


def unsourced_figures(markdown: str, read: Callable[[str], str]) -> list[str]:
  """Figures a page quotes that its declared results files do not hold.

  Args:
    markdown: the page's Markdown source, before its includes.
    read: reads a repository path (`benchmarks/results/runners.json`) and
      returns its text; raises `FileNotFoundError` when it is missing.

  Returns:
    One message per figure not held (or per declaration that names a
    missing file), empty when every figure is sourced.
  """
  sources = [p.strip() for m in FIGURES_FROM.finditer(markdown) for p in m.group(1).split(",")]
  texts, numbers, problems = [], [], []
  for path in sources:
    try:
      text = read(path)
    except FileNotFoundError:
      problems.append(f"declares figures from {path}, which does not exist")
      continue
    texts.append(text)
    if path.endswith(".json"):
      _numbers(json.loads(text), numbers)
      try:
        texts.append(read(path[: -len(".json")] + ".md"))
      except FileNotFoundError:
        pass
  prose = _prose(markdown)
  for match in _FIGURE.finditer(prose):
    figure = match.group(1)
    if not _held(figure, texts, numbers):
      line = prose[: match.start()].count("\n") + 1
      where = f"from {', '.join(sources)}" if sources else "(the page declares no results file)"
      problems.append(f"{match.group(0)!r} (prose line {line}) is not in the results {where}")
  return problems
