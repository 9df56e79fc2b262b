"""Sparse Binary Compression (Sattler et al., arXiv 1805.08768) on abtune's trainer.

Each rank trains alone for `delay` optimizer steps, then forms its update since the last exchange,
dW = W - W_ref, adds the residual of what it did not send before, and compresses it per tensor:
the top `sparsity` fraction of the positive and of the negative entries, the side with the larger
mean magnitude kept, every kept entry replaced by that mean (`compress.sparse_binarize`). The
positions are Golomb/Rice coded into bytes; one frame per rank (all tensors' records) crosses the
wire in an all-gather of variable-length messages; every rank decodes every frame, averages the
updates in rank order (so all ranks agree bit for bit) and sets W = W_ref + mean.

Traffic is counted from the real encoded bytes (plus the length exchange and the padding of the
all-gather); `summary()` also reports the closed-form expected bits for comparison.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from abtune.comm import all_gather_bytes
from abtune.methods.base import Method
from abtune.methods.ddp.method import average_buffers_
from abtune.methods.sbc.compress import (
    BITS_PER_BYTE,
    Message,
    decode_from,
    dense_from,
    encode,
    encoded_bits_closed_form,
    sparse_binarize,
    sparsify_dense,
)
from abtune.phases import Phase

FLOAT32_BYTES = 4


@dataclass
class ExchangeStats:
    exchanges: int = 0
    encoded_bytes: int = 0  # this rank's frames
    padded_frame_bytes: int = 0  # the longest frame of each exchange: what every rank sends in the all-gather
    closed_form_bytes: float = 0.0  # expected size of the same messages (closed form)
    dense_update_bytes: int = 0  # the fp32 updates those frames stand for
    positions_sent: int = 0


class SparseBinaryCompression(Method):
    name = "sbc"

    def _setup(self) -> None:
        self.module = self.model  # no wrapper: ranks train alone between exchanges
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.reference = [p.detach().clone() for p in self.params]
        self.residual = [torch.zeros_like(p) for p in self.params]
        self.stats = ExchangeStats()
        self.rebuild_optimizer(self.params)

    def begin_step(self, step: int) -> None:
        self.meter.phase = Phase.TRAIN

    @property
    def phase(self) -> str:
        return Phase.TRAIN.value

    def end_step(self, step: int) -> None:
        if (step + 1) % self.config.delay == 0 or step + 1 == self.ctx.total_steps:
            self.exchange()

    # --- one exchange -------------------------------------------------------------------------
    def exchange(self) -> None:
        frame = self._compress_updates()
        frames = all_gather_bytes(self.meter, frame, self.world, self.ctx.env.device)
        self.stats.padded_frame_bytes += max(len(f) for f in frames)
        mean_updates = self._decode_mean(frames)
        with torch.no_grad():
            for param, reference, update in zip(self.params, self.reference, mean_updates, strict=True):
                reference += update.view_as(reference)
                param.copy_(reference)
        self.stats.exchanges += 1

    def _compress_updates(self) -> bytes:
        """This rank's frame; the residuals keep exactly what the frame leaves out."""
        records = []
        with torch.no_grad():
            for param, reference, residual in zip(self.params, self.reference, self.residual, strict=True):
                update = param - reference + residual
                message = self._compress(update)
                sent = dense_from(message, update.device).view_as(update)
                residual.copy_(update - sent)
                records.append(encode(message))
                self._count(message, update)
        frame = b"".join(records)
        self.stats.encoded_bytes += len(frame)
        return frame

    def _compress(self, update: torch.Tensor) -> Message:
        if self.config.binarize:
            return sparse_binarize(update, self.config.sparsity)
        return sparsify_dense(update, self.config.sparsity)

    def _count(self, message: Message, update: torch.Tensor) -> None:
        count = len(message.positions)
        bits = encoded_bits_closed_form(update.numel(), count, binarized=self.config.binarize)
        self.stats.closed_form_bytes += bits / BITS_PER_BYTE
        self.stats.dense_update_bytes += update.numel() * FLOAT32_BYTES
        self.stats.positions_sent += count

    def _decode_mean(self, frames: list[bytes]) -> list[torch.Tensor]:
        device = self.ctx.env.device
        totals = [torch.zeros(p.numel(), dtype=torch.float32, device=device) for p in self.params]
        for frame in frames:  # rank order: every rank sums in the same order
            offset = 0
            for total in totals:
                message, offset = decode_from(frame, offset)
                total += dense_from(message, device)
        return [(total / len(frames)).to(p.dtype) for total, p in zip(totals, self.params, strict=True)]

    # --- evaluation, reporting, checkpoints ------------------------------------------------------
    def eval_module(self) -> nn.Module:
        """The model all ranks agree on: the weights of the last exchange (local steps since are not shared)."""
        self.meter.phase = Phase.EVAL
        average_buffers_(self.model, self.meter, self.world)
        agreed = self.ctx.make_dense_model()
        agreed.load_state_dict(self.model.state_dict())
        with torch.no_grad():
            for param, reference in zip((p for p in agreed.parameters() if p.requires_grad), self.reference,
                                        strict=True):
                param.copy_(reference)
        return agreed

    def compression_ratio(self) -> float:
        """Dense fp32 updates of every step (what DDP would send) per encoded byte sent."""
        if not self.stats.encoded_bytes:
            return 1.0
        return self.stats.dense_update_bytes * self.config.delay / self.stats.encoded_bytes

    def summary(self) -> dict[str, Any]:
        stats = asdict(self.stats)
        closed = self.stats.closed_form_bytes
        stats["encoded_vs_closed_form"] = self.stats.encoded_bytes / closed if closed else None
        stats["update_compression"] = (self.stats.dense_update_bytes / self.stats.encoded_bytes
                                       if self.stats.encoded_bytes else None)
        return {"sbc": stats}

    def state_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "residual": self.residual, "stats": asdict(self.stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for mine, saved in zip(self.reference + self.residual, state["reference"] + state["residual"], strict=True):
            mine.copy_(saved)
        self.stats = ExchangeStats(**state["stats"])
