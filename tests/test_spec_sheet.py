"""Compute for a card nobody published training rates for: a spec sheet (peaks and memory bandwidth) predicted
as a roofline with per-family efficiencies (abtune/timing.py `spec_sheet`, `FAMILY_ROOFLINES`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from abtune.errors import ConfigError
from abtune.timing import REFERENCE_CARD, Cluster, load_cluster, spec_sheet_for, step_compute

RESNET50, VIT_B_16 = ("resnet50", 8178368512), ("vit_b_16", 35127656448)


def rate(cluster: Cluster, model: tuple[str, int], precision: str, batch: int = 256) -> float:
    summary = {"config": {"model.arch": model[0], "train.precision": precision},
               "timing": {"forward_flops_per_sample": model[1]}}
    return batch / step_compute(summary, cluster).seconds(batch)


def with_sheet(sheet: dict, floor_ms: float = 0.0) -> Cluster:
    base = load_cluster("v100-sxm2-spec").model_dump()
    base["compute"] = {"spec_sheet": sheet, **({"step_floor_ms": floor_ms, "step_floor_source": "assumed: test"}
                                                if floor_ms else {})}
    return Cluster.model_validate(base)


def test_a_spec_sheet_description_is_accepted_and_names_its_source() -> None:
    cluster = load_cluster("v100-sxm2-spec")
    assert cluster.compute.spec_sheet is not None and cluster.compute.spec_sheet.memory_gb_per_s == 900
    summary = {"config": {"model.arch": "resnet50", "train.precision": "fp16"},
               "timing": {"forward_flops_per_sample": RESNET50[1]}}
    source = step_compute(summary, cluster).source
    assert source.kind == "spec sheet" and "V100-SXM2-16GB" in source.detail and "conv roofline" in source.detail


def test_on_the_reference_card_the_roofline_gives_back_the_published_rates() -> None:
    reference = with_sheet(REFERENCE_CARD.model_dump())
    assert rate(reference, RESNET50, "bf16") == pytest.approx(1240.81, rel=0.005)  # NVIDIA, A100 AMP
    assert rate(reference, RESNET50, "fp32") == pytest.approx(680.15, rel=0.005)  # NVIDIA, A100 TF32
    assert rate(reference, VIT_B_16, "bf16") == pytest.approx(680.125, rel=0.005)  # FlagPerf, A100 AMP


def test_two_families_are_not_one_efficiency_the_ratio_is_not_the_flops_ratio() -> None:
    cluster = load_cluster("v100-sxm2-spec")
    ratio = rate(cluster, RESNET50, "fp16") / rate(cluster, VIT_B_16, "fp16")
    flops_ratio = VIT_B_16[1] / RESNET50[1]  # 4.3: what one efficiency for every model gives
    assert ratio < 0.6 * flops_ratio


def test_memory_bandwidth_speeds_a_conv_net_more_than_a_transformer() -> None:
    sheet = {"device": "X", "tflops": {"fp32": 20.0, "bf16": 300.0}, "memory_gb_per_s": 1000.0, "source": "test"}
    slow, fast = with_sheet(sheet), with_sheet({**sheet, "memory_gb_per_s": 2000.0})
    conv_gain = rate(fast, RESNET50, "bf16") / rate(slow, RESNET50, "bf16")
    transformer_gain = rate(fast, VIT_B_16, "bf16") / rate(slow, VIT_B_16, "bf16")
    assert conv_gain > 1.5 and transformer_gain < 1.1


def test_v100_published_rates_are_within_30_percent() -> None:
    """The same NVIDIA README's V100-16GB rows (AMP 856.52, FP32 373.21 images/s): the conv family's memory
    share was fitted to them, so this pins the fit, not an independent check (BENCHMARKS.md)."""
    cluster = load_cluster("v100-sxm2-spec")
    assert rate(cluster, RESNET50, "fp16") == pytest.approx(856.52, rel=0.3)
    assert rate(cluster, RESNET50, "fp32", batch=128) == pytest.approx(373.21, rel=0.3)


def test_a_spec_sheet_without_memory_bandwidth_is_refused_in_one_line(tmp_path: Path) -> None:
    raw = load_cluster("v100-sxm2-spec").model_dump()
    del raw["compute"]["spec_sheet"]["memory_gb_per_s"]
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"compute\.spec_sheet\.memory_gb_per_s: Field required"):
        load_cluster(str(path))


def test_a_gpu_name_finds_its_spec_sheet() -> None:
    assert spec_sheet_for("NVIDIA H100 80GB HBM3").name == "h100-sxm-spec"
    assert spec_sheet_for("NVIDIA H200").name == "h200-spec"
    assert spec_sheet_for("Tesla V100-SXM2-16GB").name == "v100-sxm2-spec"
    assert spec_sheet_for("x86_64") is None
