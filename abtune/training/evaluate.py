"""Validation: each rank scores its disjoint shard, one metered all-reduce adds the counts up."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from abtune.comm import CommGroup, CommMeter

TOP_K = 5


@dataclass(frozen=True)
class Evaluation:
    top1: float
    top5: float
    loss: float
    samples: int


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, meter: CommMeter, world: CommGroup) -> Evaluation:
    was_training = model.training
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # top1 hits, top5 hits, loss sum, samples
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        logits = model(images)
        k = min(TOP_K, logits.shape[1])
        hits = logits.topk(k, dim=1).indices.eq(labels[:, None])
        totals[0] += hits[:, 0].sum()
        totals[1] += hits.any(dim=1).sum()
        totals[2] += F.cross_entropy(logits, labels, reduction="sum").double()
        totals[3] += labels.numel()
    model.train(was_training)
    meter.all_reduce(totals, world)
    top1, top5, loss_sum, samples = totals.tolist()
    return Evaluation(top1 / samples, top5 / samples, loss_sum / samples, int(samples))
