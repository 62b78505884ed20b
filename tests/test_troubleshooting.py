"""Troubleshooting answers what the library says to its users.

Each public exception (the classes among `torchbridge.__all__`) has a
heading of its own on docs/troubleshooting.md and an entry in the API
reference; each line the library logs on the "torchbridge" logger at INFO
or WARNING (or at a level chosen when it runs), each warning it issues and
each line its C++ prints to stderr has an entry: a heading, and under it
the line as the user sees it.

The lines are read from the source (torchbridge/ with `ast`, csrc/ for the
C++ lines), not listed here: a new line without an entry fails, naming it,
until `ENTRIES` maps it to the Troubleshooting heading that answers it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
import re

import pytest

import torchbridge as tb

# No bridged call: `make test` runs it in the native pass only.
pytestmark = pytest.mark.one_pass

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"
API = ROOT / "docs" / "api.md"

# Each line the library says, by a phrase of its template (the constant
# text of the message, `{}` or `%s` where a value goes) -> the heading (a
# phrase of it) of the Troubleshooting entry that answers it. The entry's
# section must quote the phrase: the line as the user sees it.
ENTRIES = {
  # Install and build
  "not preloading triton's library": "Does the import order matter?",
  "building the native TF op for this set-up": "The native op's build",
  "built the native TF op in": "The native op's build",
  "the native TF op did not build": "The native op's build",
  "building %s into %s, once per set-up": "The native op's build",
  "built %s in %.1f s": "The native op's build",
  "native TF op disabled by": "native TF op disabled by",
  "native TF op unavailable (": "native TF op unavailable",
  "without its torch side, trading DLPack capsules": "without its torch side",
  # First call and capture
  "graph calls run as TF ops (its exact translation": "graph calls run as TF ops",
  "graph calls run torch through the bridge (run=": "graph calls run torch through the bridge",
  "graph calls run torch from C++ (the C++ torch runner": "graph calls run torch from C++",
  "graph calls run torch on the Python path": "graph calls run torch on the Python path",
  "(torchscript=True) is deprecated": "is deprecated",
  # Graph calls
  "records of torch calls compiled with XLA": "records of torch calls compiled with XLA",
}

# Calls that log: `<logger>.info(...)` and the like on a name that reads
# as a logger, and `warnings.warn(...)`. A function that hands its own
# argument to one of them (say_once, a module's `_say`) is found as such.
_LOGGER = re.compile(r"(?:^|\.)_?(?:log|logger|LOG|LOGGER)$")
_METHODS = {"info", "warning", "warn", "error", "critical", "exception"}  # not debug


@dataclass(frozen=True)
class Said:
  """A line the library says: its template and where."""

  template: str
  where: str


class _Module:
  def __init__(self, path: Path, root: Path) -> None:
    self.path = path
    self.root = root
    self.name = path.stem if path.name != "__init__.py" else path.parent.name
    self.tree = ast.parse(path.read_text(encoding="utf-8"))
    self.parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(self.tree):
      for child in ast.iter_child_nodes(node):
        self.parents[child] = node

  def enclosing(self, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
    node = self.parents.get(node)
    while node is not None and not isinstance(node, kinds):
      node = self.parents.get(node)
    return node

  def where(self, node: ast.AST) -> str:
    return f"{self.path.relative_to(self.root)}:{node.lineno}"


class _Reader:
  """Finds every line torchbridge/ logs or warns, as templates."""

  def __init__(self, root: Path) -> None:
    self.modules = [_Module(p, root) for p in sorted((root / "torchbridge").rglob("*.py"))]
    self.said: list[Said] = []
    self.unread: list[str] = []

  def read(self) -> tuple[list[Said], list[str]]:
    for module in self.modules:
      for node in ast.walk(module.tree):
        if isinstance(node, ast.Call):
          sink = _sink(node)
          if sink is not None:
            level, message = sink
            self._follow(module, node, level, message, depth=0)
    return self.said, self.unread

  def _follow(
    self, module: _Module, call: ast.Call, level: ast.expr | None, message: ast.expr, depth: int
  ) -> None:
    """Records the templates `message` takes at `call`, following a
    parameter of the enclosing function to that function's callers."""
    if depth > 4:
      self.unread.append(f"{module.where(call)}: too many calls deep")
      return
    if level is not None and _is_debug(level):
      return
    function = module.enclosing(call, (ast.FunctionDef, ast.AsyncFunctionDef))
    params = _parameters(function) if function is not None else []
    if isinstance(message, ast.Name) and message.id in params:
      level_param = level.id if isinstance(level, ast.Name) and level.id in params else None
      for caller_module, caller, arguments in self._callers(module, function):
        given = arguments.get(message.id)
        if given is None:
          self.unread.append(f"{caller_module.where(caller)}: its message is not an argument")
          continue
        given_level = arguments.get(level_param) if level_param else None
        self._follow(caller_module, caller, given_level, given, depth + 1)
      return
    template = _template(module, call, message)
    if template is None:
      self.unread.append(f"{module.where(call)}: {ast.unparse(message)[:80]}")
    else:
      self.said.append(Said(template, module.where(call)))

  def _callers(self, module: _Module, function: ast.AST):
    """`(module, call, {parameter: argument})` for each call of `function`:
    a method through `self.` in its class, a module function by its name
    in its module or as `<module>.<name>` elsewhere."""
    owner = module.enclosing(function, (ast.ClassDef, ast.FunctionDef, ast.Module))
    is_method = isinstance(owner, ast.ClassDef)
    params = _parameters(function)
    for other in self.modules:
      if is_method and other is not module:
        continue
      for node in ast.walk(other.tree):
        if not isinstance(node, ast.Call):
          continue
        func = node.func
        if is_method:
          hit = (
            isinstance(func, ast.Attribute)
            and func.attr == function.name
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
            and other.enclosing(node, (ast.ClassDef,)) is owner
          )
        elif other is module:
          hit = isinstance(func, ast.Name) and func.id == function.name
        else:
          hit = (
            isinstance(func, ast.Attribute)
            and func.attr == function.name
            and isinstance(func.value, ast.Name)
            and func.value.id == module.name
          )
        if hit:
          yield other, node, _arguments(function, params, node)


