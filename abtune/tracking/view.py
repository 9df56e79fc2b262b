"""What the MLflow UI (3.x) shows when a user opens one of abtune's experiments.

Two of the UI's own mechanisms, both stored on the experiment when abtune creates it:
- `mlflow.experimentKind`: abtune's experiments are model training, not GenAI apps. MLflow 3.17's UI
  ignores the tag for its view: it chooses GenAI or model training from its sidebar switch, which a link
  sets with `?workflowType=machine_learning` and the browser otherwise keeps in its local storage
  (`mlflow.workflowType_v1`, GenAI until the user flips it); the server has no setting for it. The tag
  still types the experiment for releases and tools that read it.
- a shared view (`mlflow.sharedViewState.KEY`, opened with `?viewStateShareKey=KEY`, what the UI's
  own "share" button writes): the runs table with each run's results (in the units a person reads) as its
  first columns, best final top-1 first, instead of the UI's default of no metric column at all.
`experiment_url` is the link that opens both; `abtune ui` prints it for every abtune experiment.

The compare-runs page has no such setting: its parallel-coordinates plot starts (MLflow 3.17, in the browser,
from nothing stored or linked) on the first three, by name, of the parameters whose values differ between the
compared runs, and on the first metric the runs logged. A study's trial runs therefore log their searched
parameters again under `Search/` (capitals sort before every lower-case key), so the plot opens on them
instead of `ab_cycles`, `group_size` and `method`; its metric stays the first logged one (`train/loss`).
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

from abtune.tracking.records import HEADLINE

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
VIEW_KEY = "abtune-results"
VIEW_TAG = SHARED_VIEW_PREFIX + VIEW_KEY
# the result metrics of a run in the order the table shows them: the headline ones (top-1 %, inter-node MB,
# compression, traffic against DDP's; records.HEADLINE), rounded as a person reads them
RESULT_METRICS = HEADLINE
SEARCH_SECTION = "Search"


def _column(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"  # the UI's column key (makeCanonicalSortKey)


def results_view() -> dict[str, object]:
    """The runs table as the UI's view state: search facets and table state in one flat object."""
    columns = [*(_column("metrics", m) for m in RESULT_METRICS), _column("params", "method")]
    return {"orderByKey": columns[0], "orderByAsc": False, "searchFilter": "", "selectedColumns": columns,
            "columnOrder": columns}


def search_params(params: dict[str, object]) -> dict[str, object]:
    """A trial's searched parameters as the extra params of its run: `Search/warmup_frac` for
    `method.warmup_frac` (the section said once when they share it, as prose.settings does)."""
    from abtune import prose

    section = prose.shared_section(params)
    return {f"{SEARCH_SECTION}/{prose.short_key(key, section)}": value for key, value in params.items()}


def experiment_tags() -> dict[str, str]:
    """Tags of every experiment abtune creates (runs, studies, comparisons, reports)."""
    return {EXPERIMENT_KIND_TAG: MODEL_TRAINING, VIEW_TAG: json.dumps(results_view())}


def experiment_url(ui_url: str, experiment_id: str) -> str:
    query = urlencode({"workflowType": "machine_learning", "viewStateShareKey": VIEW_KEY})
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def experiment_links(tracking_uri: str, ui_url: str, limit: int) -> list[tuple[str, str]]:
    """(name, link) of the `limit` most recently updated abtune experiments in the store."""
    from mlflow import MlflowClient

    found = MlflowClient(tracking_uri).search_experiments(
        filter_string=f"tags.`{VIEW_TAG}` LIKE '%'", order_by=["last_update_time DESC"], max_results=limit)
    return [(e.name, experiment_url(ui_url, e.experiment_id)) for e in found]
