"""The cost of a study or a campaign, printed before anything trains (abtune/study/cost.py,
abtune/promote/cost.py, abtune/timing.py `estimate_run`)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest

from abtune.cli import main
from abtune.config import ModelConfig
from abtune.data import DatasetInfo
from abtune.study import cost
from abtune.timing import PlannedRun, estimate_run, load_cluster, overlapped_step, straggling
from tests.promote_fixtures import single_objective_study

STUDIES = Path(__file__).resolve().parent.parent / "studies"
PROBED = 0.01  # seconds a sample a probe "measured" (the real probe is timed in its own test)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cost, "probe_seconds_per_sample", lambda *args: PROBED)


def test_creating_the_cifar100_study_here_prints_its_cost_and_the_slurm_route(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], probed: None) -> None:
    code, out, _ = run(capsys, "study", "create", str(STUDIES / "minivit_cifar100.yaml"),
                       "--storage", f"sqlite:///{tmp_path / 's.db'}")
    assert code == 0
    # 10,000 steps of 64 samples at 0.01 s each, 8 ranks sharing this machine's cores; one bucket of
    # ~43M gradients over loopback is small beside that
    per_trial = 10_000 * 64 * PROBED * max(1.0, 8 / (os.cpu_count() or 1))
    flat = " ".join(out.split())  # the lines wrap at the terminal's width
    line = flat[flat.index("estimated training time here"):]
    assert f"8 ranks on {os.cpu_count()} CPU core" in line and "for 40 trials" in line
    hours = float(re.search(r": ([\d.]+) h a trial", line).group(1)) if " h a trial" in line else None
    assert hours is not None and hours == pytest.approx(per_trial / 3600, rel=0.05)
    assert "compute measured" in line and "probe of the trial's model" in line
    assert "run it on SLURM with `abtune study launch minivit_cifar100 --launcher PROFILE" in flat
    assert "docs/first-slurm-study.md" in flat


def test_the_quickstart_study_gets_its_estimate_without_the_slurm_route(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], probed: None) -> None:
    code, out, _ = run(capsys, "study", "create", str(STUDIES / "quickstart.yaml"), "--storage",
                       f"sqlite:///{tmp_path / 's.db'}")
    assert code == 0 and "estimated training time here" in out and "SLURM" not in out


def test_a_long_local_study_run_is_refused_without_yes_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], probed: None) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    assert run(capsys, "study", "create", str(STUDIES / "minivit_cifar100.yaml"), "--storage", storage)[0] == 0
    code, out, err = run(capsys, "study", "run", "minivit_cifar100", "--storage", storage)
    assert code != 0 and "estimated training time here" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "pass --yes to run it here anyway" in lines[0]
    assert "abtune study launch minivit_cifar100 --launcher PROFILE" in lines[0]
    assert not (tmp_path / "runs").exists()  # no trial started


def test_create_with_a_cluster_estimates_there_from_the_description(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "study", "create", str(STUDIES / "minivit_cifar100.yaml"), "--storage",
                       f"sqlite:///{tmp_path / 's.db'}", "--cluster", "paper-a100-hdr200")
    assert code == 0
    assert "estimated training time on cluster paper-a100-hdr200" in out and "SLURM" not in out
    assert "compute assumed: 20% of 19.5 TFLOP/s (fp32)" in out  # a mini ViT in fp32 has no published row


def test_estimate_run_is_the_compute_and_the_overlapped_ring_all_reduce_by_hand() -> None:
    cluster = load_cluster("paper-a100-hdr200")
    run_ = PlannedRun("resnet50", 8178368512, 25_557_032, "bf16", 256, 1000, nodes=2, ranks_per_node=4)
    estimate = estimate_run(run_, cluster)
    # the published 1-GPU rate net of the 2 ms floor, waiting for the slowest of 8 ranks
    compute = (0.002 + 256 * (1 / 1240.81 - 0.002 / 256)) * straggling(cluster.compute, 8)
    grad_bytes = 25_557_032 * 4
    inter = 2 * 7 / 8 * grad_bytes * 8 / (400 * 0.96 * 1e9)
    intra = 2 * 7 / 8 * grad_bytes * 8 / (2400 * 1e9)
    link = max(inter, intra) + 2 * 7 * 2e-6
    step = overlapped_step(compute, link, math.ceil(grad_bytes / (25 * 2**20)), 0.667)
    assert estimate.step_seconds == pytest.approx(step)
    assert estimate.seconds == pytest.approx(1000 * step)
    assert estimate.compute_source.kind == "published"


def test_the_probe_times_a_real_step_of_the_model() -> None:
    seconds = cost.probe_seconds_per_sample(ModelConfig(arch="small_cnn"), DatasetInfo(10, 8, 3), "fp32", 2)
    assert 0 < seconds < 5


def test_promote_dry_run_prints_gpu_hours_per_run_and_in_total(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    single_objective_study(storage)
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "promote", "tiny", "--storage", storage, "--to", str(STUDIES / "imagenet_vit_b16.yaml"),
                       "--nodes", "2,4", "--scaling", "global", "--dry-run", "--cluster", "paper-a100-hdr200")
    assert code == 0, out
    assert "estimated GPU-hours on cluster paper-a100-hdr200, as DDP trains" in out
    runs = dict(re.findall(r"  run (n\d\d-[\w-]+): \d+ GPUs x [\d,.]+ h = ([\d,]+) GPU-hours", out))
    assert set(runs) == {"n02-ddp", "n02-trial-2", "n04-ddp", "n04-trial-2"}
    total = int(re.search(r"total: ([\d,]+) GPU-hours for 4 runs", out).group(1).replace(",", ""))
    assert abs(total - sum(int(v.replace(",", "")) for v in runs.values())) <= 2  # each line rounded
    # ViT-B/16, 300 epochs of ImageNet in bf16 at FlagPerf's published 680 images/s per A100: ~157 GPU-hours
    floor = 300 * 1_281_167 / 680.125 / 3600
    assert floor * 0.95 < int(runs["n02-ddp"].replace(",", "")) < floor * 1.5


def test_a_slurm_run_is_estimated_only_with_a_cluster_description_and_never_refused(
        capsys: pytest.CaptureFixture[str], probed: None) -> None:
    from abtune.study.spec import load_study_spec
    spec = load_study_spec(STUDIES / "minivit_cifar100.yaml")
    cost.check_local_run(spec, "minivit_cifar100", "slurm", None, 1, yes=False)  # never refuses a SLURM run
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""  # its launcher's own checks speak first
    cost.check_local_run(spec, "minivit_cifar100", "slurm", "paper-a100-hdr200", 4, yes=False)
    out = capsys.readouterr().out
    assert "on cluster paper-a100-hdr200" in out and "4 at a time" in out and "SLURM" not in out
