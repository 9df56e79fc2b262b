"""Where the test suite's time goes, per file: the table of docs/development.md from pytest's own report.

    pytest -q --durations=0 --durations-min=0 > durations.txt
    python benchmarks/suite_durations.py durations.txt [--top 25]

Reads the "slowest durations" lines pytest prints (`12.34s call     tests/x.py::test_y`) and sums them per
file and phase: set-up (fixtures: trained runs, clusters, servers), the tests' own calls, teardown.
Seconds are summed over both pytest-xdist workers, so they add up to more than the run's wall time;
compare files with each other, and runs only at the same load.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^(?P<seconds>\d+(?:\.\d+)?)s (?P<phase>setup|call|teardown)\s+(?P<test>\S+)")
PHASES = ("setup", "call", "teardown")


def per_file(report: str) -> dict[str, dict[str, float]]:
    """Seconds per file and phase, and the number of tests whose call was reported."""
    files: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys((*PHASES, "tests"), 0.0))
    for line in report.splitlines():
        found = LINE.match(line)
        if found:
            row = files[found["test"].split("::")[0]]
            row[found["phase"]] += float(found["seconds"])
            row["tests"] += found["phase"] == "call"
    return files


def table(files: dict[str, dict[str, float]], top: int) -> str:
    total = sum(sum(row[p] for p in PHASES) for row in files.values()) or 1.0
    ranked = sorted(files.items(), key=lambda item: -sum(item[1][p] for p in PHASES))
    lines = ["| file | tests | set-up s | calls s | teardown s | total s | share |", "|---|---|---|---|---|---|---|"]
    for name, row in ranked[:top]:
        seconds = sum(row[p] for p in PHASES)
        lines.append(f"| {name} | {row['tests']:.0f} | {row['setup']:.0f} | {row['call']:.0f} | "
                     f"{row['teardown']:.0f} | {seconds:.0f} | {seconds / total:.0%} |")
    lines.append(f"| all {len(files)} files | {sum(r['tests'] for r in files.values()):.0f} | | | | {total:.0f} | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="the output of `pytest -q --durations=0 --durations-min=0`")
    parser.add_argument("--top", type=int, default=25, help="files shown, slowest first")
    args = parser.parse_args()
    print(table(per_file(args.report.read_text(errors="replace")), args.top))


if __name__ == "__main__":
    main()
