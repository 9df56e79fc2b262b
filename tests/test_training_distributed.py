"""Real multi-process runs (gloo on CPU, 4 ranks as 2 simulated nodes) through the `abtune` command, and the
run folder's contract (abtune.runfiles) read from the AB run (trained once, for both).

The schedule used here (40 steps): warmup [0,10) | AB [10,20) | rebound [20,25) | AB [25,35) | rebound [35,40).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from abtune.config import load_run_config
from abtune.data import DatasetInfo
from abtune.methods.ab import lowrank
from abtune.models import build_model
from abtune.runfiles import CONFIG_FILE, SUMMARY_FILE, read_summary
from tests.conftest import abtune_command, train_and_read, write_config

NPROC, RANKS_PER_NODE = 4, 2
FLOAT32 = 4
INT32 = 4
INT64 = 8
# rank_cap null: every eligible weight is factored whatever its rank, so the formulas below hold exactly.
AB_SECTION = {"warmup_frac": 0.25, "ab_frac": 0.25, "rebound_frac": 0.5, "lr_rebound_frac": 0.5,
              "sigma_cutoff": 0.3, "rank_cap": None}
DIGITS = DatasetInfo(num_classes=10, image_size=8, in_channels=3)

pytestmark = pytest.mark.slow


def train(config: Path, run_dir: Path, *extra: str) -> dict[str, Any]:
    return train_and_read(config, run_dir, NPROC, RANKS_PER_NODE, *extra)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("distributed")


@pytest.fixture(scope="module")
def ab_config(workdir: Path) -> Path:
    return write_config(workdir / "ab.yaml", method={"name": "ab", **AB_SECTION}, train={"checkpoint_every": 5})


@pytest.fixture(scope="module")
def ab_run(workdir: Path, ab_config: Path) -> tuple[Path, dict[str, Any]]:
    run_dir = workdir / "ab_run"
    return run_dir, train(ab_config, run_dir)


@pytest.fixture(scope="module")
def ddp_run(workdir: Path) -> dict[str, Any]:
    config = write_config(workdir / "ddp.yaml")
    return train(config, workdir / "ddp_run")


def payload(summary: dict[str, Any], rank: int, phase: str, locality: str | None = None) -> int:
    rows = summary["traffic"]["rows_per_rank"][rank]
    return sum(r["payload_bytes"] for r in rows if r["phase"] == phase and locality in (None, r["locality"]))


def ddp_rebuild_bytes(num_tensors: int, buckets: int = 1) -> int:
    """DDP's one-time bucket-order broadcast: (indices + 1) int32 and one int32 per bucket."""
    return (num_tensors + 1) * INT32 + buckets * INT32


def tiny_model(config_path: Path) -> torch.nn.Module:
    return build_model(load_run_config(config_path).model, DIGITS)


def test_ddp_traffic_matches_the_formula_exactly(ddp_run: dict[str, Any], workdir: Path) -> None:
    model = tiny_model(workdir / "ddp.yaml")
    params = list(model.parameters())
    dense = sum(p.numel() for p in params) * FLOAT32
    for rank in range(NPROC):
        assert payload(ddp_run, rank, "train") == 40 * dense + ddp_rebuild_bytes(len(params))
        assert payload(ddp_run, rank, "setup") == NPROC * INT64 + dense  # node gather + initial broadcast
    # Wire bytes: ring all-reduce over 4 ranks moves 2*3/4 of the payload; the world spans both nodes.
    train_rows = [r for r in ddp_run["traffic"]["rows_per_rank"][0] if r["phase"] == "train"]
    assert all(r["locality"] == "inter" for r in train_rows)
    assert sum(r["wire_bytes"] for r in train_rows if r["op"] == "all_reduce") == 40 * dense * 1.5
    assert ddp_run["traffic"]["reduction_vs_ddp"] == pytest.approx(1.0, rel=1e-3)
    # gloo's all-reduce ring sends to the previous rank: ranks 0 and 2 send all that leaves a node (0->3, 2->1),
    # ranks 1 and 3 nothing; rank 0's live rows show the run's mean per rank, half of its own.
    last = ddp_run["history"][-1]
    def reduced_across(rank: int) -> float:
        rows = ddp_run["traffic"]["rows_per_rank"][rank]
        return sum(r["inter_node_bytes"] for r in rows if r["phase"] == "train" and r["op"] == "all_reduce")
    assert last["step"] == 40 and reduced_across(1) == reduced_across(3) == 0
    assert reduced_across(0) == reduced_across(2) == pytest.approx(40 * dense * 1.5)
    assert last["training_inter_node_bytes"] == pytest.approx(ddp_run["traffic"]["training_inter_node_bytes"])
    assert last["training_inter_node_bytes"] == pytest.approx(40 * dense * 1.5 / 2, rel=1e-3)


