"""Labels, position-weighted losses and teacher-forced metrics of packed proposal blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

DISTILLATION_KINDS = ("kl", "tv")
# DFlash's published decay per block size (gamma 7 for B = 16); other sizes scale with the block.
_DEFAULT_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    return _DEFAULT_GAMMA.get(block_size, max(1.0, block_size / 2 - 1))


def position_weights(block_size: int, gamma: float, device: torch.device | None = None) -> torch.Tensor:
    """`w_j = exp(-(j - 1) / gamma)` for proposal rows j = 1..B-1."""
    j = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(j - 1) / gamma)


def block_labels(
    input_ids: torch.LongTensor,
    loss_mask: torch.Tensor,
    anchors: torch.LongTensor,
    anchor_valid: torch.BoolTensor,
    block_size: int,
) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """Labels `x_{a+1} .. x_{a+B-1}` of the blocks at `anchors`, `(b, A, B-1)`, and where they count.

    A label counts while every token from `a + 1` up to it is a response token inside the sequence: a block's labels
    end with the response it starts in.
    """
    length = input_ids.shape[1]
    positions = anchors[:, :, None] + torch.arange(1, block_size, device=anchors.device)  # (b, A, B-1)
    inside = positions < length
    clamped = positions.clamp(max=length - 1)
    labels = torch.gather(input_ids, 1, clamped.flatten(1)).view_as(positions)
    response = torch.gather(loss_mask.bool(), 1, clamped.flatten(1)).view_as(positions) & inside
    valid = torch.cumprod(response.long(), dim=-1).bool() & anchor_valid[:, :, None]
    return labels, valid


def leading_matches(
    predictions: torch.LongTensor, labels: torch.LongTensor, valid: torch.BoolTensor
) -> torch.LongTensor:
    """Per block, how many leading rows equal their (valid) label: the drafts a target would accept."""
    hits = (predictions == labels) & valid
    return torch.cumprod(hits.long(), dim=-1).sum(dim=-1)


def draft_losses(
    logits: torch.Tensor,
    labels: torch.LongTensor,
    target_logits: torch.Tensor | None = None,
    distillation: str | None = None,
    distillation_weight: float = 0.0,
) -> torch.Tensor:
    """Per-row loss `(b, A, B-1)`: `(1 - λ) CE + λ D` with D the KL or total variation to the target's distribution.

    KL is `KL(p_target || q_drafter)`; total variation is `½ Σ |p_target - q_drafter|`.
    """
    log_q = F.log_softmax(logits.float(), dim=-1)
    ce = -torch.gather(log_q, -1, labels[..., None]).squeeze(-1)
    if not distillation or distillation_weight == 0.0:
        return ce
    if target_logits is None:
        raise ValueError("Distillation needs the target's logits at the block positions.")
    log_p = F.log_softmax(target_logits.float(), dim=-1)
    if distillation == "kl":
        divergence = (log_p.exp() * (log_p - log_q)).sum(-1)
    elif distillation == "tv":
        divergence = 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)
    else:
        raise ValueError(f"distillation must be one of {DISTILLATION_KINDS} or None, got {distillation!r}.")
    return (1.0 - distillation_weight) * ce + distillation_weight * divergence


def weighted_block_loss_sum(row_losses: torch.Tensor, valid: torch.BoolTensor, weights: torch.Tensor) -> torch.Tensor:
    """`Σ_blocks Σ_j w_j ℓ_j / Σ_j w_j` over valid rows: each anchor contributes at most its weighted mean loss.

    Dividing this sum by the number of anchors (the same count for one large batch and for its accumulated parts)
    gives the reported loss, so gradient accumulation and multi-process runs scale exactly like a single batch.
    """
    return (row_losses * valid * weights).sum() / weights.sum()


def teacher_forced_metrics(
    logits: torch.Tensor, labels: torch.LongTensor, valid: torch.BoolTensor, anchor_valid: torch.BoolTensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Sums and counts of per-position accuracy and teacher-forced acceptance length.

    Acceptance length under teacher forcing is `1 + (leading rows whose argmax equals the label)`: the bonus token
    plus the drafts a greedy target would accept, given the recorded prefix.
    """
    predictions = logits.argmax(-1)
    hits = (predictions == labels) & valid
    metrics = {
        f"acc_pos_{j + 1:02d}": (hits[..., j].sum().float(), valid[..., j].sum().float())
        for j in range(labels.shape[-1])
    }
    accepted = leading_matches(predictions, labels, valid)
    metrics["tau_teacher_forced"] = (((accepted + 1) * anchor_valid).sum().float(), anchor_valid.sum().float())
    return metrics


__all__ = [
    "DISTILLATION_KINDS",
    "block_labels",
    "default_gamma",
    "draft_losses",
    "leading_matches",
    "position_weights",
    "teacher_forced_metrics",
    "weighted_block_loss_sum",
]
