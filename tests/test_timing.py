"""The cluster step-time model (abtune/timing.py) against hand computations: a ring all-reduce and a tree
broadcast in alpha-beta terms with gloo's messages, the overlap rule, an AB cycle, time to target and the
break-even rate; and the cluster files' one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from abtune.comm import CommMeter, Op, Topology
from abtune.config import ModelConfig
from abtune.data import DatasetInfo
from abtune.errors import ConfigError
from abtune.models import forward_flops_per_sample
from abtune.timing import (
    FROM_RUN,
    Cluster,
    ComputeSource,
    break_even_gbit,
    cluster_names,
    load_cluster,
    overlapped_step,
    predict,
    straggling,
    with_link_rate,
)
from tests.bench_helpers import load_benchmark

REPO = Path(__file__).resolve().parent.parent
GBIT = 1e9
LINK = {"gbit_per_s": 1.0, "latency_us": 10.0, "header_bytes_per_packet": 66, "packet_payload_bytes": 1448}


def cluster(**compute: Any) -> Cluster:
    return Cluster.model_validate({
        "name": "hand", "nodes": 4, "accelerators_per_node": 2, "inter_node": LINK,
        "intra_node": {"gbit_per_s": 8.0, "latency_us": 1.0},
        "compute": {"from_run": True, "backward_overlap": 2 / 3, **compute}})


def summary(topology: Topology, calls: dict[str, list[tuple[Op, int, tuple[int, ...]]]], steps: dict[str, int],
            seconds: dict[str, float], starts: list[tuple[str, int]] | None = None, **extra: Any) -> dict[str, Any]:
    """A summary.json as the trainer writes it, with every rank's meter rows from the given collectives."""
    meters = [CommMeter(topology, rank=rank) for rank in range(topology.world_size)]
    for phase, collectives in calls.items():
        for meter in meters:
            meter.phase = phase
            for op, nbytes, ranks in collectives:
                if meter.rank in ranks:
                    meter.record(op, nbytes, meter.group("world" if len(ranks) == topology.world_size
                                                         else f"ab_group{ranks[0] // len(ranks)}", ranks))
    total = sum(steps.values())
    return {"world_size": topology.world_size, "num_nodes": topology.num_nodes,
            "ranks_per_node": topology.ranks_per_node, "steps_done": total, "history": extra.pop("history", []),
            "traffic": {"rows_per_rank": [m.rows() for m in meters]},
            "config": {"model.arch": "vit", "train.precision": "bf16"},
            "timing": {"by_phase": {p: {"steps": n, "seconds": seconds[p]} for p, n in steps.items()},
                       "phase_starts": starts or [(p, 0) for p in steps], "target_top1": extra.pop("target", None)},
            **extra}


def test_a_ring_all_reduce_costs_its_bytes_framing_and_headers_at_the_rate_plus_its_rounds_of_latency() -> None:
    # 2 nodes x 1 rank, 10 steps of one 1000 B float32 all-reduce: gloo cuts 4 segments (252, 252, 252, 244 B),
    # each rank sends 2 reduce-scatter + 2 all-gather messages (1000 B) a call and receives 4.
    # Per node and call: 1000 B + framing 4 x 96 + 4 x 48 = 576 B + headers 66 x (1576 / 1448 + 3 x 4) packets.
    run = summary(Topology((0, 1)), {"train": [(Op.ALL_REDUCE, 1000, (0, 1))] * 10}, {"train": 10}, {"train": 0.0})
    egress = 1000 + 576 + 66 * (1576 / 1448 + 12)
    link = 10 * egress * 8 / GBIT + 10 * 4 * 10e-6  # 4 rounds a call (2 iterations each way), 10 us each
    assert predict(run, cluster()).train_seconds == pytest.approx(link)
    # at a tenth of the rate, the bandwidth term alone grows tenfold
    slow = predict(run, with_link_rate(cluster(), 0.1)).train_seconds
    assert slow == pytest.approx(10 * 10 * egress * 8 / GBIT + 10 * 4 * 10e-6)


