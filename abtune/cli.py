"""The `abtune` command line: one small function per subcommand.

User errors end in one line on stderr and exit code 2; failed runs in one line and exit code 1;
never a traceback for either.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from abtune.config import RunConfig, flatten, load_run_config
from abtune.errors import AbtuneError, ConfigError
from abtune.launch.profiles import Layout, LocalProfile, Profile, SlurmProfile, check_fits, load_profile

DEFAULT_RUNS_DIR = Path("runs")
INTERRUPTED_EXIT = 130


def _parse_value(text: str) -> Any:
    return yaml.safe_load(text)


def _overrides(pairs: list[str]) -> dict[str, Any]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set method.sigma_cutoff=0.2")
        result[key] = _parse_value(value)
    return result


def _default_run_dir(config: RunConfig) -> Path:
    return DEFAULT_RUNS_DIR / f"{config.name}-{config.method.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _prepare_run_dir(config: RunConfig, run_dir: Path | None, resume: bool) -> Path:
    if run_dir is None:
        if resume:
            raise ConfigError("--resume needs --run-dir: the folder of the run to continue")
        run_dir = _default_run_dir(config)
    stored = run_dir / "config.yaml"
    if resume:
        _check_same_config(stored, config)
    elif stored.exists():
        raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    stored.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    shutil.rmtree(run_dir / "failures", ignore_errors=True)
    return run_dir


def _check_same_config(stored: Path, config: RunConfig) -> None:
    if not stored.exists():
        raise ConfigError(f"{stored.parent} holds no run to resume (no config.yaml)")
    before = flatten(load_run_config(stored))
    after = flatten(config)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if changed:
        raise ConfigError(
            f"the config differs from the run being resumed in {', '.join(changed)}; "
            "resume with the same config or start a new --run-dir"
        )


def _layout(profile: Profile, nproc: int | None, ranks_per_node: int | None) -> Layout:
    """Ranks and nodes: from --nproc/--ranks-per-node locally, from the profile on SLURM, 1 x 1 in debug."""
    if isinstance(profile, LocalProfile):
        from abtune.launch.local import check_layout

        nproc = nproc or 1
        ranks_per_node = ranks_per_node or nproc
        check_layout(nproc, ranks_per_node)
        return Layout(nproc // ranks_per_node, ranks_per_node)
    if nproc is not None or ranks_per_node is not None:
        where = "set nodes and tasks_per_node in the profile" if profile.kind == "slurm" else "debug runs one rank"
        raise ConfigError(f"--nproc and --ranks-per-node are for --launcher local; {where}")
    if isinstance(profile, SlurmProfile):
        return Layout(profile.nodes, profile.tasks_per_node)
    return Layout(1, 1)


def cmd_train(args: argparse.Namespace) -> int:
    config = load_run_config(args.config, _overrides(args.set))
    profile = load_profile(args.launcher)
    layout = _layout(profile, args.nproc, args.ranks_per_node)
    check_fits(config, layout)
    if args.dry_run:
        return _dry_run(config, profile, layout, args.run_dir or _default_run_dir(config))
    run_dir = _prepare_run_dir(config, args.run_dir, args.resume)
    if isinstance(profile, SlurmProfile):
        return _train_on_slurm(run_dir, layout, profile, args.resume, args.detach)
    try:
        if isinstance(profile, LocalProfile):
            _train_locally(run_dir, layout, args.resume)
        else:
            _train_in_process(run_dir, layout, profile, args.resume)
    except KeyboardInterrupt:
        print(f"abtune: interrupted; continue with: abtune train {args.config} --run-dir {run_dir} --resume",
              file=sys.stderr)
        return INTERRUPTED_EXIT
    except AbtuneError as error:
        raise type(error)(f"{error} (run folder {run_dir}; checkpoints allow --resume)") from None
    return _print_summary(run_dir)


def _print_summary(run_dir: Path) -> int:
    from abtune.training.report import print_summary

    print_summary(json.loads((run_dir / "summary.json").read_text()), run_dir)
    return 0


def _discard_unstarted(run_dir: Path) -> None:
    """Nothing ran: remove what _prepare_run_dir and submitit made, so the same --run-dir works next time."""
    from abtune.launch.submit import job_folder

    (run_dir / "config.yaml").unlink(missing_ok=True)
    shutil.rmtree(job_folder(run_dir), ignore_errors=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()  # only if empty: never a folder the user had filled


def _dry_run(config: RunConfig, profile: Profile, layout: Layout, run_dir: Path) -> int:
    """What would start, and nothing else: the sbatch script on SLURM."""
    if isinstance(profile, SlurmProfile):
        from abtune.launch.slurm import sbatch_script

        print(sbatch_script(run_dir, layout, profile), end="")
    else:
        print(f"{profile.kind}: {layout.world_size} rank(s) of run {config.name} in {run_dir} "
              f"({layout.nodes} simulated node(s) x {layout.ranks_per_node})")
    return 0


def _train_locally(run_dir: Path, layout: Layout, resume: bool) -> None:
    from abtune.launch.local import launch

    launch(run_dir, layout.world_size, layout.ranks_per_node, resume=resume)


def _train_in_process(run_dir: Path, layout: Layout, profile: Profile, resume: bool) -> None:
    from abtune.launch.submit import submit_run

    result = submit_run(run_dir, layout, profile, resume=resume).result()
    if not result.ok:
        raise AbtuneError(result.reason or "the run failed")


def _train_on_slurm(run_dir: Path, layout: Layout, profile: SlurmProfile, resume: bool, detach: bool) -> int:
    """Submit; unless detached, follow the job to its end and print the summary."""
    from abtune.launch.follow import follow
    from abtune.launch.slurm import SubmissionFailed
    from abtune.launch.submit import job_folder, submit_run

    try:
        job = submit_run(run_dir, layout, profile, resume=resume)
    except SubmissionFailed as error:
        if not resume:
            _discard_unstarted(run_dir)
        raise ConfigError(str(error)) from None
    print(f"submitted SLURM job {job.job_id}: {layout.nodes} node(s) x {layout.ranks_per_node} rank(s), "
          f"run folder {run_dir}, logs {job_folder(run_dir)}", flush=True)
    if detach:
        print(f"follow with: squeue -j {job.job_id}; the result appears in {run_dir / 'summary.json'}")
        return 0
    try:
        result = follow(job, run_dir)
    except KeyboardInterrupt:
        print(f"abtune: stopped following; SLURM job {job.job_id} keeps running (scancel {job.job_id} stops it)",
              file=sys.stderr)
        return INTERRUPTED_EXIT
    if not result.ok:
        raise AbtuneError(f"{result.reason} (run folder {run_dir}; checkpoints allow --resume)")
    return _print_summary(run_dir)


def cmd_config_show(args: argparse.Namespace) -> int:
    config = load_run_config(args.config) if args.config else RunConfig()
    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="abtune", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train one run (local processes, in-process debug, or SLURM)")
    train.add_argument("config", type=Path, help="run config YAML")
    train.add_argument("--launcher", default="local", metavar="NAME|PATH",
                       help="launcher profile: local (default), debug, slurm, or a YAML file")
    train.add_argument("--nproc", type=int, default=None, help="local: number of ranks (processes; default 1)")
    train.add_argument("--ranks-per-node", type=int, default=None, help="local: ranks per simulated node (default: all)")
    train.add_argument("--run-dir", type=Path, default=None, help="output folder (default: runs/NAME-METHOD-TIME)")
    train.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its checkpoint")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    train.add_argument("--dry-run", action="store_true", help="print what would start (SLURM: the sbatch script); change nothing")
    train.add_argument("--detach", action="store_true", help="SLURM: submit, print the job id and return")
    train.set_defaults(func=cmd_train)

    config = commands.add_parser("config", help="inspect run configs")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="print the resolved config (defaults filled in)")
    show.add_argument("config", type=Path, nargs="?", default=None)
    show.set_defaults(func=cmd_config_show)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except AbtuneError as error:
        for line in str(error).splitlines():
            print(f"abtune: error: {line}", file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
