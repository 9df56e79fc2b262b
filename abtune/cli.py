"""The `abtune` command line: one small function per subcommand.

User errors end in one line on stderr and exit code 2; failed runs in one line and exit code 1;
never a traceback for either.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from abtune.config import RunConfig, flatten, load_run_config
from abtune.errors import AbtuneError, ConfigError

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


def _check_method_layout(config: RunConfig, nproc: int, ranks_per_node: int) -> None:
    """Problems that depend on the number of ranks, found before any process starts."""
    if config.method.name == "ab":
        from abtune.methods.ab.groups import resolve_group_size

        resolve_group_size(config.method.group_size, nproc, ranks_per_node, nproc // ranks_per_node)


def _prepare_run_dir(config: RunConfig, run_dir: Path | None, resume: bool) -> Path:
    if run_dir is None:
        if resume:
            raise ConfigError("--resume needs --run-dir: the folder of the run to continue")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = DEFAULT_RUNS_DIR / f"{config.name}-{config.method.name}-{stamp}"
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


def cmd_train(args: argparse.Namespace) -> int:
    from abtune.launch.local import check_layout, launch
    from abtune.tracking import LaunchInfo, open_tracking
    from abtune.training.report import print_summary

    config = load_run_config(args.config, _overrides(args.set))
    ranks_per_node = args.ranks_per_node or args.nproc
    check_layout(args.nproc, ranks_per_node)
    _check_method_layout(config, args.nproc, ranks_per_node)
    tracking = open_tracking(args.tracking_uri, enabled=not args.no_tracking)
    run_dir = _prepare_run_dir(config, args.run_dir, args.resume)
    run_id = tracking.start_run(config, experiment=config.name, run_name=run_dir.name,
                                launch_info=LaunchInfo("local", args.nproc, ranks_per_node),
                                tags={"abtune.run_dir": str(run_dir.resolve()),
                                      **_resumed_from(run_dir, args.resume)})
    _install_tracking_hook(run_dir, tracking.hook_spec(run_id))
    status = "FAILED"
    try:
        launch(run_dir, args.nproc, ranks_per_node, resume=args.resume)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        print(f"abtune: interrupted; continue with: abtune train {args.config} --run-dir {run_dir} --resume",
              file=sys.stderr)
        return INTERRUPTED_EXIT
    except AbtuneError as error:
        raise type(error)(f"{error} (run folder {run_dir}; checkpoints allow --resume)") from None
    finally:
        tracking.finish_run(run_id, run_dir, status)
    summary = json.loads((run_dir / "summary.json").read_text())
    print_summary(summary, run_dir)
    if run_id is not None:
        where = tracking.describe()
        see = f"open {where}" if where.startswith("http") else f"abtune ui --tracking-uri {where}"
        print(f"MLflow: run {run_id} in experiment {config.name!r} at {where} (see it: {see})")
    return 0


def _install_tracking_hook(run_dir: Path, spec: dict[str, Any] | None) -> None:
    """Put the tracking hook into hooks.yaml next to any others, replacing one from an earlier launch."""
    from abtune.tracking._base import Tracking
    from abtune.training.hooks import configured_hook_specs, write_hook_specs

    others = [s for s in configured_hook_specs(run_dir) if s["factory"] != Tracking.HOOK_FACTORY]
    if spec is not None or len(others) != len(configured_hook_specs(run_dir)):
        write_hook_specs(run_dir, [*others, *([spec] if spec else [])])


def _resumed_from(run_dir: Path, resume: bool) -> dict[str, str]:
    """A resumed run is a new MLflow run pointing at the one it continues (metrics replayed into it)."""
    from abtune.tracking._base import Tracking
    from abtune.training.hooks import configured_hook_specs

    if not resume:
        return {}
    previous = [s for s in configured_hook_specs(run_dir) if s["factory"] == Tracking.HOOK_FACTORY]
    return {"abtune.resumed_from": previous[0]["options"]["run_id"]} if previous else {}


def cmd_ui(args: argparse.Namespace) -> int:
    from abtune.tracking import resolve_tracking_uri
    from abtune.tracking.ui import serve

    uri = resolve_tracking_uri(args.tracking_uri)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(f"no MLflow store at {uri}; run abtune ui where you trained, or pass --tracking-uri")
    return serve(uri, args.storage, args.host)


def cmd_config_show(args: argparse.Namespace) -> int:
    config = load_run_config(args.config) if args.config else RunConfig()
    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="abtune", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train one run on local processes")
    train.add_argument("config", type=Path, help="run config YAML")
    train.add_argument("--nproc", type=int, default=1, help="number of ranks (processes)")
    train.add_argument("--ranks-per-node", type=int, default=None, help="ranks per simulated node (default: all)")
    train.add_argument("--run-dir", type=Path, default=None, help="output folder (default: runs/NAME-METHOD-TIME)")
    train.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its checkpoint")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    train.add_argument("--tracking-uri", default=None, metavar="URI",
                       help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    train.add_argument("--no-tracking", action="store_true", help="record nothing in MLflow")
    train.set_defaults(func=cmd_train)

    ui = commands.add_parser("ui", help="start the MLflow UI and optuna-dashboard on this machine")
    ui.add_argument("--tracking-uri", default=None, metavar="URI",
                    help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    ui.add_argument("--storage", default=None, metavar="OPTUNA_URL", help="Optuna storage for optuna-dashboard")
    ui.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    ui.set_defaults(func=cmd_ui)

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
