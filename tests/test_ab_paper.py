"""AB-training as the paper defines it (arXiv 2405.01067: Algorithm 1, equations 1 and 4, Table 2),
pinned by values: ECR, the rank cap, the sqrt(S) split, even groups, every sync mode, the no-groups
variant, the MAX agreement of ranks and the learning-rate rebound the trainer really applies.

The multi-rank checks run 4 real gloo processes as 2 simulated nodes (ranks 0-1 on node 0, 2-3 on
node 1), drive the method directly and make the ranks' weights differ by construction, so that the
averaged result can be checked against a hand computation.
"""

from __future__ import annotations

import gc
import json
import math
import multiprocessing
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from optuna.distributions import FloatDistribution
from torch import nn

from abtune.dist import DistEnv, discover_topology, init_distributed, shutdown
from abtune.errors import ConfigError
from abtune.launch.local import free_port
from abtune.methods.ab import lowrank
from abtune.methods.ab.method import ABTraining
from abtune.methods.ab.settings import AbConfig
from abtune.methods.base import MethodContext
from abtune.runfiles import RunSummary
from abtune.study.results import result_attrs
from abtune.study.space import build_distributions
from abtune.study.spec import load_study_spec
from abtune.training.summary import estimated_communication_reduction, traffic_summary
from tests.conftest import CliResult, run_cli, write_config
from tests.study_helpers import write_study

NPROC, RANKS_PER_NODE = 4, 2
FLOAT32 = 4
TOTAL_STEPS = 10  # warmup [0, 2), AB [2, 5), rebound [5, 7), AB [7, 10)
AB_START, AB_END = 2, 5
SCHEDULE = {"warmup_frac": 0.2, "ab_frac": 0.3, "rebound_frac": 0.5}


# --- equation 4 and Table 2 -------------------------------------------------------------------------


@pytest.mark.parametrize(("ratio", "ecr"), [(2.00, 37.5), (2.71, 47.32), (36.63, 72.95), (2.26, 41.81),
                                            (2.39, 43.62), (1.84, 34.24), (27.25, 72.25)])
def test_ecr_reproduces_table_2s_non_ab_rows(ratio: float, ecr: float) -> None:
    assert estimated_communication_reduction(ratio) == pytest.approx(ecr, abs=0.005)


def test_an_uncompressed_model_saves_nothing() -> None:
    assert estimated_communication_reduction(1.0) == 0.0


# --- equation 1: the split, and the rank cap ---------------------------------------------------------


def test_factors_split_the_singular_values_as_square_roots() -> None:
    torch.manual_seed(0)
    weight = torch.randn(7, 5)
    u, s, vh = torch.linalg.svd(weight, full_matrices=False)
    a, b = lowrank.factorize(weight, 3)
    assert torch.allclose(a.norm(dim=0), s[:3].sqrt(), atol=1e-5)  # A = U sqrt(S): column norms sqrt(sigma)
    assert torch.allclose(b.norm(dim=1), s[:3].sqrt(), atol=1e-5)  # B = sqrt(S) V^T: row norms sqrt(sigma)
    assert torch.allclose(a.T @ a, torch.diag(s[:3]), atol=1e-5)
    assert torch.allclose(a @ b, u[:, :3] @ torch.diag(s[:3]) @ vh[:3], atol=1e-5)


@pytest.mark.parametrize(
    ("shape", "rank", "cap", "fits"),
    [
        ((8, 8), 3, 1.0, True),  # 3 * 16 = 48 < 64
        ((8, 8), 4, 1.0, False),  # 4 * 16 = 64: the factors are as large as W
        ((8, 8), 3, 0.5, False),  # 48 > 0.5 * 64
        ((8, 8), 2, 0.5, True),  # 32 <= 32
        ((8, 8), 8, None, True),  # no cap: factor whatever the rank
        ((16, 2, 3, 3), 4, 1.0, True),  # a conv weight is a 16 x 18 matrix: 4 * 34 = 136 < 288
    ],
)
def test_rank_cap_factors_only_weights_whose_factors_are_smaller(
    shape: tuple[int, ...], rank: int, cap: float | None, fits: bool
) -> None:
    assert lowrank.factors_fit(torch.Size(shape), rank, cap) is fits


