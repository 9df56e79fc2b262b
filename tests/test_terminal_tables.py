"""Tables that fit the terminal (abtune/tables.py), seen in a real pseudo-terminal at 80, 100 and 200 columns:
no line is wider than the terminal, no row wraps, every header is whole, and what a narrow terminal leaves out
is named. The commands run in this process on a terminal of their own (tests/terminal.py); at 80 columns
`study best` also runs as the installed command, and shows the same lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from abtune import tables
from tests.terminal import run_here_in_terminal, run_in_terminal, tables_in, too_wide

PARAMS = ["warmup_frac", "ab_frac", "rebound_frac", "lr_rebound_frac", "sigma_cutoff"]  # the method. prefix: in the title
ESSENTIAL = ["trial", "top1", "inter MB", "vs DDP", "compr", *PARAMS]
VIT_TARGET = Path(__file__).resolve().parent.parent / "studies" / "imagenet_vit_b16.yaml"


def _columns_of(shown: list, title: str) -> list[str]:
    (table,) = [t for t in shown if title in t.title]
    return table.headers


# 80: the installed command too, in a terminal of its own (a new Python)
@pytest.mark.parametrize("columns", [pytest.param(80, marks=pytest.mark.slow), 100, 200])
def test_study_best_fits_the_terminal_with_every_essential_column_whole(quickstart: tuple[Path, str],
                                                                       columns: int) -> None:
    folder, url = quickstart
    code, lines = run_here_in_terminal(["study", "best", "quickstart", "--storage", url], columns, folder)
    assert code == 0, "\n".join(lines)
    if columns == 80:  # the installed entry point in a terminal of its own shows what the call in process did
        assert run_in_terminal(["study", "best", "quickstart", "--storage", url], columns, folder) == (code, lines)
    wide = too_wide(lines, columns)
    assert [line for line in wide if not line.startswith("run it again: abtune train")] == [], "\n".join(lines)
    shown = tables_in(lines)
    (front,) = [t for t in shown if "Pareto front" in t.title]
    assert [row[0] for row in front.rows] == ["4", "7", "2"]  # one line each, never wrapped
    for title in ("recommended configuration", "Pareto front", "reference trials"):
        headers = _columns_of(shown, title)
        assert set(ESSENTIAL) <= set(headers), (title, headers)
    assert "…" not in "\n".join(lines)
    left_out = [line for line in lines if line.startswith("not shown at")]
    if columns == 200:
        assert left_out == [] and "note" in _columns_of(shown, "reference trials")
    else:
        assert left_out and all(line.startswith(f"not shown at {columns} columns: vs paper") for line in left_out)
    assert "paper defaults" in "\n".join(lines) and "DDP reference" in "\n".join(lines)  # the references' note stays


def test_study_best_wide_shows_every_column(quickstart: tuple[Path, str]) -> None:
    folder, url = quickstart
    code, lines = run_here_in_terminal(["study", "best", "quickstart", "--storage", url, "--wide"], 80, folder)
    assert code == 0
    recommended = _columns_of(tables_in(lines), "recommended configuration")
    assert recommended == ["trial", "top1", "vs paper", "inter MB", "vs DDP", "compr", *PARAMS, "note"]
    assert not any(line.startswith("not shown") for line in lines)


@pytest.mark.parametrize("columns", [80, 100])
def test_promote_dry_run_fits_the_terminal(quickstart: tuple[Path, str], columns: int) -> None:
    folder, url = quickstart
    code, lines = run_here_in_terminal(["promote", "quickstart", "--storage", url, "--to", str(VIT_TARGET), "--nodes",
                                   "2,4,8,16,32", "--scaling", "local", "--dry-run"], columns, folder)
    assert code == 0, "\n".join(lines)
    assert too_wide([line for line in lines if "│" in line or "┃" in line], columns) == []
    campaign = _columns_of(tables_in(lines), "dry run")
    assert {"run", "nodes", "local batch", "global batch", "steps", "warmup", "AB", "rebound", "LR rebound"} <= set(campaign)


def _printed(columns: list[tables.Column], rows: list[list[str]], width: int, wide: bool = False) -> str:
    out = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    tables.print_table(out, "t", columns, rows, wide=wide, elsewhere="x.csv has every column")
    return out.export_text()


def test_the_least_important_columns_go_first_and_are_named() -> None:
    columns = [tables.Column("method", justify="left"), tables.Column("final top-1"),
               tables.Column("ECR", tables.KEY), tables.Column("wall s", tables.DETAIL)]
    rows = [["ab-nogroups", "0.9500", "48.69%", "19.3"]]
    assert "not shown" not in _printed(columns, rows, 80)
    narrow = _printed(columns, rows, 30)
    assert "not shown at 30 columns: ECR, wall s (--wide shows them; x.csv has every column)" in " ".join(narrow.split())
    assert "0.9500" in narrow and "ab-nogroups" in narrow
    assert "ECR" in _printed(columns, rows, 30, wide=True)


def test_a_header_wraps_only_where_it_may_and_a_value_is_never_cut() -> None:
    assert tables._wrapped("method.lr_rebound_frac", 9) == "method.\nlr_\nrebound_\nfrac"
    assert tables._wrapped("inter-node vs ddp", 10) == "inter-node\nvs ddp"
    column = tables.Column("predicted s to target")
    least, natural = tables._widths(column, ["12345.6", "never"])
    assert (least, natural) == (9, 21)  # "predicted" and the whole header on one line
    note = tables.Column("note", wrap=True)
    assert tables._widths(note, ["retry of 3 pruned at step 40"]) == (6, 28)  # "pruned" is its longest word


def test_essential_columns_wider_than_the_terminal_continue_below() -> None:
    columns = [tables.Column("trial", justify="left"), *(tables.Column(f"parameter_{i}") for i in range(8))]
    text = _printed(columns, [["7", *[f"0.{i}2345" for i in range(8)]]], 60)
    assert "t (continued)" in text and max(len(line) for line in text.splitlines()) <= 60
    assert all(f"0.{i}2345" in text for i in range(8))


@pytest.mark.parametrize("forcing", ["FORCE_COLOR", "TTY_COMPATIBLE"])
def test_output_to_a_file_is_not_cut_to_80_columns_when_colour_is_forced(forcing: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """FORCE_COLOR and TTY_COMPATIBLE make rich call a file a terminal, 80 columns wide: a width is the
    terminal's only on a terminal or from $COLUMNS."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv(forcing, "1")
    assert tables.console().width == tables.UNLIMITED
    monkeypatch.setenv("COLUMNS", "100")
    assert tables.console().width == 100
