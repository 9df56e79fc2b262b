"""A cluster description is validated like every other file of abtune: the project's strict base, and every
problem named, one line each, in the project's words (abtune/schema.py `validation_lines`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from abtune import timing
from abtune.errors import ConfigError
from abtune.schema import StrictModel


def test_every_model_of_a_cluster_description_stands_on_the_strict_base() -> None:
    models = [value for value in vars(timing).values()
              if isinstance(value, type) and issubclass(value, StrictModel) and value.__module__ == timing.__name__]
    assert {m.__name__ for m in models} >= {"Cluster", "Link", "Compute", "Throughput"}


def test_a_cluster_file_with_two_problems_names_both_in_the_project_s_words(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes: 0\naccelerators_per_node: 1\ninter_node: {gbit_per_s: 1, speed: 3}\n"
                   "intra_node: {gbit_per_s: 1}\ncompute: {from_run: true}\n")
    with pytest.raises(ConfigError) as error:
        timing.load_cluster(str(bad))
    assert str(error.value).splitlines() == [
        f"{bad}: nodes: Input should be greater than or equal to 1 (got 0)",
        f"{bad}: inter_node.speed: unknown key (check the spelling; see `abtune config show` for valid keys)",
    ]
