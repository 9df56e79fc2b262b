"""The one way abtune reads a YAML file: run configs, study files, launcher profiles, hooks.yaml.

Every problem is one line that names the file: a missing or empty file, bytes that are not UTF-8
text, a syntax error as `FILE:LINE:COL: not valid YAML: <problem>`, a key given twice (YAML would
silently keep the last one), or a top level of the wrong kind.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from abtune.errors import ConfigError


class _UniqueKeys:
    """A SafeLoader's constructor that refuses a mapping with the same key twice instead of keeping the last value."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            if not isinstance(key, Hashable):
                continue  # SafeLoader refuses it below
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (first on line {seen[key].line + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


class _UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """Pure Python: the wording of every syntax error."""


# libyaml's parser, where PyYAML has it, reads a file several times faster (abtune reads its configs and study
# files often: every study command, every trial); a text it refuses is parsed again by the pure-Python loader,
# whose message is the one shown, so that the message does not depend on how PyYAML was built. A text with a tab
# goes to the pure-Python loader only: libyaml takes `key:<tab>value`, which the pure-Python one refuses.
_FAST_LOADER = type("_FastUniqueKeyLoader", (_UniqueKeys, yaml.CSafeLoader), {}) if yaml.__with_libyaml__ else None


def read_yaml(path: Path, expected: type = dict) -> Any:
    """The file's top-level value, which must be an `expected` (a mapping by default)."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    value = parse_yaml(_read_text(path), str(path))
    if value is None:
        raise ConfigError(f"{path}: the file is empty (or holds only comments); expected a YAML {_kind(expected)}")
    if not isinstance(value, expected):
        raise ConfigError(f"{path}: expected a YAML {_kind(expected)} at the top level, got {type(value).__name__}")
    return value


def parse_yaml(text: str, source: str) -> Any:
    """`text` parsed as YAML; a syntax error is one line that starts with `source:LINE:COL:`."""
    if _FAST_LOADER is not None and "\t" not in text:
        try:
            return yaml.load(text, Loader=_FAST_LOADER)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError:
            pass  # worded below
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.reader.ReaderError as error:
        line, column = _line_and_column(text, error.position)
        raise ConfigError(f"{source}:{line}:{column}: not valid YAML: control character #x{error.character:02x} "
                          "is not allowed (is this a binary file?)") from None
    except yaml.MarkedYAMLError as error:
        raise ConfigError(_describe(error, source)) from None
    except yaml.YAMLError as error:  # unmarked errors are rare; keep them on one line
        raise ConfigError(f"{source}: not valid YAML: {' '.join(str(error).split())}") from None


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if b"\x00" in data:
        raise ConfigError(f"{path}: a binary file (it contains NUL bytes); expected YAML text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        valid = data[: error.start].decode("utf-8")
        line, column = _line_and_column(valid, len(valid))
        raise ConfigError(f"{path}:{line}:{column}: not UTF-8 text (byte 0x{data[error.start]:02x}); a binary file, "
                          "or text in another encoding: save it as UTF-8") from None


def _describe(error: yaml.MarkedYAMLError, source: str) -> str:
    mark = error.problem_mark or error.context_mark
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    problem = " ".join((error.problem or error.context or "syntax error").split())
    if error.problem and error.context:
        problem += f" ({' '.join(error.context.split())})"
    return f"{where}: not valid YAML: {problem}"


def _line_and_column(text: str, position: int) -> tuple[int, int]:
    before = text[:position]
    return before.count("\n") + 1, position - (before.rfind("\n") + 1) + 1


def _kind(expected: type) -> str:
    return {dict: "mapping", list: "list"}.get(expected, expected.__name__)
