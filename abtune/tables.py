"""Every table abtune prints on a terminal, through one helper that knows the terminal's width and the
columns' priorities (`compare`, `study best`, `study list`, `promote`).

A table takes the terminal's width. Its columns carry a priority: `ESSENTIAL` ones are always shown (when
they alone are wider than the terminal, the table continues below, its first column repeated), the others
are kept in priority order while they fit, and the ones left out are named under the table with where to
find them (`--wide` shows every column; the CSV/JSON holds them all). A header is never cut: it wraps after
a space, `.` or `_`, and a column is never narrower than its longest header piece or its widest value
(a text column marked `wrap` folds its values at spaces instead).

Not on a terminal (a file, a pipe) the width is $COLUMNS when set, else unlimited: a file has no width.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

ESSENTIAL, KEY, DETAIL = 0, 1, 2  # priorities: always shown; next; first to go
UNLIMITED = 100_000  # columns of a file or pipe without $COLUMNS
BORDER = 3  # a column's share of the frame: a bar and a space either side
_PIECES = re.compile(r".+?(?:[ ._]|$)")  # a header's pieces: up to and including a break character


@dataclass(frozen=True)
class Column:
    header: str
    priority: int = ESSENTIAL
    justify: Literal["left", "right"] = "right"
    wrap: bool = False  # values are text that may fold at spaces (notes, reasons)


def console() -> Console:
    """A console as wide as the terminal (a file or pipe: $COLUMNS, else unlimited); it wraps text at
    spaces (print a command with `soft_wrap=True`: it stays one line to copy)."""
    # sys.stdout itself, not rich's is_terminal: FORCE_COLOR or TTY_COMPATIBLE ask for colours, and would
    # give a file rich's default 80 columns
    if _is_tty(sys.stdout) or "COLUMNS" in os.environ:
        return Console(highlight=False)
    return Console(highlight=False, width=UNLIMITED, file=sys.stdout)


def _is_tty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def print_table(out: Console, title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], *,
                wide: bool = False, elsewhere: str = "") -> list[str]:
    """Print `rows` under `columns` within `out`'s width (`wide`: every column, as wide as it needs); return
    the headers left out, which a line under the table names, with `elsewhere` (where they can be read)."""
    widths = [_widths(column, [row[i] for row in rows]) for i, column in enumerate(columns)]
    limit = UNLIMITED if wide else out.width
    shown = _kept(columns, [w[0] for w in widths], limit)
    left_out = [c.header for i, c in enumerate(columns) if i not in shown]
    for part, indices in enumerate(_parts(shown, [widths[i][0] for i in range(len(columns))], limit)):
        chosen = [columns[i] for i in indices]
        grown = _grown(chosen, [widths[i] for i in indices], limit)
        table = _table(title if part == 0 else f"{title} (continued)", chosen, [[row[i] for i in indices] for row in rows],
                       grown)
        _print_at_least(out, table, 1 + sum(w + BORDER for w in grown))
    if left_out:
        where = f"; {elsewhere}" if elsewhere else ""
        out.print(f"not shown at {out.width} columns: {', '.join(left_out)} (--wide shows them{where})")
    return left_out


def _widths(column: Column, cells: Sequence[str]) -> tuple[int, int]:
    """(least, natural) width: no header piece cut, no value cut (a `wrap` column: no word cut)."""
    pieces = [cell_len(p.rstrip()) for p in _PIECES.findall(column.header)] or [0]
    values = [cell_len(c) for c in cells] or [0]
    words = [cell_len(w) for c in cells for w in c.split()] or [0]
    least = max(max(pieces), max(words) if column.wrap else max(values), 1)
    return least, max(least, cell_len(column.header), max(values))


def _print_at_least(out: Console, table: Table, width: int) -> None:
    """`--wide`: a table wider than the terminal is printed whole; the terminal wraps its lines."""
    terminal = out.width
    out.width = max(terminal, width)
    try:
        out.print(table)
    finally:
        out.width = terminal


def _kept(columns: Sequence[Column], least: list[int], limit: int) -> set[int]:
    """The essential columns, then the others by priority (left first) until one does not fit: a column never
    takes the place of a more important one."""
    kept = {i for i, c in enumerate(columns) if c.priority == ESSENTIAL}
    width = 1 + sum(least[i] + BORDER for i in kept)
    for i in sorted((i for i, c in enumerate(columns) if c.priority != ESSENTIAL), key=lambda i: (columns[i].priority, i)):
        if width + least[i] + BORDER > limit:
            break
        kept.add(i)
        width += least[i] + BORDER
    return kept


def _parts(shown: set[int], least: list[int], limit: int) -> list[list[int]]:
    """The shown columns in their order, split into tables that fit; each later one repeats the first column."""
    order = sorted(shown)
    parts: list[list[int]] = [[]]
    for i in order:
        current = parts[-1]
        if current and 1 + sum(least[j] + BORDER for j in [*current, i]) > limit:
            parts.append([order[0]])
        parts[-1].append(i)
    return parts


def _grown(columns: Sequence[Column], widths: list[tuple[int, int]], limit: int) -> list[int]:
    """From the least widths, while the table fits: first a line less for the tallest header (the cheapest
    such step when several are as tall), then each column toward its natural width, left first."""
    chosen = [least for least, _ in widths]
    room = limit - 1 - sum(w + BORDER for w in chosen)
    while room > 0:
        steps = [(-_lines(c.header, chosen[i]), wider - chosen[i], i) for i, c in enumerate(columns)
                 if (wider := _fewer_lines(c.header, chosen[i], widths[i][1])) is not None and wider - chosen[i] <= room]
        if not steps:
            break
        _, extra, i = min(steps)
        chosen[i] += extra
        room -= extra
    for i, (_, natural) in enumerate(widths):
        extra = min(max(room, 0), natural - chosen[i])
        chosen[i] += extra
        room -= extra
    return chosen


def _lines(header: str, width: int) -> int:
    return _wrapped(header, width).count("\n") + 1


def _fewer_lines(header: str, width: int, natural: int) -> int | None:
    """The least width above `width` at which `header` takes fewer lines (None: it takes one already)."""
    lines = _lines(header, width)
    return next((w for w in range(width + 1, natural + 1) if _lines(header, w) < lines), None)


def _table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], widths: list[int]) -> Table:
    table = Table(title=title)
    for column, width in zip(columns, widths, strict=True):
        table.add_column(Text(_wrapped(column.header, width)), justify=column.justify, width=width,
                         no_wrap=not column.wrap, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def _wrapped(header: str, width: int) -> str:
    """`header` in lines of at most `width` cells, broken only after a space, `.` or `_`."""
    lines = [""]
    for piece in _PIECES.findall(header):
        if lines[-1] and cell_len((lines[-1] + piece).rstrip()) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(line.rstrip() for line in lines)
