"""`abtune study ...`: one small function per subcommand, registered into abtune's parser by
`register_study_commands(commands)`. Every subcommand takes --storage (else $ABTUNE_STORAGE, else
sqlite:///optuna.db in the working directory); URLs are printed with their password masked."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from abtune.errors import INTERRUPTED_EXIT, AbtuneError, ConfigError
from abtune.launch.profiles import add_launcher_argument
from abtune.prose import say
from abtune.redact import redact
from abtune.study.ranking import DEFAULT_MARGIN, DEFAULT_RULE, RULES, Rule
from abtune.tracking.uri import add_tracking_arguments, tracking_arguments
from abtune.words import plural

COST_HELP = "estimate the study's time on this cluster description (clusters/NAME.yaml) instead of here"

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from abtune.tracking import Tracking

MARGIN_RULE = "within-margin"  # the one rule that reads --margin


def add_rule_arguments(parser: argparse.ArgumentParser) -> None:
    """--rule and --margin: how `study best`, `study status`, `study confirm` and `promote` choose from a Pareto front."""
    parser.add_argument("--rule", choices=RULES, default=DEFAULT_RULE.name,
                        help="how to choose from a multi-objective study's Pareto front (default: %(default)s: the "
                             "least traffic within --margin top-1 of the best top-1)")
    parser.add_argument("--margin", type=float, default=None,
                        help=f"top-1 difference for --rule within-margin (default: {DEFAULT_MARGIN}, one point)")


def rule_of(args: argparse.Namespace) -> Rule:
    if args.margin is None:
        return Rule(args.rule)
    if args.rule != MARGIN_RULE:
        print(f"abtune: note: --margin is read by --rule {MARGIN_RULE} only; --rule {args.rule} ignores it",
              file=sys.stderr)
    return Rule(args.rule, args.margin)


def _storage(args: argparse.Namespace, create: bool = False, from_file: str | None = None):  # noqa: ANN202
    from abtune.study.storage import open_storage, quiet_optuna, resolve_storage_url

    quiet_optuna()
    url = resolve_storage_url(args.storage, from_file)
    return open_storage(url, create=create), url


def _shown(url: str) -> str:
    from abtune.study.storage import absolute_url

    return redact(absolute_url(url))


def cmd_create(args: argparse.Namespace) -> int:
    from abtune.study import lifecycle
    from abtune.study.spec import load_study_spec
    from abtune.study.storage import quiet_optuna, resolve_storage_url

    quiet_optuna()
    url = resolve_storage_url(args.storage, load_study_spec(args.study_file).storage)
    storage_before = _budget_if_exists(args, url)
    old = _warm_start_study(args, url)
    name, created = lifecycle.create(args.study_file, args.name, url, args.force, old)
    where = _shown(url)
    if not created:
        old = storage_before.get(name)
        new = lifecycle.budget(_storage(args)[0], name)
        if old is not None and old != new:
            print(f"study {name} in {where}: budget set to {plural(new, 'trial')} (was {old}); its trials are kept")
        else:
            print(f"study {name} already exists in {where} with this definition; nothing to do")
        return 0
    print(f"created study {name} in {where}")
    from abtune.study.storage import open_storage

    storage = open_storage(url)
    study_id = storage.get_study_id_from_name(name)
    if old is not None:
        from abtune.attrs import WARM_START_ATTR

        warm = [t.user_attrs[WARM_START_ATTR] for t in storage.get_all_trials(study_id) if WARM_START_ATTR in t.user_attrs]
        print(f"warm start: {plural(len(warm), 'trial')} of study {old.study_name} enqueued first ({', '.join(warm)}: "
              "its confirmed picks, then its Pareto front)")
    from abtune.study import cost

    cost.announce(load_study_spec(args.study_file), name, args.cluster, cost.KeptProbe(storage, study_id))
    storage_flag = f" --storage '{where}'" if args.storage else ""
    print(f"run it: abtune study run {name}{storage_flag}")
    return 0


def _warm_start_study(args: argparse.Namespace, url: str):  # noqa: ANN202 - optuna.Study | None
    """The finished study `--warm-start OLD` names, in --warm-start-storage (default: the new study's storage)."""
    if args.warm_start is None:
        return None
    import optuna

    from abtune.study.storage import open_storage, require_study, resolve_storage_url

    old_url = resolve_storage_url(args.warm_start_storage, None) if args.warm_start_storage else url
    storage = open_storage(old_url)
    require_study(storage, args.warm_start, old_url)
    return optuna.load_study(study_name=args.warm_start, storage=storage)


def _budget_if_exists(args: argparse.Namespace, url: str) -> dict[str, int]:
    """{name: budget} of the study a `study create` would meet in the storage (none when there is none)."""
    from abtune.study import lifecycle
    from abtune.study.spec import load_study_spec
    from abtune.study.storage import open_storage

    name = args.name or load_study_spec(args.study_file).name or args.study_file.stem
    try:
        return {name: lifecycle.budget(open_storage(url), name)}
    except (KeyError, ConfigError):  # no such study (or no storage yet): nothing to compare with
        return {}


def cmd_run(args: argparse.Namespace) -> int:
    from abtune.launch.launchers import load_launcher
    from abtune.study.report.best import print_best
    from abtune.study.runner import StudyRunner
    from abtune.study.storage import require_study

    launcher = load_launcher(args.launcher)
    storage, url = _storage(args)
    study_id = require_study(storage, args.name, url)
    if args.parallel < 1 or (args.trials is not None and args.trials < 1):
        raise ConfigError("--parallel and --trials must be at least 1")
    _grow(args, storage)
    if _spent(storage, study_id):
        print(f"study {args.name}: budget spent, nothing ran; add trials with `{_run_command(args, url)} "
              "--add-trials N`")
        print_best(storage, args.name, DEFAULT_RULE)
        return 0
    from abtune.study import cost
    cost.check_local_run(cost.stored_spec_of(storage, args.name), args.name, launcher.kind, args.cluster,
                         args.parallel, args.yes, cost.KeptProbe(storage, study_id))
    from abtune.tracking import open_tracking

    tracking = open_tracking(args.tracking_uri, enabled=not args.no_tracking)
    again = _run_command(args, url)
    runner = StudyRunner(storage, args.name, url, args.parallel, args.trials, launcher, tracking=tracking)
    try:
        finished = runner.run()
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        print(f"abtune: aborted; trials still RUNNING are re-attached (SLURM jobs) or failed and retried by the "
              f"next `{again}`", file=sys.stderr)
        return INTERRUPTED_EXIT
    if runner.left_running:
        jobs = f"{runner.left_running[0].label}(s) {', '.join(job.job_id for job in runner.left_running)}"
        print(f"abtune: stopped following; {jobs} keep running and their "
              f"trials stay RUNNING. Re-attach with: {again}", file=sys.stderr)
        return INTERRUPTED_EXIT
    if not finished:
        print(f"abtune: interrupted; no trial is left running. Continue with: {again}", file=sys.stderr)
        return INTERRUPTED_EXIT
    print_best(storage, args.name, DEFAULT_RULE)
    return 0


def _grow(args: argparse.Namespace, storage: BaseStorage) -> None:
    """--add-trials N: the budget grows by N first, every trial kept."""
    if args.add_trials is None:
        return
    from abtune.study import lifecycle

    old, new = lifecycle.add_trials(storage, args.name, args.add_trials)
    print(f"study {args.name}: budget raised from {old} to {new} trials; every trial so far is kept")


def _spent(storage: BaseStorage, study_id: int) -> bool:
    """Nothing for a runner to do: no waiting trial, no trial to re-attach, no budget left."""
    from abtune.study.definition import stored_spec
    from abtune.study.worker_array import work_left

    return not work_left(storage.get_all_trials(study_id, deepcopy=False), stored_spec(storage, study_id).trials)


def _run_command(args: argparse.Namespace, url: str) -> str:
    """The `abtune study run` that carries on where this one stopped: its launcher, storage and tracking (a
    password masked), quoted for a shell."""
    words = ["abtune", "study", "run", args.name]
    if args.launcher != "local":
        words += ["--launcher", args.launcher]
    if args.storage:
        words += ["--storage", _shown(url)]
    return shlex.join([*words, *tracking_arguments(args)])


def cmd_launch(args: argparse.Namespace) -> int:
    from abtune.launch.base import SubmissionFailed
    from abtune.launch.launchers import load_launcher
    from abtune.rundir import check_writable
    from abtune.study import worker_array
    from abtune.study.definition import stored_spec, stored_study_dir
    from abtune.study.storage import require_study

    launcher = load_launcher(args.launcher)
    workers = worker_array.require_workers(launcher, args.name)
    if args.workers < 1 or (args.trials is not None and args.trials < 1):
        raise ConfigError("--workers and --trials must be at least 1")
    storage, url = _storage(args)
    study_id = require_study(storage, args.name, url)
    if args.dry_run and args.add_trials is not None:
        raise ConfigError("--add-trials changes the study's budget; a --dry-run changes nothing: drop one of them")
    _grow(args, storage)
    spec, study_dir = stored_spec(storage, study_id), stored_study_dir(storage, study_id)
    check_writable(study_dir, "study_dir")  # the workers write their logs and the trials' folders there
    layout = worker_array.check_study_fits(spec, launcher, args.name)
    unchecked = launcher.check_request(layout)
    if unchecked is None:
        unchecked = workers.check_worker_room(layout, args.workers, f"abtune study run {args.name} --launcher {args.launcher}")
    else:
        unchecked += ", nor the room workers leave trials"
    if unchecked is not None and args.dry_run:  # a real launch asks the cluster itself, and fails there if it must
        print(f"abtune: note: {unchecked}", file=sys.stderr)
    if not worker_array.work_left(storage.get_all_trials(study_id, deepcopy=False), spec.trials):
        print(f"study {args.name}: budget spent ({plural(spec.trials, 'trial')}), nothing launched; add trials with "
              f"`abtune study launch {args.name} --add-trials N` (see abtune study best {args.name})")
        return 0
    if args.dry_run:
        print(worker_array.dry_run(study_dir, args.name, launcher, args.workers, layout), end="")
        return 0
    from abtune.tracking import open_tracking

    tracking = open_tracking(args.tracking_uri, enabled=not args.no_tracking)  # checks the store; exports its URI
    # The study's parent run exists before the workers do: workers starting together each found none and
    # made their own (seen with 2 workers), as the look-up and the creation are two calls.
    tracking.study_parent_run(args.name, _shown(url))  # the storage as the runner records it
    try:
        job_ids = worker_array.launch(study_dir, args.name, url, launcher, args.workers, args.trials,
                                tracking=not args.no_tracking)
    except SubmissionFailed as error:
        raise ConfigError(str(error)) from None
    from abtune.study.stop import record_worker_jobs

    record_worker_jobs(storage, study_id, launcher.kind, job_ids)  # for `abtune study stop`
    print(f"submitted {len(job_ids)} worker(s) of study {args.name}: {launcher.job_type.label}(s) {' '.join(job_ids)}")
    print(f"each trial is a job of {layout.nodes} node(s) x {layout.ranks_per_node} rank(s); "
          f"worker logs in {study_dir / worker_array.WORKERS_DIR}")
    storage_flag = f" --storage '{_shown(url)}'" if args.storage else ""
    watch = workers.watch_workers_command(worker_array.job_name(args.name))
    print(f"watch: abtune study status {args.name}{storage_flag}" + (f"; {watch}" if watch else ""))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from abtune.study import stop
    from abtune.study.definition import stored_spec
    from abtune.study.storage import require_study

    if args.let_trials_finish and args.fail:
        raise ConfigError("--let-trials-finish and --fail contradict each other: a trial left to finish is not failed")
    storage, url = _storage(args)
    study_id = require_study(storage, args.name, url)
    mode = stop.LET_FINISH if args.let_trials_finish else stop.FAIL if args.fail else stop.REQUEUE
    stop.stop_study(storage, args.name, stored_spec(storage, study_id), mode, say=lambda line: print(line, flush=True),
                    tracking=_tracking_for_stop(args))
    return 0


def _tracking_for_stop(args: argparse.Namespace) -> Tracking:
    """The store of the trials' MLflow runs, to close those the stop itself ends; a store it cannot reach
    costs a warning, not the stop."""
    from abtune.tracking import Tracking, open_tracking

    try:
        return open_tracking(args.tracking_uri, enabled=not args.no_tracking)
    except AbtuneError as error:
        print(f"abtune: warning: {error}; MLflow runs of trials this stop ends stay RUNNING there", file=sys.stderr)
        return Tracking()


def cmd_status(args: argparse.Namespace) -> int:
    from abtune.study.report.status import print_status
    from abtune.study.storage import require_study

    rule = rule_of(args)
    storage, url = _storage(args)
    require_study(storage, args.name, url)
    print_status(storage, args.name, _shown(url), rule)
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    from abtune.study.report.best import print_best
    from abtune.study.storage import require_study

    rule = rule_of(args)
    storage, url = _storage(args)
    require_study(storage, args.name, url)
    print_best(storage, args.name, rule, wide=args.wide)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from abtune.study.report.export import export_text
    from abtune.study.storage import require_study

    storage, url = _storage(args)
    require_study(storage, args.name, url)
    text = export_text(storage, args.name, args.format)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def cmd_confirm(args: argparse.Namespace) -> int:
    from abtune.launch.launchers import load_launcher
    from abtune.study.confirm import confirm, print_confirmation
    from abtune.study.storage import require_study
    from abtune.tracking import open_tracking

    if args.top < 1 or args.seeds < 2 or args.parallel < 1:
        raise ConfigError("--top and --parallel must be at least 1, --seeds at least 2 (a spread needs two values)")
    rule = rule_of(args)
    launcher = load_launcher(args.launcher)
    storage, url = _storage(args)
    require_study(storage, args.name, url)
    tracking = open_tracking(args.tracking_uri, enabled=not args.no_tracking)
    try:
        _, records = confirm(storage, args.name, args.top, args.seeds, rule, launcher, args.parallel, tracking)
    except KeyboardInterrupt:
        print(f"abtune: interrupted; finished seeds are kept. Continue with: abtune study confirm {args.name} "
              f"--top {args.top} --seeds {args.seeds}", file=sys.stderr)
        return INTERRUPTED_EXIT
    print_confirmation(args.name, records)
    _print_confirmed_recommendation(args.name, storage, url, tracking)
    return 0


def _print_confirmed_recommendation(name: str, storage: BaseStorage, url: str, tracking: Tracking) -> None:
    """The study's recommendation after a confirmation, as every command now reads it, and where it is shown."""
    import optuna

    from abtune.study import recommendation
    from abtune.study.report.best import print_recommendation
    from abtune.tables import console

    study = optuna.load_study(study_name=name, storage=storage)
    answer = recommendation.current(study)
    if answer is not None:
        print_recommendation(console(), answer, DEFAULT_RULE)
        recommendation.publish(study, answer, tracking, tracking.study_parent_run(name, _shown(url)))
    say(f"stored in study {name} (user attrs abtune.confirmation.*, abtune.recommendation); `abtune study best`, "
        f"`study status`, `study export` and `abtune promote {name}` now name the confirmed choice")


def cmd_list(args: argparse.Namespace) -> int:
    from abtune.study.report.export import print_list

    storage, url = _storage(args)
    print_list(storage, _shown(url))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    from abtune.study import lifecycle
    from abtune.study.storage import require_study

    storage, url = _storage(args)
    require_study(storage, args.name, url)
    if not args.yes and not _confirm(f"delete study {args.name} and its trial folders? [y/N] "):
        raise ConfigError(f"not deleted; pass --yes to delete study {args.name} without a question")
    folder = lifecycle.delete(storage, args.name)
    print(f"deleted study {args.name} from {_shown(url)}" + (f" and {folder}" if folder else ""))
    return 0


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(question).strip().lower() in ("y", "yes")


def register_study_commands(commands: argparse._SubParsersAction) -> None:
    study = commands.add_parser("study", help="Optuna studies: search AB-training hyperparameters")
    sub = study.add_subparsers(dest="study_command", required=True)
    storage_help = "storage URL: sqlite:///FILE, postgresql://..., journal:FILE (default $ABTUNE_STORAGE or sqlite:///optuna.db)"

    def add(name: str, func, help_text: str, named: bool = True) -> argparse.ArgumentParser:  # noqa: ANN001
        parser = sub.add_parser(name, help=help_text)
        if named:
            parser.add_argument("name", help="study name")
        parser.add_argument("--storage", default=None, help=storage_help)
        parser.set_defaults(func=func)
        return parser

    create = add("create", cmd_create, "create a study from a study file", named=False)
    create.add_argument("study_file", type=Path, help="study YAML (see studies/quickstart.yaml)")
    create.add_argument("--name", default=None, help="study name (default: the file's name: or its stem)")
    create.add_argument("--force", action="store_true", help="replace a study of that name with a different definition")
    create.add_argument("--cluster", default=None, metavar="NAME|PATH", help=COST_HELP)
    create.add_argument("--warm-start", default=None, metavar="OLD",
                        help="enqueue the finished study OLD's confirmed picks and Pareto front first (e.g. at more nodes)")
    create.add_argument("--warm-start-storage", default=None, metavar="URL",
                        help="storage of the --warm-start study (default: the new study's)")
    run = add("run", cmd_run, "run trials until the study's budget is spent")
    run.add_argument("--trials", type=int, default=None, help="at most this many trials in this invocation")
    run.add_argument("--add-trials", type=int, default=None, metavar="N",
                     help="raise the study's budget by N trials first, keeping every trial (a spent study grows)")
    run.add_argument("--parallel", type=int, default=1, help="trials at a time (each starts layout.nproc ranks)")
    add_tracking_arguments(run)
    add_launcher_argument(run, "local (default: layout.nproc processes here) or a slurm profile (a job per trial)")
    run.add_argument("--cluster", default=None, metavar="NAME|PATH", help=COST_HELP)
    run.add_argument("--yes", action="store_true", help="run a local study estimated beyond a few hours without asking")
    launch = add("launch", cmd_launch, "submit W SLURM workers (one job array) that run the study; returns at once")
    launch.add_argument("--workers", type=int, default=1, help="worker jobs, each running one trial at a time")
    add_launcher_argument(launch, "slurm profile (default: slurm)", default="slurm")
    launch.add_argument("--trials", type=int, default=None, help="at most this many trials per worker")
    launch.add_argument("--dry-run", action="store_true", help="print the sbatch scripts; submit nothing")
    launch.add_argument("--add-trials", type=int, default=None, metavar="N",
                        help="raise the study's budget by N trials first, keeping every trial")
    add_tracking_arguments(launch)
    stop = add("stop", cmd_stop, "stop the study's workers, then its trials (re-enqueued); nothing left RUNNING")
    stop.add_argument("--let-trials-finish", action="store_true",
                      help="leave running trials to finish; their workers or the next `study run` tell them")
    stop.add_argument("--fail", action="store_true", help="fail the stopped trials instead of re-enqueuing them")
    add_tracking_arguments(stop)
    status = add("status", cmd_status, "trial counts, running trials, the configuration recommended so far")
    add_rule_arguments(status)
    best = add("best", cmd_best, "the recommended configuration and the Pareto front, with deltas vs the reference trials")
    add_rule_arguments(best)
    best.add_argument("--wide", action="store_true", help="every column, however wide the tables get")
    export = add("export", cmd_export, "every trial as CSV or JSON")
    export.add_argument("--format", choices=("csv", "json"), default="csv")
    export.add_argument("--output", type=Path, default=None, help="file to write (default: standard output)")
    confirm = add("confirm", cmd_confirm, "re-run the best configurations and both references with fresh seeds")
    confirm.add_argument("--top", type=int, default=1, help="configurations to confirm (default: %(default)s)")
    confirm.add_argument("--seeds", type=int, default=5, help="fresh seeds per configuration (default: %(default)s)")
    add_rule_arguments(confirm)
    confirm.add_argument("--parallel", type=int, default=1, help="runs at a time (each starts layout.nproc ranks)")
    add_launcher_argument(confirm, "local (default) or a slurm profile (a job per run)")
    add_tracking_arguments(confirm)
    add("list", cmd_list, "studies in the storage", named=False)
    delete = add("delete", cmd_delete, "delete a study and its trial folders")
    delete.add_argument("--yes", action="store_true", help="do not ask")