def _sink(call: ast.Call) -> tuple[ast.expr | None, ast.expr] | None:
  """`(level, message)` of a call that logs or warns itself, or None."""
  func = call.func
  if not isinstance(func, ast.Attribute):
    return None
  receiver = ast.unparse(func.value)
  if receiver == "warnings" and func.attr == "warn" and call.args:
    return None, call.args[0]
  if not _LOGGER.search(receiver):
    return None
  if func.attr == "log" and len(call.args) >= 2:
    return call.args[0], call.args[1]
  if func.attr in _METHODS and call.args:
    return None, call.args[0]
  return None


def _is_debug(level: ast.expr) -> bool:
  return ast.unparse(level) in ("logging.DEBUG", "DEBUG", "10")


def _parameters(function: ast.AST) -> list[str]:
  """The positional parameters a caller passes (no `self` or `cls`)."""
  args = function.args
  names = [a.arg for a in args.posonlyargs + args.args]
  if names and names[0] in ("self", "cls"):
    names = names[1:]
  return names + [a.arg for a in args.kwonlyargs]


def _arguments(function: ast.AST, params: list[str], call: ast.Call) -> dict[str, ast.expr]:
  """What `call` passes for each parameter of `function` it can be read
  for (no argument after a `*starred` one), defaults included."""
  given: dict[str, ast.expr] = {}
  for name, arg in zip(params, call.args):
    if isinstance(arg, ast.Starred):
      break
    given[name] = arg
  for keyword in call.keywords:
    if keyword.arg is not None:
      given[keyword.arg] = keyword.value
  args = function.args
  positional = [a.arg for a in args.posonlyargs + args.args]
  for name, default in zip(positional[len(positional) - len(args.defaults) :], args.defaults):
    given.setdefault(name, default)
  return given


def _template(module: _Module, at: ast.AST, message: ast.expr) -> str | None:
  """The constant text of `message`, `{}` for each value formatted in."""
  if isinstance(message, ast.Constant) and isinstance(message.value, str):
    return message.value
  if isinstance(message, ast.JoinedStr):
    return "".join(
      part.value if isinstance(part, ast.Constant) else "{}" for part in message.values
    )
  if isinstance(message, ast.BinOp) and isinstance(message.op, ast.Add):
    parts = [_template(module, at, side) for side in (message.left, message.right)]
    return None if parts == [None, None] else "".join(p if p is not None else "{}" for p in parts)
  if isinstance(message, ast.BinOp) and isinstance(message.op, ast.Mod):
    return _template(module, at, message.left)
  if (
    isinstance(message, ast.Call)
    and isinstance(message.func, ast.Attribute)
    and message.func.attr == "format"
  ):
    return _template(module, at, message.func.value)
  if isinstance(message, ast.Name):
    assigned = _last_assignment(module, at, message.id)
    return None if assigned is None else _template(module, assigned, assigned.value)
  return None


