"""Sentences abtune prints, wrapped at words to the terminal's width (tables have abtune/tables.py).

`say(text)` prints on stdout, `warn(text)` on stderr as `abtune: warning: ...`; their continuation lines are
indented. A command in backticks is never broken: when it does not fit where it falls it starts a line of its
own, and one wider than the terminal stays whole on its line, so it can be copied. Not on a terminal, the
width is $COLUMNS when set, else unlimited (a log keeps one line per message).
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from abtune.tables import UNLIMITED, _is_tty

_COMMAND = re.compile(r"`[^`]+`")
_KEEP = "\u00a0"  # a space that textwrap does not break at
INDENT = "  "


def width(stream: TextIO) -> int:
    """Columns of the terminal `stream` writes to; $COLUMNS when set; else unlimited."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    if _is_tty(stream):
        try:
            return os.get_terminal_size(stream.fileno()).columns
        except OSError:
            return UNLIMITED
    return UNLIMITED


def wrapped(text: str, columns: int, first: str = "") -> str:
    """`first` + `text` in lines of at most `columns`, broken at spaces only (never inside a `command`); each
    line of `text` is wrapped on its own, so lines stay lines."""
    kept = _COMMAND.sub(lambda m: m.group(0).replace(" ", _KEEP), text)
    paragraphs = (first + kept).split("\n")
    lines = [line for paragraph in paragraphs
             for line in textwrap.wrap(paragraph, columns, subsequent_indent=INDENT, break_long_words=False,
                                       break_on_hyphens=False) or [paragraph]]
    return "\n".join(lines).replace(_KEEP, " ")


def say(text: str, stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    print(wrapped(text, width(out)), file=out, flush=True)


def warn(text: str) -> None:
    print(wrapped(text, width(sys.stderr), "abtune: warning: "), file=sys.stderr, flush=True)


def shown_path(path: Path | str) -> str:
    """A path as short as it can be read: relative to the current folder when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        return str(path)


def readable(value: Any) -> str:
    """A number as a person reads it: 4 significant digits (the stored value keeps full precision)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def shared_section(keys: Iterable[str]) -> str | None:
    """`method` when every key is `method.<name>` (a header or a list can say it once); else None."""
    sections = {key.partition(".")[0] if "." in key else None for key in keys}
    return sections.pop() if len(sections) == 1 and None not in sections else None


def short_key(key: str, section: str | None) -> str:
    """`method.warmup_frac` -> `warmup_frac` when `section` is `method`."""
    return key.removeprefix(f"{section}.") if section else key


def settings(values: Mapping[str, Any]) -> str:
    """`warmup_frac=0.1014, ab_frac=0.0336 (method.*)`: dotted keys that share a section name it once."""
    section = shared_section(values)
    shown = ", ".join(f"{short_key(key, section)}={readable(v)}" for key, v in values.items())
    return f"{shown} ({section}.*)" if section else shown
