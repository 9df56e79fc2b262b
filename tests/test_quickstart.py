"""The README's main job, end to end: the quickstart config on 4 ranks as 2 simulated nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

QUICKSTART = Path(__file__).parent.parent / "studies" / "run_quickstart.yaml"
CHANCE = 0.1  # ten digit classes
MIN_TOP1 = 0.85
MAX_AB_INTER_NODE_SHARE = 0.45  # of DDP's training inter-node bytes, with the paper's guideline fractions


@pytest.mark.slow
def test_quickstart_methods_learn_and_ab_saves_inter_node_traffic(tmp_path: Path) -> None:
    results = {}
    for method in ("ddp", "ab"):  # ab-nogroups trains end to end in test_strict_device, pinned in test_ab_paper
        run_dir = tmp_path / method
        output = run_cli("train", str(QUICKSTART), "--nproc", "4", "--ranks-per-node", "2",
                         "--run-dir", str(run_dir), "--set", f"method.name={method}")
        assert "reduction vs DDP" in output.stdout
        results[method] = json.loads((run_dir / "summary.json").read_text())
    for method, summary in results.items():
        assert summary["final"]["val_top1"] > MIN_TOP1 > CHANCE, method
    ddp_inter = results["ddp"]["traffic"]["training_inter_node_bytes"]
    # DDP's training reference is what the ddp run sends (plus its one-time bucket-order broadcast).
    assert results["ab"]["traffic"]["ddp_reference_inter_node_bytes"] == pytest.approx(ddp_inter, rel=1e-4)
    ab_inter = results["ab"]["traffic"]["training_inter_node_bytes"]
    assert ab_inter <= MAX_AB_INTER_NODE_SHARE * ddp_inter
    assert results["ab"]["schedule"] == {"total_steps": 600, "warmup_steps": 120, "ab_steps": 20,
                                         "rebound_steps": 5, "lr_rebound_steps": 10, "ab_cycles": 20}
