"""The checks `make docs` runs on every page (docs/_checks.py), and the pages.

The checks themselves are tested on pages whose right answer is known; then
every user page and the README are held to them here too, so a figure typed
by hand that no committed results file holds fails the suite, not only the
site's build.
"""

import importlib.util
import subprocess
import sys
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


# --- the built pages ----------------------------------------------------------


def test_the_workshop_is_found_in_built_html_generated_tables_included():
  names = {"LeanTorchModule"}
  html = (
    "<!-- figures from benchmarks/results/x.json -->"
    "<table><thead><tr><th>run</th><th>commit</th></tr></thead>"
    "<tbody><tr><td><code>bare_native.LeanTorchModule</code></td><td>3301fe3</td></tr>"
    "</tbody></table><p>see csrc/torch_thread.h, tests/test_module.py and "
    "torchbridge/_runtime/_omp_team.py; run python -m benchmarks.load; every "
    "contender above the floor</p>"
  )
  assert checks.workshop(html, names) == [
    "LeanTorchModule",
    "3301fe3",
    "csrc/torch_thread.h",
    "tests/test_module.py",
    "torchbridge/_runtime/_omp_team.py",
    "benchmarks.load",
    "contender",
    "floor",
  ]
  targets = "<table><thead><tr><th>target</th><th>met</th></tr></thead></table>"
  assert checks.workshop(targets) == ["a targets table"]


def test_what_a_user_runs_or_reads_is_no_workshop():
  html = (
    "<p>run <code>python examples/td3_pendulum.py</code> or <code>make bench-rl</code>; "
    "the trace names torchbridge/kernel and torchbridge/C++ call; "
    "<code>torchbridge.__version__</code>; the library "
    "~/.cache/torchbridge/torchbridge_op-cc72f7252676d7372f98.so; an address 0x7F3A2B1C4D</p>"
    "<!-- include benchmarks/results/runners.md -->"
  )
  assert checks.workshop(html, {"LeanTorchModule"}) == []


def test_public_exceptions_by_name_are_the_exception_classes_torchbridge_exports():
  import torchbridge as tb  # pylint: disable=import-outside-toplevel

  exported = {n for n in tb.__all__ if isinstance(getattr(tb, n), type)}
  classes = {n for n in exported if issubclass(getattr(tb, n), BaseException)}
  assert checks.public_exceptions(ROOT) == classes
  assert "StaleCaptureError" in classes


def test_a_public_exception_without_its_entries_is_named():
  troubleshooting = '<h2 id="stale">tb.StaleCaptureError: the mode changed</h2><p>ParityError</p>'
  api = '<h2 id="torchbridge.StaleCaptureError">StaleCaptureError</h2>'
  assert checks.missing_exceptions(["StaleCaptureError", "ParityError"], troubleshooting, api) == [
    "ParityError: no Troubleshooting heading names it",
    "ParityError: no entry in the API reference",
  ]


def _hooks():
  spec = importlib.util.spec_from_file_location("_doc_hooks", ROOT / "docs" / "_hooks.py")
  hooks = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(hooks)
  return hooks


class _Page:
  def __init__(self, uri):
    self.file = type("File", (), {"src_uri": uri})()


def test_the_build_fails_on_workshop_in_a_user_page_only():
  hooks = _hooks()
  hooks.on_pre_build({})
  html = "<table><tr><td>LeanTorchModule at 3301fe3</td></tr></table>"
  assert hooks.on_page_content(html, _Page("contributing/measurements.md"), {}, None) == html
  hooks.on_post_build({})  # the workshop's own pages may show it
  hooks.on_page_content("<p>111 us per call</p>" + html, _Page("guides/threads.md"), {}, None)
  with pytest.raises(ValueError, match=r"guides/threads.md: the workshop shows: .*LeanTorchModule"):
    hooks.on_post_build({})


def test_the_build_fails_on_a_public_exception_missing_from_troubleshooting():
  hooks = _hooks()
  hooks.on_pre_build({})
  api = "".join(f'<h2 id="torchbridge.{n}">{n}</h2>' for n in checks.public_exceptions(ROOT))
  hooks.on_page_content(api, _Page("api.md"), {}, None)
  hooks.on_page_content("<h2>tb.ParityError</h2>", _Page("troubleshooting.md"), {}, None)
  with pytest.raises(ValueError, match="StaleCaptureError: no Troubleshooting heading names it"):
    hooks.on_post_build({})


def test_user_pages_write_microseconds_one_way():
  hooks = _hooks()
  out = hooks.on_page_content("<td>106 us</td><code>5 us</code>", _Page("index.md"), {}, None)
  assert out == "<td>106 µs</td><code>5 us</code>"


def test_mkdocs_fails_a_site_whose_built_page_shows_the_workshop(tmp_path):
  # The hooks wired into a real build: a user page whose code shows a
  # repository path fails `mkdocs build`; the same under contributing/ passes.
  (tmp_path / "docs" / "contributing").mkdir(parents=True)
  (tmp_path / "docs" / "contributing" / "index.md").write_text("# C\n\n`csrc/torch_thread.h`\n")
  (tmp_path / "docs" / "index.md").write_text("# Home\n\nNothing of the workshop.\n")
  config = tmp_path / "mkdocs.yml"
  config.write_text(
    f"site_name: t\ndocs_dir: docs\nsite_dir: {tmp_path / 'site'}\n"
    f"hooks:\n  - {ROOT / 'docs' / '_hooks.py'}\n"
  )
  build = [sys.executable, "-m", "mkdocs", "build", "--quiet", "-f", str(config)]
  ok = subprocess.run(build, capture_output=True, text=True, check=False)
  assert ok.returncode == 0, ok.stderr[-2000:]
  (tmp_path / "docs" / "index.md").write_text("# Home\n\n```\nvim csrc/torch_thread.h\n```\n")
  failed = subprocess.run(build, capture_output=True, text=True, check=False)
  assert failed.returncode != 0
  assert "index.md: the workshop shows: csrc/torch_thread.h" in failed.stderr
