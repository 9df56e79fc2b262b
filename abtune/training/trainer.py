"""The training loop, readable top to bottom: build, maybe resume, step, evaluate, checkpoint, report.

The trainer knows nothing of low rank, groups or compression: the method does. Each rank runs
one Trainer; rank 0 prints and writes the summary.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from abtune.comm import GROUP_MEAN_INTER, sum_rows
from abtune.config import RunConfig
from abtune.data import build_datasets, build_loaders, steps_per_epoch
from abtune.dist import DistEnv, discover_topology, node_name
from abtune.errors import TrainingFailed
from abtune.methods import build_method
from abtune.methods.base import MethodContext
from abtune.models import build_model
from abtune.phases import TRAINING_PHASES, Phase
from abtune.runfiles import write_summary
from abtune.timing import check_fits, load_cluster
from abtune.training.checkpoint import (
    Checkpointer,
    load_optimizer_state_by_name,
    optimizer_state_by_name,
    rng_state,
    set_rng_state,
)
from abtune.training.evaluate import Evaluation, evaluate
from abtune.training.hang import HangDetector, RankId
from abtune.training.hooks import MetricsFile, TrainingHook, build_hooks, configured_hook_specs
from abtune.training.lr import scheduled_lr
from abtune.training.precision import Precision
from abtune.training.progress import ProgressReporter
from abtune.training.state import TrainState
from abtune.training.summary import add_cluster_time, build_summary, gather_rows, intra_node_bytes


def _make_optimizer(config: RunConfig):  # noqa: ANN202 - returns a factory
    opt = config.optimizer

    def make(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        if opt.name == "sgd":
            return torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
        return torch.optim.AdamW(params, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay)

    return make


class Trainer:
    def __init__(self, config: RunConfig, run_dir: Path, env: DistEnv) -> None:
        self.config = config
        self.run_dir = run_dir
        self.env = env
        self.state = TrainState()
        self.began = time.perf_counter()  # evaluations say how long this process has trained, set-up included
        torch.manual_seed(config.seed)
        self.topology, self.meter = discover_topology(env)
        self.world = self.meter.world()
        # the cluster whose time the summary predicts: found now, not when the summary is written
        self.cluster = load_cluster(config.train.cluster) if config.train.cluster is not None else None
        if self.cluster is not None:
            check_fits(self.topology.num_nodes, self.topology.ranks_per_node, self.cluster)
        self.hang = HangDetector(config.train.hang, RankId(env.rank, env.node_rank, node_name()),
                                 lambda: self.meter.waiting_in, lambda: self.meter.last_issued)
        train_set, val_set, self.data_info = build_datasets(config.data, config.seed)
        self.train_loader, self.val_loader, self.sampler = build_loaders(
            train_set, val_set, config.train.local_batch_size, env.rank, env.world_size, config.seed,
            config.data.num_workers,
        )
        self.steps_per_epoch = steps_per_epoch(len(train_set), config.train.local_batch_size, env.world_size)
        self.eval_every = config.train.eval_every or self.steps_per_epoch
        self.precision = Precision(config.train.precision, env.device, config.train.loss_scale)
        self.progress = ProgressReporter(env.is_main, config.train.steps, f"train {config.method.name}")
        self.method = build_method(
            config.method,
            MethodContext(env, self.meter, config.train.steps, _make_optimizer(config), self._new_model,
                          note=self.progress.note),
        )
        self.checkpointer = Checkpointer(run_dir, env.rank, config.train.keep_checkpoints, self.meter, self.world,
                                         (self.topology.num_nodes, self.topology.ranks_per_node))
        self.hook_specs = configured_hook_specs(run_dir)  # every rank reads them: stopping is collective
        self.hooks_may_stop = any(spec.get("may_stop", True) for spec in self.hook_specs)
        self.hooks: list[TrainingHook] = []
        self._window = _LogWindow()

    def _new_model(self) -> nn.Module:
        return build_model(self.config.model, self.data_info).to(self.env.device)

    # --- the loop -------------------------------------------------------------------------
    def train(self, resume: bool = False) -> dict[str, Any] | None:
        checkpoint = self.checkpointer.latest() if resume else None
        self.method.setup(self._new_model(), broadcast_initial=checkpoint is None)
        if checkpoint is not None:
            self._load(checkpoint)
        self._open_hooks(resumed_at=self.state.step if checkpoint is not None else None)
        try:
            self._loop()
            self.hang.ending(self.state.step, self.method.phase)
            self.method.finish()
            if self.state.stopped_early is None:
                self._evaluate()
            self._save()
            return self._report()
        finally:
            for hook in self.hooks:
                hook.close()

    def _loop(self) -> None:
        batches = self._batches()
        with self.progress:
            while self.state.step < self.config.train.steps and self.state.stopped_early is None:
                step = self.state.step
                started = time.perf_counter()
                with self.hang.doing("step", step, self.method.phase):
                    self.method.begin_step(step)
                    loss = self._train_step(step, *next(batches))
                    self.method.end_step(step)
                self.state.step += 1
                seconds = time.perf_counter() - started
                self.state.train_seconds += seconds
                self._time_phase(step, seconds)
                self.progress.step(self.state.step, loss, self.method.phase)
                self._log(loss, seconds)
                if self.state.step % self.eval_every == 0 and self.state.step < self.config.train.steps:
                    self._evaluate()
                if self._checkpoint_due():
                    self._save()

    def _time_phase(self, step: int, seconds: float) -> None:
        phase = self.method.phase
        if not self.state.phase_starts or self.state.phase_starts[-1][0] != phase:
            self.state.phase_starts.append((phase, step))
        tally = self.state.seconds_by_phase.setdefault(phase, [0, 0.0])
        tally[0], tally[1] = tally[0] + 1, tally[1] + seconds

    def _train_step(self, step: int, images: torch.Tensor, labels: torch.Tensor) -> float:
        images, labels = images.to(self.env.device), labels.to(self.env.device)
        with self.precision.autocast():
            loss = F.cross_entropy(self.method.module(images), labels)
        if not torch.isfinite(loss):
            raise TrainingFailed(
                f"the loss became {loss.item()} at step {step} (phase {self.method.phase}, rank {self.env.rank}); "
                "lower optimizer.lr or set train.grad_clip"
            )
        self.precision.backward(loss)
        if self.config.train.grad_clip is not None:
            self.precision.unscale_(self.method.optimizer)
            torch.nn.utils.clip_grad_norm_(self.method.model.parameters(), self.config.train.grad_clip)
        scheduled = scheduled_lr(self.config.schedule, self.config.optimizer.lr, step, self.config.train.steps)
        for group in self.method.optimizer.param_groups:
            group["lr"] = self.method.learning_rate(step, scheduled)
        if not self.precision.step(self.method.optimizer):
            self.state.skipped_steps += 1
        self.method.optimizer.zero_grad(set_to_none=True)
        self._window.lr = self.method.optimizer.param_groups[0]["lr"]  # what the optimizer stepped with
        return loss.item()

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless batches; remembers the position in the epoch so a checkpoint can resume there."""
        while True:
            self.sampler.set_position(self.state.epoch, self.state.batch_in_epoch * self.config.train.local_batch_size)
            for images, labels in self.train_loader:
                self.state.batch_in_epoch += 1
                yield images, labels
            self.state.epoch += 1
            self.state.batch_in_epoch = 0

    def _evaluate(self) -> Evaluation:
        with self.hang.doing("evaluation", self.state.step, self.method.phase):
            return self._evaluate_now()

    def _evaluate_now(self) -> Evaluation:
        module = self.method.eval_module()  # outside autocast: merging AB's factors stays fp32
        with self.precision.autocast():
            result = evaluate(module, self.val_loader, self.env.device, self.meter, self.world)
        counts = self.method.parameter_counts()
        rows = self.meter.rows()
        inter = {p: sum_rows(rows, GROUP_MEAN_INTER, phase=p) for p in TRAINING_PHASES}
        row = {
            "step": self.state.step,
            "total_steps": self.config.train.steps,
            "epoch": self.state.step / self.steps_per_epoch,
            "phase": self.method.phase,
            "loss": self.progress.mean_loss(),
            **{f"val_{k}": v for k, v in asdict(result).items()},
            "model_compression": self.method.trained_model_counts().compression,
            "dense_over_current": counts.compression,
            "trainable_params": counts.trainable,
            "train_seconds": self.state.train_seconds,
            "elapsed_seconds": time.perf_counter() - self.began,
            "training_inter_node_bytes": sum(inter.values()),
            "predicted_training_inter_node_bytes": self.method.predict_training_bytes(inter, self.state.step),
            "inter_node_bytes": self.meter.total(GROUP_MEAN_INTER),
            "intra_node_bytes": intra_node_bytes(self.meter, GROUP_MEAN_INTER),
        }
        self.state.history.append(row)
        self.progress.evaluation(row)
        self._ask_hooks_to_continue(row)
        return result

    # --- hooks (rank 0) ---------------------------------------------------------------------
    def _open_hooks(self, resumed_at: int | None) -> None:
        if self.env.is_main:
            self.hooks = [MetricsFile(self.run_dir, resumed_at), *build_hooks(self.run_dir, self.hook_specs)]

    def _log(self, loss: float, seconds: float) -> None:
        window = self._window
        window.add(loss, seconds)
        if self.state.step % self.config.train.log_every and self.state.step != self.config.train.steps:
            return
        record = {
            "step": self.state.step, "phase": self.method.phase, **window.flush(),
            "skipped_steps": self.state.skipped_steps,
            "total_bytes": self.meter.total(),
            "inter_node_bytes": self.meter.total(GROUP_MEAN_INTER),
            "intra_node_bytes": intra_node_bytes(self.meter, GROUP_MEAN_INTER),
            **self._bytes_by_phase(),
        }
        for hook in self.hooks:
            hook.on_log(record)

    def _bytes_by_phase(self) -> dict[str, dict[str, float]]:
        """Rank 0's cumulative wire bytes per phase, all and its groups' mean sent to other nodes (for trackers'
        per-phase curves)."""
        rows = self.meter.rows()
        phases = sorted({row["phase"] for row in rows})
        return {"phase_bytes": {p: sum_rows(rows, phase=p) for p in phases},
                "phase_inter_node_bytes": {p: sum_rows(rows, GROUP_MEAN_INTER, phase=p) for p in phases}}

    def _ask_hooks_to_continue(self, row: dict[str, Any]) -> None:
        """Rank 0's hooks may stop the run (pruning); the decision is broadcast so all ranks stop together."""
        reasons = [reason for hook in self.hooks if (reason := hook.on_evaluation(row))]
        if not self.hooks_may_stop or self.state.step >= self.config.train.steps:
            return  # the final evaluation ends the run anyway
        decision = torch.tensor([1 if reasons else 0], dtype=torch.uint8, device=self.env.device)
        self.meter.phase = Phase.CONTROL
        self.meter.broadcast(decision, 0, self.world)
        if int(decision.item()):
            self.state.stopped_early = reasons[0] if reasons else "stopped by rank 0"
            self.progress.note(f"stopping early at step {self.state.step}: {self.state.stopped_early}")

    # --- checkpoints ----------------------------------------------------------------------
    def _checkpoint_due(self) -> bool:
        every = self.config.train.checkpoint_every
        return every > 0 and self.state.step % every == 0 and self.state.step < self.config.train.steps

    def _save(self) -> None:
        with self.hang.doing("checkpoint", self.state.step, self.method.phase):
            self._save_now()

    def _save_now(self) -> None:
        self.checkpointer.save(
            self.state.step,
            {
                "train_state": asdict(self.state),
                "method": self.method.state_dict(),
                "model": self.method.model.state_dict(),
                "optimizer": optimizer_state_by_name(self.method.model, self.method.optimizer),
                "scaler": self.precision.state_dict(),
                "meter": self.meter.state_dict(),
                "progress": self.progress.state_dict(),
                "rng": rng_state(),
            },
        )

    def _load(self, folder: Path) -> None:
        saved = self.method.upgrade_checkpoint(self.checkpointer.load(folder))
        self.state = TrainState(**saved["train_state"])
        self.method.load_state_dict(saved["method"])
        self.method.model.load_state_dict(saved["model"])
        load_optimizer_state_by_name(self.method.model, self.method.optimizer, saved["optimizer"])
        self.precision.load_state_dict(saved.get("scaler", {}))
        self.meter.load_state_dict(saved["meter"])
        self.progress.load_state_dict(saved["progress"])
        set_rng_state(saved["rng"])
        self.progress.note(f"resumed from {folder} at step {self.state.step}")

    # --- the summary ----------------------------------------------------------------------
    def _report(self) -> dict[str, Any] | None:
        self.hang.ending(self.state.step, self.method.phase)  # rank 0's trackers may upload for a while
        per_rank = gather_rows(self.meter, self.world, self.env.device)
        summary = build_summary(self.config, self.state, self.method, self.topology, per_rank,
                                rank=self.env.rank, loss_scale=self.precision.loss_scale())
        if self.env.is_main:
            add_cluster_time(summary, self.config, self.data_info, self.cluster)
            write_summary(self.run_dir, summary)
            for hook in self.hooks:
                hook.on_end(summary)
        return summary


@dataclass
class _LogWindow:
    """Loss and step time averaged over the steps since the last log record."""

    lr: float = 0.0
    loss_sum: float = 0.0
    seconds_sum: float = 0.0
    count: int = 0

    def add(self, loss: float, seconds: float) -> None:
        self.loss_sum += loss
        self.seconds_sum += seconds
        self.count += 1

    def flush(self) -> dict[str, float]:
        record = {"loss": self.loss_sum / self.count, "lr": self.lr, "step_seconds": self.seconds_sum / self.count}
        self.loss_sum, self.seconds_sum, self.count = 0.0, 0.0, 0
        return record
