"""Labels, position-weighted losses and teacher-forced metrics of packed proposal blocks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

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
    """Per-row loss `(..., )` of `(..., V)` logits: `(1 - λ) CE + λ D`, D the KL or total variation to the target.

    KL is `KL(p_target || q_drafter)`; total variation is `½ Σ |p_target - q_drafter|`. This is the dense reference
    form; training computes the same through `head_row_losses`, chunk by chunk.
    """
    log_q = F.log_softmax(logits.float(), dim=-1)
    ce = -torch.gather(log_q, -1, labels[..., None]).squeeze(-1)
    if not distillation or distillation_weight == 0.0:
        return ce
    if target_logits is None:
        raise ValueError("Distillation needs the target's logits at the block positions.")
    divergence = _divergence(log_q, DenseTeacherChunk(F.log_softmax(target_logits.float(), dim=-1)), distillation)
    return (1.0 - distillation_weight) * ce + distillation_weight * divergence


@dataclass
class DenseTeacherChunk:
    """The target's log-probabilities over the (draft) vocabulary, `(n, V)`."""

    log_probs: torch.Tensor


@dataclass
class SparseTeacherChunk:
    """The target's top-k, `(n, K)`: draft-vocabulary indices and log-probabilities renormalised over the entries
    that lie in the draft vocabulary (`-inf` for the others)."""

    indices: torch.LongTensor
    log_probs: torch.Tensor


def _divergence(log_q: torch.Tensor, teacher, kind: str) -> torch.Tensor:
    if kind not in DISTILLATION_KINDS:
        raise ValueError(f"distillation must be one of {DISTILLATION_KINDS} or None, got {kind!r}.")
    if isinstance(teacher, DenseTeacherChunk):
        log_p = teacher.log_probs
        if kind == "kl":
            return torch.where(log_p > float("-inf"), log_p.exp() * (log_p - log_q), 0.0).sum(-1)
        return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)
    # Sparse teacher: p is zero outside its top-k entries.
    p = teacher.log_probs.exp()
    log_q_k = torch.gather(log_q, -1, teacher.indices)
    present = p > 0
    if kind == "kl":
        return torch.where(present, p * (teacher.log_probs - log_q_k), 0.0).sum(-1)
    q_k = torch.where(present, log_q_k.exp(), 0.0)
    return 0.5 * ((p - q_k).abs().sum(-1) + (1.0 - q_k.sum(-1)).clamp(min=0.0))


class DenseTeacher:
    """Teacher from the target's final-norm states `(N, H)` at the trained rows: logits through the target's head
    are computed a chunk at a time, restricted to the draft vocabulary and renormalised there."""

    def __init__(self, states: torch.Tensor, logits_fn, draft_token_ids: torch.LongTensor | None):
        self.states, self.logits_fn, self.draft_token_ids = states, logits_fn, draft_token_ids

    def chunk(self, start: int, end: int) -> DenseTeacherChunk:
        with torch.no_grad():
            logits = self.logits_fn(self.states[start:end])
            if self.draft_token_ids is not None:
                logits = logits.index_select(-1, self.draft_token_ids)
            return DenseTeacherChunk(F.log_softmax(logits.float(), dim=-1))


class TopKTeacher:
    """Teacher from stored top-k next-token log-probabilities `(N, K)` (target ids), restricted to the draft
    vocabulary and renormalised over what remains (rows whose top-k lies wholly outside it get no divergence)."""

    def __init__(self, token_ids: torch.LongTensor, log_probs: torch.Tensor, to_draft_indices):
        self.token_ids, self.log_probs, self.to_draft_indices = token_ids, log_probs, to_draft_indices

    def chunk(self, start: int, end: int) -> SparseTeacherChunk:
        with torch.no_grad():
            indices, inside = self.to_draft_indices(self.token_ids[start:end].long())
            log_p = self.log_probs[start:end].float().masked_fill(~inside, float("-inf"))
            log_p = log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)
            return SparseTeacherChunk(indices, torch.nan_to_num(log_p, nan=float("-inf")))


