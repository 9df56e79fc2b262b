"""The `abtune` command line: one small function per subcommand.

User errors end in one line on stderr and exit code 2; failed runs in one line and exit code 1;
never a traceback for either.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from abtune.config import RunConfig, load_run_config
from abtune.errors import AbtuneError, ConfigError
from abtune.rundir import check_method_layout, prepare_run_dir
from abtune.study.cli import register_study_commands

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


def cmd_train(args: argparse.Namespace) -> int:
    from abtune.launch.local import check_layout, launch
    from abtune.training.report import print_summary

    config = load_run_config(args.config, _overrides(args.set))
    ranks_per_node = args.ranks_per_node or args.nproc
    check_layout(args.nproc, ranks_per_node)
    check_method_layout(config, args.nproc, ranks_per_node)
    run_dir = prepare_run_dir(config, args.run_dir, args.resume)
    try:
        launch(run_dir, args.nproc, ranks_per_node, resume=args.resume)
    except KeyboardInterrupt:
        print(f"abtune: interrupted; continue with: abtune train {args.config} --run-dir {run_dir} --resume",
              file=sys.stderr)
        return INTERRUPTED_EXIT
    except AbtuneError as error:
        raise type(error)(f"{error} (run folder {run_dir}; checkpoints allow --resume)") from None
    summary = json.loads((run_dir / "summary.json").read_text())
    print_summary(summary, run_dir)
    return 0


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
    train.set_defaults(func=cmd_train)

    config = commands.add_parser("config", help="inspect run configs")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="print the resolved config (defaults filled in)")
    show.add_argument("config", type=Path, nargs="?", default=None)
    show.set_defaults(func=cmd_config_show)
    register_study_commands(commands)
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
