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
- `workshop(html)`: in a built user page, generated tables included, what
  belongs to the workshop and not to a user: commit hashes, issue numbers,
  repository paths a user cannot import or run (`csrc/`, `tests/`,
  `benchmarks/`, private modules; `examples/` is the user's), the names of
  the benchmarks' own classes, benchmark words ("contender", "floor", "bare
  op", "development venv") and targets tables.
- `microseconds(html)`: one unit on every user page: "us" after a figure
  or in a column's "(us)" becomes "µs" outside code, generated tables
  included.
- `missing_exceptions(names, troubleshooting_html, api_html)`: public
  exceptions without a Troubleshooting heading or an API reference entry.

Example:
  >>> run_on_lists("<p>Two kinds:\\n- one\\n- two</p>")
  ['Two kinds: / - one / - two']
  >>> jargon("fixed in 3301fe3 (issue 40)")
  ['3301fe3', 'issue 40']
"""

import ast
from collections.abc import Callable
from collections.abc import Iterable
from html import unescape
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


# --- the built page -----------------------------------------------------------

_HIDDEN = re.compile(r"<!--.*?-->|<script\b.*?</script>|<style\b.*?</style>", re.S)
_WORKSHOP = re.compile(
  r"(?<![\w/.-])(?:csrc|tests|benchmarks|docs|\.ci)/[\w./*-]*"  # a repository path
  r"|(?<![\w/.-])torchbridge/(?:_[\w./*-]+|[\w/]+\.(?:py|h|cc))"  # a source file
  r"|\btorchbridge\._[a-z]\w*(?:\.\w+)*"  # a private module
  # a commit: lower-case hex standing alone (capitals make an address, a name)
  r"|(?-i:(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/-]|\.\w))"
  r"|(?<![\w.])benchmarks\.\w+"  # python -m benchmarks.x
  r"|\bcontenders?\b|\bfloors?\b|\bbare op\b|\bdevelopment venv\b",
  re.I,
)
_HEX = re.compile(r"[0-9a-fA-F]{7,40}")
_TABLE_HEAD = re.compile(r"<thead>(.*?)</thead>", re.S)


def _text(html: str) -> str:
  """A built page's visible text: no comments, scripts, styles or tags."""
  text = re.sub(r"<[^>]+>", " ", _HIDDEN.sub("", html))
  return unescape(text)


def benchmark_class_names(root: Path) -> set[str]:
  """The classes benchmarks/ defines whose names are no plain word (two
  capitals or more: `LeanTorchModule`, not `Recorder`)."""
  names = set()
  for path in (root / "benchmarks").rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ClassDef) and len(re.findall(r"[A-Z]", node.name)) >= 2:
        names.add(node.name)
  return names


def workshop(html: str, class_names: Iterable[str] = ()) -> list[str]:
  """The workshop in a built user page's content.

  Args:
    html: the page's content as MkDocs built it, its included tables in it.
    class_names: names no user page may show (`benchmark_class_names`).

  Returns:
    Each find, in order: the word, path or name, or "a targets table".

  Example:
    >>> workshop("<p>see <code>csrc/torch_thread.h</code> at 3301fe3</p>")
    ['csrc/torch_thread.h', '3301fe3']
  """
  text = _text(html)
  # _JARGON's words, its commits left to _WORKSHOP's stricter pattern.
  found = [
    (m.start(), m.group(0)) for m in _JARGON.finditer(text) if not _HEX.fullmatch(m.group(0))
  ]
  found += [(m.start(), m.group(0)) for m in _WORKSHOP.finditer(text)]
  for name in class_names:
    found += [(m.start(), name) for m in re.finditer(rf"\b{re.escape(name)}\b", text)]
  words = [word for _, word in sorted(found)]
  for head in _TABLE_HEAD.finditer(html):
    if re.search(r"<th\b[^>]*>\s*targets?\s*</th>", head.group(1), re.I):
      words.append("a targets table")
  return words


def missing_exceptions(names: Iterable[str], troubleshooting_html: str, api_html: str) -> list[str]:
  """The public exceptions that Troubleshooting gives no heading of their
  own, or that the API reference does not document.

  Example:
    >>> missing_exceptions(["ParityError"], "<h2 id='x'>ParityError</h2>", "")
    ['ParityError: no entry in the API reference']
  """
  headings = " ".join(
    _text(m.group(0)) for m in re.finditer(r"<h[1-4]\b.*?</h[1-4]>", troubleshooting_html, re.S)
  )
  problems = []
  for name in sorted(names):
    if not re.search(rf"\b{name}\b", headings):
      problems.append(f"{name}: no Troubleshooting heading names it")
    if f'id="torchbridge.{name}"' not in api_html:
      problems.append(f"{name}: no entry in the API reference")
  return problems


def public_exceptions(root: Path) -> set[str]:
  """The names in torchbridge's `__all__` that name exceptions (by their
  name: tests/test_docs_checks.py holds it to the imported classes)."""
  tree = ast.parse((root / "torchbridge" / "__init__.py").read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(
      isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    ):
      names = ast.literal_eval(node.value)
      return {n for n in names if re.search(r"(Error|Exception|Warning)$", n)}
  raise ValueError("torchbridge/__init__.py has no __all__")


_CODE = re.compile(r"(<pre\b.*?</pre>|<code\b.*?</code>|<[^>]+>)", re.S)
_US = re.compile(r"(?<=\d)(?P<space>\s?)us\b|\((?P<column>us)\)|\b(?P<word>us) (?=per\b)")


def microseconds(html: str) -> str:
  """The page with microseconds written one way, "µs", outside code.

  Example:
    >>> microseconds("<td>111 us</td><th>call (us)</th><code>5 us</code>")
    '<td>111 µs</td><th>call (µs)</th><code>5 us</code>'
  """

  def unit(match: re.Match) -> str:
    if match.group("column"):
      return "(µs)"
    if match.group("word"):
      return "µs "
    return match.group("space") + "µs"

  parts = _CODE.split(html)
  return "".join(part if i % 2 else _US.sub(unit, part) for i, part in enumerate(parts))