@pytest.mark.parametrize(
    ("shape", "cap", "max_rank"),
    [
        ((8, 8), 1.0, 3),  # 3 * 16 = 48 < 64 <= 4 * 16
        ((8, 8), 0.5, 2),  # 2 * 16 = 32 <= 0.5 * 64 < 3 * 16
        ((8, 8), None, 8),  # the paper: every rank is factored
        ((384, 128), 1.0, 95),  # the quickstart's attention input projection: 95 * 512 < 49152 = 96 * 512
        ((16, 2, 3, 3), 1.0, 8),  # 16 x 18: 8 * 34 = 272 < 288 <= 9 * 34
    ],
)
def test_the_largest_factored_rank_is_the_caps_bound(shape: tuple[int, ...], cap: float | None, max_rank: int) -> None:
    size = torch.Size(shape)
    assert lowrank.max_factored_rank(size, cap) == max_rank
    assert lowrank.factors_fit(size, max_rank, cap) and not lowrank.factors_fit(size, max_rank + 1, cap)


def test_a_weight_is_factored_from_the_cutoff_sigma_r_max_over_sigma_1() -> None:
    sigma = torch.tensor([4.0, 2.0, 1.0, 0.5, 0.25])
    # r_max 2: the cutoff must leave at most 2 values above it, so from sigma[2] / sigma[0] = 0.25 on
    assert lowrank.factoring_cutoff(sigma, 2) == 0.25
    assert lowrank.rank_for_cutoff(sigma, 0.25) == 2 and lowrank.rank_for_cutoff(sigma, 0.2499) == 3
    assert lowrank.factoring_cutoff(sigma, 5) == 0.0  # any cutoff
    assert lowrank.factoring_cutoff(sigma, 0) is None  # no cutoff
    decision = lowrank.decide(torch.Size((5, 40)), sigma, rank=3, cap=1.0)  # 5 x 40: r_max 4 (4 * 45 < 200)
    assert decision.as_dict() == {"rank": 3, "max_rank": 4, "factored": True, "factors_from_cutoff": 0.0625}


# --- groups ---------------------------------------------------------------------------------------


def test_groups_split_the_ranks_in_halves() -> None:
    assert AbConfig().resolved_group_size(8, 2, 4) == 2  # 4 nodes: 2 A groups, 2 B groups
    assert AbConfig(group_size=1).resolved_group_size(6, 6, 1) == 1  # 6 groups of one rank: 3 A, 3 B
    with pytest.raises(ConfigError, match="makes 3 groups of the 6 ranks .* choose one of 1, 3"):
        AbConfig().resolved_group_size(6, 2, 3)  # one group per node on 3 nodes: 1 A group, 2 B groups


