"""`target.generate(..., assistant_model=drafter)` with a Carryover drafter.

Transformers 5.23 has no registry of candidate generators, so importing `carryover_hf` wraps
`GenerationMixin._get_candidate_generator`: a `CarryoverDrafterModel` assistant gets a `CarryoverCandidateGenerator`,
everything else goes to Transformers unchanged. The generation loop, verification and speculative sampling stay
Transformers' own, which is what keeps the output lossless.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.utils import GenerationMixin
from transformers.utils import logging

from .compatibility import check_compatibility, check_single_sequence, check_target
from .features import embed_block_tokens, gather_target_features, hidden_state_indices
from .modeling_carryover import CarryoverDrafterModel


logger = logging.get_logger(__name__)


@dataclass
class GenerationStats:
    """What one `generate` call did, filled round by round. Times are wall-clock seconds."""

    acceptance_lengths: list[int] = field(default_factory=list)  # tokens per verification round, bonus included
    draft_lengths: list[int] = field(default_factory=list)  # drafts proposed per round
    carry_rows: list[int] = field(default_factory=list)  # carry rows seen by each proposal
    prefill_time: float = 0.0
    drafting_time: float = 0.0
    verification_time: float = 0.0

    @property
    def num_rounds(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def mean_acceptance_length(self) -> float:
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "num_rounds": self.num_rounds, "mean_acceptance_length": self.mean_acceptance_length}


class CarryoverCandidateGenerator(CandidateGenerator):
    """Proposes one block per round from the target's verified states.

    Round r: the target verified `[anchor, d_1..d_K]` and accepted m drafts. Rows `0..m` join the drafter's context
    cache; rows `m+1..K` (states at rejected drafts) become the carry segment of the next proposal only.
    """

    requires_model_outputs = True

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: CarryoverDrafterModel,
        input_ids: torch.LongTensor,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList | None,
        model_kwargs: dict[str, Any],
    ):
        check_pair(target, drafter)
        check_single_sequence(input_ids, model_kwargs.get("attention_mask"))

        self.drafter = drafter
        self.config = drafter.config
        self.embed_tokens = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        self.model_kwargs_overrides = {"output_hidden_states": hidden_state_indices(self.config.target_layer_ids)}
        self.max_length = generation_config.max_length
        self.do_sample = bool(generation_config.do_sample)
        self.logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
        self.device = drafter.device

        self.context_cache = DynamicCache(config=self.config)
        self.num_context = 0  # rows in the context cache = position of the next anchor
        self.carry_features: torch.Tensor | None = None
        self.carry_positions: torch.Tensor | None = None
        self.finished_drafting = False
        self.stats = GenerationStats()
        drafter.last_generation_stats = self.stats
        self._sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        self._clock = time.perf_counter()

    def _lap(self) -> float:
        self._sync()
        now = time.perf_counter()
        elapsed, self._clock = now - self._clock, now
        return elapsed

    @torch.no_grad()
    def get_candidates(
        self,
        input_ids: torch.LongTensor,
        model_kwargs: dict[str, Any] | None = None,
        model_outputs: Any = None,
        is_first_iteration: bool = False,
        n_last_matches: int = 0,
        **kwargs,
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        # The target's prefill runs first: there are no states to draft from yet.
        if is_first_iteration:
            self._lap()
            return input_ids, None
        if self.finished_drafting:
            raise RuntimeError("The drafter was asked for candidates after the length budget ran out.")
        self._lap()  # closes the bookkeeping between rounds

        # 1. Verify output -> split accepted / rejected rows.
        verified = gather_target_features(model_outputs.hidden_states, self.config.target_layer_ids).to(self.device)
        num_accepted = verified.shape[1] if self.num_context == 0 else n_last_matches + 1
        accepted, rejected = verified[:, :num_accepted], verified[:, num_accepted:]

        # 2. Update context: accepted rows keep their absolute positions.
        context_positions = self._positions(self.num_context, num_accepted)
        self.num_context += num_accepted
        anchor_position = self.num_context
        if anchor_position != input_ids.shape[1] - 1:
            raise RuntimeError(f"Drafter context ({anchor_position} rows) is out of step with the sequence.")

        # 3. Refresh carry: the rejected rows, at the positions where they were verified; replaced every round.
        if self.config.use_carryover and rejected.shape[1] > 0:
            self.carry_features, self.carry_positions = rejected, self._positions(anchor_position, rejected.shape[1])
        else:
            self.carry_features = self.carry_positions = None

        self.stats.carry_rows.append(0 if self.carry_features is None else self.carry_features.shape[1])
        num_drafts = min(self.config.block_size - 1, self.max_length - input_ids.shape[1] - 1)
        if num_drafts <= 0:
            # The next target step fills the length budget and generation ends there: no proposal is needed.
            self.finished_drafting = True
            self.stats.draft_lengths.append(0)
            self.stats.drafting_time += self._lap()
            return input_ids, None

        # 4. Draft one block [anchor, MASK x (B-1)] at positions anchor_pos + j.
        block_ids = torch.full((1, self.config.block_size), self.config.mask_token_id, device=input_ids.device)
        block_ids[:, 0] = input_ids[:, -1]
        output = self.drafter(
            block_embeds=embed_block_tokens(self.embed_tokens, block_ids).to(self.device),
            block_position_ids=self._positions(anchor_position, self.config.block_size),
            context_features=accepted,
            context_position_ids=context_positions,
            carry_features=self.carry_features,
            carry_position_ids=self.carry_positions,
            past_key_values=self.context_cache,
            use_cache=True,
        )
        candidate_ids, candidate_logits = self._pick_tokens(input_ids, output.last_hidden_state[:, 1 : 1 + num_drafts])
        self.stats.draft_lengths.append(num_drafts)
        self.stats.drafting_time += self._lap()
        return candidate_ids, candidate_logits

    def _positions(self, start: int, length: int) -> torch.LongTensor:
        return torch.arange(start, start + length, device=self.device).unsqueeze(0)

    def _pick_tokens(
        self, input_ids: torch.LongTensor, block_states: torch.Tensor
    ) -> tuple[torch.LongTensor, torch.Tensor]:
        """Choose drafts row by row from the processed logits, and return exactly the distributions sampled from.

        Transformers' speculative sampling accepts draft j with probability min(1, p/q) where q = softmax of the
        returned logits, so the logits returned must be the ones the draft was drawn from.
        """
        base_logits = self.drafter.proposal_logits(block_states, self.lm_head).to(input_ids.device)
        if len(self.logits_processor) == 0 and self.drafter.markov_head is None and not self.do_sample:
            return torch.cat([input_ids, base_logits.argmax(dim=-1)], dim=-1), base_logits

        candidate_ids, rows = input_ids, []
        for j in range(base_logits.shape[1]):
            logits = base_logits[:, j]
            if self.drafter.markov_head is not None:
                logits = logits + self.drafter.markov_head(candidate_ids[:, -1].to(self.device)).float().to(logits.device)
            if len(self.logits_processor) > 0:
                logits = self.logits_processor(candidate_ids, logits)
            if self.do_sample:
                token = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)
            else:
                token = logits.argmax(dim=-1, keepdim=True)
            candidate_ids = torch.cat([candidate_ids, token], dim=-1)
            rows.append(logits)
        return candidate_ids, torch.stack(rows, dim=1)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        elapsed = self._lap()
        if self.num_context == 0:  # the target's prefill produced the first token
            self.stats.prefill_time += elapsed
            return
        self.stats.verification_time += elapsed
        self.stats.acceptance_lengths.append(int(num_matches) + 1)


def check_pair(target: PreTrainedModel, drafter: CarryoverDrafterModel) -> None:
    """The target can feed the drafter, and the drafter was made for this target (name mismatches only warn)."""
    check_target(target)
    check_compatibility(drafter.config, target.config, check_name=False)
    recorded, actual = drafter.config.target_name_or_path, target.config._name_or_path
    if recorded and actual and recorded != actual:
        logger.warning_once(f"The drafter records target {recorded!r}; generating with {actual!r}.")


_transformers_validate_generation_mode = GenerationMixin._validate_generation_mode
_transformers_get_candidate_generator = GenerationMixin._get_candidate_generator


def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
    # Runs before Transformers' own checks, whose vocabulary check would otherwise ask for a second tokenizer.
    assistant = generation_mode_kwargs.get("assistant_model")
    if isinstance(assistant, CarryoverDrafterModel):
        check_pair(self, assistant)
    return _transformers_validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs)


def _get_candidate_generator(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
                             assistant_model=None, target_tokenizer=None, assistant_tokenizer=None):
    if isinstance(assistant_model, CarryoverDrafterModel):
        return CarryoverCandidateGenerator(
            target=self,
            drafter=assistant_model,
            input_ids=input_ids,
            generation_config=generation_config,
            logits_processor=logits_processor,
            model_kwargs=model_kwargs,
        )
    return _transformers_get_candidate_generator(
        self,
        generation_config=generation_config,
        input_ids=input_ids,
        inputs_tensor=inputs_tensor,
        logits_processor=logits_processor,
        model_kwargs=model_kwargs,
        assistant_model=assistant_model,
        target_tokenizer=target_tokenizer,
        assistant_tokenizer=assistant_tokenizer,
    )


def install_generation_hook() -> None:
    """Route Carryover drafters passed as `assistant_model` to `CarryoverCandidateGenerator`. Idempotent."""
    if getattr(GenerationMixin._get_candidate_generator, "_carryover_hook", False):
        return
    _get_candidate_generator._carryover_hook = True
    GenerationMixin._validate_generation_mode = _validate_generation_mode
    GenerationMixin._get_candidate_generator = _get_candidate_generator


__all__ = ["CarryoverCandidateGenerator", "GenerationStats", "check_pair", "install_generation_hook"]
