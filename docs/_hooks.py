"""MkDocs hooks: the pictures the pages show live beside the results they
plot (benchmarks/results/, examples/results/), not in docs/; they are added
to the site from there, so a page's link to one resolves and a missing one
fails `mkdocs build --strict`."""

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
PICTURES = ("benchmarks/results/*.png", "examples/results/*.png",
            "examples/results/*/*.png")


def on_files(files, config):
  for pattern in PICTURES:
    for path in sorted(ROOT.glob(pattern)):
      files.append(File(str(path.relative_to(ROOT)), str(ROOT),
                        config["site_dir"], config["use_directory_urls"]))
  return files
