"""`abtune compare` ends with a verdict on top-1 against training traffic (which method dominates which, which
trade one for the other), and names SBC's own figure as update compression beside the model's compression."""

from __future__ import annotations

from rich.console import Console

from abtune import compare
from abtune.compare import ComparisonRow, verdict


def _row(method: str, top1: float, mb: float, **more: float) -> ComparisonRow:
    return ComparisonRow(method, final_top1=top1, training_inter_node_mb=mb, training_mb=mb, ddp_training_inter_node_mb=64.0,
                         compression=1.0, reduction_vs_ddp=64.0 / mb, inter_node_reduction_vs_ddp=64.0 / mb,
                         other_mb=0.0, val_loss=0.1, train_seconds=1.0, wall_seconds=2.0, **more)


def test_the_verdict_names_who_dominates_and_who_trades_off() -> None:
    rows = [_row("ddp", 0.96, 64.0), _row("ab", 0.94, 30.0), _row("powersgd", 0.95, 20.0), _row("fp16", 0.93, 32.0),
            ComparisonRow("sbc", error="rank 1 died")]
    assert verdict(rows) == ("verdict: powersgd dominates ab and fp16 (no lower top-1, no more traffic, better on one); "
                             "ddp and powersgd trade top-1 for traffic (highest top-1 first)")
    assert verdict([_row("ddp", 0.96, 64.0), _row("ab", 0.97, 30.0)]) == (
        "verdict: ab dominates ddp (no lower top-1, no more traffic, better on one); ab is best on both")
    assert verdict([_row("ddp", 0.96, 64.0)]) is None


def test_sbc_shows_its_update_compression_apart_from_the_models(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(compare.tables, "console", lambda: Console(width=100, highlight=False))
    compare.print_table([_row("ddp", 0.96, 64.0, method_ratio=1.0), _row("sbc", 0.95, 0.039, method_ratio=1641.4)])
    out = capsys.readouterr().out
    assert "1,641.4:1" in out and "update compression: what sbc compresses each gradient update by" in out
    assert "ddp and sbc compress" not in out  # ddp sends its gradients whole
    assert out.rstrip().splitlines()[-1].startswith("verdict: ddp and sbc trade top-1 for traffic")
    assert max(len(line) for line in out.splitlines()) <= 100
