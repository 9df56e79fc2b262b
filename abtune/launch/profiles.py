"""Launcher profiles: the typed YAML file behind each launcher (`local`, `debug`, `slurm`; launchers.py).

`--launcher NAME|PATH`: a path to a YAML file, or a name looked up as `./launchers/NAME.yaml` (a
project's own profiles) and then among the shipped profiles (the checkout's top-level `launchers/`,
installed as the package data `abtune/launchers/`). Adding a shipped profile is adding a file. A profile is
validated once, when it is loaded (unknown keys, ranges), and again against the run it will start
(`check_fits`): AB's groups must not straddle nodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from abtune.config import RunConfig, describe_validation_error
from abtune.errors import ConfigError
from abtune.launch.base import Layout
from abtune.schema import StrictModel
from abtune.words import plural
from abtune.yamlfile import find_named, names_in, read_yaml

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
# Installed from a wheel the profiles sit inside the package; in a checkout (editable install or
# PYTHONPATH) they are the top-level launchers/ folder beside abtune/.
_INSTALLED_DIR = _PACKAGE_DIR / "launchers"
BUILTIN_DIR = _INSTALLED_DIR if _INSTALLED_DIR.is_dir() else _PACKAGE_DIR.parent / "launchers"
PROJECT_DIR = Path("launchers")

# submitit sends the preemption signal (USR2) `signal_delay_s` before the limit and counts it as a
# *timeout* (which spends one of `max_requeues`) once the job ran min(0.8 x limit, limit - 10 min).
# At 10 minutes or less that bound is <= 0, so every preemption counts as a timeout; 15 minutes
# leaves a 5-minute window in which a preempted job is requeued for free and time to reach a checkpoint.
MIN_TIME_LIMIT_MIN = 15
NO_TIME_LIMIT = 0  # sbatch's --time=0: no limit but the partition's own
_NO_LIMIT_WORDS = ("unlimited", "infinite")  # sbatch takes these too, and squeue shows UNLIMITED
# sbatch options the profile sets through its own keys ("" : abtune sets them itself)
_TYPED_OPTIONS = {
    "partition": "partition", "account": "account", "qos": "qos", "nodes": "nodes", "ntasks-per-node": "tasks_per_node",
    "gpus-per-node": "gpus_per_node", "cpus-per-task": "cpus_per_task", "mem": "mem", "time": "time_limit",
    "chdir": "workdir", "signal": "signal_delay_s", "array": "array_parallelism", "job-name": "", "output": "",
    "error": "", "open-mode": "",
}


def parse_time_limit(value: int | str) -> int:
    """Minutes, rounded up, from an int (minutes) or any of sbatch's --time formats: "minutes",
    "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes", "days-hours:minutes:seconds";
    0, UNLIMITED or INFINITE: no limit (NO_TIME_LIMIT)."""
    if isinstance(value, int):
        return value
    text = value.strip()
    if text.lower() in _NO_LIMIT_WORDS:
        return NO_TIME_LIMIT
    days, clock = text.split("-", 1) if "-" in text else (None, text)
    fields = clock.split(":")
    if not all(f.isdigit() for f in [*fields, *([days] if days is not None else [])]) or not 1 <= len(fields) <= 3:
        raise ValueError("expected minutes or sbatch's [D-]HH:MM:SS (30, 30:00, 2:00:00, 1-12:00:00)")
    numbers = [int(f) for f in fields]
    if days is not None:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (numbers + [0, 0])[:3]
        hours += 24 * int(days)
    else:  # minutes | minutes:seconds | hours:minutes:seconds
        hours, minutes, seconds = {1: [0, numbers[0], 0], 2: [0, *numbers], 3: numbers}[len(numbers)]
    return -(-((hours * 60 + minutes) * 60 + seconds) // 60)


def parse_rate_bits(text: str) -> float:
    """tc's rate syntax (`1gbit`, `100mbit`, `500kbit`, `10mbps` = bytes) in bits per second."""
    units = {"tbit": 1e12, "gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0,
             "tbps": 8e12, "gbps": 8e9, "mbps": 8e6, "kbps": 8e3, "bps": 8.0}
    lowered = text.strip().lower()
    for unit, factor in units.items():
        if lowered.endswith(unit):
            try:
                return float(lowered[: -len(unit)]) * factor
            except ValueError:
                break
    raise ValueError(f"expected a rate such as 1gbit, 100mbit or 500kbit, got {text!r}")


