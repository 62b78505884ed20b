"""MkDocs hooks.

- The pictures the pages show live beside the results they plot
  (benchmarks/results/, examples/results/), not in docs/; they are added to
  the site from there, so a page's link to one resolves and a missing one
  fails `mkdocs build --strict`.
- `<!-- report NAME -->` in any page is replaced by the tables
  benchmarks/user_tables.py writes from the committed results at build time,
  in the user pages' words, never pasted ("What it costs" gets its tables
  from benchmarks/results/latest.json so).
- `<!-- include PATH -->` in any page is replaced by the committed results
  file PATH (a table a benchmark or a tally wrote); a missing file fails
  the build.
- `<!-- results files -->` is replaced by a table of every results file
  the site's pages draw figures from, with the commit each measured and
  the date it was committed.
- Every page is checked (docs/_checks.py): no list run into a paragraph;
  outside contributing/, no repository jargon and no figure its declared
  results files do not hold (in its Markdown), and no workshop (commit
  hashes, repository paths, the benchmarks' class names, targets tables)
  in its built HTML, generated tables included; microseconds are written
  "µs". Every public exception has a Troubleshooting heading and an API
  reference entry. A failed check fails the build, after every page is
  built, with every problem listed.
"""

import json
from pathlib import Path
import re
import subprocess
import sys

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _checks  # noqa: E402  pylint: disable=wrong-import-position

ROOT = Path(__file__).resolve().parents[1]
PICTURES = ("benchmarks/results/*.png", "examples/results/*.png", "examples/results/*/*.png")


def on_files(files, config):
  for pattern in PICTURES:
    for path in sorted(ROOT.glob(pattern)):
      files.append(
        File(
          str(path.relative_to(ROOT)), str(ROOT), config["site_dir"], config["use_directory_urls"]
        )
      )
  return files


COSTS_PAGE = "performance/costs.md"
# `<!-- report NAME -->` in a page: the tables benchmarks/user_tables.py's
# `page_table(NAME)` writes from the committed results, in the user pages'
# words (the costs page's from latest.json, the runners page's from
# runners.json, a benchmark's own table with its suite words replaced).
REPORT = re.compile(r"<!-- report (\S+) -->")
COSTS_MARKER = "<!-- report costs -->"


INCLUDE = re.compile(r"<!-- include (\S+) -->")


# "at <commit>" in a results file's header: the commit goes to the table of
# "How it was measured" (the costs page), not onto every user page.
_AT_COMMIT = re.compile(
  r"\b([Aa])t (?:\{'commit': '[0-9a-f]+', 'changed_since': \[[^\]]*\]\}|[0-9a-f]{7,40}\b)"
)


_read = _checks.repository_reader(ROOT)


def _include(match):
  try:
    text = _read(match.group(1))
  except FileNotFoundError:
    raise ValueError(f"a page includes {match.group(1)}, which does not exist") from None
  return _AT_COMMIT.sub(lambda m: ("I" if m.group(1) == "A" else "i") + "n one run", text)


def _commit_of(results):
  """The commit a results file says it measured (its `source`, its
  environment's `source`, or its own `commit`), or None."""
  if not isinstance(results, dict):
    return None
  environment = results.get("environment")
  for holder in (
    results.get("source"),
    environment.get("source") if isinstance(environment, dict) else None,
    results,
  ):
    if isinstance(holder, dict) and isinstance(holder.get("commit"), str):
      return holder["commit"]
  return None


def _committed_on(path):
  out = subprocess.run(
    ["git", "log", "-1", "--format=%cs", "--", path],
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=False,
  )
  return out.stdout.strip() or "not committed"


def results_table(config):
  """The Markdown table of every results file a page declares figures from."""
  paths = set()
  for page in sorted(Path(config["docs_dir"]).rglob("*.md")):
    text = page.read_text()
    for match in _checks.FIGURES_FROM.finditer(text):
      paths.update(p.strip() for p in match.group(1).split(","))
    for match in INCLUDE.finditer(text):
      included = match.group(1)
      sibling = included[: -len(".md")] + ".json"
      paths.add(sibling if (ROOT / sibling).is_file() else included)
  rows = ["| results file | commit measured | committed on |", "|---|---|---|"]
  for path in sorted(paths):
    if path.endswith(".json"):
      commit = _commit_of(json.loads(_read(path)))
    else:
      found = re.search(r"\b[0-9a-f]{7,40}\b", _read(path).split("\n", 1)[0])
      commit = found.group(0) if found else None
    shown = f"`{commit[:7]}`" if commit else "not recorded"
    rows.append(f"| `{path}` | {shown} | {_committed_on(path)} |")
  return "\n".join(rows) + "\n"


RESULTS_MARKER = "<!-- results files -->"


def _check_markdown(markdown, page):
  problems = []
  if not page.file.src_uri.startswith("contributing/"):
    problems += [f"jargon: {word!r}" for word in _checks.jargon(markdown)]
    problems += _checks.unsourced_figures(markdown, _read)
  if problems:
    raise ValueError(
      f"{page.file.src_uri}: " + "; ".join(problems) + " (see docs/_checks.py for the rules)"
    )


# What the built pages showed, checked once the site is built.
_BUILT = {"workshop": {}, "html": {}}
_CLASS_NAMES = _checks.benchmark_class_names(ROOT)


def on_pre_build(config):
  _BUILT["workshop"].clear()
  _BUILT["html"].clear()


def on_page_content(html, page, config, files):
  run_on = _checks.run_on_lists(html)
  if run_on:
    raise ValueError(
      f"{page.file.src_uri}: list items run into one paragraph (put a blank line before "
      f"a list, and indent nested items 4 spaces): {run_on[:3]}"
    )
  uri = page.file.src_uri
  if not uri.startswith("contributing/"):
    html = _checks.microseconds(html)
    found = _checks.workshop(html, _CLASS_NAMES)
    if found:
      _BUILT["workshop"][uri] = found
  if uri in (TROUBLESHOOTING_PAGE, API_PAGE):
    _BUILT["html"][uri] = html
  return html


TROUBLESHOOTING_PAGE = "troubleshooting.md"
API_PAGE = "api.md"


def on_post_build(config):
  """The checks on the built user pages, generated tables included: no
  workshop, and every public exception in Troubleshooting and the API."""
  problems = [
    f"{uri}: the workshop shows: {', '.join(dict.fromkeys(words))}"
    for uri, words in sorted(_BUILT["workshop"].items())
  ]
  html = _BUILT["html"]
  if TROUBLESHOOTING_PAGE in html and API_PAGE in html:
    problems += _checks.missing_exceptions(
      _checks.public_exceptions(ROOT), html[TROUBLESHOOTING_PAGE], html[API_PAGE]
    )
  if problems:
    raise ValueError(
      "the built site fails its checks (docs/_checks.py says why each is one):\n  "
      + "\n  ".join(problems)
    )


def on_page_markdown(markdown, page, config, files):
  _check_markdown(markdown, page)
  if RESULTS_MARKER in markdown:
    markdown = markdown.replace(RESULTS_MARKER, results_table(config))
  markdown = INCLUDE.sub(_include, markdown)
  if page.file.src_uri == COSTS_PAGE and COSTS_MARKER not in markdown:
    raise ValueError(f"{COSTS_PAGE} lost the marker its tables go to")
  if not REPORT.search(markdown):
    return markdown
  sys.path.insert(0, str(ROOT))
  try:
    from benchmarks import user_tables  # pylint: disable=import-outside-toplevel
  finally:
    sys.path.remove(str(ROOT))
  return REPORT.sub(lambda match: user_tables.page_table(match.group(1), _read), markdown)