def test_a_tree_broadcast_costs_its_busiest_node_and_log2_rounds() -> None:
    # 4 nodes x 1 rank, one broadcast of 8000 B from rank 0: rounds 1 (0->1) and 2 (0->2, 1->3); node 0's link
    # sends twice: 2 x (8000 + 2 x 48) B + one receive notification each way back... it receives none, so
    # 2 x 96 of framing, and 66 B headers on 2 x 8096 / 1448 + 3 x 2 packets
    run = summary(Topology((0, 1, 2, 3)), {"sync": [(Op.BROADCAST, 8000, (0, 1, 2, 3))]}, {"ab": 1}, {"ab": 0.0})
    node0 = 2 * 8000 + 2 * 96 + 66 * (2 * 8096 / 1448 + 3 * 2)
    assert predict(run, cluster()).sync_seconds == pytest.approx(node0 * 8 / GBIT + 2 * 10e-6)


def test_the_overlap_rule_by_hand() -> None:
    # one bucket: it is ready when the backward ends, nothing overlaps
    assert overlapped_step(0.03, 0.06, 1, 2 / 3) == pytest.approx(0.09)
    # three buckets of 0.02 s, ready at 0.03 x (1/3 + 2/9 j): 0.01667, 0.02333, 0.03; the link ends them at
    # 0.03667, 0.05667, 0.07667
    assert overlapped_step(0.03, 0.06, 3, 2 / 3) == pytest.approx(0.07667, abs=1e-5)
    # a link much faster than the backward: only the last bucket, ready as the backward ends, shows
    assert overlapped_step(0.03, 0.003, 3, 2 / 3) == pytest.approx(0.031)


def test_an_ab_cycle_its_phases_syncs_and_time_to_target() -> None:
    # 2 nodes x 2 ranks. warmup: world all-reduce 4000 B a step (one bucket); ab: group all-reduces inside
    # each node (intra rate, no link); one sync: a world all-reduce of 2000 B; rebound like warmup.
    topology, world = Topology((0, 0, 1, 1)), (0, 1, 2, 3)
    calls = {"warmup": [(Op.ALL_REDUCE, 4000, world)] * 10,
             "ab": [(Op.ALL_REDUCE, 1000, (0, 1)), (Op.ALL_REDUCE, 1000, (2, 3))] * 20,
             "sync": [(Op.ALL_REDUCE, 2000, world)], "rebound": [(Op.ALL_REDUCE, 4000, world)] * 10}
    steps = {"warmup": 10, "ab": 20, "rebound": 10}
    history = [{"step": 20, "val_top1": 0.5}, {"step": 40, "val_top1": 0.9}]
    run = summary(topology, calls, steps, {"warmup": 0.2, "ab": 0.2, "rebound": 0.2},
                  starts=[("warmup", 0), ("ab", 10), ("rebound", 30)], history=history, target=0.9)
    hand = cluster()
    p = predict(run, hand)
    # each phase: compute from the run (0.02, 0.01, 0.02 s a step); warmup's all-reduce adds its link time
    world_call = predict(summary(topology, {"train": [(Op.ALL_REDUCE, 4000, world)]}, {"train": 1},
                                 {"train": 0.0}), hand).train_seconds
    assert p.step_seconds["warmup"] == pytest.approx(0.02 + world_call)
    assert p.step_seconds["rebound"] == pytest.approx(p.step_seconds["warmup"])
    # the group all-reduce stays in the node: 2 ranks x 1000 B ring = 1000 B wire a rank at 8 Gbit/s, 4 rounds of 1 us
    assert p.step_seconds["ab"] == pytest.approx(0.01 + 1000 * 8 / 8e9 + 4 * 1e-6)
    assert p.train_seconds == pytest.approx(10 * p.step_seconds["warmup"] + 20 * p.step_seconds["ab"]
                                            + 10 * p.step_seconds["rebound"] + p.sync_seconds)
    assert p.time_to_target_seconds == pytest.approx(p.train_seconds)  # reached at the last step
    history[1]["val_top1"] = 0.5
    assert predict(run, hand).time_to_target_seconds == float("inf")
    history[0]["val_top1"] = 0.95  # at step 20: all of warmup, half of ab, half the syncs (spread by steps)
    assert predict(run, hand).time_to_target_seconds == pytest.approx(
        10 * p.step_seconds["warmup"] + 10 * p.step_seconds["ab"] + p.sync_seconds / 2)


