"""AB-training (Coquelin et al., arXiv 2405.01067, Algorithm 1), with and without groups.

`ab`: after a full-rank warmup, every eligible weight is factored W = A.B (unless the rank cap keeps
it full rank: its factors would not be smaller than it); the first half of the
groups trains A, the second half B (the other factor frozen), data-parallel inside the group and
nothing exchanged between groups; then the factors are averaged over all ranks, W is rebuilt and
full-rank DDP runs for the rebound steps. Repeat until the step budget is spent.
`ab-nogroups` (the paper's "No Group" variant): A frozen, B trained with DDP over all ranks.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from abtune.methods.ab import lowrank
from abtune.methods.ab.groups import ABGroups, Target, build_groups
from abtune.methods.ab.settings import AbConfig, ABSchedule
from abtune.methods.ab.sync import merged_state
from abtune.methods.base import Method, MethodContext, ParameterCounts
from abtune.methods.ddp.method import DataParallel, average_buffers_
from abtune.phases import Phase


class ABTraining(Method):
    name = "ab"

    def __init__(self, config: AbConfig, ctx: MethodContext) -> None:
        super().__init__(config, ctx)
        self.schedule = ABSchedule.from_config(config, ctx.total_steps)
        self.grouped = config.grouped
        self.refs: list[lowrank.WeightRef] = []
        self.groups: ABGroups | None = None
        self.ranks: dict[str, int] = {}
        self.in_ab = False
        self.decompositions: list[dict[str, Any]] = []
        self.spectra: dict[str, list[float]] = {}
        self._phase = Phase.WARMUP

    # --- set-up -------------------------------------------------------------------------
    def _setup(self) -> None:
        self.refs = lowrank.eligible_weights(self.model, self.config.keep_full_rank)
        if self.grouped:
            topology = self.meter.topology
            size = self.config.resolved_group_size(topology.world_size, topology.ranks_per_node, topology.num_nodes)
            self.groups = build_groups(self.meter, self.ctx.env.rank, size)
        self._wrap_full_rank()

    def _wrap_full_rank(self, keep_optimizer_state: bool = True) -> None:
        for param in self.model.parameters():
            param.requires_grad_(True)
        self.module = DataParallel(self.model, self.world, self.meter)
        self.rebuild_optimizer(list(self.model.parameters()), keep_state=keep_optimizer_state)

    def _wrap_low_rank(self) -> None:
        trains_a = self.groups is not None and self.groups.target is Target.A
        for ref in self.factored:
            a, b = lowrank.factors(self.model, ref)
            a.requires_grad_(trains_a)
            b.requires_grad_(not trains_a)
        group = self.groups.group if self.groups is not None else self.world
        self.module = DataParallel(self.model, group, self.meter)
        self.rebuild_optimizer([p for p in self.model.parameters() if p.requires_grad])

    # --- the phases ---------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        segment = self.schedule.segment_at(step)
        if self.in_ab and (segment.phase is not Phase.AB or step == segment.start):
            self._sync()
        if segment.phase is Phase.AB and not self.in_ab:
            self._decompose(step)
        self._phase = segment.phase
        self.meter.phase = segment.phase

    def _decompose(self, step: int) -> None:
        self.meter.phase = Phase.AB
        started = time.perf_counter()
        svds = {ref.key: lowrank.svd(getattr(ref.module(self.model), ref.attr)) for ref in self.refs}
        wanted = torch.tensor([lowrank.rank_for_cutoff(s, self.config.sigma_cutoff) for _, s, _ in svds.values()],
                              device=self.ctx.env.device)  # NCCL has no CPU backend
        self.meter.all_reduce(wanted, self.world, op=dist.ReduceOp.MAX)  # every rank must factor alike
        shapes = {ref.key: getattr(ref.module(self.model), ref.attr).shape for ref in self.refs}
        weights = {key: lowrank.decide(shapes[key], svds[key][1], rank, self.config.rank_cap)
                   for key, rank in zip(svds, wanted.tolist(), strict=True)}
        self._factor_all({key: w.rank for key, w in weights.items() if w.factored}, svds)
        seconds = time.perf_counter() - started
        self.spectra = {key: s.tolist() for key, (_, s, _) in svds.items()}
        counts = self.parameter_counts()
        self.decompositions.append(
            {"step": step, "svd_seconds": seconds, "params": counts.current, "trainable": counts.trainable,
             "compression": counts.compression, "trainable_compression": counts.dense / counts.trainable,
             "ranks": dict(self.ranks), "kept_full_rank": sorted(k for k, w in weights.items() if not w.factored),
             "weights": {key: w.as_dict() for key, w in weights.items()}}
        )
        self._tell_decomposition(step, weights, counts.compression)

    def _tell_decomposition(self, step: int, weights: dict[str, lowrank.WeightDecomposition],
                            compression: float) -> None:
        """One line at the first decomposition, and whenever whether anything is factored changes."""
        factored_before = bool(self.decompositions[-2]["ranks"]) if len(self.decompositions) > 1 else None
        if factored_before is None or factored_before != bool(self.ranks):
            self.ctx.note(describe_decomposition(step, weights, self.config.sigma_cutoff, compression))

    @property
    def factored(self) -> list[lowrank.WeightRef]:
        """The weights factored in the current (or last) AB phase: the eligible ones the rank cap let through."""
        return [ref for ref in self.refs if ref.key in self.ranks]

    def _factor_all(self, ranks: dict[str, int], svds: dict[str, lowrank.SVD] | None = None) -> None:
        self.ranks = ranks
        for ref in self.factored:
            lowrank.factor(self.model, ref, ranks[ref.key], svds[ref.key] if svds else None)
        self.in_ab = True
        self._wrap_low_rank()
        if svds is not None:  # a new decomposition (not a resume): its first step counts its FLOPs
            lowrank.count_product_flops(self.model, self._record_product_flops)

    def _record_product_flops(self, flops: dict[str, int]) -> None:
        self.decompositions[-1]["product_flops_per_sample"] = flops

    def _merged_state(self) -> dict[str, torch.Tensor]:
        if self.groups is None:
            average_buffers_(self.model, self.meter, self.world)  # the only thing ranks do not share
            return merged_state(self.model, self.factored, None, None, self.meter, self.world)
        return merged_state(self.model, self.factored, self.config.sync_mode, self.groups, self.meter, self.world)

    def _sync(self) -> None:
        self.meter.phase = Phase.SYNC
        state = self._merged_state()
        for ref in self.factored:
            lowrank.merge(self.model, ref)
        self.model.load_state_dict(state)
        self.in_ab = False
        # With groups, every parameter's optimizer moments diverged between groups (even those not
        # factored): start fresh on all ranks; the LR rebound that follows is made for this.
        self._wrap_full_rank(keep_optimizer_state=self.groups is None)

    def learning_rate(self, step: int, scheduled: float) -> float:
        return self.schedule.learning_rate(step, scheduled)

    @property
    def phase(self) -> str:
        return self._phase.value

    def eval_module(self) -> nn.Module:
        """Outside an AB phase the model itself; inside one a dense copy of the merged model, built for this
        evaluation and dropped with it (the caller holds the only reference), so no phase holds a dense
        model beside its own. Building it draws nothing from the global RNG: evaluating leaves the training's
        random stream (dropout) as it was."""
        self.meter.phase = Phase.EVAL
        if not self.in_ab:
            average_buffers_(self.model, self.meter, self.world)
            return self.model
        with torch.random.fork_rng(devices=[]):  # the model is built on the CPU, then moved
            dense = self.ctx.make_dense_model()
        dense.load_state_dict(self._merged_state())
        return dense

    def finish(self) -> None:
        if self.in_ab:
            self._sync()

    def predict_training_bytes(self, so_far: dict[str, float], steps_done: int) -> float | None:
        return predict_ab_training_bytes(self.schedule, so_far, steps_done)

    # --- compression --------------------------------------------------------------------
    def trained_model_counts(self) -> ParameterCounts:
        if not self.decompositions:
            return self.parameter_counts()
        last = self.decompositions[-1]  # the ranks do not change within an AB phase: this is its end too
        return ParameterCounts(self.dense_parameters, last["params"], last["trainable"])

    def compression_ratio(self) -> float:
        """The paper's compression: dense parameters per parameter of the model trained in the last AB phase."""
        return self.trained_model_counts().compression

    # --- checkpoints --------------------------------------------------------------------
    def compressed_model(self) -> bool:
        return bool(self.decompositions)

    def summary(self) -> dict[str, Any]:
        """The schedule in steps, the groups, and every decomposition with its ranks, compression and spectra."""
        details: dict[str, Any] = {"schedule": self.schedule.describe()}
        if self.groups is not None:
            details["groups"] = {"group_size": self.groups.group_size, "num_groups": self.groups.num_groups,
                                 "a_ranks": list(self.groups.a_ranks), "b_ranks": list(self.groups.b_ranks)}
        return {**details, "decompositions": self.decompositions,
                "compression_during_ab": [d["compression"] for d in self.decompositions],
                "svd_seconds": [d["svd_seconds"] for d in self.decompositions], "spectra": self.spectra}

    def state_dict(self) -> dict[str, Any]:
        return {"in_ab": self.in_ab, "ranks": dict(self.ranks), "decompositions": self.decompositions,
                "spectra": self.spectra, "held_bytes_by_phase": self.held_bytes_by_phase}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decompositions = list(state["decompositions"])
        self.spectra = dict(state["spectra"])
        self.held_bytes_by_phase = {**state.get("held_bytes_by_phase", {}), **self.held_bytes_by_phase}
        if state["in_ab"]:
            self._factor_all(dict(state["ranks"]))  # the saved factors are loaded into these shapes next

    def upgrade_checkpoint(self, saved: dict[str, Any]) -> dict[str, Any]:
        """Checkpoints of earlier versions named A and B `<module>.parametrizations.<attr>.original0/1`."""
        rename = lowrank.current_parameter_name
        optimizer = saved["optimizer"]
        return {**saved, "model": {rename(name): value for name, value in saved["model"].items()},
                "optimizer": {"state": {rename(name): value for name, value in optimizer["state"].items()},
                              "param_groups": [{**group, "params": [rename(n) for n in group["params"]]}
                                               for group in optimizer["param_groups"]]}}


