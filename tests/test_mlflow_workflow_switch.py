"""docs/mlflow.md tells users how MLflow's own experiment list opens abtune's experiments in the model-training
view: MLflow 3.17 ignores the experiment's kind tag for its view and keeps its sidebar switch in the browser's
local storage. These checks read the installed MLflow UI, so an MLflow that changes that mechanism (a new storage
key, a switch named otherwise) fails here before the guide goes stale; what abtune itself stores on an experiment
(the kind tag, the results view) and links is checked on a real store in tests/test_tracking.py."""

from __future__ import annotations

from pathlib import Path

import mlflow

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "mlflow.md"


def _ui_bundle() -> str:
    (main,) = (Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js").glob("main.*.js")
    return main.read_text()


def test_the_guide_names_the_switch_and_storage_key_the_installed_mlflow_ui_uses() -> None:
    bundle, guide = _ui_bundle(), " ".join(GUIDE.read_text().split())
    # useLocalStorage({key, version}) stores under `${key}_v${version}`; the switch starts on GenAI
    assert 'key:"mlflow.workflowType",version:1' in bundle and "`${e}_v${t}`" in bundle
    assert "`mlflow.workflowType_v1`" in guide
    assert 'defaultMessage:"Model training"' in bundle and "click **Model training**" in guide
    assert "workflowType=machine_learning" in guide
