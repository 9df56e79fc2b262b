"""`--resume` continues a run on the layout that wrote its checkpoint: a 2x2 run resumed as 4x1 (AB's groups
silently changed) or 2x1 (the optimizer's parameters, a summary saying world size 2) is refused in one line
naming both layouts, before anything starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from abtune.cli import main
from abtune.runfiles import CHECKPOINT_LAYOUT, check_checkpoint_layout, complete_checkpoints
from tests.conftest import train_and_read, write_config


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished 2 nodes x 2 ranks run with its final checkpoint (step 4): the config and the run folder."""
    folder = tmp_path_factory.mktemp("resume-layout")
    config = write_config(folder / "run.yaml", train={"steps": 4, "local_batch_size": 8})
    train_and_read(config, folder / "run", 4, 2)
    return config, folder / "run"


def _resume(config: Path, run_dir: Path, nproc: int, ranks_per_node: int) -> int:
    return main(["train", str(config), "--nproc", str(nproc), "--ranks-per-node", str(ranks_per_node),
                 "--run-dir", str(run_dir), "--no-tracking", "--resume"])


@pytest.mark.slow
def test_the_checkpoint_records_the_layout_that_wrote_it(two_by_two: tuple[Path, Path]) -> None:
    checkpoints = complete_checkpoints(two_by_two[1])
    assert [c.name for c in checkpoints] == ["step_00000004"]
    assert json.loads((checkpoints[-1] / CHECKPOINT_LAYOUT).read_text()) == {"nodes": 2, "ranks_per_node": 2}
    check_checkpoint_layout(two_by_two[1], 2, 2)  # the same layout resumes


@pytest.mark.slow
@pytest.mark.parametrize(("nproc", "ranks_per_node", "now"), [
    (4, 1, "4 node(s) x 1 rank(s) (world size 4)"),
    (2, 1, "2 node(s) x 1 rank(s) (world size 2)"),
])
def test_a_resume_onto_another_layout_is_refused_naming_both(two_by_two: tuple[Path, Path], nproc: int,
                                                             ranks_per_node: int, now: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    config, run_dir = two_by_two
    before = sorted(p.name for p in run_dir.rglob("*"))
    assert _resume(config, run_dir, nproc, ranks_per_node) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"abtune: error: --resume: the checkpoint at step 00000004 was written by 2 node(s) x 2 rank(s) (world size "
        f"4), this launch has {now}; a run resumes on its own layout (AB's groups, the data and the optimizer state "
        "of each rank follow it): resume with --nproc 4 --ranks-per-node 2 (nodes and tasks_per_node in a launcher "
        "profile), or start a new --run-dir"], err
    assert out == ""
    assert sorted(p.name for p in run_dir.rglob("*")) == before  # nothing started, nothing written


@pytest.mark.slow
def test_a_checkpoint_without_a_recorded_layout_is_checked_on_its_rank_files(two_by_two: tuple[Path, Path],
                                                                            tmp_path: Path) -> None:
    run_dir = shutil.copytree(two_by_two[1], tmp_path / "older")
    (complete_checkpoints(run_dir)[-1] / CHECKPOINT_LAYOUT).unlink()
    with pytest.raises(Exception, match=r"was written by 4 ranks, this launch has 2 node\(s\) x 1 rank\(s\) "
                                        r"\(world size 2\).*resume with --nproc 4 \("):
        check_checkpoint_layout(run_dir, 2, 1)
    check_checkpoint_layout(run_dir, 4, 1)  # as many ranks: the rank files cannot tell the nodes