def test_break_even_is_the_rate_where_both_take_as_long() -> None:
    # ddp: 0.01 s compute + a 100 kB all-reduce a step; ab: 0.02 s compute + 10 kB: equal near the rate r
    # where 100 kB x c / r = 0.01 + 10 kB x c / r (c: bytes on the link per payload byte, framing included)
    world, topology = (0, 1), Topology((0, 1))
    ddp = summary(topology, {"train": [(Op.ALL_REDUCE, 100_000, world)] * 10}, {"train": 10}, {"train": 0.1})
    ab = summary(topology, {"train": [(Op.ALL_REDUCE, 10_000, world)] * 10}, {"train": 10}, {"train": 0.2})
    rate = break_even_gbit(ab, ddp, cluster())
    assert rate is not None
    at = with_link_rate(cluster(), rate)
    assert predict(ab, at).train_seconds == pytest.approx(predict(ddp, at).train_seconds, rel=1e-6)
    faster = with_link_rate(cluster(), rate * 2)
    assert predict(ab, faster).train_seconds > predict(ddp, faster).train_seconds


def test_throughput_compute_is_the_dense_model_s_flops_in_every_phase() -> None:
    run = summary(Topology((0, 1)), {}, {"warmup": 10, "ab": 10}, {"warmup": 1.0, "ab": 1.0},
                  compression={"dense_params": 1000, "trained_model_params": 250})
    run["timing"].update(forward_flops_per_sample=1e9, local_batch_size=100)
    p = predict(run, cluster(from_run=False, throughput={"tflops": 100, "efficiency": 0.5}))
    full = 3 * 1e9 * 100 / (100e12 * 0.5)  # forward + backward (2x) FLOPs of a batch at half the peak
    assert p.step_seconds == pytest.approx({"warmup": full, "ab": full})  # AB's factors run as their dense product


def test_throughput_compute_counts_each_ab_phase_at_the_flops_its_factored_layers_computed() -> None:
    # warmup [0, 10) | AB [10, 20) | rebound [20, 25) | AB [25, 30) | rebound [30, 40); per sample the factored
    # weights' products cost 6e8 FLOPs dense and 2e8 (first AB phase) or 3e8 (second) as the layers compute them
    starts = [("warmup", 0), ("ab", 10), ("rebound", 20), ("ab", 25), ("rebound", 30)]
    decompositions = [{"step": 10, "product_flops_per_sample": {"dense": 6e8, "factored": 2e8}},
                      {"step": 25, "product_flops_per_sample": {"dense": 6e8, "factored": 3e8}}]
    run = summary(Topology((0, 1)), {}, {"warmup": 10, "ab": 15, "rebound": 15}, {"warmup": 1.0, "ab": 1.0, "rebound": 1.0},
                  starts, compression={"dense_params": 1000, "trained_model_params": 250}, decompositions=decompositions)
    run["timing"].update(forward_flops_per_sample=1e9, local_batch_size=100)
    p = predict(run, cluster(from_run=False, throughput={"tflops": 100, "efficiency": 0.5}))
    full = 3 * 1e9 * 100 / (100e12 * 0.5)
    share = (10 * (1e9 - 4e8) + 5 * (1e9 - 3e8)) / 15 / 1e9  # each AB phase by its steps
    assert p.step_seconds == pytest.approx({"warmup": full, "ab": share * full, "rebound": full})
    run["timing"]["forward_flops_per_sample"] = 5e8  # a dense count without the products (eval mode's fused attention)
    p = predict(run, cluster(from_run=False, throughput={"tflops": 100, "efficiency": 0.5}))
    assert p.step_seconds["ab"] == pytest.approx(p.step_seconds["warmup"])


