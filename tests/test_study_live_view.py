"""The live view of `abtune study run` on a terminal: each running trial's step, phase and ETA from its
metrics.jsonl, the study's ETA and its current front; a trial that has not logged yet reads `starting`."""

from __future__ import annotations

import json
from pathlib import Path

from optuna.distributions import FloatDistribution
from optuna.trial import create_trial
from rich.console import Console

from abtune.study.live_view import RunDisplay, duration
from abtune.study.spec import parse_study_spec
from tests.conftest import TINY_VIT


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _shown(display: RunDisplay) -> str:
    console = Console(record=True, width=100, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(display._view())
    return console.export_text()


def _log(run_dir: Path, step: int, phase: str) -> None:
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"kind": "log", "step": step, "phase": phase, "loss": 1.0}) + "\n")


def test_running_trials_show_step_phase_and_eta_and_the_study_its_eta_and_front(tmp_path: Path) -> None:
    spec = parse_study_spec({"base": {"name": "t", "model": TINY_VIT, "train": {"steps": 100}}, "trials": 6,
                             "objectives": ["top1", "inter_node_bytes"], "layout": {"nproc": 2, "ranks_per_node": 1}}, "test")
    clock = Clock()
    display = RunDisplay("demo", spec, parallel=2, clock=clock)
    display.live_mode = True  # as on a terminal, without starting rich's refresh thread
    display.started(0, "ddp")
    shown = _shown(display)
    assert "running: 0" not in shown and "starting" in shown  # not read as "nothing running"

    run_dir = tmp_path / "trial-0"
    run_dir.mkdir()
    _log(run_dir, 10, "warmup")
    display.watch({0: run_dir})
    clock.now = 10.0
    _log(run_dir, 30, "ab")
    display.watch({0: run_dir})
    shown = _shown(display)
    assert "30/100" in shown and "ab" in shown and "35s" in shown  # 70 steps left at 2 s per step

    space = {"method.warmup_frac": FloatDistribution(0.1, 0.3)}
    done = [create_trial(params={"method.warmup_frac": 0.2}, distributions=space, values=[top1, nbytes],
                         user_attrs={"top1": top1, "inter_node_bytes": nbytes, "wall_seconds": 60.0})
            for top1, nbytes in ((0.9, 50e6), (0.95, 80e6), (0.85, 90e6))]
    for number, trial in enumerate(done, start=1):
        trial.number = number
    display.finished(done[-1], done)
    # 6 trials: 3 finished, 1 running (35 s left), 2 waiting in one wave of 2 at 60 s each
    assert display.study_eta_s() == 35.0 + 60.0
    shown = _shown(display)
    assert "ETA 1m 35s" in shown and "current front: trial 2, 1" in shown


def test_durations_read_at_a_glance() -> None:
    assert [duration(s) for s in (None, 45.2, 200, 3725)] == ["-", "45s", "3m 20s", "1h 02m"]
