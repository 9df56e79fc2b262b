"""Finished Optuna studies as the study runner leaves them, and a tiny ImageNet-format folder tree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import optuna
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial
from PIL import Image

from tests.conftest import TINY_VIT

DISTRIBUTIONS = {
    "method.name": CategoricalDistribution(["ab", "ddp"]),
    "method.warmup_frac": FloatDistribution(0.0, 0.5),
    "method.ab_frac": FloatDistribution(0.01, 0.3),
    "method.rebound_frac": FloatDistribution(0.0, 1.0),
    "method.lr_rebound_frac": FloatDistribution(0.0, 1.0),
    "method.sigma_cutoff": FloatDistribution(0.05, 0.5),
    "optimizer.lr": FloatDistribution(1e-4, 1e-2, log=True),
}
PAPER_DEFAULTS = {"method.name": "ab", "method.warmup_frac": 0.2, "method.ab_frac": 1 / 30,
                  "method.rebound_frac": 0.25, "method.lr_rebound_frac": 0.5, "method.sigma_cutoff": 0.1}
BEST = {"method.name": "ab", "method.warmup_frac": 0.15, "method.ab_frac": 0.2, "method.rebound_frac": 0.3,
        "method.lr_rebound_frac": 0.4, "method.sigma_cutoff": 0.3, "optimizer.lr": 0.004}
SECOND = {"method.name": "ab", "method.warmup_frac": 0.25, "method.ab_frac": 0.1, "method.rebound_frac": 0.5,
          "method.lr_rebound_frac": 0.5, "method.sigma_cutoff": 0.2, "optimizer.lr": 0.001}
BEST_RUN_ID = "0123456789abcdef"
IMAGE_PIXELS = 20  # saved size; the target resizes and crops to 16


def _trial(params: dict[str, Any], value: float | list[float] | None, state: TrialState = TrialState.COMPLETE,
           **attrs: Any) -> optuna.trial.FrozenTrial:
    distributions = {k: DISTRIBUTIONS[k] for k in params}
    values = value if isinstance(value, list) else None
    single = value if not isinstance(value, list) else None
    return create_trial(params=params, distributions=distributions, value=single, values=values, state=state,
                        user_attrs=attrs)


def single_objective_study(storage: str, name: str = "tiny") -> optuna.Study:
    """Reference trials first (as the runner enqueues them), then searched trials; the ddp reference
    has the highest value and must still not be promoted."""
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    study.add_trial(_trial(PAPER_DEFAULTS, 0.80, reference="paper-defaults"))
    study.add_trial(_trial({"method.name": "ddp"}, 0.95, reference="ddp"))
    study.add_trial(_trial(BEST, 0.90, mlflow_run_id=BEST_RUN_ID))
    study.add_trial(_trial(SECOND, 0.85))
    study.add_trial(_trial(SECOND, None, state=TrialState.FAIL))
    return study


def pareto_study(storage: str, name: str = "pareto") -> optuna.Study:
    """(top-1 up, inter-node MB down): trials 0-3 on the front, trial 4 dominated by trial 1."""
    study = optuna.create_study(study_name=name, storage=storage, directions=["maximize", "minimize"])
    for values in ([0.90, 100.0], [0.85, 40.0], [0.80, 30.0], [0.60, 10.0], [0.84, 50.0]):
        study.add_trial(_trial(SECOND, list(values)))
    return study


def empty_study(storage: str, name: str = "empty") -> optuna.Study:
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    study.add_trial(_trial(SECOND, None, state=TrialState.FAIL))
    study.add_trial(_trial(SECOND, None, state=TrialState.PRUNED))
    return study


def image_tree(root: Path, classes: int = 3, train_per_class: int = 16, val_per_class: int = 4) -> Path:
    """root/train/<class>/*.png and root/val/<class>/*.png; each class has its own mean colour."""
    rng = np.random.default_rng(0)
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for label in range(classes):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            colour = np.zeros(3)
            colour[label % 3] = 160
            for index in range(count):
                noise = rng.normal(0, 40, (IMAGE_PIXELS, IMAGE_PIXELS, 3))
                pixels = np.clip(colour + 40 + noise, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"img{index}.png")
    return root


def tiny_target(path: Path, data_root: Path | None, epochs: int = 4) -> Path:
    """A scaling target like studies/imagenet_*.yaml, small enough for 2 cores."""
    model = {**TINY_VIT, "patch_size": 4}
    target = {
        "name": "tiny_imagenet",
        "scaling": {"epochs": epochs, "local_batch_size": 4, "global_batch_size": 16, "ranks_per_node": 2,
                    "train_samples": None},
        "run": {"name": "tiny_imagenet", "seed": 0, "model": model,
                "data": {"name": "imagenet", "root": None if data_root is None else str(data_root),
                         "image_size": 16, "augment": False},
                "optimizer": {"name": "adamw", "lr": 0.003},
                "schedule": {"name": "cosine", "warmup_frac": 0.1},
                "method": {"name": "ab", "sigma_cutoff": 0.15}},
    }
    path.write_text(yaml.safe_dump(target, sort_keys=False))
    return path
