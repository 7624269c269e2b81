"""mkdocs hooks (mkdocs.yml `hooks:`): what the docs build takes from the code and the results.

- docs/reference/config.md: the marker line is replaced by the tables that
  docs/gen/config_reference.py generates from zerolite/config/ (a missing marker fails the
  build, so the page cannot silently lose its reference);
- benchmarks/results/*.png and *.json are published under results/ in the site, so the
  benchmark pages show the pictures and link the data they were drawn from, without copies.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- config-reference: generated from zerolite/config at build time -->"
CONFIG_PAGE = "reference/config.md"


def _generator():
    spec = importlib.util.spec_from_file_location(
        "config_reference", Path(__file__).with_name("config_reference.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def on_files(files, config):
    results = REPO / "benchmarks"
    for path in sorted((results / "results").glob("*")):
        if path.suffix in (".png", ".json"):
            files.append(File(f"results/{path.name}", src_dir=str(results),
                              dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != CONFIG_PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"{CONFIG_PAGE}: the line {MARKER!r} is missing")
    return markdown.replace(MARKER, _generator().markdown())
