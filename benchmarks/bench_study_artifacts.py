"""CPU of one rebuild of a study's artifacts (importances, then the plots), what a runner does as trials end.

    python benchmarks/bench_study_artifacts.py --storage sqlite:///COPY.db --study scale [--trials 100 1000]

For each N, the first N trials of the study: `importance.analysis`, then `write_study_plots` into a
throw-away folder. Row F's study was copied from the scale harness's PostgreSQL with `optuna.copy_study`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import optuna

from abtune.study import importance
from abtune.study.definition import open_search_study
from abtune.study.storage import open_storage
from abtune.tracking.study_plots import write_study_plots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", required=True)
    parser.add_argument("--study", required=True)
    parser.add_argument("--trials", type=int, nargs="+", default=[100, 1000])
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study, spec = open_search_study(open_storage(args.storage), args.study)
    for n in args.trials:
        trials = study.all_trials()[:n]  # as the runner reads them: the reference trials included
        start = time.process_time()
        report = importance.analysis(trials, list(spec.space), importance.shown_objectives(spec))
        analysed = time.process_time()
        with tempfile.TemporaryDirectory() as folder:
            plotting = time.process_time()
            write_study_plots(trials, study.metric_names, Path(folder), report)
        print(f"{n} trials: importances {analysed - start:.1f} CPU s, plots {time.process_time() - plotting:.1f} CPU s")


if __name__ == "__main__":
    main()
