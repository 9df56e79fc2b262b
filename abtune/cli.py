"""The `abtune` command line: one small function per subcommand.

User errors end in one line on stderr and exit code 2; failed runs in one line and exit code 1;
never a traceback for either.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import yaml

from abtune import prose
from abtune.config import RunConfig, load_run_config
from abtune.errors import INTERRUPTED_EXIT, AbtuneError, ConfigError, TrainingFailed
from abtune.exiting import exit_after_handlers
from abtune.launch.base import Job, Launcher, Layout
from abtune.launch.launchers import JOBS_DIR, load_launcher
from abtune.launch.profiles import add_launcher_argument, check_fits
from abtune.launch.warm import owned_server
from abtune.methods import METHOD_NAMES
from abtune.promote.plan import STRATEGIES
from abtune.redact import redact, redacting_excepthook
from abtune.rundir import DEFAULT_RUNS_DIR, check_no_run_in, check_resumable, check_writable, default_run_dir
from abtune.runfiles import CONFIG_FILE, HOOKS_FILE, latest_checkpoint_step, read_summary, summary_path
from abtune.runlock import release_run
from abtune.runs import FAILED, FINISHED, KILLED, Run, status_of
from abtune.study.cli import add_rule_arguments, register_study_commands, rule_of
from abtune.study.storage import resolve_storage_url
from abtune.timing import check_fits as fits_cluster
from abtune.timing import load_cluster
from abtune.tracking import LaunchInfo, Tracking
from abtune.tracking.uri import add_tracking_arguments, tracking_arguments
from abtune.yamlfile import parse_yaml

BROKEN_PIPE_EXIT = 1  # what rich, which prints our tables, exits with when the reader of stdout left


def _overrides(pairs: list[str]) -> dict[str, Any]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set train.steps=600")
        result[key] = parse_yaml(value, f"--set {key}")
    return result


def cmd_train(args: argparse.Namespace) -> int:
    from abtune.tracking import open_tracking

    config = load_run_config(args.config, _overrides(args.set))
    launcher = load_launcher(args.launcher)
    layout = launcher.layout(args.nproc, args.ranks_per_node)
    run_dir, unchecked = _check_before_start(args, config, launcher, layout)
    if args.dry_run:
        if unchecked is not None:
            print(f"abtune: note: {unchecked}", file=sys.stderr)
        print(launcher.describe(run_dir, layout, config.name), end="")
        return 0
    if args.detach and not launcher.jobs_outlive_driver:
        raise ConfigError(f"--detach: a {launcher.kind} run ends with this command; --detach is for slurm profiles")
    if not args.resume:
        check_no_run_in(run_dir)  # before MLflow's import and store: seconds for a one-line refusal
    tracking = open_tracking(args.tracking_uri, enabled=not args.no_tracking)
    run = Run.prepare(config, run_dir, launcher, layout, resume=args.resume, claim=True)
    try:
        return _launch(run, args, tracking, config)
    finally:
        release_run(run.run_dir)  # the launch is over; rank 0 holds the run while it lives (runlock)


def _launch(run: Run, args: argparse.Namespace, tracking: Tracking, config: RunConfig) -> int:
    resumed_from = run.previous_tracking_run()
    run.track(tracking, tracking.start_run(
        config, experiment=config.name, run_name=run.run_dir.name,
        launch_info=LaunchInfo(run.launcher.kind, run.layout.world_size, run.layout.ranks_per_node),
        tags={"abtune.run_dir": str(run.run_dir.resolve()),
              **({"abtune.resumed_from": resumed_from} if resumed_from else {})}))
    if args.detach:
        return _submit_detached(run)  # rank 0 of the job logs into the tracking run
    code = _train_in_foreground(run, args)
    if code == 0 and run.run_id is not None:
        print(_mlflow_line(tracking, f"run {run.run_id}", config.name))
    return code


def _mlflow_line(tracking: Tracking, what: str, experiment: str) -> str:
    where = tracking.describe()
    see = f"open {where}" if where.startswith("http") else f"abtune ui --tracking-uri {where}"
    return f"MLflow: {what} in experiment {experiment!r} at {where} (see it: `{see}`)"


def _check_before_start(args: argparse.Namespace, config: RunConfig, launcher: Launcher,
                        layout: Layout) -> tuple[Path, str | None]:
    """What would fail later, refused now in one line (`--dry-run` too): AB's groups and `train.cluster` on
    this layout, a folder that cannot be written, `--resume` without a checkpoint, a run the launcher can
    never start. Returns the run folder and what could not be checked."""
    check_fits(config, layout)
    if args.resume and args.run_dir is None:
        raise ConfigError("--resume needs --run-dir: the folder of the run to continue")
    run_dir = args.run_dir or default_run_dir(config)
    check_writable(run_dir, "--run-dir" if args.run_dir else "run folder")
    if args.resume:
        check_resumable(run_dir, config, layout.nodes, layout.ranks_per_node)
    return run_dir, launcher.check_request(layout, config)


def _train_in_foreground(run: Run, args: argparse.Namespace) -> int:
    """Run (locally: the ranks are our children; SLURM: submit and follow), print the summary, and tell
    tracking how it ended. A SLURM job survives Ctrl-C: only following stops."""
    status, ran = KILLED, True
    try:
        if run.launcher.jobs_outlive_driver:
            result = _submit(run).follow(sys.stdout, run.launcher.poll_s)
        else:
            result = run.run_here()
        status, ran = status_of(result), not result.never_started
    except KeyboardInterrupt:
        if run.job is not None and run.job.outlives_driver:
            stop = run.job.cancel_command()
            print(f"abtune: stopped following; {run.job.describe()} keeps running"
                  + (f" ({stop} stops it)" if stop else ""), file=sys.stderr)
        else:
            step = latest_checkpoint_step(run.run_dir)
            print("abtune: interrupted before the run's first checkpoint; nothing to resume in "
                  f"{run.run_dir}" if step is None else
                  f"abtune: interrupted; continue from step {step} with: {_train_command(args, run.run_dir)}",
                  file=sys.stderr)
        return INTERRUPTED_EXIT
    except ConfigError:
        status, ran = FAILED, False  # a refused submission: nothing ran, nothing to resume or replay
        raise
    finally:
        run.finish(status, ran=ran)
    if result.never_started:  # as a refused submission: the same --run-dir works again
        if not run.resume:
            _discard_unstarted(run.run_dir)
        raise ConfigError(result.reason or "the job could never start")
    if not result.ok:
        failure = ConfigError if result.exit_code == ConfigError.exit_code else TrainingFailed
        step = latest_checkpoint_step(run.run_dir)
        resume = ("no checkpoint to resume from" if step is None else
                  f"continue from step {step} with: {_train_command(args, run.run_dir)}")
        raise failure(f"{result.reason or 'the run failed'} (run folder {run.run_dir}; {resume})")
    return _print_summary(run.run_dir)


def _train_command(args: argparse.Namespace, run_dir: Path) -> str:
    """The `abtune train ... --resume` that continues this run: the command as given (launcher, layout,
    overrides, tracking; a password in the tracking URI masked), quoted for a shell."""
    words = ["abtune", "train", str(args.config)]
    if args.launcher != "local":
        words += ["--launcher", args.launcher]
    for flag, value in (("--nproc", args.nproc), ("--ranks-per-node", args.ranks_per_node)):
        if value is not None:
            words += [flag, str(value)]
    words += ["--run-dir", str(run_dir), *(w for pair in args.set for w in ("--set", pair))]
    return shlex.join([*words, *tracking_arguments(args), "--resume"])


def _submit(run: Run) -> Job:
    """Submit and say so; a refused submission of a new run leaves nothing behind, so the same --run-dir
    works again."""
    from abtune.launch.base import SubmissionFailed

    try:
        job = run.submit()
    except SubmissionFailed as error:
        if not run.resume:
            _discard_unstarted(run.run_dir)
        raise ConfigError(str(error)) from None
    print(f"submitted {job.describe()}: {run.layout.nodes} node(s) x {run.layout.ranks_per_node} rank(s), "
          f"run folder {run.run_dir}, logs {run.run_dir / JOBS_DIR}", flush=True)
    return job


def _submit_detached(run: Run) -> int:
    """Submit and return; the job's own successor finishes its tracking run (Run.finish_after_job)."""
    from abtune.launch.base import SubmissionFailed

    try:
        watch = _submit(run).watch_command()
    except ConfigError:
        run.finish(FAILED, ran=False)  # refused: nothing will ever log into it
        raise
    print((f"follow with: {watch}; " if watch else "") + f"the result appears in {summary_path(run.run_dir)}")
    try:
        closer = run.finish_after_job()
    except SubmissionFailed as error:
        print(f"abtune: warning: MLflow run {run.run_id} stays RUNNING after the job ends: {error}", file=sys.stderr)
        return 0
    if closer is not None:
        print(f"MLflow run {run.run_id} is finished by {closer.describe()} once the job ends, however it ends")
    return 0