def head_row_losses(
    hidden: torch.Tensor,
    head,
    labels: torch.LongTensor,
    *,
    transition=None,
    teacher=None,
    distillation: str | None = None,
    distillation_weight: float = 0.0,
    max_chunk_elements: int = 1 << 25,
    overlap: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Per-row losses `(N,)` and argmax drafts `(N,)` (target ids) of N trained rows, never building the
    `(N x V)` logits at once; with `overlap`, also `(N,)` `Σ_v min(p_v, q_v)` against the teacher.

    Args:
        hidden (`(N, d)`): drafter states of the rows that count (contiguous).
        head: the drafter's `DraftHead` (the target's LM head over the draft vocabulary).
        labels (`(N,)`): target ids; a label outside the draft vocabulary adds no cross-entropy (it cannot be
            proposed) and is never predicted.
        transition: optional callable `(start, end) -> (n, V_draft)` Markov logits added to the head's.
        teacher: `DenseTeacher` / `TopKTeacher` for distillation.
        max_chunk_elements: rows x vocabulary per chunk. With gradients and more than one chunk, each chunk is
            recomputed in the backward pass (activation checkpointing), so only one chunk's logits are alive.
        overlap: return the rows' distribution overlap with the teacher, `1 - TV(p, q)`: the probability that a
            draft sampled from q is accepted at temperature 1 where the target's distribution is p (speculative
            sampling accepts with probability `min(1, p / q)`). Needs `teacher`.
    """
    label_index, label_inside = head.to_draft_indices(labels)
    distill = distillation is not None and distillation_weight > 0.0
    if (distill or overlap) and teacher is None:
        raise ValueError("Distillation and overlap need the target's distribution at the trained rows.")
    step = max(1, max_chunk_elements // head.size)

    def rows_loss(h: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = head(h)
        if transition is not None:
            logits = logits + transition(start, end)
        log_q = F.log_softmax(logits, dim=-1)
        ce = -torch.gather(log_q, -1, label_index[start:end, None]).squeeze(-1) * label_inside[start:end]
        loss = ce
        target = teacher.chunk(start, end) if distill or overlap else None
        if distill:
            divergence = _divergence(log_q, target, distillation)
            loss = (1.0 - distillation_weight) * ce + distillation_weight * divergence
        accepted = 1.0 - _divergence(log_q.detach(), target, "tv") if overlap else log_q.new_zeros(0)
        return loss, logits.detach().argmax(-1), accepted

    losses, picks, overlaps = [], [], []
    checkpointed = torch.is_grad_enabled() and hidden.requires_grad and hidden.shape[0] > step
    for start in range(0, hidden.shape[0], step):
        end = min(start + step, hidden.shape[0])
        if checkpointed:
            loss, pick, accepted = torch.utils.checkpoint.checkpoint(
                rows_loss, hidden[start:end], start, end, use_reentrant=False
            )
        else:
            loss, pick, accepted = rows_loss(hidden[start:end], start, end)
        losses.append(loss)
        picks.append(pick)
        overlaps.append(accepted)
    if not losses:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return (empty, labels.new_zeros(0), empty) if overlap else (empty, labels.new_zeros(0))
    out = (torch.cat(losses), head.to_token_ids(torch.cat(picks)))
    return (*out, torch.cat(overlaps)) if overlap else out


def weighted_block_loss_sum(row_losses: torch.Tensor, valid: torch.BoolTensor, weights: torch.Tensor) -> torch.Tensor:
    """`Σ_blocks Σ_j w_j ℓ_j / Σ_j w_j` over valid rows: each anchor contributes at most its weighted mean loss.

    `row_losses` holds the losses of the valid rows only, in `valid`'s order (`(N,)` with `N = valid.sum()`), or of
    every row (`valid`'s shape). Dividing this sum by the number of anchors (the same count for one large batch and
    for its accumulated parts) gives the reported loss, so gradient accumulation and multi-process runs scale exactly
    like a single batch.
    """
    row_weights = weights.expand_as(valid)
    if row_losses.shape == valid.shape:
        return (row_losses * valid * row_weights).sum() / weights.sum()
    return (row_losses * row_weights[valid]).sum() / weights.sum()


def teacher_forced_metrics(
    predictions: torch.Tensor, labels: torch.LongTensor, valid: torch.BoolTensor, anchor_valid: torch.BoolTensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Sums and counts of per-position accuracy and teacher-forced acceptance length.

    `predictions` are the drafter's argmax ids `(b, A, B-1)` (or logits `(b, A, B-1, V)`, reduced here).
    Acceptance length under teacher forcing is `1 + (leading rows whose argmax equals the label)`: the bonus token
    plus the drafts a greedy target would accept, given the recorded prefix.
    """
    if predictions.dim() == labels.dim() + 1:
        predictions = predictions.argmax(-1)
    hits = (predictions == labels) & valid
    metrics = {
        f"acc_pos_{j + 1:02d}": (hits[..., j].sum().float(), valid[..., j].sum().float())
        for j in range(labels.shape[-1])
    }
    accepted = leading_matches(predictions, labels, valid)
    metrics["tau_teacher_forced"] = (((accepted + 1) * anchor_valid).sum().float(), anchor_valid.sum().float())
    return metrics


def sampled_acceptance_metrics(
    overlap: torch.Tensor, valid: torch.BoolTensor, anchor_valid: torch.BoolTensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Sums and counts of the expected acceptance of sampled drafts at temperature 1, under teacher forcing.

    `overlap` `(b, A, B-1)` holds each row's `Σ_v min(p_v, q_v)` (0 where not valid): the probability that its draft,
    sampled from the drafter's q, is accepted by a target sampling from p, given the recorded prefix. Reported: that
    probability at position 1, and the expected acceptance length `1 + Σ_k Π_{j<=k} overlap_j` (bonus included;
    positions taken as independent given the recorded prefix), the temperature-1 counterpart of `tau_teacher_forced`.
    """
    overlap = overlap * valid
    expected = 1.0 + torch.cumprod(overlap, dim=-1).sum(-1)
    return {
        "acceptance_t1_pos_01": (overlap[..., 0].sum().float(), valid[..., 0].sum().float()),
        "tau_t1_teacher_forced": ((expected * anchor_valid).sum().float(), anchor_valid.sum().float()),
    }


__all__ = [
    "DISTILLATION_KINDS",
    "DenseTeacher",
    "TopKTeacher",
    "head_row_losses",
    "block_labels",
    "default_gamma",
    "draft_losses",
    "leading_matches",
    "position_weights",
    "sampled_acceptance_metrics",
    "teacher_forced_metrics",
    "weighted_block_loss_sum",
]
