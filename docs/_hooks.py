"""MkDocs hooks.

- The pictures the pages show live beside the results they plot
  (benchmarks/results/, examples/results/), not in docs/; they are added to
  the site from there, so a page's link to one resolves and a missing one
  fails `mkdocs build --strict`.
- "What it costs" gets its tables from benchmarks/results/latest.json,
  written by benchmarks/report.py at build time, never pasted.
- `<!-- include PATH -->` in any page is replaced by the committed results
  file PATH (a table a benchmark or a tally wrote); a missing file fails
  the build.
"""

import json
from pathlib import Path
import re
import sys

from mkdocs.structure.files import File

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
COSTS_MARKER = (
  "<!-- latest.json tables: docs/_hooks.py writes them here "
  "from benchmarks/results/latest.json, with "
  "benchmarks/report.py -->"
)


INCLUDE = re.compile(r"<!-- include (\S+) -->")


def _include(match):
  path = ROOT / match.group(1)
  if not path.is_file():
    raise ValueError(f"a page includes {match.group(1)}, which does not exist")
  return path.read_text()


def on_page_markdown(markdown, page, config, files):
  markdown = INCLUDE.sub(_include, markdown)
  if page.file.src_uri != COSTS_PAGE:
    return markdown
  if COSTS_MARKER not in markdown:
    raise ValueError(f"{COSTS_PAGE} lost the marker its tables go to")
  sys.path.insert(0, str(ROOT))
  try:
    from benchmarks import report  # pylint: disable=import-outside-toplevel
  finally:
    sys.path.remove(str(ROOT))
  results = json.loads((ROOT / "benchmarks" / "results" / "latest.json").read_text())
  return markdown.replace(COSTS_MARKER, report.markdown(results))