def test_measured_compute_lies_between_the_dense_and_the_factored_step() -> None:
    run = summary(Topology((0, 1)), {}, {"warmup": 10, "ab": 10}, {"warmup": 1.0, "ab": 1.0},
                  compression={"dense_params": 1000, "trained_model_params": 600})
    run["timing"].update(forward_flops_per_sample=1e9, local_batch_size=100)
    step = {"arch": "vit", "forward_flops_per_sample": 1_000_000_000, "precision": "bf16",
            "full_seconds_per_sample": 1e-4, "lowrank_seconds_per_sample": 6e-5, "lowrank_params_ratio": 0.2}
    p = predict(run, cluster(from_run=False, measured=[step]))
    # the factored phase at 0.6 of the parameters: halfway from 0.2 (6e-5 s) to 1.0 (1e-4 s) is 8e-5 s a sample
    assert p.step_seconds == pytest.approx({"warmup": 100 * 1e-4, "ab": 100 * 8e-5})
    other = cluster(from_run=False, measured=[{**step, "precision": "fp32"}])
    with pytest.raises(ConfigError, match="no measured or published rate for vit .* in bf16, and no throughput "
                                          "for bf16; calibrate it"):
        predict(run, other)


def test_shipped_clusters_load_and_bad_files_are_one_line(tmp_path: Path) -> None:
    assert {"paper-a100-hdr200", "ethernet-25g", "this-machine"} <= set(cluster_names())
    paper = load_cluster("paper-a100-hdr200").inter_node  # two HDR adapters of 200 Gbit/s, 24 GB/s each in NCCL
    assert (paper.gbit_per_s, paper.efficiency) == (400, 0.96)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes: 2\naccelerators_per_node: 1\ninter_node: {gbit_per_s: 0}\n"
                   "intra_node: {gbit_per_s: 1}\ncompute: {from_run: true}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: inter_node.gbit_per_s: Input should be greater than 0"):
        load_cluster(str(bad))
    bad.write_text("name: x\nnodes: 2\naccelerators_per_node: 1\ninter_node: {gbit_per_s: 1}\n"
                   "intra_node: {gbit_per_s: 1}\ncompute: {}\n")
    with pytest.raises(ConfigError, match="compute needs from_run: true, measured steps, published rates or a throughput"):
        load_cluster(str(bad))
    with pytest.raises(ConfigError, match="no such description; choose one of .*this-machine"):
        load_cluster("nowhere")
    run = summary(Topology((0, 0, 0, 1, 1, 1)), {}, {"train": 1}, {"train": 1.0})
    with pytest.raises(ConfigError, match=r"2 node\(s\) x 3 rank\(s\) do not fit cluster hand \(4 x 2\)"):
        predict(run, cluster())


@pytest.mark.slow  # runs the calibration benchmark's ranks: the whole suite's, not the fast tier's
def test_calibration_writes_a_cluster_whose_measured_compute_predicts_a_run(tmp_path: Path) -> None:
    out = tmp_path / "node.yaml"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "calibrate_cluster.py"), "--out", str(out), "--name",
                    "node", "--models", "quickstart", "--batches", "1,2", "--steps", "1", "--nodes", "2"],
                   check=True, capture_output=True, text=True)
    node = load_cluster(str(out))
    (step,) = node.compute.measured
    assert (step.arch, step.precision, node.nodes) == ("vit", "fp32", 2) and 0 < step.lowrank_params_ratio < 1
    assert node.compute.step_floor_ms == pytest.approx(step.step_floor_seconds * 1e3)
    assert node.compute.step_floor_source.startswith("measured: the smallest dense intercept")
    # a run of the quickstart model (its FLOPs a sample identify it) gets the measured floor and seconds a sample
    run = summary(Topology((0, 1)), {}, {"train": 10}, {"train": 1.0}, compression={"dense_params": 1, "trained_model_params": 1})
    run["config"]["train.precision"] = "fp32"
    run["timing"].update(forward_flops_per_sample=step.forward_flops_per_sample, local_batch_size=32)
    p = predict(run, node)
    assert p.step_seconds["train"] == pytest.approx(step.step_floor_seconds + 32 * step.full_seconds_per_sample)
    assert p.compute_source.kind == "measured" and "calibrated on" in p.compute_source.detail