def test_an_odd_number_of_groups_is_refused_in_one_line(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    config = write_config(tmp_path / "run.yaml", method={"name": "ab"})
    result = abtune_main("train", str(config), "--nproc", "6", "--ranks-per-node", "2", "--run-dir",
                         str(tmp_path / "run"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "method.group_size: 2 makes 3 groups of the 6 ranks" in result.stderr
    assert not (tmp_path / "run").exists()


# --- the rank cap inside a decomposition (one real rank) -----------------------------------------------


def _mlp() -> nn.Module:
    """Linear 6->8 and 8->8 are factored; the last Linear is the head and stays full rank."""
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


def _ab(env: DistEnv, notes: list[str] | None = None, **config: Any) -> ABTraining:
    _, meter = discover_topology(env)
    ctx = MethodContext(env, meter, TOTAL_STEPS, make_optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                        make_dense_model=_mlp, note=(notes.append if notes is not None else lambda _: None))
    return ABTraining(AbConfig(**{**SCHEDULE, **config}), ctx)


def _set_singular_values(linear: nn.Linear, values: list[float]) -> None:
    with torch.no_grad():
        linear.weight.zero_()
        for i, value in enumerate(values):
            linear.weight[i, i] = value


def test_decomposition_keeps_a_weight_full_rank_when_its_factors_would_not_be_smaller(
    one_rank_world: DistEnv,
) -> None:
    torch.manual_seed(0)
    model = _mlp()
    _set_singular_values(model[0], [1.0] * 6)  # 8 x 6 at rank 6: 6 * 14 = 84 >= 48 entries
    _set_singular_values(model[2], [1.0, 1.0, 1.0])  # 8 x 8 at rank 3: 3 * 16 = 48 < 64 entries
    method = _ab(one_rank_world, name="ab-nogroups", sigma_cutoff=0.5)
    method.setup(model, broadcast_initial=True)
    method.begin_step(0)
    method.begin_step(AB_START)
    assert method.ranks == {"2.weight": 3}
    assert not lowrank.is_factored(model, lowrank.WeightRef("0", "weight"))
    assert lowrank.is_factored(model, lowrank.WeightRef("2", "weight"))
    decomposition = method.decompositions[-1]
    assert decomposition["kept_full_rank"] == ["0.weight"]
    dense = sum(p.numel() for p in _mlp().parameters())
    assert decomposition["params"] == dense - 64 + 48
    assert method.trained_model_counts().compression == pytest.approx(dense / (dense - 16))
    assert method.compression_ratio() == method.trained_model_counts().compression
    # 8 x 6 has r_max 3 (3 * 14 = 42 < 48 <= 4 * 14) and a flat spectrum of six ones: only a cutoff of
    # 1.0 (sigma[3] / sigma[0]) would factor it; 8 x 8 has r_max 3 and three ones then zeros: any cutoff
    assert decomposition["weights"] == {
        "0.weight": {"rank": 6, "max_rank": 3, "factored": False, "factors_from_cutoff": 1.0},
        "2.weight": {"rank": 3, "max_rank": 3, "factored": True, "factors_from_cutoff": 0.0},
    }


def test_a_decomposition_that_factors_nothing_says_so_with_the_cutoff_that_would(one_rank_world: DistEnv) -> None:
    model = _mlp()
    _set_singular_values(model[0], [1.0, 0.8, 0.6, 0.4, 0.2, 0.1])  # r_max 3: from 0.4 / 1.0 on
    _set_singular_values(model[2], [1.0, 0.9, 0.8, 0.7, 0.5, 0.45, 0.3, 0.2])  # r_max 3: from 0.7 on
    notes: list[str] = []
    method = _ab(one_rank_world, notes, name="ab-nogroups", sigma_cutoff=0.1)
    method.setup(model, broadcast_initial=True)
    method.begin_step(0)
    method.begin_step(AB_START)
    assert method.ranks == {}
    assert notes == ["step 2: sigma_cutoff 0.1 factored none of 2 weights (the rank cap keeps them full rank); "
                     "from sigma_cutoff 0.4 on, 0.weight would be factored"]
    method.begin_step(AB_END)
    method.begin_step(7)  # the next AB phase factors nothing again: no second line
    assert len(notes) == 1


def test_a_decomposition_that_factors_tells_how_much(one_rank_world: DistEnv) -> None:
    model = _mlp()
    _set_singular_values(model[0], [1.0, 0.8, 0.05, 0.04, 0.02, 0.01])
    _set_singular_values(model[2], [1.0, 0.9, 0.8, 0.07, 0.05, 0.04, 0.03, 0.02])
    notes: list[str] = []
    method = _ab(one_rank_world, notes, name="ab-nogroups", sigma_cutoff=0.1)
    method.setup(model, broadcast_initial=True)
    method.begin_step(0)
    method.begin_step(AB_START)
    assert method.ranks == {"0.weight": 2, "2.weight": 3}
    compression = method.trained_model_counts().compression
    assert notes == [f"step 2: sigma_cutoff 0.1 factored 2 of 2 weights (ranks 2-3); model compression {compression:.2f}:1"]


def test_an_evaluation_inside_an_ab_phase_keeps_no_dense_copy_and_draws_no_random_numbers(
    one_rank_world: DistEnv,
) -> None:
    """The dense model an AB phase evaluates is the merged one, built for the evaluation and gone with it;
    building it leaves the global RNG (dropout masks) where training left it."""
    model = _mlp()
    _set_singular_values(model[0], [1.0, 0.8, 0.05, 0.04, 0.02, 0.01])
    _set_singular_values(model[2], [1.0, 0.9, 0.8, 0.07, 0.05, 0.04, 0.03, 0.02])
    method = _ab(one_rank_world, name="ab-nogroups", sigma_cutoff=0.1)
    method.setup(model, broadcast_initial=True)
    method.begin_step(0)
    method.begin_step(AB_START)
    assert method.in_ab and method.ranks == {"0.weight": 2, "2.weight": 3}
    merged = {ref.key: torch.matmul(*lowrank.factors(model, ref)).detach().clone() for ref in method.factored}
    for _ in range(2):  # a second evaluation builds its own copy
        random_state = torch.random.get_rng_state()
        dense = method.eval_module()
        assert torch.equal(torch.random.get_rng_state(), random_state)
        assert all(torch.allclose(dense.state_dict()[key], product) for key, product in merged.items())
        evaluated = weakref.ref(dense)
        del dense
        gc.collect()
        assert evaluated() is None  # nothing in the method holds it after the evaluation


# --- groups ---------------------------------------------------------------------------------------


# --- four real ranks, driven directly -----------------------------------------------------------------


def _rank_main(rank: int, port: int, out: str, scenario: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(NPROC), LOCAL_RANK=str(rank % RANKS_PER_NODE),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ABTUNE_NODE_RANK=str(rank // RANKS_PER_NODE))
    torch.set_num_threads(1)
    env = init_distributed(timeout_s=120)
    try:
        torch.save(SCENARIOS[scenario](env), Path(out) / f"rank_{rank}.pt")
    finally:
        shutdown()


def _run_ranks(tmp_path: Path, scenario: str) -> list[dict[str, Any]]:
    # A fork server that has imported this module (so torch and abtune) once starts every test's ranks:
    # each fresh interpreter of mp.spawn would import torch again, 4 ranks x 3 tests on 2 cores.
    multiprocessing.set_forkserver_preload([__name__])
    mp.start_processes(_rank_main, args=(free_port(), str(tmp_path), scenario), nprocs=NPROC, join=True,
                       start_method="forkserver")
    return [torch.load(tmp_path / f"rank_{r}.pt", weights_only=False) for r in range(NPROC)]


def _sync_payload(method: ABTraining) -> int:
    return sum(row["payload_bytes"] for row in method.meter.rows() if row["phase"] == "sync")


def _sync_modes(env: DistEnv) -> dict[str, Any]:
    """Each rank scales the (common) factors and every other parameter by rank + 1, then syncs."""
    results = {}
    for mode in ("with-stale", "only-learned", "full"):
        torch.manual_seed(0)
        method = _ab(env, sync_mode=mode, sigma_cutoff=0.01, rank_cap=None)
        model = _mlp()
        method.setup(model, broadcast_initial=True)
        method.begin_step(0)
        method.begin_step(AB_START)
        products, others, factor_numel, factor_ids = {}, {}, 0, set()
        with torch.no_grad():
            for ref in method.factored:
                a, b = lowrank.factors(model, ref)
                products[ref.key] = (a @ b).clone()
                factor_numel += a.numel() + b.numel()
                factor_ids |= {id(a), id(b)}
                a.mul_(env.rank + 1)
                b.mul_(env.rank + 1)
            for name, param in model.named_parameters():
                if id(param) not in factor_ids:
                    others[name] = param.detach().clone()
                    param.mul_(env.rank + 1)
        method.begin_step(AB_END)  # the end of the AB phase: sync
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        numel = {"factors": factor_numel, "dense": sum(p.numel() for p in products.values()),
                 "others": sum(p.numel() for p in others.values())}
        results[mode] = {"state": state, "products": products, "others": others, "numel": numel,
                         "sync_payload": _sync_payload(method), "factored": list(products),
                         "a_ranks": method.groups.a_ranks, "b_ranks": method.groups.b_ranks}
    return results


# Hand computation: rank r holds (r+1)A0 and (r+1)B0 for every factored weight W0 = A0 B0, and
# (r+1)p for every other parameter p. A ranks are 0 and 1, B ranks 2 and 3.
#   with-stale:   A = mean(1,2,3,4) A0 = 2.5 A0, B = 2.5 B0          -> W = 6.25 W0
#   only-learned: A = mean(1,2) A0 = 1.5 A0, B = mean(3,4) B0 = 3.5 B0 -> W = 5.25 W0
#   full:         W = mean(1, 4, 9, 16) W0                             -> W = 7.5 W0
# Every other parameter: mean(1,2,3,4) p = 2.5 p in every mode.
EXPECTED_SCALE = {"with-stale": 6.25, "only-learned": 5.25, "full": 7.5}
OTHERS_SCALE = 2.5


@pytest.mark.slow
def test_every_sync_mode_averages_as_computed_by_hand(tmp_path: Path) -> None:
    per_rank = _run_ranks(tmp_path, "sync_modes")
    for mode, scale in EXPECTED_SCALE.items():
        first = per_rank[0][mode]
        assert (first["a_ranks"], first["b_ranks"]) == ((0, 1), (2, 3))
        assert first["factored"] == ["0.weight", "2.weight"]
        for key, product in first["products"].items():
            assert torch.allclose(first["state"][key], scale * product, rtol=1e-5, atol=1e-6), (mode, key)
        for name, value in first["others"].items():
            assert torch.allclose(first["state"][name], OTHERS_SCALE * value, rtol=1e-5, atol=1e-6), (mode, name)
        for other in per_rank[1:]:  # every rank ends with the same model, bit for bit
            for key, value in first["state"].items():
                assert torch.equal(other[mode]["state"][key], value), (mode, key)
    numel = per_rank[0]["with-stale"]["numel"]
    # with-stale and only-learned send A, B and the rest (only-learned: zeros for the factor not learned);
    # full sends every rebuilt W and the rest.
    assert per_rank[0]["with-stale"]["sync_payload"] == (numel["factors"] + numel["others"]) * FLOAT32
    assert per_rank[0]["only-learned"]["sync_payload"] == (numel["factors"] + numel["others"]) * FLOAT32
    assert per_rank[0]["full"]["sync_payload"] == (numel["dense"] + numel["others"]) * FLOAT32


def _no_groups(env: DistEnv) -> dict[str, Any]:
    torch.manual_seed(0)
    method = _ab(env, name="ab-nogroups", sigma_cutoff=0.01, rank_cap=None)
    model = _mlp()
    method.setup(model, broadcast_initial=True)
    method.begin_step(0)
    method.begin_step(AB_START)
    factors = {ref.key: lowrank.factors(model, ref) for ref in method.factored}
    before = {k: (a.detach().clone(), b.detach().clone()) for k, (a, b) in factors.items()}
    torch.manual_seed(100 + env.rank)  # every rank sees different data
    images, labels = torch.randn(4, 6), torch.randint(0, 3, (4,))
    nn.functional.cross_entropy(method.module(images), labels).backward()
    grads = {k: b.grad.detach().clone() for k, (_, b) in factors.items()}
    method.optimizer.step()
    after = {k: (a.detach().clone(), b.detach().clone()) for k, (a, b) in factors.items()}
    method.begin_step(AB_END)
    products = {k: a @ b for k, (a, b) in after.items()}
    return {"requires_grad": {k: (a.requires_grad, b.requires_grad) for k, (a, b) in factors.items()},
            "group": (method.module.group.name, method.module.group.ranks), "before": before, "after": after,
            "grads": grads, "sync_rows": [r for r in method.meter.rows() if r["phase"] == "sync"],
            "products": products, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


@pytest.mark.slow
def test_no_groups_freezes_a_trains_b_over_all_ranks_and_exchanges_nothing_at_sync(tmp_path: Path) -> None:
    per_rank = _run_ranks(tmp_path, "no_groups")
    for rank, result in enumerate(per_rank):
        assert result["group"] == ("world", (0, 1, 2, 3))
        assert result["requires_grad"] == {"0.weight": (False, True), "2.weight": (False, True)}
        assert result["sync_rows"] == []  # the ranks never diverged: nothing to exchange
        for key, (a_before, _) in result["before"].items():
            assert torch.equal(result["after"][key][0], a_before), "A is frozen"
            assert not torch.equal(result["after"][key][1], result["before"][key][1]), "B trained"
            assert torch.equal(result["state"][key], result["products"][key]), "W = A B, locally"
            # B's gradient is the mean over all four ranks' different batches: every rank holds the same.
            assert torch.equal(result["grads"][key], per_rank[0]["grads"][key]), (rank, key)
            assert torch.equal(result["after"][key][1], per_rank[0]["after"][key][1]), (rank, key)


def _rank_agreement(env: DistEnv) -> dict[str, Any]:
    """Rank r's weights have r + 2 singular values above the cutoff; every rank must factor at the MAX."""
    torch.manual_seed(0)
    method = _ab(env, sigma_cutoff=0.5, rank_cap=None)
    model = _mlp()
    _set_singular_values(model[0], [1.0] * (env.rank + 2) + [0.01] * (4 - env.rank))
    _set_singular_values(model[2], [1.0] * (env.rank + 2) + [0.01] * (6 - env.rank))
    method.setup(model, broadcast_initial=False)  # keep the ranks' different weights
    method.begin_step(0)
    method.begin_step(AB_START)
    shapes = {ref.key: tuple(t.shape for t in lowrank.factors(model, ref)) for ref in method.factored}
    return {"ranks": dict(method.ranks), "shapes": shapes}


@pytest.mark.slow
def test_ranks_that_disagree_all_factor_at_the_largest_rank(tmp_path: Path) -> None:
    per_rank = _run_ranks(tmp_path, "rank_agreement")
    largest = NPROC - 1 + 2
    for result in per_rank:
        assert result["ranks"] == {"0.weight": largest, "2.weight": largest}
        assert result["shapes"] == {"0.weight": ((8, largest), (largest, 6)), "2.weight": ((8, largest), (largest, 8))}


SCENARIOS: dict[str, Callable[[DistEnv], dict[str, Any]]] = {
    "sync_modes": _sync_modes, "no_groups": _no_groups, "rank_agreement": _rank_agreement,
}


# --- the learning-rate rebound, as the trainer applies it -------------------------------------------


def _cosine(step: int, base: float, warmup: int, total: int, floor_frac: float) -> float:
    if step < warmup:
        return base * (step + 1) / (warmup + 1)
    progress = (step - warmup) / (total - warmup)
    return floor_frac * base + (base - floor_frac * base) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.slow
def test_trainer_steps_with_the_rebound_from_the_floor_to_the_schedule(tmp_path: Path) -> None:
    steps, base, floor = 20, 0.003, 1e-5
    config = write_config(
        tmp_path / "run.yaml", train={"steps": steps, "log_every": 1, "eval_every": 1000},
        optimizer={"name": "adamw", "lr": base}, schedule={"name": "cosine", "warmup_frac": 0.1, "min_lr_frac": 0.0},
        method={"name": "ab", "warmup_frac": 0.25, "ab_frac": 0.25, "rebound_frac": 0.5, "lr_rebound_frac": 0.4},
    )
    run_dir = tmp_path / "run"
    run_cli("train", str(config), "--nproc", "2", "--ranks-per-node", "1", "--run-dir", str(run_dir), "--no-tracking")
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    stepped = {r["step"] - 1: r["lr"] for r in logged if r["kind"] == "log"}  # the LR the optimizer stepped with
    # warmup [0, 5), AB [5, 10), rebound [10, 13), AB [13, 18), rebound [18, 20): the shape changes at
    # 5, 10, 13 and 18, and the LR rebound lasts round(0.4 * 5) = 2 steps: floor, halfway, schedule.
    changes, rebound = (5, 10, 13, 18), 2
    expected = {}
    for step in range(steps):
        scheduled = _cosine(step, base, warmup=2, total=steps, floor_frac=0.0)
        since = min((step - c for c in changes if c <= step), default=rebound)
        expected[step] = scheduled if since >= rebound else floor + (scheduled - floor) * since / rebound
    assert stepped == pytest.approx(expected, rel=1e-9)
    assert stepped[5] == stepped[10] == stepped[13] == stepped[18] == pytest.approx(floor)


# --- study files ----------------------------------------------------------------------------------------


def test_rank_cap_is_searchable(tmp_path: Path) -> None:
    spec_path = write_study(tmp_path / "s.yaml", space={"method.rank_cap": {"low": 0.25, "high": 1.0},
                                                        "method.lr_rebound_floor": {"low": 1e-6, "high": 1e-4, "log": True}})
    distributions = build_distributions(load_study_spec(spec_path), "s.yaml")
    assert distributions["method.rank_cap"] == FloatDistribution(0.25, 1.0)
    assert distributions["method.lr_rebound_floor"] == FloatDistribution(1e-6, 1e-4, log=True)


def test_the_paper_study_initializes_orthogonally_as_the_paper() -> None:
    spec = load_study_spec(Path(__file__).parent.parent / "studies" / "minivit_cifar100.yaml")
    assert spec.base["model"]["init"] == "orthogonal"


# --- traffic with one meaning each ----------------------------------------------------------------------


def _row(phase: str, locality: str, wire: float) -> dict[str, Any]:
    return {"phase": phase, "group": "world", "locality": locality, "op": "all_reduce", "calls": 1,
            "payload_bytes": int(wire), "wire_bytes": wire,
            "inter_node_bytes": wire if locality == "inter" else 0.0}  # 2 ranks on 2 nodes: every hop leaves


def test_training_traffic_leaves_out_evaluation_setup_and_checkpoints() -> None:
    rank = [_row("warmup", "inter", 300.0), _row("ab", "intra", 200.0), _row("sync", "inter", 100.0),
            _row("eval", "inter", 50.0), _row("setup", "inter", 10.0), _row("checkpoint", "inter", 1.0)]
    traffic = traffic_summary([rank, rank], steps=4, seconds=2.0, node_of_rank=(0, 1), ddp_step_bytes=200.0)
    assert traffic["training_bytes"] == 600.0 and traffic["training_inter_node_bytes"] == 400.0
    assert traffic["non_training_inter_node_bytes"] == {"checkpoint": 1.0, "eval": 50.0, "setup": 10.0}
    assert traffic["inter_node_bytes"]["mean"] == 461.0  # every phase
    assert traffic["training_inter_node_gb_per_s"] == pytest.approx(400.0 / 1e9 / 2.0)  # training bytes / training s
    assert traffic["inter_node_reduction_vs_ddp"] == pytest.approx(800.0 / 400.0)


def test_a_trial_records_training_inter_node_bytes_the_trained_models_compression_and_ecr() -> None:
    summary = {"final": {"val_top1": 0.9}, "best_top1": 0.9, "steps_done": 10, "stopped_early": None,
               "timing": {"train_seconds": 1.0},
               "traffic": {"training_inter_node_bytes": 400.0, "inter_node_bytes": {"mean": 461.0, "max": 461.0}},
               "compression": {"trained_model_ratio": 2.0, "ecr_percent": 37.5, "dense_over_final_params": 1.0}}
    attrs = result_attrs(RunSummary(summary), wall_seconds=2.0)
    assert (attrs["inter_node_bytes"], attrs["compression"], attrs["ecr"]) == (400.0, 2.0, 37.5)
