"""Study files: bad ones end in one line and exit 2 and touch no storage; create is idempotent and
refuses to replace a different definition; the space follows the RunConfig's field types."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from abtune.attrs import DDP, FAIL_REASON_ATTR, OVER_BUDGET_ATTR, PAPER_DEFAULTS, SPEC_ATTR, WORKER_ATTR
from abtune.cli import main
from abtune.errors import ConfigError
from abtune.methods.ab.settings import AbConfig
from abtune.study.space import build_distributions
from abtune.study.spec import load_study_spec
from abtune.study.storage import open_storage
from tests.conftest import CliResult, run_cli
from tests.study_helpers import TINY_BASE, gone_worker, study_attrs, trials_of, write_study

ROOT = Path(__file__).parent.parent


def _abtune(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


BAD_STUDIES = [
    ({"space": {"method.sigma_cutof": {"low": 0.1, "high": 0.2}}}, "space.method.sigma_cutof: 'sigma_cutof' is not a field of method 'ab'"),
    ({"samplr": {"name": "tpe"}}, "samplr: unknown key"),
    ({"space": {"method.warmup_frac": {"low": 0.2, "high": 0.2}}}, "space.method.warmup_frac: empty range: low == high == 0.2; fix the value in the base config instead"),
    ({"space": {"method.warmup_frac": {"low": 0.3, "high": 0.1}}}, "`low <= high` must hold, but got (low=0.3, high=0.1)"),
    ({"space": {"method.sigma_cutoff": {"low": 0.0, "high": 0.5, "log": True}}}, "a log range must be positive"),
    ({"space": {"method.sigma_cutoff": {"low": 0.1, "high": 1.5}}}, "space.method.sigma_cutoff: value 1.5 is invalid"),
    ({"space": {"method.ab_frac": {"low": 0.0, "high": 0.05}}}, "space.method.ab_frac: value 0.0 is invalid"),
    ({"space": {"method.group_size": {"low": 1, "high": 2}}}, "method.group_size: value 2 is invalid"),
    ({"space": {"method.sync_mode": {"low": 1, "high": 2}}}, "takes choices, not a range; e.g. choices: [...]: with-stale"),
    ({"space": {"train.steps": {"low": 10.5, "high": 20}}}, "an integer field needs integer low/high/step"),
    ({"space": {"optimizer.lr": {"low": 0.01, "high": 0.1}}}, "the base config's value 0.003"),
    ({"sampler": {"name": "bayes"}}, "sampler.name: Input should be 'tpe'"),
    ({"pruner": {"name": "aggressive"}}, "pruner.name: Input should be 'none'"),
    ({"sampler": {"name": "tpe", "options": {"n_startup": 3}}}, "bad.yaml: sampler.options.n_startup: not an option of TPESampler; valid options: consider_prior (default None), "),
    ({"sampler": {"name": "tpe", "options": {"n_startup": 3}}}, ", n_startup_trials (default 10), n_ei_candidates (default 24), "),
    ({"sampler": {"name": "tpe", "options": {"n_startup_trials": "not-a-number"}}}, "bad.yaml: sampler.options.n_startup_trials: expected int, got 'not-a-number' (str); default: 10"),
    ({"sampler": {"name": "tpe", "options": {"n_startup_trials": -3}}}, "bad.yaml: sampler.options.n_startup_trials: must be >= 0, got -3"),
    ({"sampler": {"name": "tpe", "options": {"multivariate": "yes"}}}, "sampler.options.multivariate: expected bool | None, got 'yes' (str)"),
    ({"sampler": {"name": "tpe", "options": {"n_ei_candidates": 0}}}, "sampler.options.n_ei_candidates: must be >= 1, got 0"),
    ({"sampler": {"name": "tpe", "options": {"gamma": 0.1}}}, "sampler.options.gamma: TPESampler takes a Python object here (Callable[[int], int] | None)"),
    ({"sampler": {"name": "tpe", "options": {"seed": 3}}}, "sampler.options.seed: set sampler.seed instead"),
    ({"sampler": {"name": "random", "options": {"seed": 3}}}, "sampler.options.seed: set sampler.seed instead"),
    ({"sampler": {"name": "random", "options": {"n_startup_trials": 3}}}, "sampler.options.n_startup_trials: RandomSampler takes no options; remove sampler.options"),
    ({"sampler": {"name": "nsgaii", "options": {"population_size": 1}}}, "sampler nsgaii with options {'population_size': 1}: `population_size` must be greater than or equal to 2."),
    ({"sampler": {"name": "qmc", "options": {"qmc_type": "lattice"}}}, "The `qmc_type='lattice'` is invalid. Choose either `halton` or `sobol`."),
    ({"pruner": {"name": "median", "options": {"n_warmup_steps": 2.5}}}, "pruner.options.n_warmup_steps: expected int, got 2.5 (float); default: 0"),
    ({"pruner": {"name": "median", "options": {"n_startup_trials": True}}}, "pruner.options.n_startup_trials: expected int, got True (bool)"),
    ({"pruner": {"name": "median", "options": {"interval_steps": 0}}}, "pruner median with options {'interval_steps': 0}: Pruning interval steps must be at least 1"),
    ({"pruner": {"name": "hyperband", "options": {"reduction_factor": 1}}}, "pruner.options.reduction_factor: must be >= 2, got 1"),
    ({"pruner": {"name": "hyperband", "options": {"min_resource": 31}}}, "pruner.options: min_resource 31 is above max_resource 30 (default: train.steps)"),
    ({"pruner": {"name": "none", "options": {"n_startup_trials": 3}}}, "pruner.options.n_startup_trials: NopPruner takes no options; remove pruner.options"),
    ({"objectives": ["top1", "inter_node_bytes"], "pruner": {"name": "median"}}, "bad.yaml: pruner: Optuna's median pruner ranks one objective, and this study has 2 (top1, inter_node_bytes): set pruner: pareto-asha (or none)"),
    ({"trials": 2}, "trials: 2 leaves no trial for the search after the 2 reference trials"),
    ({"layout": {"nproc": 2}, "objectives": ["top1", "inter_node_bytes"]}, "bad.yaml: layout: inter-node traffic needs more than one node"),
    ({"base": "missing.yaml"}, "missing.yaml: no such file"),
]


@pytest.mark.parametrize(("fields", "expected"), BAD_STUDIES)
def test_bad_study_file_gives_one_line_exit_2_and_no_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fields: dict, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ABTUNE_STORAGE", raising=False)
    study = write_study(tmp_path / "bad.yaml", **fields)
    code, out, err = _abtune(capsys, "study", "create", str(study))
    lines = err.strip().splitlines()
    assert code == 2
    assert len(lines) == 1, err
    assert lines[0].startswith("abtune: error: ") and expected in lines[0], lines[0]
    assert not (tmp_path / "optuna.db").exists()
    assert not (tmp_path / "runs").exists()


def test_unreachable_storage_is_one_line_without_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    study = write_study(tmp_path / "s.yaml")
    for url, expected in [("postgresql://abtune:s3cret-pw@127.0.0.1:9/abtune", "postgresql://abtune:***@127.0.0.1:9/abtune is unreachable"),
                          (f"sqlite:///{tmp_path}/no/such/dir/o.db", "is unreachable: folder"),
                          (f"journal:{tmp_path}/no/such/dir/j.log", "is unreachable: folder")]:
        code, _, err = _abtune(capsys, "study", "create", str(study), "--storage", url)
        assert code == 2 and len(err.strip().splitlines()) == 1 and expected in err, err
        assert "s3cret" not in err
    monkeypatch.chdir(tmp_path)
    code, _, err = _abtune(capsys, "study", "status", "tiny")
    assert code == 2 and "no studies at sqlite:///" in err
    assert not (tmp_path / "optuna.db").exists()  # reading never creates a storage


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_create_enqueues_references_and_refuses_a_different_definition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], storage: str
) -> None:
    url = f"sqlite:///{tmp_path}/o.db" if storage == "sqlite" else f"journal:{tmp_path}/o.log"
    study = write_study(tmp_path / "s.yaml")
    code, out, _ = _abtune(capsys, "study", "create", str(study), "--storage", url)
    assert code == 0 and "created study tiny" in out
    waiting = trials_of(url)
    assert [(t.number, t.state.name, t.user_attrs["reference"]) for t in waiting] == [
        (0, "WAITING", PAPER_DEFAULTS), (1, "WAITING", DDP)]
    assert waiting[0].system_attrs["fixed_params"] == {f"method.{k}": AbConfig.guideline[k] for k in ("warmup_frac", "sigma_cutoff")}
    stored = study_attrs(url)[SPEC_ATTR]
    assert stored["base"]["train"]["steps"] == 30 and stored["trials"] == 4
    # optuna-dashboard labels its axes and selectors with these (it showed "0" and "1", issue 21)
    assert optuna.load_study(study_name="tiny", storage=open_storage(url)).metric_names == ["top1"]

    code, out, _ = _abtune(capsys, "study", "create", str(study), "--storage", url)
    assert code == 0 and "already exists" in out and len(trials_of(url)) == 2

    grown = write_study(tmp_path / "s2.yaml", trials=6)  # only the budget changed: set, every trial kept
    code, out, _ = _abtune(capsys, "study", "create", str(grown), "--storage", url)
    assert code == 0 and "budget set to 6 trials (was 4)" in out and len(trials_of(url)) == 2
    assert study_attrs(url)[SPEC_ATTR]["trials"] == 6

    changed = write_study(tmp_path / "s3.yaml", trials=6, sampler={"name": "random", "seed": 1})
    code, _, err = _abtune(capsys, "study", "create", str(changed), "--storage", url)
    assert code == 2 and "already exists" in err and "--force" in err
    assert study_attrs(url)[SPEC_ATTR]["sampler"]["seed"] == 0

    code, out, _ = _abtune(capsys, "study", "create", str(changed), "--storage", url, "--force")
    assert code == 0 and study_attrs(url)[SPEC_ATTR]["sampler"]["seed"] == 1 and len(trials_of(url)) == 2

    code, _, err = _abtune(capsys, "study", "delete", "tiny", "--storage", url)
    assert code == 2 and "--yes" in err
    code, out, _ = _abtune(capsys, "study", "delete", "tiny", "--storage", url, "--yes")
    assert code == 0
    code, out, _ = _abtune(capsys, "study", "list", "--storage", url)
    assert "tiny" not in out


def test_space_kinds_follow_the_run_config(tmp_path: Path) -> None:
    spec = load_study_spec(write_study(tmp_path / "s.yaml", space={
        "method.sigma_cutoff": {"low": 0.01, "high": 0.5, "log": True},
        "method.group_size": {"choices": [1]},
        "method.sync_mode": {"choices": ["with-stale", "full"]},
        "optimizer.lr": {"low": 1e-4, "high": 1e-2, "log": True},
        "train.local_batch_size": {"low": 8, "high": 32, "step": 8},
    }))
    dists = build_distributions(spec, "s.yaml")
    assert dists["method.sigma_cutoff"] == FloatDistribution(0.01, 0.5, log=True)
    assert dists["method.sync_mode"] == CategoricalDistribution(["with-stale", "full"])
    assert dists["train.local_batch_size"] == IntDistribution(8, 32, step=8)
    assert dists["method.group_size"] == CategoricalDistribution([1])


def test_base_from_a_file_with_overrides(tmp_path: Path) -> None:
    spec = load_study_spec(ROOT / "studies" / "quickstart.yaml")
    assert spec.base["train"]["steps"] == 300 and spec.base["model"]["hidden_dim"] == 96
    assert spec.directions == ["maximize", "minimize"] and spec.layout.per_node == 2
    shorter = write_study(tmp_path / "short.yaml", base=str(ROOT / "studies" / "run_quickstart.yaml"),
                          overrides={"train.steps": 150})
    assert load_study_spec(shorter).base["train"]["steps"] == 150
    ddp_base = write_study(tmp_path / "d.yaml", base={**TINY_BASE, "method": {"name": "ddp"}},
                           space={"optimizer.lr": {"low": 1e-3, "high": 1e-2}})
    with pytest.raises(ConfigError, match="references.paper_defaults needs an AB method"):
        from abtune.study.lifecycle import validate

        validate(load_study_spec(ddp_base), "d.yaml")


@pytest.mark.slow  # a new Python through the installed command: torch and the cost probe, 6 s of CPU
def test_the_installed_command_creates_and_lists(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    """`study create` through the installed command (`study best`'s is test_terminal_tables.py's); `list` and
    `status` read what it stored in process (a new Python for each added only its imports)."""
    study = write_study(tmp_path / "s.yaml")
    run_cli("study", "create", str(study), cwd=tmp_path)
    assert (tmp_path / "optuna.db").exists()
    listing = abtune_main("study", "list", cwd=tmp_path)
    assert listing.returncode == 0 and "tiny" in listing.stdout and "top1" in listing.stdout
    status = abtune_main("study", "status", "tiny", cwd=tmp_path)
    assert status.returncode == 0 and "budget 0/4 finished; waiting 2" in status.stdout
    missing = abtune_main("study", "best", "nope", cwd=tmp_path)
    assert missing.returncode == 2 and "no study named 'nope'" in missing.stderr and "studies there: tiny" in missing.stderr


def test_abtune_storage_variable_and_no_password_in_the_stored_definition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"journal:{tmp_path}/env.log"
    monkeypatch.setenv("ABTUNE_STORAGE", url)
    study = write_study(tmp_path / "s.yaml", storage="postgresql://me:hunter2@db.example/abtune")
    code, out, _ = _abtune(capsys, "study", "create", str(study))  # the variable wins over the file's storage
    assert code == 0 and f"created study tiny in journal:{tmp_path}/env.log" in out
    assert study_attrs(url)[SPEC_ATTR]["storage"] == "postgresql://me:***@db.example/abtune"
    code, out, _ = _abtune(capsys, "study", "status", "tiny")
    assert code == 0 and "budget 0/4 finished" in out and "hunter2" not in out


def _slurm_profile(tmp_path: Path, **fields: object) -> Path:
    import yaml

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"kind": "slurm", "partition": "gpu", "nodes": 2, "tasks_per_node": 1, **fields}))
    return path


def test_study_launch_dry_run_needs_no_slurm_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.test_launchers import without_slurm

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", without_slurm()["PATH"])  # no sinfo, whether the suite's test cluster is up or not
    url = f"journal:{tmp_path}/j.log"
    _abtune(capsys, "study", "create", str(write_study(tmp_path / "s.yaml")), "--storage", url)
    before = [(t.number, t.state) for t in trials_of(url)]
    profile = _slurm_profile(tmp_path, gpus_per_node=4, sbatch={"exclusive": True, "constraint": "a100"})
    code, out, err = _abtune(capsys, "study", "launch", "tiny", "--workers", "3", "--launcher", str(profile),
                             "--storage", url, "--dry-run")
    assert (code, err) == (0, "abtune: note: sinfo gave no partitions here: the request was not checked against "
                              "the cluster, nor the room workers leave trials\n")  # says what it could not check
    workers, trial = out.split("# each trial: one job of 2 node(s) x 1 rank(s)")
    assert "#SBATCH --array=0-2%3" in workers and "#SBATCH --job-name=abtune-study-tiny" in workers
    assert "--gpus-per-node" not in workers and "--exclusive" not in workers  # a worker needs no GPU node
    assert "#SBATCH --constraint=a100" in workers
    assert "#SBATCH --job-name=abtune-tiny-N" in trial
    assert "#SBATCH --gpus-per-node=4" in trial and "#SBATCH --exclusive" in trial and "#SBATCH --nodes=2" in trial
    assert str(tmp_path / "j.log") not in out  # the storage reaches the jobs through the environment
    assert [(t.number, t.state) for t in trials_of(url)] == before and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("args", "expected"), [
    (("launch", "--launcher", "local"), "abtune: error: --launcher local: `study launch` submits study workers that "
                                        "run on after it returns, which local jobs do not; use a slurm profile, or "
                                        "run the study here with `abtune study run tiny`\n"),
    (("run", "--launcher", "debug"), "abtune: error: --launcher debug: studies run on local, slurm or gridengine profiles "
                                     "(step through one run with `abtune train --launcher debug`)\n"),
    (("launch", "--launcher", "ONE_NODE", "--dry-run"), "abtune: error: launcher profile: nodes is 1, but this study "
                                                        "measures inter-node traffic; use a profile with nodes >= 2\n"),
    (("launch", "--launcher", "ONE_NODE", "--workers", "0"), "abtune: error: --workers and --trials must be at least 1\n"),
])
def test_study_launcher_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], expected: str
) -> None:
    url = f"journal:{tmp_path}/j.log"
    study = write_study(tmp_path / "s.yaml", objectives=["top1", "inter_node_bytes"])
    _abtune(capsys, "study", "create", str(study), "--storage", url)
    args = tuple(str(_slurm_profile(tmp_path, nodes=1)) if a == "ONE_NODE" else a for a in args)
    code, out, err = _abtune(capsys, "study", args[0], "tiny", *args[1:], "--storage", url)
    assert (code, out, err) == (2, "", expected)
    assert all(t.state.name == "WAITING" for t in trials_of(url))


def test_study_commands_without_slurm_are_one_line_and_lose_nothing(tmp_path: Path,
                                                                    abtune_main: Callable[..., CliResult]) -> None:
    from tests.test_launchers import slurm_hidden

    url = f"journal:{tmp_path}/j.log"
    assert abtune_main("study", "create", str(write_study(tmp_path / "s.yaml", trials=3)), "--storage", url,
                       cwd=tmp_path).returncode == 0
    profile = str(_slurm_profile(tmp_path))
    no_slurm = ('abtune: error: no SLURM here (Could not detect "srun", are you indeed on a slurm cluster?); '
                "use --launcher local\n")
    launch = abtune_main("study", "launch", "tiny", "--launcher", profile, "--storage", url, env=slurm_hidden())
    assert (launch.returncode, launch.stderr) == (2, no_slurm)
    run = abtune_main("study", "run", "tiny", "--launcher", profile, "--storage", url)
    assert (run.returncode, run.stderr) == (2, no_slurm)
    trials = trials_of(url)  # the paper-defaults trial it asked for is waiting again, as a retry
    assert [t.state.name for t in trials] == ["FAIL", "WAITING", "WAITING"]
    assert trials[2].user_attrs["retry_of"] == 0 and trials[2].user_attrs["reference"] == PAPER_DEFAULTS


def test_a_trial_asked_beyond_the_budget_is_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    abtune_main: Callable[..., CliResult]) -> None:
    """Two workers pass the budget check at once; the one whose ask comes second steps back."""
    from abtune.study import results
    from abtune.study.runner import StudyRunner
    from abtune.study.storage import open_storage

    monkeypatch.setenv("ABTUNE_STORAGE", "")  # restored after the runner sets it
    url = f"journal:{tmp_path}/j.log"
    study = write_study(tmp_path / "s.yaml", trials=1, references={"paper_defaults": False, "ddp": False})
    assert abtune_main("study", "create", str(study), "--storage", url, cwd=tmp_path).returncode == 0
    runner = StudyRunner(open_storage(url), "tiny", url, 1, None)
    runner.study.ask()  # another worker's ask: the last trial of the budget
    runner._start()  # this worker had seen budget left just before
    trials = trials_of(url)
    assert [(t.number, t.state.name) for t in trials] == [(0, "RUNNING"), (1, "FAIL")]
    assert trials[1].user_attrs["over_budget"] and not runner.active
    assert results.budget_used(trials) == 1 and not runner._may_start()


GOOD_STUDY_TEXT = "name: bad\nbase: run.yaml\nlayout: {nproc: 2, ranks_per_node: 1}\ntrials: 4\n"
BAD_STUDY_FILES = [
    (GOOD_STUDY_TEXT + "sampler:\n  name: tpe\n   options: {}\n", "bad.yaml:7:11: not valid YAML: mapping values are not allowed here"),
    (GOOD_STUDY_TEXT + "space: {method.warmup_frac: {low: 0.1, high: 0.3}\n", "bad.yaml:6:1: not valid YAML: expected ',' or '}', but got '<stream end>' (while parsing a flow mapping)"),
    (GOOD_STUDY_TEXT + "trials: 8\n", "bad.yaml:5:1: not valid YAML: key 'trials' appears twice (first on line 4)"),
    (bytes(range(256)), "bad.yaml: a binary file (it contains NUL bytes); expected YAML text"),
    (b"name: caf\xe9\n", "bad.yaml:1:10: not UTF-8 text (byte 0xe9)"),
    ("", "bad.yaml: the file is empty (or holds only comments); expected a YAML mapping"),
    ("# a study, some day\n", "bad.yaml: the file is empty (or holds only comments); expected a YAML mapping"),
    (GOOD_STUDY_TEXT.replace("run.yaml", "empty.yaml"), "empty.yaml: the file is empty (or holds only comments)"),
    (GOOD_STUDY_TEXT + "sampler: {name: tpe, options: {n_startup_trials: not-a-number}}\n",
     "bad.yaml: sampler.options.n_startup_trials: expected int, got 'not-a-number' (str); default: 10"),
    (GOOD_STUDY_TEXT + "sampler: {name: tpe, options: {n_startup_trials: -3}}\n",
     "bad.yaml: sampler.options.n_startup_trials: must be >= 0, got -3"),
]


@pytest.mark.parametrize(("content", "expected"), BAD_STUDY_FILES)
def test_bad_study_file_text_gives_one_line_and_stores_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], abtune_main: Callable[..., CliResult], content: str | bytes,
    expected: str
) -> None:
    url = f"sqlite:///{tmp_path}/o.db"
    assert _abtune(capsys, "study", "create", str(write_study(tmp_path / "keep.yaml", name="keep")), "--storage", url)[0] == 0
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(TINY_BASE))
    (tmp_path / "empty.yaml").write_text("")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = abtune_main("study", "create", "bad.yaml", "--storage", url, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("abtune: error: ") and expected in lines[0], result.stderr
    storage = open_storage(url)
    assert [s.study_name for s in storage.get_all_studies()] == ["keep"]
    assert len(trials_of(url, "keep")) == 2
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("method", "dotted", "dim", "expected"), [
    ("sbc", "method.delay", {"low": 2, "high": 20}, IntDistribution(2, 20)),
    ("sbc", "method.binarize", {"choices": [True, False]}, CategoricalDistribution([True, False])),
    ("powersgd", "method.rank", {"low": 1, "high": 4}, IntDistribution(1, 4)),
    ("ddp", "method.comm_hook", {"choices": ["allreduce"]}, CategoricalDistribution(["allreduce"])),
])
def test_every_method_s_fields_can_be_searched(tmp_path: Path, method: str, dotted: str, dim: dict,
                                                expected: object) -> None:
    spec = load_study_spec(write_study(tmp_path / "s.yaml", base={**TINY_BASE, "method": {"name": method}},
                                       space={dotted: dim}))
    assert build_distributions(spec, "s.yaml") == {dotted: expected}


def test_a_field_of_another_method_names_the_base_method(tmp_path: Path) -> None:
    spec = load_study_spec(write_study(tmp_path / "s.yaml", base={**TINY_BASE, "method": {"name": "sbc"}},
                                       space={"method.sigma_cutoff": {"low": 0.1, "high": 0.2}}))
    with pytest.raises(ConfigError, match="'sigma_cutoff' is not a field of method 'sbc'; valid: binarize, delay, name"):
        build_distributions(spec, "s.yaml")


def test_a_study_of_sbc_searching_its_delay_is_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/o.db"
    sbc = {**TINY_BASE, "method": {"name": "sbc"}}
    space = {"method.delay": {"low": 2, "high": 20}}
    refused = write_study(tmp_path / "r.yaml", base=sbc, space=space)
    code, _, err = _abtune(capsys, "study", "create", str(refused), "--storage", url)
    assert code == 2 and err.count("\n") == 1
    assert "references.paper_defaults needs an AB method in the base config (method.name: ab), got sbc" in err

    study = write_study(tmp_path / "s.yaml", base=sbc, space=space, references={"paper_defaults": False, "ddp": True})
    code, out, err = _abtune(capsys, "study", "create", str(study), "--storage", url)
    assert code == 0 and "created study tiny" in out, err
    assert [t.user_attrs["reference"] for t in trials_of(url)] == [DDP]
    stored = study_attrs(url)[SPEC_ATTR]
    assert (stored["base"]["method"]["name"], list(stored["space"])) == ("sbc", ["method.delay"])


def test_best_speaks_of_a_traffic_budget_only_when_the_study_has_one(tmp_path: Path,
                                                                     abtune_main: Callable[..., CliResult]) -> None:
    plain = write_study(tmp_path / "plain.yaml", name="plain")
    assert abtune_main("study", "create", str(plain), cwd=tmp_path).returncode == 0
    assert abtune_main("study", "best", "plain").stdout.strip() == "study plain has no completed search trial yet"

    budget = write_study(tmp_path / "budget.yaml", name="budget", constraints={"max_inter_node_mb": 10}, sampler={"name": "tpe"},
                         references={"paper_defaults": False, "ddp": False})
    assert abtune_main("study", "create", str(budget)).returncode == 0
    over = create_trial(params={"method.warmup_frac": 0.2}, distributions={"method.warmup_frac": FloatDistribution(0.1, 0.3)},
                        value=0.9, user_attrs={"top1": 0.9, "inter_node_bytes": 50e6, "traffic_excess_mb": 40.0})
    optuna.load_study(study_name="budget", storage=f"sqlite:///{tmp_path / 'optuna.db'}").add_trial(over)
    assert abtune_main("study", "best", "budget").stdout.strip() == (
        "study budget has no completed search trial yet within the traffic budget of 10 inter-node MB per rank "
        "(constraints.max_inter_node_mb)")


def test_a_bad_override_is_reported_against_the_study_file_and_a_bad_base_against_its_own(tmp_path: Path) -> None:
    quickstart = str(ROOT / "studies" / "run_quickstart.yaml")
    study = write_study(tmp_path / "s.yaml", base=quickstart, overrides={"train.steps": -5})
    with pytest.raises(ConfigError) as bad_override:
        load_study_spec(study)
    assert str(bad_override.value) == f"{study}: overrides: train.steps: Input should be greater than or equal to 1 (got -5)"
    (tmp_path / "base.yaml").write_text("name: b\ntrain: {steps: 0}\n")
    study = write_study(tmp_path / "s.yaml", base="base.yaml", overrides={"train.local_batch_size": 8})
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'base.yaml'}: train.steps: Input should be greater"):
        load_study_spec(study)


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({}, "--nproc 2 --ranks-per-node 1"),  # a study from before the launcher was recorded: local
        ({"launcher": "local"}, "--nproc 2 --ranks-per-node 1"),
        ({"launcher": "emulated"}, "--launcher emulated --nproc 2 --ranks-per-node 1"),
        ({"launcher": "/p/mycluster.yaml", "slurm_job_id": "812_3"}, "--launcher /p/mycluster.yaml"),
    ],
)
def test_best_says_how_to_run_the_best_trial_again_where_it_ran(tmp_path: Path, abtune_main: Callable[..., CliResult],
                                                               attrs: dict, expected: str) -> None:
    study = write_study(tmp_path / "s.yaml", references={"paper_defaults": False, "ddp": False})
    assert abtune_main("study", "create", str(study), cwd=tmp_path).returncode == 0
    trial = create_trial(params={"method.warmup_frac": 0.2}, distributions={"method.warmup_frac": FloatDistribution(0.1, 0.3)},
                         value=0.9, user_attrs={"top1": 0.9, "inter_node_bytes": 5e6, "compression": 1.0,
                                                "run_dir": "runs/studies/tiny/trials/0", **attrs})
    optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'optuna.db'}").add_trial(trial)
    out = abtune_main("study", "best", "tiny").stdout
    assert f"run it again: abtune train runs/studies/tiny/trials/0/config.yaml {expected}\n" in out


def test_status_names_a_dead_workers_trial_and_the_latest_failure_reasons(
        tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    study_file = write_study(tmp_path / "s.yaml", references={"paper_defaults": False, "ddp": False})
    assert abtune_main("study", "create", str(study_file), "--storage", url, cwd=tmp_path).returncode == 0
    study = optuna.load_study(study_name="tiny", storage=open_storage(url))
    reasons = [f"the job exited with code {code}" for code in range(1, 6)]
    for reason in reasons:
        study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={FAIL_REASON_ATTR: reason}))
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={FAIL_REASON_ATTR: "not run", OVER_BUDGET_ATTR: True}))
    worker = gone_worker()
    orphan = study.ask()
    study._storage.set_trial_system_attr(orphan._trial_id, WORKER_ATTR, worker)
    status = abtune_main("study", "status", "tiny", "--storage", url).stdout
    start = f"{study.trials[orphan.number].datetime_start:%H:%M:%S}"
    assert (f"running: trial 6 on {worker['host']}:{worker['pid']} since {start}; its worker is gone (the next "
            "`abtune study run` re-attaches its job or retries it)\n") in status, status
    assert "latest failures (3 of 5; every one: abtune study export tiny):\n" in status, status
    shown = [line.strip() for line in status.splitlines() if line.startswith("  trial ")]
    assert [line.split(": ", 1) for line in shown] == [
        [f"trial {n} ({study.trials[n].datetime_complete:%H:%M:%S})", reasons[n]] for n in (2, 3, 4)]