def test_the_calibration_fits_a_step_floor_and_seconds_a_sample() -> None:
    fit_line = load_benchmark("calibrate_cluster").fit_line
    # 2 ms + 0.5 ms a sample at batches 1, 4, 16, with +-0.1 ms of noise that cancels in the fit
    assert fit_line([1, 4, 16], [2.6e-3, 3.9e-3, 10.1e-3]) == pytest.approx((2.0e-3, 0.5e-3), abs=1e-4)
    # a line that would cross zero below batch 0, or fall with the batch (noise): no floor, the slope through
    # the origin
    assert fit_line([2, 4], [1.0e-3, 3.0e-3]) == pytest.approx((0.0, (2 * 1e-3 + 4 * 3e-3) / 20))
    assert fit_line([1, 2], [3.0e-3, 2.0e-3]) == pytest.approx((0.0, (1 * 3e-3 + 2 * 2e-3) / 5))


RESNET50 = {"arch": "resnet50", "forward_flops_per_sample": 8_000_000_000, "precisions": ["bf16", "fp16"],
            "as_published": "AMP", "images_per_s_per_gpu": 1000.0, "batch_per_gpu": 250, "gpus": 1,
            "device": "some GPU", "source": "https://example.org/rn50"}


def model_run(arch: str, flops: float, precision: str = "bf16", batch: int = 250) -> dict[str, Any]:
    run = summary(Topology((0, 1)), {}, {"warmup": 10, "ab": 10}, {"warmup": 1.0, "ab": 1.0},
                  compression={"dense_params": 1000, "trained_model_params": 250})
    run["config"].update({"model.arch": arch, "train.precision": precision})
    run["timing"].update(forward_flops_per_sample=flops, local_batch_size=batch)
    return run


def test_published_rates_give_compute_and_name_their_source_scaled_within_a_family_else_assumed() -> None:
    hand = cluster(from_run=False, published=[RESNET50], step_floor_ms=10.0, step_floor_source="assumed: a guess",
                   throughput={"tflops": {"fp32": 20, "bf16": 300}, "efficiency": 0.25})
    # the published model at its batch runs at the published rate: 250 images at 1000/s, floor included
    p = predict(model_run("resnet50", 8e9), hand)
    assert p.step_seconds["warmup"] == pytest.approx(0.25) and p.step_floor_seconds == pytest.approx(0.01)
    assert p.compute_source.kind == "published" and "https://example.org/rn50" in p.compute_source.detail
    assert p.notes == []  # published, and the floor is a small part of the step
    # at another batch the floor stays and the rest scales: 0.01 + 100 x (1/1000 - 0.01/250)
    assert predict(model_run("resnet50", 8e9, batch=100), hand).step_seconds["warmup"] == pytest.approx(0.01 + 0.096)
    # resnet18 (same family, a quarter of the FLOPs): scaled from resnet50, and flagged as a guess
    scaled = predict(model_run("resnet18", 2e9), hand)
    assert scaled.step_seconds["warmup"] == pytest.approx(0.01 + 250 * (1e-3 - 4e-5) / 4)
    assert scaled.compute_source.kind == "scaled" and scaled.compute_source.detail.startswith("from resnet50 by")
    assert scaled.notes == ["compute on hand is not measured (scaled); calibrate a node "
                            "(benchmarks/calibrate_cluster.py) for a measured figure"]
    # a ViT in fp32: no row of its family or precision, so the assumed throughput for fp32 (20 TFLOP/s at 25%)
    assumed = predict(model_run("vit", 1e9, precision="fp32", batch=100), hand)
    assert assumed.step_seconds["warmup"] == pytest.approx(0.01 + 3 * 1e9 * 100 / (20e12 * 0.25))
    assert assumed.compute_source == ComputeSource("assumed", "25% of 20 TFLOP/s (fp32) for 3 x the forward FLOPs a sample")
    assert assumed.notes[0].startswith("compute on hand is not measured (assumed)")
    with pytest.raises(ConfigError, match="no measured or published rate for vgg16 .* and no throughput for fp16"):
        predict(model_run("vgg16", 1e9, precision="fp16"), hand)