def _last_assignment(module: _Module, at: ast.AST, name: str) -> ast.Assign | None:
  """The assignment to `name` that `at` reads: the last one before it in
  its function, else the module's own."""
  scopes = [module.enclosing(at, (ast.FunctionDef, ast.AsyncFunctionDef)), module.tree]
  for scope in scopes:
    if scope is None:
      continue
    found = [
      node
      for node in ast.walk(scope)
      if isinstance(node, ast.Assign)
      and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
      and (scope is module.tree or node.lineno < at.lineno)
      and (scope is not module.tree or module.enclosing(node, (ast.FunctionDef,)) is None)
    ]
    if found:
      return max(found, key=lambda node: node.lineno)
  return None


def _native_lines(root: Path) -> list[Said]:
  """The lines the C++ prints to stderr (`fprintf(stderr, "torchbridge: ...")`)."""
  said = []
  for path in sorted((root / "csrc").rglob("*.cc")):
    text = path.read_text(encoding="utf-8")
    for match in re.finditer(r"fprintf\(\s*stderr,\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+)", text):
      literal = "".join(re.findall(r"\"((?:[^\"\\]|\\.)*)\"", match.group(1)))
      line = text.count("\n", 0, match.start()) + 1
      said.append(Said(literal.replace("\\n", ""), f"{path.relative_to(root)}:{line}"))
  return said


def library_lines(root: Path = ROOT) -> list[Said]:
  """Every line the library says to its users (the templates), read from
  the source; raises where a message cannot be read."""
  said, unread = _Reader(root).read()
  if unread:
    raise AssertionError(
      "these log calls' messages cannot be read from the source (give each a "
      "constant template, an f-string or a named constant):\n  " + "\n  ".join(unread)
    )
  return said + _native_lines(root)


def headings(page: str) -> list[tuple[int, str, str]]:
  """`(level, title, section)` of each heading of a Markdown page, its
  section running to the next heading of its level or above (fenced code
  is no heading)."""
  lines = page.splitlines()
  found, fenced = [], False
  for i, line in enumerate(lines):
    if line.startswith("```"):
      fenced = not fenced
    match = None if fenced else re.match(r"(#{1,6})\s+(.*)", line)
    if match:
      found.append((i, len(match.group(1)), match.group(2).strip()))
  sections = []
  for k, (i, level, title) in enumerate(found):
    end = next((j for j, lv, _ in found[k + 1 :] if lv <= level), len(lines))
    sections.append((level, title, "\n".join(lines[i + 1 : end])))
  return sections


def _plain(text: str) -> str:
  """Markdown as words: no backticks or emphasis, lines joined."""
  return re.sub(r"\s+", " ", re.sub(r"[`*]", "", text))


def missing_entries(page: str, said: list[Said], entries: dict[str, str] = ENTRIES) -> list[str]:
  """What Troubleshooting (`page`, its Markdown) lacks: a line of `said`
  that no phrase of `entries` holds, an entry whose heading is gone or
  whose section does not quote the line; and phrases no line holds."""
  problems = []
  for line in said:
    if not any(phrase in line.template for phrase in entries):
      problems.append(
        f"{line.where}: {line.template[:100]!r} has no Troubleshooting entry: add one to "
        "docs/troubleshooting.md (the line as the user sees it, what it means, the fix) and "
        "map a phrase of it to that heading in ENTRIES"
      )
  sections = headings(page)
  for phrase, heading in entries.items():
    if not any(phrase in line.template for line in said):
      problems.append(f"ENTRIES: {phrase!r} is in no line the library says any more")
    under = [body for _, title, body in sections if _plain(heading) in _plain(title)]
    if not under:
      problems.append(f"{phrase!r}: Troubleshooting has no heading {heading!r}")
    elif not any(all(part in _plain(body) for part in _quoted(phrase)) for body in under):
      problems.append(f"{phrase!r}: the entry {heading!r} does not quote it")
  return problems


def _quoted(phrase: str) -> list[str]:
  """The constant parts of `phrase` a page's quote holds (the values
  filled in between them are the page's own)."""
  parts = (_plain(part).strip() for part in re.split(r"\{\}|%[-.\d]*l*[sdf]", phrase))
  return [part for part in parts if part]


def public_exceptions() -> list[str]:
  return sorted(
    name
    for name in tb.__all__
    if isinstance(getattr(tb, name), type) and issubclass(getattr(tb, name), Exception)
  )


