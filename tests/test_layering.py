"""The layers import only downwards: the rule each layer's `__init__.py`
states ("May import: ..."), checked against every import in the package.

The public faces (`torchbridge/__init__.py`, `keras.py`, `__main__.py`,
`ray/`) may import any layer. Keras is imported only by the Keras wrapper,
the public `torchbridge.keras` and the `info` report; Ray only by
`torchbridge.ray`. ARCHITECTURE.md's table of folders states the same rule.
"""

import ast
import re
from pathlib import Path

import pytest

# The same in both passes of `make test`: run in the native pass only.
pytestmark = pytest.mark.one_pass

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "torchbridge"

# Files that may import these third-party packages (paths under torchbridge/).
ALLOWED_FRAMEWORK_IMPORTS = {
  "keras": {"keras.py", "_wrappers/_keras_layer.py", "_cli/_report.py"},
  "ray": {"ray/_ray.py"},
}


def layers():
  """{layer: the set of layers it may import}, from each `__init__.py`."""
  rules = {}
  for init in sorted(PACKAGE.glob("_*/__init__.py")):
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    match = re.search(r"^May import: (.*)\.$", doc, flags=re.M)
    assert match, (
      f"{init.relative_to(ROOT)} must end its docstring with "
      "'May import: <layers>.' (or 'May import: nothing.')"
    )
    names = match.group(1)
    rules[init.parent.name] = set() if names == "nothing" else {n.strip() for n in names.split(",")}
  return rules