def _print_summary(run_dir: Path) -> int:
    from abtune.training.run_tables import print_summary

    print_summary(read_summary(run_dir), run_dir)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from abtune import compare
    from abtune.tracking import open_tracking

    methods = compare.parse_methods(args.methods)
    shared, per_method = compare.split_overrides(_overrides(args.set), methods)
    base = load_run_config(args.config, shared)
    launcher = load_launcher(args.launcher)
    if launcher.kind != "local":  # the methods run here, one after another, on simulated nodes
        raise ConfigError(f"--launcher {args.launcher}: compare runs on local profiles (local, emulated)")
    layout = launcher.layout(args.nproc, args.ranks_per_node)
    configs = {m: compare.method_config(base, m, per_method[m]) for m in methods}
    for config in configs.values():
        check_fits(config, layout)
        launcher.check_request(layout, config)
    cluster = load_cluster(args.cluster) if args.cluster else None
    if cluster is not None:
        fits_cluster(layout.nodes, layout.ranks_per_node, cluster)
    out_dir = args.out or DEFAULT_RUNS_DIR / f"{base.name}-compare-{time.strftime('%Y%m%d-%H%M%S')}"
    check_writable(out_dir, "--out")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(f"{out_dir} is not empty; choose another --out")
    tracking = open_tracking(args.tracking_uri, enabled=not args.no_tracking)
    experiment = next(iter(configs.values())).name
    out_dir.mkdir(parents=True, exist_ok=True)
    group = tracking.start_group(experiment, out_dir.name, {"abtune.role": "compare", "abtune.compare_dir": str(out_dir.resolve())})
    train = functools.partial(_train_one, launcher=launcher, layout=layout, tracking=tracking, group=group)
    try:
        rows = compare.run_methods(configs, out_dir, train, cluster)
    except KeyboardInterrupt:
        tracking.finish_group(group, [], KILLED)
        print(f"abtune: interrupted; finished runs are in {out_dir}", file=sys.stderr)
        return INTERRUPTED_EXIT
    compare.print_table(rows, args.wide)
    if cluster is not None:
        for line in compare.prediction_lines(compare.finished_predictions(out_dir, rows, cluster)):
            print(line)
        for line in compare.break_even_lines(out_dir, rows, cluster):
            print(line)
    written = compare.write_outputs(rows, out_dir)
    for path in written:
        prose.say(f"wrote {prose.shown_path(path)}")
    failed = [r.method for r in rows if r.error is not None]
    tracking.finish_group(group, written, FAILED if failed else FINISHED)
    if group is not None:
        prose.say(_mlflow_line(tracking, f"comparison {group} (a run per method inside it)", experiment))
    if failed:
        raise AbtuneError(f"{', '.join(failed)} failed (see the table); the other results are in {out_dir}")
    return 0


