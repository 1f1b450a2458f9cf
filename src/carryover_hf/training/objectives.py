"""The two drafter objectives of SPEC section 2, computed for a collated batch.

Both read the target's features from one pass over each sequence and pack all anchors' blocks into one drafter
forward. Inputs are built exactly as `CarryoverCandidateGenerator` builds them at inference:

* context rows: target features at positions `< anchor` (absolute positions);
* block: `[x_a, MASK x (B-1)]` at positions `a .. a+B-1`, embedded with the target's input embedding;
* carry rows (carryover only): the target's verified states at the rejected rows `m+1 .. B-1`, at the positions
  where they were verified, fused with `fuse_carry` (i.e. plus `E_carry`) inside the drafter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import PreTrainedModel

from ..features import embed_block_tokens
from ..masks import PackedBlocks, backend_mask
from ..modeling_carryover import CarryoverDrafterModel, DraftHead
from .losses import (
    DenseTeacher,
    TopKTeacher,
    block_labels,
    head_row_losses,
    leading_matches,
    position_weights,
    sampled_acceptance_metrics,
    teacher_forced_metrics,
    weighted_block_loss_sum,
)
from .verification import TargetStates, parallel_verify, target_forward, target_logits


@dataclass
class ObjectiveOutput:
    """loss_sum: weighted loss summed over anchors (divide by the anchor count of the whole batch).
    num_anchors: valid anchors in this batch. metrics: name -> (sum, count)."""

    loss_sum: torch.Tensor
    num_anchors: torch.Tensor
    metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def metric_names(objective: str, block_size: int) -> list[str]:
    """The metrics an objective logs, in a fixed order (so processes can reduce them together)."""
    names = [f"acc_pos_{j:02d}" for j in range(1, block_size)] + ["tau_teacher_forced"]
    names += ["acceptance_t1_pos_01", "tau_t1_teacher_forced"]  # evaluation with the target's distribution only
    if objective == "carryover":
        names += ["first_draft_tau", "carry_rows"]
    return names


def block_ids(input_ids: torch.LongTensor, anchors: torch.LongTensor, block_size: int, mask_token_id: int):
    """`(b, A, B)` blocks `[x_a, MASK, ..., MASK]`."""
    first = torch.gather(input_ids, 1, anchors)
    blocks = torch.full((*anchors.shape, block_size), mask_token_id, dtype=torch.long, device=anchors.device)
    blocks[..., 0] = first
    return blocks


class DrafterObjective:
    """Computes the dflash or carryover loss of a drafter on a batch from `CarryoverDataCollator`.

    Args:
        target: the frozen target (eval mode, no gradients).
        objective: `"dflash"` or `"carryover"`.
        gamma: decay of the position weights.
        distillation / distillation_weight: optional KL or TV term against the target's next-token distribution.
        plain_weight: with the carryover objective, add this times the dflash loss of the first draft (the plain
            block at each anchor), so that the draft without carry rows keeps training beside the one after a
            rejection (0: the second draft alone, as SPEC section 2 states the objective).
        max_chunk_elements: rows x vocabulary per chunk of the head's logits (losses never build them all at once).

    A batch that carries `target_features` (offline features, `carryover_hf.training.features`) is trained by the
    dflash objective without any target forward; stored `target_topk_ids` / `target_topk_logprobs` serve
    distillation. The carryover objective runs the target for its prefix cache and verification either way.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        objective: str = "dflash",
        gamma: float = 7.0,
        distillation: str | None = None,
        distillation_weight: float = 0.0,
        max_chunk_elements: int = 1 << 25,
        plain_weight: float = 0.0,
    ):
        if plain_weight < 0:
            raise ValueError(f"plain_weight must be >= 0, got {plain_weight}.")
        self.target = target
        self.objective = objective
        self.plain_weight = plain_weight if objective == "carryover" else 0.0
        self.gamma = gamma
        self.distillation = distillation if distillation_weight > 0 else None
        self.distillation_weight = distillation_weight if distillation else 0.0
        self.max_chunk_elements = max_chunk_elements
        self._head = None

    # -- drafter passes ----------------------------------------------------------------------------------------
    def run_drafter(
        self,
        model: nn.Module,
        drafter: CarryoverDrafterModel,
        block_ids: torch.LongTensor,
        anchors: torch.LongTensor,
        context_features: torch.Tensor,
        carry_features: torch.Tensor | None = None,
        carry_owner: torch.LongTensor | None = None,
        carry_valid: torch.BoolTensor | None = None,
        carry_positions: torch.LongTensor | None = None,
    ) -> torch.Tensor:
        """Final-norm drafter states of all packed blocks, `(b, A, B, d)`.

        `model` is what runs the forward (possibly DDP- or PEFT-wrapped), `drafter` the bare model it wraps.
        """
        batch, num_blocks, size = block_ids.shape
        length = context_features.shape[1]
        packed = PackedBlocks(anchors, size, length, carry_owner, carry_valid, carry_positions)
        dtype = drafter.fc.weight.dtype
        mask = backend_mask(packed, drafter.config._attn_implementation, dtype)
        output = model(
            block_embeds=embed_block_tokens(self.target.get_input_embeddings(), block_ids.flatten(1)),
            block_position_ids=packed.block_position_ids(),
            context_features=context_features,
            context_position_ids=torch.arange(length, device=anchors.device).expand(batch, -1),
            carry_features=carry_features,
            carry_position_ids=carry_positions,
            attention_mask=mask,
        )
        return output.last_hidden_state.view(batch, num_blocks, size, -1)

    def draft_head(self, drafter: CarryoverDrafterModel) -> DraftHead:
        """The target's LM head over the drafter's draft vocabulary, gathered once and reused while neither the
        draft vocabulary nor the head's weight changes."""
        lm_head = self.target.get_output_embeddings()
        ids = drafter.draft_token_ids
        key = (None if ids is None else (ids.data_ptr(), ids._version), lm_head.weight.data_ptr(), lm_head.weight._version)
        if self._head is None or self._head[0] != key:
            self._head = (key, drafter.draft_head(lm_head))
        return self._head[1]

    @torch.no_grad()
    def greedy_drafts(self, drafter: CarryoverDrafterModel, hidden: torch.Tensor, anchor_ids: torch.LongTensor):
        """Greedy proposals `(b, A, B-1)` exactly as the candidate generator picks them (`drafter.propose`)."""
        return drafter.propose(hidden[:, :, 1:], self.draft_head(drafter), anchor_ids, return_logits=False).tokens

    def first_drafts(self, drafter: CarryoverDrafterModel, hidden: torch.Tensor, blocks: torch.LongTensor, labels):
        """The first draft's proposals `(b, A, B-1)`: greedy, as at temperature 0. Override for other policies."""
        return self.greedy_drafts(drafter, hidden, blocks[..., 0])

    def _teacher(self, head: DraftHead, anchors, labels, valid, last_hidden_state, topk):
        """The target's next-token distribution at the trained rows (label j of anchor a: the state at a + j - 1)."""
        if self.distillation is None:
            return None
        source = topk[0] if topk is not None else last_hidden_state  # (b, T, ...): per-position teacher inputs
        if source is None:
            raise ValueError("Distillation needs the target's final-norm states or stored top-k log-probabilities.")
        positions = anchors[:, :, None] + torch.arange(labels.shape[-1], device=anchors.device)  # (b, A, B-1)
        positions = positions.clamp(max=source.shape[1] - 1)[valid]
        rows = torch.arange(anchors.shape[0], device=anchors.device)[:, None, None].expand_as(valid)[valid]
        if topk is not None:
            ids, log_probs = topk
            return TopKTeacher(ids[rows, positions], log_probs[rows, positions], head.to_draft_indices)
        states = last_hidden_state[rows, positions]  # (N, H)
        return DenseTeacher(states, lambda s: target_logits(self.target, s), head.token_ids)

    def _trained_draft_loss(
        self,
        drafter: CarryoverDrafterModel,
        hidden: torch.Tensor,
        block_ids: torch.LongTensor,
        anchors: torch.LongTensor,
        anchor_valid: torch.BoolTensor,
        labels: torch.LongTensor,
        valid: torch.BoolTensor,
        last_hidden_state: torch.Tensor | None,
        topk: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict]:
        head = self.draft_head(drafter)
        rows = hidden[:, :, 1:][valid]  # (N, d): only the rows that count, contiguous
        transition = None
        if drafter.markov_head is not None:
            # The Markov head is trained with teacher forcing: row j sees the recorded token x_{a+j-1}.
            previous = torch.cat([block_ids[..., :1], labels[..., :-1]], dim=-1)[valid]
            markov = drafter.markov_head(previous).float()  # (N, V_draft): small next to the rows x V logits
            transition = lambda start, end: markov[start:end]  # noqa: E731
        teacher = self._teacher(head, anchors, labels, valid, last_hidden_state, topk)
        # Evaluation (no gradients) with the target's distribution at hand also measures sampled acceptance.
        overlap = teacher is not None and not torch.is_grad_enabled()
        row_losses, picks, *overlaps = head_row_losses(
            rows,
            head,
            labels[valid],
            transition=transition,
            teacher=teacher,
            distillation=self.distillation,
            distillation_weight=self.distillation_weight,
            max_chunk_elements=self.max_chunk_elements,
            overlap=overlap,
        )
        weights = position_weights(block_ids.shape[-1], self.gamma, device=rows.device)
        loss_sum = weighted_block_loss_sum(row_losses, valid, weights)
        with torch.no_grad():
            predictions = torch.full_like(labels, -1)
            predictions[valid] = picks
            metrics = teacher_forced_metrics(predictions, labels, valid, anchor_valid)
            if overlap:
                per_row = torch.zeros(labels.shape, dtype=torch.float32, device=labels.device)
                per_row[valid] = overlaps[0].float()
                metrics.update(sampled_acceptance_metrics(per_row, valid, anchor_valid))
        return loss_sum, metrics

    # -- objectives --------------------------------------------------------------------------------------------
    def __call__(
        self, model: nn.Module, drafter: CarryoverDrafterModel, batch: dict[str, torch.Tensor]
    ) -> ObjectiveOutput:
        input_ids, loss_mask = batch["input_ids"], batch["loss_mask"]
        anchors, anchor_valid = batch["anchors"], batch["anchor_mask"].bool()
        config = drafter.config
        size = config.block_size
        carryover = self.objective == "carryover"
        topk = None
        if "target_topk_ids" in batch:
            topk = (batch["target_topk_ids"], batch["target_topk_logprobs"])
        if "target_features" in batch and not carryover:
            # Offline features: what the target would compute, read from the store. No target forward.
            states = TargetStates(features=batch["target_features"])
            if self.distillation is not None and topk is None:
                raise ValueError(
                    "Distillation from offline features needs stored top-k log-probabilities: rebuild the features "
                    "with `carryover-hf features --top_k K`, or train without --distillation."
                )
        else:
            states = target_forward(
                self.target,
                input_ids,
                batch.get("attention_mask"),
                config.target_layer_ids,
                use_cache=carryover,
                with_last_hidden_state=self.distillation is not None and topk is None,
            )
        blocks = block_ids(input_ids, anchors, size, config.mask_token_id)
        labels, valid = block_labels(input_ids, loss_mask, anchors, anchor_valid, size)
        num_anchors = anchor_valid.sum()

        if not carryover:
            hidden = self.run_drafter(model, drafter, blocks, anchors, states.features)
            loss_sum, metrics = self._trained_draft_loss(
                drafter, hidden, blocks, anchors, anchor_valid, labels, valid, states.last_hidden_state, topk
            )
            return ObjectiveOutput(loss_sum, num_anchors, metrics)

        # 1. First draft: the plain block at each anchor; detached unless its dflash loss is mixed in.
        plain_loss = None
        if self.plain_weight:
            # The bare drafter runs it (a DDP wrapper's forward is taken once per step, by the second draft); its
            # gradient reaches the same parameters, and DDP reduces them once the backward is done.
            hidden = self.run_drafter(drafter, drafter, blocks, anchors, states.features)
            plain_loss, _ = self._trained_draft_loss(
                drafter, hidden, blocks, anchors, anchor_valid, labels, valid, states.last_hidden_state, topk
            )
            hidden = hidden.detach()
        else:
            with torch.no_grad():
                hidden = self.run_drafter(drafter, drafter, blocks, anchors, states.features)
        with torch.no_grad():
            drafts = self.first_drafts(drafter, hidden, blocks, labels)
        accepted = leading_matches(drafts, labels, valid)  # m per anchor

        # 2. Verify all first drafts at once on top of the prefix cache.
        verify_ids = torch.cat([blocks[..., :1], drafts], dim=-1)
        verified = parallel_verify(self.target, states.past_key_values, verify_ids, anchors, config.target_layer_ids)
        states.past_key_values = None  # extended by the verify rows: no longer the prefix cache

        # 3. Second draft at a' = a + m + 1 with the rejected rows m+1..B-1 as carry rows.
        length = input_ids.shape[1]
        second = anchors + accepted + 1
        inside = second < length
        second = second.clamp(max=length - 1)
        second_valid = anchor_valid & inside & torch.gather(loss_mask.bool(), 1, second)
        second_blocks = block_ids(input_ids, second, size, config.mask_token_id)
        second_labels, second_label_valid = block_labels(input_ids, loss_mask, second, second_valid, size)

        batch_size, num_blocks = anchors.shape
        rows = torch.arange(1, size, device=anchors.device)
        carry_valid = (rows[None, None, :] > accepted[:, :, None]) & anchor_valid[:, :, None]
        carry_owner = (
            torch.arange(num_blocks, device=anchors.device).repeat_interleave(size - 1).expand(batch_size, -1)
        )
        carry_positions = (anchors[:, :, None] + rows).flatten(1)
        carry_features = verified.features[:, :, 1:].flatten(1, 2)

        hidden = self.run_drafter(
            model,
            drafter,
            second_blocks,
            second,
            states.features,
            carry_features=carry_features,
            carry_owner=carry_owner,
            carry_valid=carry_valid.flatten(1),
            carry_positions=carry_positions,
        )
        loss_sum, metrics = self._trained_draft_loss(
            drafter,
            hidden,
            second_blocks,
            second,
            second_valid,
            second_labels,
            second_label_valid,
            states.last_hidden_state,
            topk,
        )
        if plain_loss is not None:
            loss_sum = loss_sum + self.plain_weight * plain_loss
        valid_count = anchor_valid.sum().float()
        metrics["first_draft_tau"] = (((accepted + 1) * anchor_valid).sum().float(), valid_count)
        metrics["carry_rows"] = (((size - 1 - accepted) * anchor_valid).sum().float(), valid_count)
        return ObjectiveOutput(loss_sum, num_anchors, metrics)


__all__ = ["DrafterObjective", "ObjectiveOutput", "block_ids", "metric_names"]
