"""mkdocs hook: BENCHMARKS.md (kept at the top of the repository, where benchmarks are written up) becomes
the site's benchmarks.md, with the figures it shows, so its links and the docs' links into it are checked
by `mkdocs build --strict` like every other page's.

Links are written as they work on GitHub: a page of docs/ links `../BENCHMARKS.md#...`, BENCHMARKS.md links
`docs/PAGE.md`. In the site both lie side by side, so each is rewritten before mkdocs resolves it."""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPOSITORY = Path(__file__).resolve().parents[2]
PAGE = "benchmarks.md"
FIGURES = "benchmarks/figures"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, PAGE, abs_src_path=str(REPOSITORY / "BENCHMARKS.md")))
    for figure in sorted((REPOSITORY / FIGURES).glob("*.png")):
        files.append(File.generated(config, f"{FIGURES}/{figure.name}", abs_src_path=str(figure)))
    return files


def on_page_markdown(markdown: str, page: Page, **_: object) -> str:
    if page.file.src_uri == PAGE:
        return markdown.replace("](docs/", "](")
    return markdown.replace("](../BENCHMARKS.md", f"]({PAGE}")
