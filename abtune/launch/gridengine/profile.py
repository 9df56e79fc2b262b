"""The `kind: gridengine` launcher profile (launchers/gridengine.yaml)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from abtune.schema import StrictModel

_HARD_RUN_TIME = re.compile(r"^\d+:[0-5]\d:[0-5]\d$")

# qsub options the profile sets through its own keys, or abtune itself ("")
_TYPED_OPTIONS = {"-q": "queue", "-pe": "parallel_environment and slots", "-P": "project", "-wd": "workdir",
                  "-cwd": "workdir", "-S": "", "-N": "", "-o": "", "-e": "", "-j": "", "-V": "", "-sync": ""}


class GridEngineProfile(StrictModel):
    """One Grid Engine job per run: `slots` ranks on one host, each in a slot of `parallel_environment`."""

    kind: Literal["gridengine"] = "gridengine"
    queue: str | None = Field(None, description="qsub -q; default: any queue the cell chooses")
    parallel_environment: str = Field("smp", description="qsub -pe NAME: one that puts all of a job's slots on "
                                                         "one host (allocation_rule $pe_slots)")
    slots: int = Field(1, ge=1, description="ranks per run, one slot each")
    project: str | None = Field(None, description="qsub -P")
    time_limit: int | str = Field("1:00:00", description="hard run time (-l h_rt): minutes, or H:MM:SS; 0 for none")
    resources: dict[str, str | int] = Field({}, description="more -l requests, e.g. {h_vmem: 4G, gpu: 1}")
    qsub: tuple[str, ...] = Field((), description="any other qsub options, one per item, e.g. ['-l hostname=n1']")
    setup: tuple[str, ...] = Field((), description="shell lines before the ranks start (module load ...)")
    python: str | None = Field(None, description="python on the hosts; default: the one running abtune")
    workdir: Path | None = Field(None, description="the job's working directory; default: where abtune runs")

    @field_validator("time_limit")
    @classmethod
    def _a_time(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0 or isinstance(value, str) and not _HARD_RUN_TIME.match(value):
            raise ValueError(f"expected minutes or H:MM:SS (90, 1:30:00), got {value!r}")
        return value

    @field_validator("qsub")
    @classmethod
    def _not_a_typed_option(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for option in value:
            own = _TYPED_OPTIONS.get(option.split()[0] if option.strip() else "")
            if own is not None:
                raise ValueError(f"{option.split()[0]} is set by abtune{f'; use the profile key {own}' if own else ''}")
        return value

    @property
    def hard_run_time(self) -> str | None:
        """-l h_rt as HH:MM:SS; None for no limit."""
        if isinstance(self.time_limit, str):
            return self.time_limit
        return f"{self.time_limit // 60}:{self.time_limit % 60:02d}:00" if self.time_limit else None
