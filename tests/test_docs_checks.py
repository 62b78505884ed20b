"""The checks `make docs` runs on every page (docs/_checks.py), and the pages.

The checks themselves are tested on pages whose right answer is known; then
every user page and the README are held to them here too, so a figure typed
by hand that no committed results file holds fails the suite, not only the
site's build.
"""

import importlib.util
from pathlib import Path

import pytest

# No bridged call: `make test` runs it in the native pass only.
pytestmark = pytest.mark.one_pass

ROOT = Path(__file__).parents[1]
_spec = importlib.util.spec_from_file_location("_doc_checks", ROOT / "docs" / "_checks.py")
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)

USER_PAGES = [
  page
  for page in sorted((ROOT / "docs").rglob("*.md"))
  if "contributing" not in page.relative_to(ROOT / "docs").parts
] + [ROOT / "README.md"]


_read = checks.repository_reader(ROOT)


def test_a_list_run_into_a_paragraph_is_found():
  html = "<p>Two kinds:\n- one\n- two</p><ul>\n<li>fine</li>\n</ul>"
  assert checks.run_on_lists(html) == ["Two kinds: / - one / - two"]
  # A numbered list too, and an item nested at 2 spaces inside an item.
  assert checks.run_on_lists("<p>Steps:\n1. build\n2. run</p>")
  assert checks.run_on_lists("<li>outer\n  - inner</li>")


def test_a_list_that_renders_and_code_pass():
  assert checks.run_on_lists("<p>one line</p>\n<ul>\n<li>a</li>\n<li>b</li>\n</ul>") == []
  # A dash inside code or a sentence is not a list.
  assert checks.run_on_lists("<pre><code>x\n- y\n</code></pre>") == []
  assert checks.run_on_lists("<p>a - b, and c\nd</p>") == []


def test_jargon_is_found_in_prose_only():
  text = "Fixed at 3301fe3 for issue 40, on this machine (the lent GPU)."
  assert checks.jargon(text) == ["3301fe3", "issue 40", "this machine", "lent"]
  # Code, inline code and comments are not prose; capitals are no commit.
  clean = (
    "```\ngit show 3301fe3\n```\nRun `git log 3301fe3`. <!-- 945ce29 -->\nA 0xDEADBEEF1 address."
  )
  assert checks.jargon(clean) == []
  # Plain words with a hex look are not commits without a digit.
  assert checks.jargon("a deadbeef cafebabe decade") == []


def test_a_figure_is_held_by_its_results_file(tmp_path, monkeypatch):
  results = {"a": {"median_us": 227.74, "ms": 6.0231}, "ok": True}
  files = {
    "r.json": __import__("json").dumps(results),
    "r.md": "| torchbridge | 1.08x |",
  }

  def read(path):
    if path not in files:
      raise FileNotFoundError(path)
    return files[path]

  page = "<!-- figures from r.json -->\nIt takes 6.02 ms (227.7 us, 1.08x), 0.23 ms."
  assert checks.unsourced_figures(page, read) == []
  wrong = "<!-- figures from r.json -->\nIt takes 6.03 ms and 1.09x."
  problems = checks.unsourced_figures(wrong, read)
  assert len(problems) == 2 and "'6.03 ms'" in problems[0] and "'1.09x'" in problems[1]
  # No declaration: every figure is unsourced; a missing file is named.
  assert checks.unsourced_figures("It takes 6.02 ms.", read)
  assert checks.unsourced_figures("<!-- figures from gone.json -->", read) == [
    "declares figures from gone.json, which does not exist"
  ]
  # Both ends of a range are figures.
  assert len(checks.unsourced_figures("<!-- figures from r.json -->\n1.81-6.02 ms", read)) == 1


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_hold_no_jargon(page):
  assert checks.jargon(page.read_text()) == []


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_a_user_page_quotes_is_in_its_results(page):
  assert checks.unsourced_figures(page.read_text(), _read) == []


def test_the_readme_is_short_and_points_to_installation_and_quickstart():
  text = (ROOT / "README.md").read_text()
  assert len(text.splitlines()) < 250
  assert "(docs/installation.md)" in text and "(docs/quickstart.md)" in text
  assert text.split("\n```\n", 1)[1].startswith("make demo")


def _nav_pages(entries):
  for entry in entries:
    for value in entry.values() if isinstance(entry, dict) else [entry]:
      if isinstance(value, list):
        yield from _nav_pages(value)
      else:
        yield value


def test_the_nav_lists_each_page_once_and_every_page():
  yaml = pytest.importorskip("yaml")
  nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
  pages = list(_nav_pages(nav))
  assert len(pages) == len(set(pages)), sorted(p for p in pages if pages.count(p) > 1)
  on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
  assert on_disk == set(pages), (on_disk - set(pages), set(pages) - on_disk)


OPENS_WITH_CODE = sorted((ROOT / "docs" / "guides").glob("*.md")) + sorted(
  (ROOT / "docs" / "examples").glob("*.md")
)
OPENS_WITH_CODE += [ROOT / "docs" / "installation.md", ROOT / "docs" / "quickstart.md"]


@pytest.mark.parametrize("page", OPENS_WITH_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_getting_started_and_every_guide_open_with_code(page):
  # The first block under the title (comments aside) is code, or one
  # sentence leading into it.
  body = page.read_text().split("\n", 1)[1]
  blocks = [b.strip() for b in body.split("\n\n") if b.strip() and not b.strip().startswith("<!--")]
  first = blocks[0]
  lead_in = first.count("\n") <= 4 and blocks[1].startswith("```")
  assert first.startswith("```") or lead_in, first[:200]
