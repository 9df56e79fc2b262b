"""Counts in words: `plural(1, "minute")` is "1 minute", `plural(2, "minute")` is "2 minutes"."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def either(names: list[str] | tuple[str, ...]) -> str:
    """`a`, `a or b`, `a, b or c`: alternatives as a sentence says them."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
