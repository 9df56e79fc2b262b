from __future__ import annotations

import pytest

from abtune.comm import CommMeter, Op, Topology, wire_factor


def test_ring_wire_factors() -> None:
    assert wire_factor(Op.ALL_REDUCE, 4) == pytest.approx(1.5)
    assert wire_factor(Op.BROADCAST, 4) == pytest.approx(0.75)
    assert wire_factor(Op.ALL_GATHER, 2) == pytest.approx(0.5)
    assert wire_factor(Op.ALL_REDUCE, 1) == 0.0
    assert wire_factor(Op.BARRIER, 8) == 0.0


def test_groups_inside_one_node_are_intra_node() -> None:
    meter = CommMeter(Topology((0, 0, 1, 1)))
    assert not meter.group("g0", (0, 1)).inter_node
    assert meter.group("mixed", (1, 2)).inter_node
    assert meter.world().inter_node


def test_meter_tallies_by_phase_and_locality_and_round_trips() -> None:
    meter = CommMeter(Topology((0, 0, 1, 1)))
    meter.phase = "warmup"
    meter.record(Op.ALL_REDUCE, 1000, meter.world())
    meter.phase = "ab"
    meter.record(Op.ALL_REDUCE, 400, meter.group("g0", (0, 1)))
    meter.record(Op.ALL_REDUCE, 400, meter.group("g0", (0, 1)))
    assert meter.total(locality="inter") == 1500.0
    assert meter.total(phase="ab") == 800.0
    assert meter.total(phase="ab", key="payload_bytes") == 800
    restored = CommMeter(meter.topology)
    restored.load_state_dict(meter.state_dict())
    assert restored.rows() == meter.rows()