def predict_ab_training_bytes(schedule: ABSchedule, so_far: dict[str, float], steps_done: int) -> float | None:
    """AB's training bytes after its last step: what was sent, plus each phase's remaining steps at the
    rate that phase has had so far, plus the remaining syncs at the cost of one sync so far.

    Full-rank steps (warmup and rebound) all cost the same. Once the first AB phase has been synced,
    the prediction is exact as long as later decompositions choose the ranks of the last one. Before
    that it is None: what AB saves is decided by the ranks of its first decomposition, and a guess (as
    if nothing were factored) overstates the final bytes enough that a pruner stops trials that would
    end on the front.
    """
    sent = sum(so_far.values())
    if steps_done >= schedule.total_steps:
        return sent
    syncs_done = schedule.syncs_done(steps_done)
    if syncs_done == 0:
        return None
    done, total = schedule.steps_by_phase(steps_done), schedule.steps_by_phase(schedule.total_steps)
    full_steps = done[Phase.WARMUP] + done[Phase.REBOUND]
    ab = so_far.get(Phase.AB, 0.0) / done[Phase.AB]  # a sync follows an AB phase: it has steps
    full = (so_far.get(Phase.WARMUP, 0.0) + so_far.get(Phase.REBOUND, 0.0)) / full_steps if full_steps else ab
    sync = so_far.get(Phase.SYNC, 0.0) / syncs_done
    rate = {Phase.WARMUP: full, Phase.AB: ab, Phase.REBOUND: full}
    remaining_steps = sum((total[p] - done[p]) * rate[p] for p in rate)
    return sent + remaining_steps + (schedule.syncs_done(schedule.total_steps) - syncs_done) * sync