def test_the_step_floor_is_in_every_step_and_a_step_that_is_mostly_floor_says_so() -> None:
    hand = cluster(from_run=False, throughput={"tflops": 100, "efficiency": 0.5}, step_floor_ms=2.0,
                   step_floor_source="assumed: a guess")
    p = predict(model_run("vit", 1e6, batch=32), hand)  # 3 x 1e6 x 32 / 50e12: about 2 microseconds
    assert p.step_seconds == pytest.approx({"warmup": 2e-3 + 1.92e-6, "ab": 2e-3 + 1.92e-6})
    assert p.notes[1] == ("predicted steps on hand are mostly its per-step floor (2 ms, assumed): the model "
                          "computes less than that a step")
    # without a floor, a step no GPU could run says so too
    bare = predict(model_run("vit", 1e6, batch=32), cluster(from_run=False, throughput={"tflops": 100, "efficiency": 0.5}))
    assert bare.step_seconds["warmup"] == pytest.approx(1.92e-6)
    assert bare.notes[1].startswith("predicted steps on hand compute in under 1 ms, less than any real GPU step")
    # the run's own step times hold their own fixed cost: nothing is added, nothing is flagged
    own = predict(model_run("vit", 1e6, batch=32), cluster())
    assert own.step_seconds["warmup"] == pytest.approx(0.1) and own.notes == [] and own.step_floor_seconds == 0


def test_a_measured_step_floor_lies_between_the_dense_and_the_factored_one() -> None:
    step = {"arch": "vit", "forward_flops_per_sample": 1_000_000_000, "precision": "bf16",
            "full_seconds_per_sample": 1e-4, "lowrank_seconds_per_sample": 6e-5, "lowrank_params_ratio": 0.2,
            "step_floor_seconds": 0.004, "lowrank_step_floor_seconds": 0.006}
    run = model_run("vit", 1e9, batch=100)
    run["compression"]["trained_model_params"] = 600
    p = predict(run, cluster(from_run=False, measured=[step]))
    # dense 0.004 + 0.01; factored (0.2 of the parameters) 0.006 + 0.006; at 0.6: halfway, 0.013
    assert p.step_seconds == pytest.approx({"warmup": 0.014, "ab": 0.013})


@pytest.mark.parametrize(("compute", "message"), [
    ("{from_run: true, throughput: {tflops: 312, efficiency: 0.4}}",
     "compute: from_run takes the run's own step times, so throughput would be ignored; remove it or from_run"),
    ("{from_run: true, step_floor_ms: 1, step_floor_source: 'assumed: a guess'}",
     "compute: from_run takes the run's own step times, so step_floor_ms would be ignored"),
    ("{throughput: {tflops: 312, efficiency: 0.4}, step_floor_ms: 1}",
     "compute: step_floor_ms needs a step_floor_source that begins with measured .how., published .a link. or "
     "assumed .why., got ''"),
    ("{throughput: {tflops: {fp32: 0}, efficiency: 0.4}}", "compute.throughput: throughput.tflops must be positive"),
])
def test_contradicting_compute_is_refused_in_one_line(tmp_path: Path, compute: str, message: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes: 2\naccelerators_per_node: 1\ninter_node: {gbit_per_s: 1}\n"
                   f"intra_node: {{gbit_per_s: 1}}\ncompute: {compute}\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: {message}") as error:
        load_cluster(str(bad))
    assert "\n" not in str(error.value)


