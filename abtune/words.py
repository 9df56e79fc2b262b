"""Counts in words: `plural(1, "minute")` is "1 minute", `plural(2, "minute")` is "2 minutes"."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