def describe_decomposition(step: int, weights: dict[str, lowrank.WeightDecomposition], cutoff: float,
                           compression: float) -> str:
    """What a decomposition did, in one line; when it factored nothing, the cutoff that would factor something."""
    factored = {key: w for key, w in weights.items() if w.factored}
    if not weights:
        return f"step {step}: AB has no eligible weight to factor (every layer is kept full rank)"
    if factored:
        ranks = [w.rank for w in factored.values()]
        span = f"rank {ranks[0]}" if min(ranks) == max(ranks) else f"ranks {min(ranks)}-{max(ranks)}"
        return (f"step {step}: sigma_cutoff {cutoff:g} factored {len(factored)} of {len(weights)} weights "
                f"({span}); model compression {compression:.2f}:1")
    reachable = {key: w.factors_from_cutoff for key, w in weights.items() if w.factors_from_cutoff is not None}
    if not reachable:
        return (f"step {step}: sigma_cutoff {cutoff:g} factored none of {len(weights)} weights, and the rank cap "
                "lets none be factored at any cutoff: raise method.rank_cap or set it to null")
    key = min(reachable, key=lambda k: reachable[k])
    return (f"step {step}: sigma_cutoff {cutoff:g} factored none of {len(weights)} weights (the rank cap keeps "
            f"them full rank); from sigma_cutoff {reachable[key]:.3g} on, {key} would be factored")