def test_the_quickstart_on_the_paper_cluster_takes_no_step_under_a_millisecond_and_says_it_is_a_guess() -> None:
    # the quickstart's model (studies/run_quickstart.yaml): a 2-layer ViT on 8-pixel digits, batch 32
    flops = forward_flops_per_sample(ModelConfig(arch="vit", patch_size=4, num_layers=2, num_heads=4, hidden_dim=96,
                                                 mlp_dim=192), DatasetInfo(10, 8, 3, "digits"))
    paper = load_cluster("paper-a100-hdr200")
    for precision, kind in (("fp32", "assumed"), ("bf16", "scaled")):
        p = predict(model_run("vit", flops, precision=precision, batch=32), paper)
        assert min(p.step_seconds.values()) >= 1e-3, precision
        assert p.compute_source.kind == kind and p.notes[0].startswith(f"compute on paper-a100-hdr200 is not measured ({kind})")
        assert p.notes[1].startswith("predicted steps on paper-a100-hdr200 are mostly its per-step floor (2 ms, assumed)")


def test_the_shipped_gpu_clusters_predict_their_published_rates_at_the_published_batch() -> None:
    for name in ("paper-a100-hdr200", "ethernet-25g"):
        for rate in load_cluster(name).compute.published:
            run = model_run(rate.arch, rate.forward_flops_per_sample, rate.precisions[0], rate.batch_per_gpu)
            described = load_cluster(name)
            p = predict(run, described)
            # at the published GPU count; this run's 2 ranks wait for the slower of 2 instead
            at_two = straggling(described.compute, rate.gpus) / straggling(described.compute, 2)
            assert rate.batch_per_gpu / p.step_seconds["warmup"] == pytest.approx(rate.images_per_s_per_gpu * at_two)
            assert p.compute_source.kind == "published" and rate.source in p.compute_source.detail


def test_mlflow_gets_the_prediction_and_never_an_infinity() -> None:
    from abtune.tracking.records import predicted_metrics, predicted_tags

    run = summary(Topology((0, 1)), {"train": [(Op.ALL_REDUCE, 1000, (0, 1))]}, {"train": 1}, {"train": 0.5},
                  history=[{"step": 1, "val_top1": 0.1}], target=0.9)
    predicted = predict(run, cluster()).as_dict()
    metrics = predicted_metrics(predicted)
    assert metrics["predicted/time_to_target_seconds"] is None  # never reached: inf, which MLflow cannot plot
    assert metrics["predicted/train_seconds"] == metrics["predicted/step_seconds_train"] > 0.5
    assert predicted_metrics(None) == {}
    # where the compute came from rides along as tags (MLflow metrics are numbers)
    assert (predicted["compute_source"], predicted["step_floor_seconds"]) == ("measured", 0.0)
    assert predicted_tags(predicted) == {"abtune.predicted.compute_source": "measured",
                                         "abtune.predicted.compute_source_detail": FROM_RUN.detail,
                                         "abtune.predicted.cluster": "hand"}
    assert predicted_tags(None) == {}


def test_the_paper_cluster_agrees_with_published_figures_it_does_not_hold() -> None:
    """BENCHMARKS.md's table: images/s on 8 GPUs and on 2 nodes (NVIDIA DeepLearningExamples, FlagPerf), and
    the all-reduce of ResNet-50's and ViT-B/16's gradients at 2, 4 and 8 nodes (NCCL's published bus
    bandwidth), each within 20%."""
    bench = load_benchmark("bench_published_figures")
    paper = load_cluster("paper-a100-hdr200")
    checked = [row for row in bench.rate_rows() if row.checks]
    assert len(checked) == 3
    for row in checked:
        predicted, kind = bench.predicted_rate(row, paper)
        assert kind == "published" and predicted == pytest.approx(row.published, rel=0.2), row.what
    for arch in ("resnet50", "vit_b_16"):
        for nodes in (2, 4, 8):
            predicted, published = bench.all_reduce_seconds(arch, nodes, paper)
            assert published < predicted < 1.2 * published, (arch, nodes)