def test_ab_traffic_matches_the_formula_exactly(ab_run: tuple[Path, dict[str, Any]], ab_config: Path) -> None:
    _, summary = ab_run
    model = tiny_model(ab_config)
    refs = lowrank.eligible_weights(model)
    ranks_per_cycle = [d["ranks"] for d in summary["decompositions"]]
    assert len(ranks_per_cycle) == 2
    factored = {ref.key for ref in refs}
    shapes = {ref.key: getattr(ref.module(model), ref.attr).reshape(getattr(ref.module(model), ref.attr).shape[0], -1).shape for ref in refs}
    others = [p for n, p in model.named_parameters() if n not in factored]
    other_numel = sum(p.numel() for p in others)
    params = list(model.parameters())
    dense = sum(p.numel() for p in params) * FLOAT32

    expected_ab = {0: 0, 3: 0}  # rank 0 trains A (first group), rank 3 trains B
    expected_sync = 0
    for ranks in ranks_per_cycle:
        a_numel = sum(shapes[k][0] * r for k, r in ranks.items())
        b_numel = sum(r * shapes[k][1] for k, r in ranks.items())
        trainable_tensors = len(refs) + len(others)
        expected_ab[0] += 10 * (a_numel + other_numel) * FLOAT32 + ddp_rebuild_bytes(trainable_tensors)
        expected_ab[3] += 10 * (b_numel + other_numel) * FLOAT32 + ddp_rebuild_bytes(trainable_tensors)
        expected_sync += (a_numel + b_numel + other_numel) * FLOAT32  # with-stale: A, B and the rest, averaged
    agreement = 2 * len(refs) * INT64  # one int64 rank per factored weight, all-reduced (MAX) at each decomposition
    for rank in (0, 3):
        assert payload(summary, rank, "warmup") == 10 * dense + ddp_rebuild_bytes(len(params))
        assert payload(summary, rank, "ab", "intra") == expected_ab[rank]
        assert payload(summary, rank, "ab", "inter") == agreement
        assert payload(summary, rank, "sync") == expected_sync
        assert payload(summary, rank, "rebound") == 2 * (5 * dense + ddp_rebuild_bytes(len(params)))
    # The independent phase never crosses the interconnect: group = node.
    assert summary["groups"] == {"group_size": 2, "num_groups": 2, "a_ranks": [0, 1], "b_ranks": [2, 3]}
    assert payload(summary, 0, "ab", "inter") == agreement


def _final_states(run_dir: Path) -> list[dict[str, torch.Tensor]]:
    final = sorted((run_dir / "checkpoints").iterdir())[-1]
    return [torch.load(final / f"rank_{r}.pt", weights_only=False)["model"] for r in range(NPROC)]