def _train_one(config: RunConfig, run_dir: Path, *, launcher: Launcher, layout: Layout, tracking: Tracking,
               group: str | None) -> None:
    """One method of `abtune compare` in the foreground, an MLflow run inside the comparison's; raises when
    it failed."""
    run = Run.prepare(config, run_dir, launcher, layout)
    run.track(tracking, tracking.start_run(
        config, experiment=config.name, run_name=config.method.name, parent_run_id=group,
        launch_info=LaunchInfo(launcher.kind, layout.world_size, layout.ranks_per_node),
        tags={"abtune.role": "compare-method", "abtune.run_dir": str(run_dir.resolve())}))
    status = KILLED
    try:
        result = run.run_here()
        status = status_of(result)
    finally:
        run.finish(status)
    if not result.ok:
        raise TrainingFailed(result.reason or "the run failed")


def cmd_promote(args: argparse.Namespace) -> int:
    from abtune.promote import campaign as runner
    from abtune.promote.campaign_table import print_campaign
    from abtune.promote.plan import parse_nodes, plan_campaign
    from abtune.promote.select import (
        chosen_by,
        inert_carried,
        load_study,
        promoted_from_study,
        selection_basis,
    )
    from abtune.promote.target import check_data_root, load_target, train_samples
    from abtune.tracking import open_tracking

    rule = rule_of(args)
    launcher = load_launcher(args.launcher)
    nodes = parse_nodes(args.nodes)
    target = load_target(args.to, args.data_root, args.ranks_per_node)
    study = load_study(args.study, resolve_storage_url(args.storage))
    promoted = promoted_from_study(study, args.top, rule)
    prose.say(chosen_by(study, promoted, rule))
    try:
        check_data_root(target, str(args.to))
    except ConfigError as error:
        if not args.dry_run:
            raise
        prose.warn(f"{error} (a real campaign stops here)")
    if (basis := selection_basis(study)) is not None:
        prose.warn(basis)
    for line in inert_carried(study, promoted):
        prose.warn(line)
    campaign, configs = plan_campaign(target, str(args.to), promoted, nodes, args.scaling, train_samples(target),
                                      study=args.study)
    check_writable(args.campaign_dir or DEFAULT_RUNS_DIR, "--campaign-dir" if args.campaign_dir else "runs folder")
    print_campaign(campaign, "dry run (nothing written): " if args.dry_run else "", args.wide)
    from abtune.promote.cost import gpu_hours_lines
    prose.say("\n".join(gpu_hours_lines(campaign, configs, args.cluster)))
    if args.dry_run:
        _print_campaign_scripts(campaign, launcher, args.campaign_dir or DEFAULT_RUNS_DIR / "CAMPAIGN")
        return 0
    out = args.campaign_dir or DEFAULT_RUNS_DIR / f"{args.study}-{target.name}-{args.scaling}-{time.strftime('%Y%m%d-%H%M%S')}"
    runner.write_campaign(out, campaign, configs)
    try:
        outcomes = runner.run_campaign(out, campaign, launcher, show_progress=sys.stdout.isatty(),
                                       tracking=open_tracking(args.tracking_uri, enabled=not args.no_tracking))
    except KeyboardInterrupt:
        print(f"abtune: interrupted; finished runs are in {out} (abtune report scaling {out})", file=sys.stderr)
        return INTERRUPTED_EXIT
    failed = [f"{name} ({o.reason})" for name, o in outcomes.items() if not o.ok]
    print(f"campaign in {out}: {len(outcomes) - len(failed)} of {len(outcomes)} runs finished; "
          f"report with: abtune report scaling {out}")
    if failed:
        raise AbtuneError(f"{len(failed)} run(s) failed: {'; '.join(failed)}")
    return 0