class FabricFault(StrictModel):
    """A change to one node's link once the run has reached `at_step` (as rank 0's log records say, every
    `train.log_every` steps): the link down or up again, or its loss and one-way latency from then on."""

    at_step: int = Field(ge=1)
    node: int = Field(0, ge=0, description="the simulated node whose link changes")
    link: Literal["down", "up"] | None = None
    loss_pct: float | None = Field(None, ge=0, lt=100)
    latency_ms: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _changes_something(self) -> FabricFault:
        if self.link is None and self.loss_pct is None and self.latency_ms is None:
            raise ValueError("a fault changes something: give link (down|up), loss_pct or latency_ms")
        return self


class FabricProfile(StrictModel):
    """An emulated interconnect between the simulated nodes (`abtune/launch/fabric.py`): each node in a
    network namespace of its own, joined by links shaped with `tc`. Needs root (or CAP_NET_ADMIN) and iproute2."""

    bandwidth: str | None = Field(None, description="each node's link rate in tc's units (1gbit, 100mbit); "
                                                    "null: unshaped")
    latency_ms: float = Field(0.0, ge=0, description="one-way delay between two nodes")
    loss_pct: float = Field(0.0, ge=0, lt=100, description="share of the packets reaching each node that are "
                            "lost (an iptables rule in the node's namespace)")
    faults: tuple[FabricFault, ...] = Field((), description="changes to a node's link at a given step (tests, drills)")

    @field_validator("bandwidth")
    @classmethod
    def _a_rate(cls, value: str | None) -> str | None:
        if value is not None and parse_rate_bits(value) <= 0:
            raise ValueError(f"expected a positive rate, got {value!r}")
        return value

    @property
    def loses_packets(self) -> bool:
        """From the start or after a fault (iptables is needed)."""
        return self.loss_pct > 0 or any(f.loss_pct is not None for f in self.faults)


class LocalProfile(StrictModel):
    """Ranks as processes on this machine (`--nproc`, `--ranks-per-node` simulate nodes); with `fabric`,
    the simulated nodes talk over an emulated, shaped network instead of the loopback."""

    kind: Literal["local"] = "local"
    fabric: FabricProfile | None = None


class DebugProfile(StrictModel):
    """One rank inside the `abtune` process itself, so breakpoints and debuggers work."""

    kind: Literal["debug"] = "debug"


def _check_time_limit(value: int | str) -> int | str:
    minutes = parse_time_limit(value)
    if minutes != NO_TIME_LIMIT and minutes < MIN_TIME_LIMIT_MIN:
        raise ValueError(
            f"{plural(minutes, 'minute')} is too short to checkpoint and requeue: submitit counts every signal in "
            f"a job of 10 minutes or less as a timeout; use at least {MIN_TIME_LIMIT_MIN} minutes, or 0 for no limit"
        )
    return value


class WorkerSection(StrictModel):
    """Where `abtune study launch` puts its worker jobs (1 task, no GPU each); unset keys: the profile's.
    A service or CPU partition keeps the workers off the nodes their trials need."""

    partition: str | None = Field(None, description="sbatch --partition of the workers")
    account: str | None = None
    qos: str | None = None
    time_limit: int | str | None = Field(None, description="minutes or [D-]HH:MM:SS; a worker requeues itself at it")
    cpus: int = Field(1, ge=1, description="CPUs per worker")

    @field_validator("time_limit")
    @classmethod
    def _long_enough(cls, value: int | str | None) -> int | str | None:
        return None if value is None else _check_time_limit(value)


class SlurmProfile(StrictModel):
    """One SLURM job of `nodes x tasks_per_node` tasks per run; every task is one rank."""

    kind: Literal["slurm"] = "slurm"
    partition: str | None = Field(None, description="sbatch --partition; default: the cluster's default")
    account: str | None = None
    qos: str | None = None
    nodes: int = Field(1, ge=1)
    tasks_per_node: int = Field(1, ge=1, description="ranks per node; one per GPU on a GPU cluster")
    gpus_per_node: int | None = Field(None, ge=0)
    cpus_per_task: int | None = Field(None, ge=1)
    mem: str | None = Field(None, pattern=r"^\d+[KMGT]?$", description="memory per node, sbatch --mem (e.g. 64G)")
    time_limit: int | str = Field("1:00:00", description="minutes or [D-]HH:MM:SS; at least 15 minutes, 0 for no limit")
    setup: tuple[str, ...] = Field((), description="shell lines before the ranks start (module load ...)")
    sbatch: dict[str, str | int | bool] = Field({}, description="extra sbatch options, e.g. {constraint: a100}")
    array_parallelism: int = Field(8, ge=1, description="array jobs (study workers) running at once")
    max_requeues: int = Field(3, ge=0, description="times a job that hits its time limit is requeued")
    signal_delay_s: int = Field(120, ge=10, description="the preemption signal comes this long before the limit")
    python: str | None = Field(None, description="python on the nodes; default: the one running abtune")
    workdir: Path | None = Field(None, description="the jobs' working directory; default: where abtune runs")
    worker: WorkerSection = Field(WorkerSection(), description="`study launch` workers: partition, account, qos, "
                                                                "time_limit, cpus (default: the profile's, 1 CPU)")

    @field_validator("time_limit")
    @classmethod
    def _long_enough(cls, value: int | str) -> int | str:
        return _check_time_limit(value)

    @field_validator("sbatch")
    @classmethod
    def _not_a_typed_option(cls, value: dict[str, str | int | bool]) -> dict[str, str | int | bool]:
        for key in value:
            own = _TYPED_OPTIONS.get(key.replace("_", "-"))
            if own is not None:
                raise ValueError(f"{key} is set by abtune{f'; use the profile key {own}' if own else ''}")
        return value

    @property
    def time_limit_min(self) -> int:
        return parse_time_limit(self.time_limit)


