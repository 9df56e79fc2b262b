"""The documentation: README.md, a landing page that opens with the two commands, and the mkdocs site of
docs/ (with BENCHMARKS.md), built strict so that a link or anchor that leads nowhere fails the suite."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from abtune.cli import EXAMPLES, build_parser
from tests.conftest import REPO

README = REPO / "README.md"
README_MAX_LINES = 300
TWO_COMMANDS = (
    "pip install -e '.[dev]' && abtune study create studies/quickstart.yaml && abtune study run quickstart\n"
    "pytest -q\n"
)
SITE_SOURCES = ("mkdocs.yml", "docs", "BENCHMARKS.md", "benchmarks/figures")
BUILD_TIMEOUT_S = 120
LINK = re.compile(r"\]\(([^)\s]+)\)")


def build_site(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    built = build_site(REPO, site)
    assert built.returncode == 0, built.stderr
    return site


def copy_of_the_site_sources(target: Path) -> Path:
    for name in SITE_SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name)
        else:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target / name)
    return target


def first_code_block(markdown: str) -> str:
    match = re.search(r"^```[a-z]*\n(.*?)^```", markdown, flags=re.M | re.S)
    assert match, "no code block"
    return match.group(1)


def test_every_docs_page_and_benchmarks_md_is_in_the_built_site(site: Path) -> None:
    pages = {p.stem for p in (REPO / "docs").glob("*.md")} | {"benchmarks"}
    built = {p.parent.name for p in site.glob("*/index.html")} | {"index"}
    assert pages <= built
    figures = {p.name for p in (REPO / "benchmarks" / "figures").glob("*.png")}
    assert figures and figures <= {p.name for p in (site / "benchmarks" / "figures").glob("*.png")}


BROKEN_LINKS = {
    "anchor": ("docs/studies.md", "[a section that is gone](running.md#no-such-section)"),
    "page": ("docs/studies.md", "[a page that is gone](no-such-page.md)"),
    "docs-to-benchmarks": ("docs/studies.md", "[a benchmark that is gone](../BENCHMARKS.md#no-such-benchmark)"),
    "benchmarks-to-docs": ("BENCHMARKS.md", "[a docs page that is gone](docs/no-such-page.md)"),
}


@pytest.fixture(scope="module")
def broken_build(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """One build of the site with every link of BROKEN_LINKS added (a build takes seconds): mkdocs --strict
    warns of each and fails at the end, so each test finds its own link's warning."""
    root = copy_of_the_site_sources(tmp_path_factory.mktemp("checkout"))
    for page, broken in BROKEN_LINKS.values():
        with (root / page).open("a") as handle:
            handle.write(f"\nSee {broken}.\n")
    return build_site(root, tmp_path_factory.mktemp("broken-site"))


@pytest.mark.parametrize("kind", list(BROKEN_LINKS))
def test_a_link_that_leads_nowhere_fails_the_build(broken_build: subprocess.CompletedProcess[str], kind: str) -> None:
    assert broken_build.returncode != 0
    target = LINK.search(BROKEN_LINKS[kind][1]).group(1).rsplit("/", 1)[-1].split("#")[-1]
    warnings = [line for line in broken_build.stderr.splitlines() if line.startswith("WARNING")]
    assert any(target in line for line in warnings), broken_build.stderr


def test_readme_opens_with_the_two_commands_and_says_what_the_tests_install() -> None:
    readme = README.read_text()
    assert first_code_block(readme) == TWO_COMMANDS
    after_commands = readme.split(TWO_COMMANDS + "```\n", 1)[1].lstrip().split("\n\n", 1)[0]
    assert "root" in after_commands and "tests/system.py" in after_commands
    for package in ("SLURM", "PostgreSQL", "chromium", "iproute2", "iptables"):
        assert package in after_commands


def test_readme_is_a_landing_page() -> None:
    assert len(README.read_text().splitlines()) <= README_MAX_LINES


@pytest.mark.parametrize("page", ["docs/index.md", "docs/getting-started.md"])
def test_the_docs_show_the_two_commands_as_the_readme_does(page: str) -> None:
    assert first_code_block((REPO / page).read_text()) == TWO_COMMANDS


def test_every_link_of_the_readme_leads_somewhere(site: Path) -> None:
    links = [link for link in LINK.findall(README.read_text()) if "://" not in link]
    assert links, "the README links into docs/"
    for link in links:
        path, _, anchor = link.partition("#")
        assert (REPO / path).exists(), link
        if anchor:
            assert path.startswith("docs/") and path.endswith(".md"), link
            page = site / Path(path).relative_to("docs").with_suffix("") / "index.html"
            if page.parent.name == "index":
                page = site / "index.html"
            assert f'id="{anchor}"' in page.read_text(), link


@pytest.mark.parametrize(("command", "what"), EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_every_example_of_abtune_help_parses(command: str, what: str) -> None:
    for part in command.split(" && "):
        words = shlex.split(part)
        assert words[0] == "abtune"
        build_parser().parse_args(words[1:])
        for word in words:
            if word.startswith("studies/"):
                assert (REPO / word).is_file(), word
