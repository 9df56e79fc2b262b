"""Promotion without training: which trials are picked, how a campaign is planned, what the CLI refuses."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from abtune.errors import ConfigError
from abtune.promote.plan import plan_campaign
from abtune.promote.select import promoted_from_study
from abtune.promote.target import load_target
from abtune.study.ranking import Rule
from tests import cli_fixture
from tests.cli_fixture import Result
from tests.conftest import run_cli
from tests.promote_fixtures import (
    BEST,
    BEST_RUN_ID,
    PAPER_DEFAULTS,
    SECOND,
    empty_study,
    pareto_study,
    single_objective_study,
    tiny_target,
)

STUDIES = Path(__file__).parent.parent / "studies"
VIT_TARGET = STUDIES / "imagenet_vit_b16.yaml"
RESNET_TARGET = STUDIES / "imagenet_resnet50.yaml"
CARRIED = ("method.name", "method.warmup_frac", "method.ab_frac", "method.rebound_frac", "method.lr_rebound_frac",
           "method.sigma_cutoff")
IMAGENET_TRAIN = 1_281_167

cli = cli_fixture.cli  # the in-process `abtune` fixture


@pytest.fixture
def storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'studies.db'}"


def test_single_objective_takes_the_best_finished_trials_but_never_the_ddp_reference(storage: str) -> None:
    promoted = promoted_from_study(single_objective_study(storage), top=3)
    assert [p.source.trial for p in promoted] == [2, 3, 0]  # values 0.90, 0.85, 0.80; ddp (0.95) and FAIL left out
    best = promoted[0]
    assert best.name == "trial-2" and best.source.values == (0.90,) and best.source.mlflow_run_id == BEST_RUN_ID
    assert best.overrides == {k: BEST[k] for k in CARRIED}  # the fractions and cutoff, exactly
    assert best.dropped == ("optimizer.lr",)  # the target keeps its own optimizer
    assert promoted[2].overrides == PAPER_DEFAULTS


@pytest.mark.parametrize(("rule", "expected"), [
    (Rule("best-accuracy"), [0, 1, 2, 3]),
    (Rule("least-traffic"), [3, 2, 1, 0]),
    # shortfall from the ideal per objective, scaled over the front: #0 (0, 1), #1 (0.17, 0.33),
    # #2 (0.33, 0.22), #3 (1, 0): distances 1, 0.37, 0.40, 1 (ties by trial number)
    (Rule("knee"), [1, 2, 0, 3]),
    # top-1 0.90, 0.85, 0.80, 0.60 at 100, 40, 30, 10 MB: within 0.01 of 0.90 only #0, then by top-1
    (Rule("within-margin"), [0, 1, 2, 3]),
    (Rule("within-margin", 0.1), [2, 1, 0, 3]),  # 0.80-0.90: least traffic first, then #3 by top-1
])
def test_pareto_front_is_ranked_by_the_rule(storage: str, rule: Rule, expected: list[int]) -> None:
    study = pareto_study(storage)
    promoted = promoted_from_study(study, top=4, rule=rule)
    assert [p.source.trial for p in promoted] == expected
    assert all(p.overrides == {k: SECOND[k] for k in CARRIED} for p in promoted)


def test_selection_errors_say_what_is_wrong(storage: str) -> None:
    with pytest.raises(ConfigError, match=r"study 'empty' has no finished trials \(1 fail, 1 pruned\)"):
        promoted_from_study(empty_study(storage), top=1)
    with pytest.raises(ConfigError, match=r"--top 4: study 'tiny' has only 3 finished trial\(s\)"):
        promoted_from_study(single_objective_study(storage), top=4)
    with pytest.raises(ConfigError, match=r"--top 5: the Pareto front of study 'pareto' holds only 4 trial"):
        promoted_from_study(pareto_study(storage), top=5)


def test_planned_steps_follow_the_strategy_and_the_fractions(storage: str) -> None:
    target = load_target(RESNET_TARGET)
    promoted = promoted_from_study(single_objective_study(storage), top=1)
    campaign, configs = plan_campaign(target, str(RESNET_TARGET), promoted, (2, 4), "local", IMAGENET_TRAIN)
    assert [r.name for r in campaign.runs] == ["n02-ddp", "n02-trial-2", "n04-ddp", "n04-trial-2"]
    ab = campaign.runs[3]
    assert (ab.world_size, ab.local_batch_size, ab.global_batch_size, ab.steps_per_epoch) == (16, 256, 4096, 312)
    assert ab.steps == 90 * 312 == 28_080
    # warmup 0.15, AB 0.2 of the steps; rebound 0.3 and LR rebound 0.4 of the AB steps (rounded half up)
    assert ab.schedule == {"total_steps": 28_080, "warmup_steps": 4_212, "ab_steps": 5_616, "rebound_steps": 1_685,
                           "lr_rebound_steps": 2_246, "ab_cycles": 4}
    config = configs["n04-trial-2"]
    assert (config.train.steps, config.train.local_batch_size, config.method.sigma_cutoff) == (28_080, 256, 0.3)
    assert config.optimizer.lr == 0.001 and config.model.arch == "resnet50"  # target's, not the trial's
    assert configs["n04-ddp"].method.name == "ddp" and campaign.runs[2].schedule is None


def test_layouts_that_cannot_run_are_refused_when_planning(storage: str) -> None:
    target = load_target(VIT_TARGET)
    promoted = promoted_from_study(single_objective_study(storage), top=1)
    with pytest.raises(ConfigError, match="global batch 4096 does not divide evenly over 12 ranks"):
        plan_campaign(target, str(VIT_TARGET), promoted, (3,), "global", IMAGENET_TRAIN)
    one_rank = load_target(VIT_TARGET, ranks_per_node=1)
    with pytest.raises(ConfigError, match=r"1 node\(s\) x 1 ranks: method ab needs at least 2 ranks"):
        plan_campaign(one_rank, str(VIT_TARGET), promoted, (1,), "local", IMAGENET_TRAIN)
    with pytest.raises(ConfigError, match="a global batch of 32768 is more than the 1000 training samples"):
        plan_campaign(target, str(VIT_TARGET), promoted, (32,), "local", 1000)


def _table_rows(stdout: str) -> dict[str, list[str]]:
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line) if c.strip()]
        if cells and re.fullmatch(r"n\d\d-.+", cells[0]):
            rows[cells[0]] = cells
    return rows


# (nodes, local batch, global batch, steps per epoch, steps) for ViT-B/16, 300 epochs, 1,281,167 images, 4 GPUs per node
PAPER_LOCAL = [(2, 256, 2048, 625, 187_500), (4, 256, 4096, 312, 93_600), (8, 256, 8192, 156, 46_800),
               (16, 256, 16384, 78, 23_400), (32, 256, 32768, 39, 11_700)]
PAPER_GLOBAL = [(2, 512, 4096, 312, 93_600), (4, 256, 4096, 312, 93_600), (8, 128, 4096, 312, 93_600),
                (16, 64, 4096, 312, 93_600), (32, 32, 4096, 312, 93_600)]


# "local" through the installed command: a new Python that imports torch to count ViT-B/16's FLOPs (6 s of CPU)
@pytest.mark.parametrize(("scaling", "expected"), [pytest.param("local", PAPER_LOCAL, marks=pytest.mark.slow),
                                                   ("global", PAPER_GLOBAL)])
def test_dry_run_prints_the_papers_batches_and_steps_and_writes_nothing(
        tmp_path: Path, storage: str, scaling: str, expected: list[tuple[int, ...]], cli: Callable[..., Result],
        monkeypatch: pytest.MonkeyPatch) -> None:
    single_objective_study(storage)
    before = sorted(tmp_path.rglob("*"))
    args = ("promote", "tiny", "--storage", storage, "--top", "1", "--to", str(VIT_TARGET), "--nodes", "2,4,8,16,32",
            "--scaling", scaling, "--dry-run")
    monkeypatch.chdir(tmp_path)
    result = run_cli(*args, cwd=tmp_path) if scaling == "local" else cli(*args)  # the entry point once
    assert result.returncode == 0
    rows = _table_rows(result.stdout)
    assert len(rows) == 10
    for nodes, local, global_, per_epoch, steps in expected:
        ddp, ab = rows[f"n{nodes:02d}-ddp"], rows[f"n{nodes:02d}-trial-2"]
        numbers = [int(c.replace(",", "")) for c in ab[1:7]]
        assert numbers == [nodes, 4 * nodes, local, global_, per_epoch, steps]
        assert ddp[1:7] == ab[1:7] and ddp[11] == "ddp" and ab[11] == "ab"
        assert ddp[12] == ab[12] == "bf16"  # the target's train.precision, shown per run
        warmup, ab_steps, rebound, lr_rebound = (int(c.replace(",", "")) for c in ab[7:11])
        assert (warmup, ab_steps) == (round(0.15 * steps), round(0.2 * steps))
        assert (rebound, lr_rebound) == (int(0.3 * ab_steps + 0.5), int(0.4 * ab_steps + 0.5))
    assert "tiny #2 (mlflow 0123456789abcdef)" in result.stdout
    assert "data.root: not set" in result.stderr  # a warning under --dry-run
    assert sorted(tmp_path.rglob("*")) == before  # no campaign folder, no runs/


def _one_line_error(result: Result) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize(("study", "top", "expected"), [
    ("empty", 1, "abtune: error: study 'empty' has no finished trials (1 fail, 1 pruned)"),
    ("tiny", 4, "abtune: error: --top 4: study 'tiny' has only 3 finished trial(s)"),
    ("nope", 1, "abtune: error: no study named 'nope' in sqlite:///"),
])
def test_bad_promotions_give_one_line_and_exit_2(tmp_path: Path, storage: str, study: str, top: int,
                                                 expected: str, cli: Callable[..., Result]) -> None:
    single_objective_study(storage)
    empty_study(storage)
    target = tiny_target(tmp_path / "target.yaml", tmp_path)
    out = tmp_path / "campaign"
    result = cli("promote", study, "--storage", storage, "--top", str(top), "--to", str(target), "--nodes", "1",
                 "--scaling", "local", "--campaign-dir", str(out))
    assert _one_line_error(result).startswith(expected)
    assert not out.exists()


@pytest.mark.parametrize("root", [None, "missing"])
def test_missing_data_path_stops_before_anything_is_written(tmp_path: Path, storage: str, root: str | None,
                                                           cli: Callable[..., Result]) -> None:
    single_objective_study(storage)
    target = tiny_target(tmp_path / "target.yaml", None if root is None else tmp_path / root)
    out = tmp_path / "campaign"
    result = cli("promote", "tiny", "--storage", storage, "--to", str(target), "--nodes", "1", "--scaling", "local",
                 "--campaign-dir", str(out))
    line = _one_line_error(result)
    assert line.startswith("abtune: error: data.root: ")
    assert ("not set" in line) if root is None else (f"{tmp_path / 'missing'} does not exist" in line)
    assert not out.exists()


def test_dry_run_on_slurm_prints_each_runs_sbatch_script_at_its_size(tmp_path: Path, storage: str,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        cli: Callable[..., Result]) -> None:
    """The launcher resized to every run of the campaign: one script per run, with its own node count."""
    single_objective_study(storage)
    before = sorted(tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)
    result = cli("promote", "tiny", "--storage", storage, "--top", "1", "--to", str(VIT_TARGET), "--nodes", "2,4",
                 "--scaling", "local", "--dry-run", "--launcher", "slurm")
    assert result.returncode == 0, result.stderr
    scripts = result.stdout.split("# --- ")[1:]
    assert [s.splitlines()[0] for s in scripts] == [f"{name}: {n} node(s) x 4 ---" for n in (2, 4)
                                                    for name in (f"n{n:02d}-ddp", f"n{n:02d}-trial-2")]
    for script, nodes in zip(scripts, (2, 2, 4, 4), strict=True):
        assert f"#SBATCH --nodes={nodes}\n" in script and "#SBATCH --ntasks-per-node=4\n" in script
    assert sorted(tmp_path.rglob("*")) == before  # a dry run writes nothing