def test_after_sync_every_rank_holds_identical_parameters(ab_config: Path, ab_run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, summary = ab_run
    states = _final_states(run_dir)
    assert states[0].keys() == tiny_model(ab_config).state_dict().keys(), "the final model is merged (full rank)"
    for other in states[1:]:
        assert other.keys() == states[0].keys()
        for key in states[0]:
            assert torch.equal(other[key], states[0][key]), key


def _kill_when_checkpoint_appears(process: subprocess.Popen[str], folder: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not (folder / "COMPLETE").exists():
        assert process.poll() is None, "the run ended before the checkpoint appeared"
        assert time.monotonic() < deadline, f"no checkpoint at {folder}"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def test_killed_mid_ab_run_resumes_to_the_same_parameters(
    workdir: Path, ab_config: Path, ab_run: tuple[Path, dict[str, Any]]
) -> None:
    uninterrupted_dir, uninterrupted = ab_run
    run_dir = workdir / "killed_run"
    command = [*abtune_command(), "train", str(ab_config), "--nproc", str(NPROC), "--ranks-per-node",
               str(RANKS_PER_NODE), "--run-dir", str(run_dir), "--no-tracking"]
    # its own process group (killpg), in pytest's session: its ranks fork from the warm server
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
    mid_ab = run_dir / "checkpoints" / "step_00000015"  # AB phase runs [10, 20)
    _kill_when_checkpoint_appears(process, mid_ab, timeout=300)
    # The kill may land a little after step 15: drop newer checkpoints so the resume starts mid-AB.
    for newer in sorted((run_dir / "checkpoints").iterdir()):
        if newer.name > mid_ab.name:
            for item in newer.iterdir():
                item.unlink()
            newer.rmdir()
    saved = [torch.load(mid_ab / f"rank_{r}.pt", weights_only=False) for r in range(NPROC)]
    assert saved[0]["method"]["in_ab"]
    a_key = next(k for k in saved[0]["model"] if k.endswith(".weight_a"))
    # Inside a group the trained factor is data-parallel; between groups nothing is exchanged.
    assert torch.equal(saved[0]["model"][a_key], saved[1]["model"][a_key])
    assert not torch.equal(saved[0]["model"][a_key], saved[2]["model"][a_key])

    resumed = train(ab_config, run_dir, "--resume")
    for ours, theirs in zip(_final_states(run_dir), _final_states(uninterrupted_dir), strict=True):
        for key in theirs:
            assert torch.equal(ours[key], theirs[key]), key
    assert resumed["final"] == uninterrupted["final"]
    # Same gradient and sync traffic; the restart adds only DDP's bucket-order broadcast of the
    # rebuilt wrapper and checkpoint barriers, which the meter counts too.
    def all_reduces(summary: dict[str, Any]) -> list[list[dict[str, Any]]]:
        return [[r for r in rows if r["op"] == "all_reduce"] for rows in summary["traffic"]["rows_per_rank"]]

    assert all_reduces(resumed) == all_reduces(uninterrupted)
    extra = resumed["traffic"]["total_bytes"]["mean"] - uninterrupted["traffic"]["total_bytes"]["mean"]
    assert 0 < extra < 200


# --- the run folder's contract (abtune.runfiles), read from the same AB run ------------------------------
STEPS = 40  # write_config's


def test_the_typed_summary_reads_what_the_trainer_wrote(ab_run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, _ = ab_run
    raw = json.loads((run_dir / SUMMARY_FILE).read_text())  # the file itself, read independently
    summary = read_summary(run_dir)
    assert summary.raw == raw
    assert (summary.name, summary.method, summary.world_size, summary.num_nodes) == ("tiny", "ab", NPROC, 2)
    assert (summary.steps_done, summary.stopped_early) == (STEPS, None)
    assert (summary.final_top1, summary.final_loss, summary.best_top1) == (
        raw["final"]["val_top1"], raw["final"]["val_loss"], raw["best_top1"])
    assert (summary.compression, summary.method_ratio, summary.ecr_percent) == (
        raw["compression"]["trained_model_ratio"], raw["compression"]["method_ratio"], raw["compression"]["ecr_percent"])
    assert summary.ecr_percent is not None  # AB decomposed: equation 4 applies
    assert summary.training_inter_node_bytes == raw["traffic"]["training_inter_node_bytes"] > 0
    assert summary.non_training_bytes == sum(raw["traffic"]["non_training_bytes"].values())
    assert (summary.train_seconds, summary.time_to_target_seconds) == (raw["timing"]["train_seconds"], None)
    assert summary.measured_inter_node_bytes is None  # no emulated interconnect


def test_the_ab_summary_holds_the_schedule_its_config_plans(ab_run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, _ = ab_run
    config = load_run_config(run_dir / CONFIG_FILE)
    raw = read_summary(run_dir).raw
    assert raw["schedule"] == config.method.phase_schedule(STEPS).describe()
    assert raw["groups"]["num_groups"] == 2 and raw["compression_during_ab"]


def test_the_run_report_reads_the_typed_summary(ab_run: tuple[Path, dict[str, Any]],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from abtune.training.run_tables import print_summary

    run_dir, _ = ab_run
    summary = read_summary(run_dir)
    print_summary(summary, run_dir)
    shown = capsys.readouterr().out
    assert f"{summary.final_top1:.4f}" in shown and "schedule (steps)" in shown and SUMMARY_FILE in shown


def test_the_run_reports_title_counts_one_rank_and_one_node_in_the_singular(
        ab_run: tuple[Path, dict[str, Any]]) -> None:
    from abtune.runfiles import RunSummary
    from abtune.training.run_tables import result_table

    four = read_summary(ab_run[0])
    assert result_table(four).title == "tiny: ab on 4 ranks / 2 nodes"
    one = RunSummary({**four.raw, "world_size": 1, "num_nodes": 1})  # `abtune train` without --nproc
    assert result_table(one).title == "tiny: ab on 1 rank / 1 node"


def test_every_objective_reads_its_figure_from_a_real_summary(ab_run: tuple[Path, dict[str, Any]]) -> None:
    from abtune.objectives import OBJECTIVES

    run_dir, _ = ab_run
    raw = json.loads((run_dir / SUMMARY_FILE).read_text())  # the file itself, read independently
    summary = read_summary(run_dir)
    read = {name: objective.read(summary) for name, objective in OBJECTIVES.items()}
    assert read == {"top1": raw["final"]["val_top1"],
                    "inter_node_bytes": raw["traffic"]["training_inter_node_bytes"],
                    "compression": raw["compression"]["trained_model_ratio"],
                    "train_seconds": raw["timing"]["train_seconds"],
                    "time_to_target": float("inf"),  # no train.target_top1: never reached, worst when minimized
                    "predicted_time_to_target": float("inf")}  # no train.cluster: no prediction, the worst too