def _print_campaign_scripts(campaign: Any, launcher: Launcher, campaign_dir: Path) -> None:
    """The batch script of every run (SLURM), as the campaign would submit it."""
    for run in campaign.runs:
        layout = Layout(run.nodes, run.ranks_per_node)
        script = launcher.resized(layout).batch_script(campaign_dir / run.run_dir, layout)
        if script is not None:
            print(f"# --- {run.name}: {run.nodes} node(s) x {run.ranks_per_node} ---")
            print(script, end="")


def cmd_report_scaling(args: argparse.Namespace) -> int:
    from abtune.promote import scaling_report
    from abtune.promote.campaign import read_campaign
    from abtune.tracking import open_tracking

    rows = scaling_report.collect_rows(args.campaigns)
    if not rows:
        raise ConfigError(f"{args.campaigns[0]}: the campaign holds no runs")
    out = args.out or args.campaigns[0]
    out.mkdir(parents=True, exist_ok=True)
    paths = scaling_report.write_report(rows, out)
    print(paths[0].read_text(), end="")
    for path in paths:
        print(f"wrote {path}")
    tracking = open_tracking(args.tracking_uri, enabled=not args.no_tracking)
    targets = sorted({read_campaign(c).target for c in args.campaigns})
    run_id = tracking.log_report(f"scaling-{targets[0]}" if len(targets) == 1 else "scaling-reports", "scaling-report",
                                 paths, {"abtune.campaigns": ", ".join(str(c.resolve()) for c in args.campaigns)})
    if run_id is not None:
        print(f"MLflow: report run {run_id} at {tracking.describe()}")
    return 0


