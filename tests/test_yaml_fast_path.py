"""abtune reads YAML with libyaml's parser where PyYAML has it (several times faster), and with the
pure-Python one otherwise and for every text libyaml refuses: what a file means and what a bad one is told
must not depend on which parser read it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from abtune import yamlfile
from abtune.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p for folder in ("configs", "studies", "clusters", "launchers") if (REPO / folder).is_dir()
                 for p in (REPO / folder).rglob("*.yaml"))


def test_every_shipped_yaml_file_reads_as_the_pure_python_loader_reads_it() -> None:
    assert SHIPPED, "no YAML files found to compare"
    for path in SHIPPED:
        text = path.read_text()
        assert yamlfile.parse_yaml(text, str(path)) == yaml.load(text, Loader=yamlfile._UniqueKeyLoader), path  # noqa: S506


@pytest.mark.parametrize(("text", "message"), [
    ("a:\tb\n", "f.yaml:1:3: not valid YAML: found character '\\t' that cannot start any token"),  # libyaml takes it
    ("a: 1\na: 2\n", "f.yaml:2:1: not valid YAML: key 'a' appears twice (first on line 1)"),
    ("a: [1\n", "f.yaml:2:1: not valid YAML: expected ',' or ']', but got '<stream end>'"),
    ("x: \x01\n", "f.yaml:1:4: not valid YAML: control character #x01 is not allowed (is this a binary file?)"),
])
def test_a_text_either_parser_refuses_is_refused_in_the_pure_python_loaders_words(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        yamlfile.parse_yaml(text, "f.yaml")
    assert str(refused.value).startswith(message), str(refused.value)


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML without libyaml: there is one parser")
def test_libyaml_reads_a_valid_text_without_the_pure_python_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    class Unused(yamlfile._UniqueKeyLoader):
        def __init__(self, stream: str) -> None:
            raise AssertionError("the pure-Python loader read a text that libyaml takes")

    monkeypatch.setattr(yamlfile, "_UniqueKeyLoader", Unused)
    assert yamlfile.parse_yaml("a: {b: [1, 2.5, 'x']}\n", "f.yaml") == {"a": {"b": [1, 2.5, "x"]}}