def test_every_public_exception_has_a_troubleshooting_heading_and_an_api_entry():
  names = public_exceptions()
  assert {"ParityError", "StaleCaptureError", "UntranslatedOpsError"} <= set(names)
  titles = " ".join(title for _, title, _ in headings(PAGE.read_text(encoding="utf-8")))
  api = API.read_text(encoding="utf-8")
  missing = [n for n in names if not re.search(rf"\b{n}\b", titles)]
  assert not missing, f"add a Troubleshooting heading naming each of {missing}"
  undocumented = [n for n in names if f"::: torchbridge.{n}\n" not in api + "\n"]
  assert not undocumented, f"add `::: torchbridge.<name>` to docs/api.md for {undocumented}"


def test_every_line_the_library_logs_has_a_troubleshooting_entry():
  said = library_lines()
  # The reader finds the lines it is meant to (a reader that finds none passes nothing).
  templates = " | ".join(line.template for line in said)
  for known in ("graph calls run torch on the Python path", "native TF op unavailable"):
    assert known in templates
  assert not any("capture %s-%s on disk" in line.template for line in said)  # DEBUG
  problems = missing_entries(PAGE.read_text(encoding="utf-8"), said)
  assert not problems, "\n".join(problems)


def test_an_entry_taken_out_of_troubleshooting_is_named():
  page = PAGE.read_text(encoding="utf-8")
  said = library_lines()
  # The whole entry gone, or its quote of the line.
  entry = re.search(r"^#+ .*graph calls run torch on the Python path.*$", page, re.M)
  assert entry is not None
  without = page.replace(entry.group(0), "### Something else")
  assert any("has no heading" in p for p in missing_entries(without, said))
  section = next(b for _, t, b in headings(page) if "graph calls run as TF ops" in t)
  unquoted = page.replace(section, "\nNothing to see.\n")
  assert any("does not quote it" in p for p in missing_entries(unquoted, said))
  # A new log line without an entry.
  new = [*said, Said("torchbridge: a line nobody wrote up", "torchbridge/x.py:1")]
  assert any("a line nobody wrote up" in p for p in missing_entries(page, new))


def side_library_names(root: Path = ROOT) -> list[str]:
  """The names the build lines give the libraries beside the op: each
  `SideLibrary(..., what="...")` of torchbridge/ (filled into "building %s
  into %s" and "built %s in %.1f s", so ENTRIES' phrases cannot hold them)."""
  names = []
  for path in sorted((root / "torchbridge").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("SideLibrary"):
        for keyword in node.keywords:
          if keyword.arg == "what" and isinstance(keyword.value, ast.Constant):
            names.append(keyword.value.value)
  return names


def test_the_build_entry_names_each_library_as_its_build_lines_do():
  names = side_library_names()
  assert {"the C++ torch runner", "the XLA custom call (for jit_compile=True)"} <= set(names)
  page = PAGE.read_text(encoding="utf-8")
  section = next(b for _, t, b in headings(page) if t == "The native op's build")
  for name in names:
    assert f"torchbridge: building {name} into " in section, name
    assert f"torchbridge: built {name} in " in section, name


def test_the_reader_follows_a_message_through_the_functions_that_pass_it_on(tmp_path):
  package = tmp_path / "torchbridge"
  package.mkdir()
  (tmp_path / "csrc").mkdir()
  (package / "_a.py").write_text(
    "import logging\n"
    "_LOG = logging.getLogger('torchbridge')\n"
    "def _say(level, message, *args):\n"
    "  _LOG.log(level, message, *args)\n"
    "def go(name):\n"
    "  _say(logging.INFO, 'torchbridge: built %s', name)\n"
    "  _say(logging.DEBUG, 'torchbridge: quiet')\n"
    "  status = f'torchbridge: {name} unavailable'\n"
    "  _LOG.warning(status)\n"
  )
  (package / "_b.py").write_text(
    "from torchbridge import _a\n"
    "class Runner:\n"
    "  def _tell(self, message):\n"
    "    _a._LOG.info(message)\n"
    "  def run(self, name):\n"
    "    self._tell(f'{name}: graph calls run as TF ops')\n"
    "    _a._say(30, 'torchbridge: ' + name + ' failed')\n"
  )
  templates = sorted(line.template for line in library_lines(tmp_path))
  assert templates == [
    "torchbridge: built %s",
    "torchbridge: {} failed",
    "torchbridge: {} unavailable",
    "{}: graph calls run as TF ops",
  ]