from abtune.launch.gridengine.profile import GridEngineProfile  # noqa: E402  (it reads this module's time limits)

Profile = LocalProfile | DebugProfile | SlurmProfile | GridEngineProfile
KINDS: dict[str, type[Profile]] = {"local": LocalProfile, "debug": DebugProfile, "slurm": SlurmProfile,
                                   "gridengine": GridEngineProfile}


def resolve_profile_path(name_or_path: str) -> Path:
    """A path if it looks like one (or exists), else ./launchers/NAME.yaml, else the shipped NAME.yaml."""
    found = find_named(name_or_path, (PROJECT_DIR, BUILTIN_DIR))
    if found is not None:
        return found
    raise ConfigError(f"--launcher {name_or_path}: no such profile; choose one of {', '.join(profile_names())} "
                      "or give the path of a YAML file")


def profile_names() -> list[str]:
    return names_in((PROJECT_DIR, BUILTIN_DIR))


def load_profile(name_or_path: str) -> Profile:
    path = resolve_profile_path(name_or_path)
    return parse_profile(read_yaml(path), str(path))


def parse_profile(raw: dict[str, Any], source: str) -> Profile:
    """A profile from its plain values (a YAML file's, or a `model_dump` sent to a study worker)."""
    schema = KINDS.get(raw.get("kind"))  # type: ignore[arg-type]
    if schema is None:
        raise ConfigError(f"{source}: kind: expected one of {', '.join(KINDS)} (got {raw.get('kind')!r})")
    try:
        return schema.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(_with_valid_keys(error, source, schema, raw["kind"])) from None


def _with_valid_keys(error: ValidationError, source: str, schema: type[BaseModel], kind: str) -> str:
    """describe_validation_error, each unknown key answered with the keys of the section it sits in."""
    lines = describe_validation_error(error, source).splitlines()
    hint = "(check the spelling; see `abtune config show` for valid keys)"
    for index, item in enumerate(error.errors()):
        if item["type"] == "extra_forbidden":
            section = _section(schema, item["loc"][:-1])
            if section is None:
                continue
            where = f"a {kind} profile" if len(item["loc"]) == 1 else f"{'.'.join(map(str, item['loc'][:-1]))}"
            lines[index] = lines[index].replace(hint, f"(valid keys of {where}: {', '.join(section.model_fields)})")
    return "\n".join(lines)


def _section(schema: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model of the section at `loc` (names of fields, indices of their tuple items); None: not a model."""
    section: type[BaseModel] | None = schema
    for key in loc:
        if isinstance(key, int) or section is None:
            continue  # an item of a tuple of sections: the same model
        annotation = section.model_fields[key].annotation
        section = next((t for t in (annotation, *_arguments(annotation))
                        if isinstance(t, type) and issubclass(t, BaseModel)), None)
    return section


def _arguments(annotation: object) -> tuple[object, ...]:
    """The types inside `X | None` and `tuple[X, ...]`, one level deep."""
    return tuple(a for arg in get_args(annotation) for a in (arg, *get_args(arg)))


def check_fits(config: RunConfig, layout: Layout) -> None:
    """Problems of this run on this layout, found before anything is submitted: AB's groups, and the cluster
    whose time it predicts (`train.cluster`), which rank 0 would refuse only after the start-up."""
    config.method.check_layout(layout.world_size, layout.ranks_per_node, layout.nodes)
    if config.train.cluster is not None:
        from abtune.timing import check_fits as fits_cluster
        from abtune.timing import load_cluster

        fits_cluster(layout.nodes, layout.ranks_per_node, load_cluster(config.train.cluster))
