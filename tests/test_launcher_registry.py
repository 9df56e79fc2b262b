"""The launcher registry and what it promises: every launcher is one class with its profile schema, found in
one table (launchers.LAUNCHERS); what only some schedulers can do is a capability (JobQueue, StudyWorkers);
a rank learns its job and node from abtune's own variables; and no module outside abtune/launch/slurm/ and
the command line names SLURM."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from abtune import dist, jobenv
from abtune.errors import ConfigError
from abtune.launch import launchers
from abtune.launch.base import Job, JobQueue, Launcher, Layout, StudyWorkers
from abtune.launch.local import rank_environment
from abtune.launch.profiles import BUILTIN_DIR
from abtune.launch.slurm import SlurmLauncher, SlurmProfile, capacity, sbatch
from abtune.schema import StrictModel

PACKAGE = Path(__file__).resolve().parent.parent / "abtune"


@pytest.mark.parametrize("kind", sorted(launchers.LAUNCHERS))
def test_every_registered_launcher_has_its_profile_schema(kind: str) -> None:
    launcher = launchers.LAUNCHERS[kind]
    assert issubclass(launcher.profile_type, StrictModel)
    assert launcher.profile_type.model_fields["kind"].default == kind == launcher.kind == launcher.job_type.kind
    assert not inspect.isabstract(launcher)  # the core is implemented, and every capability it declares
    if issubclass(launcher, StudyWorkers):
        assert issubclass(launcher, JobQueue) and launcher.worker_key


@pytest.mark.parametrize("path", sorted(BUILTIN_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_profile_parses_through_the_registry(path: Path) -> None:
    profile = launchers.load_profile(path.stem)
    assert type(profile) is launchers.LAUNCHERS[yaml.safe_load(path.read_text())["kind"]].profile_type
    assert type(launchers.launcher_for(profile)).profile_type is type(profile)


def test_an_unknown_kind_names_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"^x.yaml: kind: expected one of local, debug, slurm, gridengine \(got 'k8s'\)$"):
        launchers.parse_profile({"kind": "k8s"}, "x.yaml")


class _EchoProfile(StrictModel):
    kind: str = "echo"
    greeting: str = "hello"


class _EchoLauncher(Launcher):
    """A launcher added by one registry entry: its profiles parse, and nothing else needs to change."""

    kind = "echo"
    profile_type = _EchoProfile
    job_type: ClassVar[type[Job]] = Job

    def layout(self, nproc: int | None, ranks_per_node: int | None) -> Layout:
        return Layout(1, nproc or 1)

    def submit(self, run_dir: Path, layout: Layout, **options: Any) -> Job:
        raise NotImplementedError


def test_a_launcher_added_to_the_registry_reads_its_own_profiles(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(launchers.LAUNCHERS, "echo", _EchoLauncher)
    (tmp_path / "echo.yaml").write_text("kind: echo\ngreeting: hi\n")
    launcher = launchers.load_launcher(str(tmp_path / "echo.yaml"))
    assert isinstance(launcher, _EchoLauncher) and launcher.profile.greeting == "hi"
    assert launchers.job_queue(_EchoLauncher) is None and "echo" not in launchers.worker_launchers()
    with pytest.raises(ConfigError, match="which echo jobs do not; use a slurm profile, or run the study"):
        launchers.study_workers(launcher, "s")
    with pytest.raises(ConfigError, match="greeting: Input should be a valid string"):
        launchers.parse_profile({"kind": "echo", "greeting": 3}, "echo.yaml")


def test_a_rank_reads_its_job_and_node_from_the_variables_its_launcher_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracking hook records `slurm_job_id`, and dist.py reads the node, from abtune's own variables."""
    for name in (*jobenv.JOB_VARIABLES, jobenv.NODE_RANK, "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "812")
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    assert jobenv.job() is None and dist._node_rank_from_environment() == 0  # nothing read from SLURM itself
    identity = SlurmLauncher.rank_identity()
    assert identity == {jobenv.JOB_KIND: "slurm", jobenv.JOB_ID: "812", jobenv.NODE_RANK: "1", jobenv.NODE_NAME: "n2"}
    for name, value in identity.items():
        monkeypatch.setenv(name, value)
    assert jobenv.job_param() == ("slurm_job_id", "812")
    assert dist._node_rank_from_environment() == 1 and dist.node_name() == "n2"
    local = rank_environment(3, 4, 2, 29500)  # a local run started from inside that job is no job of it
    assert local[jobenv.NODE_RANK] == "1" and not set(jobenv.JOB_VARIABLES) & set(local)
    assert launchers.LAUNCHERS["local"].rank_identity() == {}


def test_a_worker_room_check_asks_sinfo_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []
    sinfo = "n1|debug*|4|8000|(null)|infinite|1-infinite\nn2|debug*|4|8000|(null)|infinite|1-infinite\n"
    monkeypatch.setattr(capacity, "slurm_output", lambda *args, **kwargs: calls.append(args) or sinfo)
    profile = SlurmProfile(nodes=2, tasks_per_node=2)
    with pytest.raises(ConfigError, match="4 worker"):
        capacity.check_workers_leave_room(profile, sbatch.worker_profile(profile), Layout(2, 2), 4, "abtune study run s")
    assert capacity.check_workers_leave_room(profile, sbatch.worker_profile(profile), Layout(2, 2), 1, "r") is None
    assert calls == [capacity.SINFO_NODES] * 2  # one per check, not one per question


def test_submitit_s_private_script_writer_takes_every_parameter_abtune_passes(tmp_path: Path) -> None:
    """`--dry-run` prints the script by submitit's private `_make_sbatch_string` (pyproject.toml bounds the
    version): a release that renames or drops one of its parameters fails here, not on a user's cluster."""
    from submitit.slurm.slurm import _make_sbatch_string

    profile = SlurmProfile(partition="gpu", account="a", qos="q", gpus_per_node=4, cpus_per_task=8, mem="64G",
                           sbatch={"constraint": "a100"})
    parameters = sbatch.sbatch_parameters(profile, Layout(2, 4), "job")
    assert set(parameters) <= set(inspect.signature(_make_sbatch_string).parameters)
    script = sbatch.written_script("python -u -m submitit.core._submit F", tmp_path, map_count=3, **parameters)
    for line in ("#SBATCH --partition=gpu", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --constraint=a100", "#SBATCH --array=0-2%3"):
        assert line in script.splitlines(), line


# --- no SLURM outside its package ----------------------------------------------------------------------
# The command line may name it (its help and advice speak to users). Beyond it, only:
ALLOWED = {
    "launch/launchers.py": "the registry's one entry for the SLURM launcher (its import and its line)",
    "study/cost.py": "advice to users: run a GPU study on a cluster with `study launch`, and that guide's page",
}
COMMAND_LINE = {"cli.py", "study/cli.py"}


def _docstrings(tree: ast.AST) -> set[int]:
    """Docstrings explain with examples (`SLURM job 812`); code and messages are what the check reads."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _words(node: ast.AST) -> list[str]:
    """The names, imported modules and strings a node spells."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.keyword):
        return [node.arg or ""]
    if isinstance(node, ast.alias):
        return [node.name, node.asname or ""]
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    return []


def slurm_named_outside_its_package() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("launch/slurm/") or where in COMMAND_LINE:
            continue
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        if any("slurm" in word.lower() for node in ast.walk(tree) if id(node) not in docstrings for word in _words(node)):
            found.add(where)
    return found


def test_no_module_outside_the_slurm_package_and_the_command_line_names_slurm() -> None:
    assert slurm_named_outside_its_package() == set(ALLOWED)


def test_the_check_sees_an_import_and_a_string_not_a_docstring() -> None:
    code = "from abtune.launch import slurm\nx = 'squeue -j 1'\nlabel = 'SLURM job'\ndef f():\n    '''SLURM: docs.'''\n"
    tree = ast.parse(code)
    docstrings = _docstrings(tree)
    spelled = [w for node in ast.walk(tree) if id(node) not in docstrings for w in _words(node) if "slurm" in w.lower()]
    assert sorted(spelled) == ["SLURM job", "slurm"]