def imported_modules(source):
  """Every module an import statement names (any depth, any scope)."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [(alias.name, node.lineno) for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      found.append((node.module, node.lineno))
      if node.module == "torchbridge":  # from torchbridge import _call
        found += [(f"torchbridge.{alias.name}", node.lineno) for alias in node.names]
  return found


def violations(layer, source, rules, where):
  """The imports in `source` (a module of `layer`) that the rules forbid."""
  allowed = rules[layer] | {layer}
  bad = []
  for module, line in imported_modules(source):
    parts = module.split(".")
    if parts[0] != "torchbridge" or len(parts) < 2:
      continue
    target = parts[1]
    if target.startswith("_") and target in rules and target not in allowed:
      bad.append(
        f"{where}:{line} imports {module} ({layer} may import {sorted(rules[layer]) or 'nothing'})"
      )
    elif not target.startswith("_") or target not in rules:
      # A public face (torchbridge, torchbridge.keras, .ray): only the
      # public faces import those.
      bad.append(
        f"{where}:{line} imports the public {module}; layers import only layers below them"
      )
  return bad


def test_every_layer_states_its_rule_and_the_rules_point_down():
  rules = layers()
  assert set(rules) >= {
    "_wrappers",
    "_runners",
    "_capture",
    "_state",
    "_call",
    "_native",
    "_crossing",
    "_runtime",
    "_frameworks",
    "_translate",
    "_cli",
  }
  for layer, allowed in rules.items():
    assert allowed <= set(rules), f"{layer} names unknown layers"
  # No cycle: the rules order the layers.
  seen, order = set(), []

  def visit(layer, path):
    assert layer not in path, f"import cycle: {' -> '.join(path + [layer])}"
    if layer in seen:
      return
    for below in rules[layer]:
      visit(below, path + [layer])
    seen.add(layer)
    order.append(layer)

  for layer in rules:
    visit(layer, [])
  # The ground: framework internals import nothing; the translation is pure
  # ATen -> TF (no module, no runner, no call path).
  assert rules["_frameworks"] == set()
  assert not rules["_translate"] & {
    "_runners",
    "_capture",
    "_call",
    "_state",
    "_wrappers",
    "_native",
    "_crossing",
    "_runtime",
  }
  assert "_state" not in rules["_call"] and "_wrappers" not in rules["_call"]
  # The floors of a graph call, top down: choosing a runner, capturing,
  # the module's state; the state knows no runner and no capture.
  assert {"_capture", "_state"} <= rules["_runners"]
  assert "_state" in rules["_capture"] and "_runners" not in rules["_capture"]
  assert not rules["_state"] & {"_runners", "_capture", "_translate"}


def test_every_import_in_the_package_follows_the_rules():
  rules = layers()
  bad = []
  for path in sorted(PACKAGE.rglob("*.py")):
    relative = path.relative_to(PACKAGE)
    layer = relative.parts[0]
    if len(relative.parts) == 1 or layer == "ray":
      continue  # the public faces import any layer
    bad += violations(layer, path.read_text(), rules, str(path.relative_to(ROOT)))
  assert not bad, "imports against the layering rules:\n" + "\n".join(bad)


def private_names_of_other_floors(layer, source, where):
  """The private names (`_name`, not dunders) of another floor's modules that
  `source` (a module of `layer`) uses: `from torchbridge._x._m import _f`,
  or `_m._f` through an imported module of another floor."""
  tree = ast.parse(source)
  aliases, bad = {}, []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
      parts = node.module.split(".")
      if parts[0] != "torchbridge" or len(parts) < 2 or parts[1] == layer:
        continue
      for alias in node.names:
        if len(parts) >= 3 and alias.name.startswith("_") and not alias.name.startswith("__"):
          bad.append(f"{where}:{node.lineno} imports {node.module}.{alias.name}")
        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Attribute)
      and isinstance(node.value, ast.Name)
      and node.value.id in aliases
      and node.attr.startswith("_")
      and not node.attr.startswith("__")
    ):
      bad.append(f"{where}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
  return bad


def test_no_floor_uses_a_private_name_of_another():
  bad = []
  for path in sorted(PACKAGE.rglob("*.py")):
    relative = path.relative_to(PACKAGE)
    if len(relative.parts) == 1:
      continue
    bad += private_names_of_other_floors(
      relative.parts[0], path.read_text(), str(path.relative_to(ROOT))
    )
  assert not bad, "private names used across floors:\n" + "\n".join(bad)


@pytest.mark.parametrize(
  "line, caught",
  [
    ("from torchbridge._state import _torch_state\n_torch_state._private(1)", True),
    ("from torchbridge._state._torch_state import _helper", True),
    ("from torchbridge._state import _torch_state\n_torch_state.TorchState", False),
  ],
)
def test_the_private_name_check_catches_a_reach_across(line, caught):
  assert bool(private_names_of_other_floors("_runners", line, "mutated.py")) == caught


@pytest.mark.parametrize("framework", sorted(ALLOWED_FRAMEWORK_IMPORTS))
def test_keras_and_ray_stay_at_the_edges(framework):
  importing = set()
  for path in sorted(PACKAGE.rglob("*.py")):
    modules = [m for m, _ in imported_modules(path.read_text())]
    if any(m == framework or m.startswith(framework + ".") for m in modules):
      importing.add(str(path.relative_to(PACKAGE)))
  allowed = ALLOWED_FRAMEWORK_IMPORTS[framework]
  assert importing <= allowed, (
    f"{sorted(importing - allowed)} import {framework}; the core never "
    f"does (allowed: {sorted(allowed)})"
  )
  assert importing, f"nothing imports {framework}: update this test"


@pytest.mark.parametrize(
  "layer, line, forbidden",
  [
    ("_call", "from torchbridge._state import _swap", True),
    ("_call", "from torchbridge import _wrappers", True),
    ("_translate", "from torchbridge._call import _bridge", True),
    ("_runtime", "import torchbridge.keras", True),
    ("_crossing", "from torchbridge._runtime import _placement", False),
    ("_state", "from torchbridge import _call", False),
    ("_state", "from torchbridge._capture import _guard", True),
    ("_capture", "from torchbridge._runners import _record", True),
    ("_translate", "from torchbridge._capture import _parity", True),
    ("_runners", "from torchbridge._capture import _parity", False),
  ],
)
def test_the_check_catches_a_wrong_import(layer, line, forbidden):
  """The checker itself: an import against the rules is reported (the
  mutation a wrong import would be), one along them is not."""
  source = f"def f():\n  {line}\n"
  assert bool(violations(layer, source, layers(), "mutated.py")) == forbidden


def test_architecture_table_states_the_same_rules():
  """ARCHITECTURE.md's table of folders lists, per folder, what it may
  import: the same sets as the `__init__.py` files."""
  text = (ROOT / "ARCHITECTURE.md").read_text()
  rows = re.findall(r"^\| `torchbridge/(_[a-z_]+)/` \|.*\| ([^|]*) \|$", text, flags=re.M)
  table = {folder: set(re.findall(r"`(_[a-z_]+)`", imports)) for folder, imports in rows}
  assert table == layers(), "ARCHITECTURE.md's table and the __init__ rules differ"