def _discard_unstarted(run_dir: Path) -> None:
    """Nothing ran: remove what prepare_run_dir and submitit made, so the same --run-dir works next time."""
    from abtune.runlock import LOCK_FILE

    for made in (CONFIG_FILE, HOOKS_FILE, LOCK_FILE):
        (run_dir / made).unlink(missing_ok=True)
    shutil.rmtree(run_dir / JOBS_DIR, ignore_errors=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()  # only if empty: never a folder the user had filled


def cmd_ui(args: argparse.Namespace) -> int:
    from abtune.ui import choose_stores, serve

    return serve(*choose_stores(args.tracking_uri, args.storage), args.host)


def cmd_config_show(args: argparse.Namespace) -> int:
    config = load_run_config(args.config) if args.config else RunConfig()
    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")
    return 0


class RedactingParser(argparse.ArgumentParser):
    """argparse quotes the arguments it refuses (unknown, ambiguous, an invalid choice): a storage or tracking
    URL beside a typo would show its password. Subcommands' parsers are of the same class."""

    def error(self, message: str) -> NoReturn:
        super().error(redact(message))


DESCRIPTION = """\
Find and scale hyperparameters for communication-efficient distributed
training: AB-training searched with Optuna, compared with DDP, SBC, PowerSGD
and fp16, every inter-node byte counted; on local processes, an emulated
interconnect or SLURM, every run recorded in MLflow."""

# (command, what it does): the epilog of `abtune --help`; tests/test_docs.py parses each command.
EXAMPLES = (
    ("abtune study create studies/quickstart.yaml && abtune study run quickstart",
     "the quickstart: 8 trials of a small ViT, 4 processes as 2 nodes"),
    ("abtune study best quickstart", "the recommended configuration and the Pareto front"),
    ("abtune train studies/run_quickstart.yaml --nproc 4 --ranks-per-node 2",
     "one AB-training run on 2 simulated nodes"),
    ("abtune compare studies/run_quickstart.yaml --nproc 4 --ranks-per-node 2",
     "DDP, AB, AB without groups, SBC, PowerSGD and fp16 side by side"),
    ("abtune train studies/run_quickstart.yaml --launcher slurm --dry-run",
     "the sbatch script a SLURM run would submit, nothing submitted"),
    ("abtune ui", "MLflow and optuna-dashboard over ./mlflow.db and ./optuna.db"),
)
EPILOG = "examples:\n" + "".join(f"  {command}\n      {what}\n" for command, what in EXAMPLES) + """
`abtune COMMAND --help` gives a command's options. The documentation is
README.md and docs/ in the checkout (`mkdocs serve` shows it as a site)."""


def build_parser() -> argparse.ArgumentParser:
    parser = RedactingParser(prog="abtune", description=DESCRIPTION, epilog=EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train one run (local processes, in-process debug, or SLURM)")
    train.add_argument("config", type=Path, help="run config YAML")
    add_launcher_argument(train, "launcher profile: local (default), emulated, debug, slurm, or a YAML file")
    train.add_argument("--nproc", type=int, default=None, help="local: number of ranks (processes; default 1)")
    train.add_argument("--ranks-per-node", type=int, default=None, help="local: ranks per simulated node (default: all)")
    train.add_argument("--run-dir", type=Path, default=None, help="output folder (default: runs/NAME-METHOD-TIME)")
    train.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its checkpoint")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    train.add_argument("--dry-run", action="store_true", help="print what would start (SLURM: the sbatch script); change nothing")
    train.add_argument("--detach", action="store_true", help="SLURM: submit, print the job id and return")
    add_tracking_arguments(train)
    train.set_defaults(func=cmd_train)

    comp = commands.add_parser("compare", help="train one config with several methods and compare them")
    comp.add_argument("config", type=Path, help="run config YAML")
    comp.add_argument("--methods", default=",".join(METHOD_NAMES),
                      help="comma-separated methods (default: %(default)s)")
    comp.add_argument("--nproc", type=int, default=1, help="number of ranks (processes)")
    comp.add_argument("--ranks-per-node", type=int, default=None, help="ranks per simulated node (default: all)")
    add_launcher_argument(comp, "a local profile: local (default), emulated (an emulated, shaped interconnect)")
    comp.add_argument("--out", type=Path, default=None, help="output folder (default: runs/NAME-compare-TIME)")
    comp.add_argument("--cluster", default=None, metavar="NAME|PATH",
                      help="also predict each method's time on this cluster (clusters/NAME.yaml) and the link rate "
                           "at which ab's time equals ddp's")
    comp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config field; METHOD.key=value sets a field of one method (sbc.delay=20)")
    comp.add_argument("--wide", action="store_true", help="every column of the table, however wide")
    add_tracking_arguments(comp)
    comp.set_defaults(func=cmd_compare)

    promote = commands.add_parser("promote", help="turn a study's best configurations into a scaling campaign")
    promote.add_argument("study", help="study name")
    promote.add_argument("--top", type=int, default=1, help="configurations to promote (default: %(default)s)")
    promote.add_argument("--to", type=Path, required=True, help="scaling target YAML, e.g. studies/imagenet_vit_b16.yaml")
    promote.add_argument("--nodes", default="2,4,8,16,32", help="node counts (default: %(default)s)")
    promote.add_argument("--scaling", choices=STRATEGIES, required=True,
                         help="constant local batch (global grows) or constant global batch (local shrinks)")
    add_rule_arguments(promote)
    promote.add_argument("--wide", action="store_true", help="every column of the campaign table, however wide")
    promote.add_argument("--storage", default=None, help="Optuna storage URL (default: $ABTUNE_STORAGE or sqlite:///optuna.db)")
    add_launcher_argument(promote, "launcher profile: local (default), emulated, debug, slurm, or a YAML file")
    promote.add_argument("--campaign-dir", type=Path, default=None, help="output folder (default: runs/STUDY-TARGET-SCALING-TIME)")
    promote.add_argument("--data-root", type=Path, default=None, help="the data folder (overrides the target's run.data.root)")
    promote.add_argument("--ranks-per-node", type=int, default=None, help="override the target's ranks per node (local tests)")
    promote.add_argument("--dry-run", action="store_true", help="print the campaign and change nothing")
    promote.add_argument("--cluster", default=None, metavar="NAME|PATH",
                         help="estimate GPU-hours on this cluster description (default: paper-a100-hdr200)")
    add_tracking_arguments(promote)
    promote.set_defaults(func=cmd_promote)

    report = commands.add_parser("report", help="reports over finished runs")
    report_commands = report.add_subparsers(dest="report_command", required=True)
    scaling = report_commands.add_parser("scaling", help="Table 1, accuracy, compression and figures of a campaign")
    scaling.add_argument("campaigns", type=Path, nargs="+", help="campaign folder(s) written by abtune promote")
    scaling.add_argument("--out", type=Path, default=None, help="where to write scaling.md/.csv/.png (default: the first campaign)")
    add_tracking_arguments(scaling)
    scaling.set_defaults(func=cmd_report_scaling)

    ui = commands.add_parser("ui", help="start the MLflow UI and optuna-dashboard on this machine")
    ui.add_argument("--tracking-uri", default=None, metavar="URI",
                    help="MLflow store (default: $MLFLOW_TRACKING_URI, else ./mlflow.db if it exists)")
    ui.add_argument("--storage", default=None, metavar="OPTUNA_URL",
                    help="Optuna storage for optuna-dashboard (default: $ABTUNE_STORAGE, else ./optuna.db if it exists)")
    ui.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    ui.set_defaults(func=cmd_ui)

    config = commands.add_parser("config", help="inspect run configs")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="print the resolved config (defaults filled in)")
    show.add_argument("config", type=Path, nargs="?", default=None)
    show.set_defaults(func=cmd_config_show)
    register_study_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    sys.excepthook = redacting_excepthook  # a traceback abtune did not expect must not show a password either
    args = build_parser().parse_args(argv)
    interruptible()
    try:
        with owned_server():  # ranks this command starts locally fork from one warm server
            return int(args.func(args))
    except AbtuneError as error:
        for line in str(error).splitlines():
            print(f"abtune: error: {redact(line)}", file=sys.stderr)  # a value quoted back may hold a URL's password
        return error.exit_code
    except BrokenPipeError:  # `abtune ... | head -1`: the reader left; what was done stays done, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit would fail too
        return BROKEN_PIPE_EXIT


def interruptible() -> None:
    """Ctrl-C (SIGINT) stops every command as its help says, even one started in the background, which inherits
    SIGINT ignored (`nohup abtune ... &`, a script's `&`): `kill -INT` stops it too, and what it starts does not
    inherit the ignore."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def entry() -> NoReturn:
    """The installed `abtune` command (and `python -m abtune.cli`): main(), then an exit that skips Python's
    finalization, 1-2 s of CPU after a command that imported torch (abtune/exiting.py). An exception that
    escapes main (a Ctrl-C outside a command's own handling) ends the way Python ends it."""
    exit_after_handlers(main())


if __name__ == "__main__":
    entry()
