"""`target.generate(..., assistant_model=drafter)` with a Carryover drafter.

Transformers 5.23 has no registry of candidate generators, so importing `carryover_hf` wraps
`GenerationMixin._get_candidate_generator` (and `_validate_generation_mode`, to check the pair before Transformers'
own checks): a `CarryoverDrafterModel` assistant gets a `CarryoverCandidateGenerator`, every other call goes to
Transformers with its arguments untouched. The generation loop, verification and speculative sampling stay
Transformers' own, which is what keeps the output lossless. See docs/generate.md for why this mechanism (and not
`custom_generate`), and for the per-call options (`CARRYOVER_GENERATION_OPTIONS`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.utils import GenerationMixin
from transformers.utils import logging

from .compatibility import (
    ASSISTED_LOOP_CROPS_AT_EOS,
    CACHE_ARGUMENT,
    check_compatibility,
    check_single_sequence,
    check_target,
)
from .configuration_carryover import PROPOSAL_DEFAULTS, check_count_option, check_round_policy
from .features import embed_block_tokens, gather_target_features, hidden_state_indices
from .modeling_carryover import CarryoverDrafterModel, DrafterContextBuffer
from .utils import device_synchronizer


logger = logging.get_logger(__name__)

# Per-call options, read from the `GenerationConfig` of a `generate` call (custom attributes; `None` = not set).
CARRYOVER_GENERATION_OPTIONS = {
    "use_carryover": "show the previous round's rejected states to the next proposal (default: the drafter's)",
    "draft_confidence_threshold": "end a proposal at the first row whose top drafter probability is below this "
    "(greedy: the drafted token's probability; default: the drafter's; None or 0 = off)",
    "proposal_backoff": "after a proposal whose first draft is rejected, skip proposing for 1, 2, 4, ... rounds (at "
    "most this many in a row; plain target steps, no drafter forward) until a draft is accepted again (default: the "
    "drafter's; None or 0 = off)",
    "lookup_drafts": "when the last 3 (else 2) tokens occurred earlier in the sequence, propose up to this many of the "
    "tokens that followed their latest occurrence instead of running the drafter (default: the drafter's; None or 0 "
    "= off)",
    "lookup_backoff": "after a context lookup whose first draft is rejected, do not look up for 1, 2, 4, ... rounds "
    "(at most this many in a row; the drafter proposes in them as usual) until a lookup draft is accepted again "
    "(default: the drafter's; None or 0 = off)",
    "carryover_timing": "record prefill/drafting/verification wall times in the statistics (synchronises the device "
    "at each boundary; default False)",
    "round_policy": "'cost': choose each round's source (drafter, suffix match, plain step) and draft count by "
    "expected tokens per unit of cost (`round_policy.CostAwarePolicy`; the lookup, backoff and confidence options "
    "then do not apply); 'rules': the rule-based policy those options drive (default: the drafter's; None: rules)",
    "suffix_match": "with round_policy='cost': offer drafts copied from a suffix match (this call's sequence, and "
    "earlier calls' through the drafter's `suffix_cache`) as a source beside the drafter (default True); False: the "
    "drafter and plain steps only (the drafter alone, with the length chosen per round)",
    "verification_cost": "with round_policy='cost': 'measured': each round's cost measured from the call's own "
    "rounds (wall time), in the shape of the target's verification curve calibrated once per machine and cached on "
    "disk (sampled outputs then keep the target's distribution but not a seed's exact tokens); "
    "'calibrate': calibrated on the target once and cached on disk; 'flat': every forward costs one step, as on a "
    "GPU; or a list of relative costs of verifying 0, 1, 2, ... drafts. None (default): 'calibrate'",
}
# "The drafter's" default: `drafter.generation_config` (`drafter_defaults`).
# Options that choose another candidate generator: Transformers would ignore them next to a Carryover drafter.
CONFLICTING_SPECULATION_OPTIONS = ("prompt_lookup_num_tokens", "assistant_early_exit", "speculation_type", "use_mtp")


@dataclass
class Backoff:
    """An exponential backoff over rounds: after `failures` proposals in a row whose first draft the target rejected,
    the next min(2 ** (failures - 1), `limit`) chances are skipped; an accepted first draft resets it. Serves
    `proposal_backoff` (the drafter's proposals) and `lookup_backoff` (the context lookup's)."""

    limit: int
    failures: int = 0  # proposals in a row whose first draft was rejected
    skip: int = 0  # chances left to skip

    @classmethod
    def of(cls, limit: int | None) -> "Backoff | None":
        return None if limit is None else cls(limit)

    def record(self, first_draft_accepted: bool) -> None:
        """The outcome of a proposal just verified."""
        self.failures = 0 if first_draft_accepted else self.failures + 1
        self.skip = min(2 ** (self.failures - 1), self.limit) if self.failures else 0

    def skips(self) -> bool:
        """Whether this chance is skipped (and counted off)."""
        if self.skip > 0:
            self.skip -= 1
            return True
        return False


@dataclass
class GenerationStats:
    """What one `generate` call did, filled round by round by its candidate generator.

    Times (wall-clock seconds) are recorded only when asked for (`carryover_timing=True`, see
    `CARRYOVER_GENERATION_OPTIONS`): timing synchronises the device at every boundary. `timed` says whether they were.
    """

    acceptance_lengths: list[int] = field(default_factory=list)  # tokens per verification round, bonus included
    draft_lengths: list[int] = field(default_factory=list)  # drafts proposed per round
    carry_rows: list[int] = field(default_factory=list)  # carry rows seen by each proposal
    stopped_by_confidence: int = 0  # proposals cut short by `draft_confidence_threshold`
    skipped_by_backoff: int = 0  # rounds with no proposal (plain target steps) under `proposal_backoff`
    lookup_proposals: int = 0  # rounds whose drafts came from a context lookup (`lookup_drafts`), not the drafter
    lookups_skipped_by_backoff: int = 0  # rounds whose lookup `lookup_backoff` held back (found or not)
    planning_time: float = 0.0  # seconds in the policy's `plan` (host time, always recorded: no device sync)
    timed: bool = False
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


class RoundObserver:
    """Instrumentation of a `generate` call's rounds, for tests and benchmarks: subclass it and override what you need
    (each method is a no-op here), then generate inside `observing_rounds(drafter, observer)`. The generator calls it
    at round boundaries; nothing in it changes what is proposed unless it changes the generator it is handed."""

    def generation_started(self, generator: "CarryoverCandidateGenerator") -> None:
        """The call's candidate generator is built (its `proposer` and `policy` included), before the prefill."""

    def round_started(self, input_ids: torch.LongTensor) -> None:
        """`get_candidates` was called (the prefill's call included)."""

    def proposal_started(self) -> None:
        """A drafter proposal's forward starts (its inputs are ready)."""

    def forward_finished(self) -> None:
        """The proposal's drafter forward returned; its drafts are picked next."""

    def proposal_finished(self) -> None:
        """The proposal's drafts are picked (and cut by the confidence rule, if any)."""

    def round_finished(
        self, input_ids: torch.LongTensor, candidate_ids: torch.LongTensor, candidate_logits: torch.Tensor | None
    ) -> None:
        """`get_candidates` returns these candidates (`candidate_ids == input_ids`: a plain target step)."""


@contextlib.contextmanager
def observing_rounds(drafter: CarryoverDrafterModel, observer: RoundObserver):
    """`generate` calls with `drafter` as their assistant report their rounds to `observer` inside this block."""
    previous = drafter.__dict__.get("round_observer")
    drafter.round_observer = observer
    try:
        yield observer
    finally:
        drafter.round_observer = previous


@dataclass
class ConfidenceRule:
    """`draft_confidence_threshold`: a proposal ends at the first row whose drafter confidence is below `threshold`.

    Confidence = the probability of the row's most likely token under the distribution its draft was drawn from (the
    returned candidate logits). Greedy drafts are that token, so this is the drafted token's probability. Under
    sampling the rule must not look at the sampled token itself: dropping a draft because *it* came out unlikely would
    change which tokens get proposed and bias the output (tests/test_generation_sampling.py shows the chi-square test
    rejecting that variant); the top probability of row j depends only on the drafts before it, so the proposal
    length stays a stopping time and verification keeps the target's distribution exactly.
    """

    threshold: float

    def keep(self, drafts: torch.LongTensor, logits: torch.Tensor) -> int:
        """How many of the drafts `(1, k)` to keep, given the logits `(1, k, V)` they were drawn from."""
        logits = logits[0].float()
        confidence = logits.max(dim=-1).values - torch.logsumexp(logits, dim=-1)  # log of the top probability
        low = (confidence < torch.log(torch.tensor(float(self.threshold)))).nonzero()
        return drafts.shape[1] if low.numel() == 0 else int(low[0, 0])


@dataclass
class DraftProposal:
    """What one drafter proposal returned: the candidates (the prefix followed by `num_drafts` drafts), the carry rows
    it saw and whether the confidence rule cut it."""

    candidate_ids: torch.LongTensor
    candidate_logits: torch.Tensor | None
    num_drafts: int
    carry_rows: int
    cut_by_confidence: bool


class DrafterProposer:
    """The mechanism of a round: the drafter's context buffer, the carry segment of rejected rows and one proposal.

    `observe(verified, num_accepted)` after each verification: the accepted rows join the context (the drafter fuses
    them at its next proposal), the rejected ones become the carry of the next proposal only. `propose(input_ids,
    num_drafts)` runs one drafter forward over `[anchor, MASK x (B-1)]` and picks the drafts. It decides nothing:
    whether a round proposes, and how many drafts, is `ProposalPolicy`'s. The carry-overhead benchmark
    (`bench.overhead.RecordedRound`) times this same object.
    """

    def __init__(
        self,
        drafter: CarryoverDrafterModel,
        embed_tokens: torch.nn.Module,
        draft_head: Any,
        max_length: int,
        *,
        use_carryover: bool = True,
        do_sample: bool = False,
        return_logits: bool = False,
        logits_processor: LogitsProcessorList | None = None,
        observer: RoundObserver | None = None,
    ):
        self.drafter = drafter
        self.config = drafter.config
        self.device = drafter.device
        self.embed_tokens = embed_tokens
        self.draft_head = draft_head  # the head's draft-vocabulary rows, gathered once
        self.use_carryover = bool(use_carryover)
        self.do_sample = do_sample
        self.return_logits = return_logits
        self.logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
        self.observer = observer or RoundObserver()
        # Everything a proposal needs that does not change between rounds is built once: the context key/value buffer
        # (sized from the length budget, with the rotary table), the block embeddings [anchor, MASK x (B-1)] (row 0
        # is rewritten each proposal) and the positions.
        block_size = self.config.block_size
        self.context_cache = DrafterContextBuffer(drafter, max_positions=max_length)
        mask_ids = torch.full((1, block_size), self.config.mask_token_id, device=embed_tokens.weight.device)
        self.block_embeds = embed_block_tokens(embed_tokens, mask_ids).to(self.device, drafter.fc.weight.dtype)
        self.positions = torch.arange(max_length + 2 * block_size, device=self.device).unsqueeze(0)
        self.num_context = 0  # position of the next context row = position of the next anchor
        self.num_cached = 0  # context rows the drafter has seen (fewer while rounds go by without a proposal)
        self.uncached: list[torch.Tensor] = []  # verified rows since then, given to the next proposal
        self.started = False  # whether the prefill's states have been observed
        self.drafted = False  # whether the last proposal was this drafter's (only its rejected rows are carried)
        self.carry_features: torch.Tensor | None = None
        self.carry_positions: torch.Tensor | None = None

    def accepted_rows(self, sequence_length: int, num_verified: int) -> int:
        """How many of the verified rows the target accepted (the prefill's: all). The sequence's length tells it (the
        anchor sits at `num_context`, the new last token at the end), without reading `n_last_matches`: a device
        tensor on some Transformers releases (reading it would sync)."""
        num_accepted = sequence_length - 1 - self.num_context if self.started else num_verified
        if not 1 <= num_accepted <= num_verified:
            raise RuntimeError(
                f"Drafter context ({self.num_context} rows) is out of step with the sequence ({sequence_length} "
                f"tokens, {num_verified} verified rows)."
            )
        return num_accepted

    def observe(self, verified: torch.Tensor, num_accepted: int) -> None:
        """The target's states `(1, n, k * H)` at the rows it just verified, of which the first `num_accepted` were
        accepted: they join the context at their absolute positions (rows verified in rounds without a proposal wait
        for the next one). The rest (states at rejected drafts) become the carry of the next proposal only, at the
        positions where they were verified, when carry is on and the last proposal was the drafter's (a lookup's
        rejected drafts are not what it was trained to read)."""
        self.started = True
        rejected = verified[:, num_accepted:]
        if num_accepted > 0:
            self.uncached.append(verified[:, :num_accepted])
        self.num_context += num_accepted
        if self.use_carryover and rejected.shape[1] > 0 and self.drafted:
            self.carry_features = rejected
            self.carry_positions = self.positions[:, self.num_context : self.num_context + rejected.shape[1]]
        else:
            self.carry_features = self.carry_positions = None
        self.drafted = False

    def rewind(self, num_context: int) -> None:
        """Back to `num_context` committed context rows and nothing waiting (a benchmark re-times one round)."""
        self.context_cache.length = self.num_context = self.num_cached = num_context
        self.uncached = []
        self.carry_features = self.carry_positions = None

    def propose(
        self, input_ids: torch.LongTensor, num_drafts: int, confidence: ConfidenceRule | None = None
    ) -> DraftProposal:
        """One drafter forward over `[anchor, MASK x (B-1)]` at positions anchor + j (the anchor is the last token of
        `input_ids`), with the waiting context rows and the carry; then up to `num_drafts` drafts, cut by
        `confidence` if given."""
        context = None
        if self.uncached:
            context = self.uncached[0] if len(self.uncached) == 1 else torch.cat(self.uncached, dim=1)
        context_positions = self.positions[:, self.num_cached : self.num_context]
        self.uncached, self.num_cached = [], self.num_context
        self.drafted = True
        carry_rows = 0 if self.carry_features is None else self.carry_features.shape[1]
        anchor = self.num_context
        self.block_embeds[:, :1] = embed_block_tokens(self.embed_tokens, input_ids[:, -1:]).to(self.block_embeds)
        self.observer.proposal_started()
        output = self.drafter(
            block_embeds=self.block_embeds,
            block_position_ids=self.positions[:, anchor : anchor + self.config.block_size],
            context_features=context,
            context_position_ids=context_positions if context is not None else None,
            carry_features=self.carry_features,
            carry_position_ids=self.carry_positions,
            past_key_values=self.context_cache,
            use_cache=True,
        )
        block_states = output.last_hidden_state[:, 1 : 1 + num_drafts]
        self.observer.forward_finished()
        if confidence is None:
            candidate_ids, candidate_logits = self.pick_tokens(input_ids, block_states)
            cut = False
        else:
            candidate_ids, candidate_logits, cut = self._pick_while_confident(input_ids, block_states, confidence)
        self.observer.proposal_finished()
        num_drafts = candidate_ids.shape[1] - input_ids.shape[1]
        return DraftProposal(candidate_ids, candidate_logits, num_drafts, carry_rows, cut)

    def _pick_while_confident(
        self, input_ids: torch.LongTensor, block_states: torch.Tensor, confidence: ConfidenceRule
    ) -> tuple[torch.LongTensor, torch.Tensor | None, bool]:
        """Drafts under the confidence rule: the first row alone, then (if it is confident) the others.

        The LM head dominates a proposal on CPU, and a weak drafter's proposals mostly end at row 1, so row 1 is
        drafted first and rows 2.. only when it passes. The second call continues from the first draft (it is the
        anchor and the end of the prefix), so the drafts and their distributions are those of one call over all rows.
        """
        candidate_ids, candidate_logits = self.pick_tokens(input_ids, block_states[:, :1])
        candidate_ids, candidate_logits, cut = _cut(input_ids, candidate_ids, candidate_logits, confidence)
        if cut or block_states.shape[1] == 1:
            return candidate_ids, candidate_logits, cut
        rest_ids, rest_logits = self.pick_tokens(candidate_ids, block_states[:, 1:])
        candidate_logits = torch.cat([candidate_logits, rest_logits.to(candidate_logits.device)], dim=1)
        return _cut(input_ids, rest_ids, candidate_logits, confidence)

    def pick_tokens(
        self, input_ids: torch.LongTensor, block_states: torch.Tensor
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Drafts from the block states via `drafter.propose`, and exactly the distributions they were drawn from.

        Transformers' speculative sampling accepts draft j with probability min(1, p/q) where q = softmax of the
        returned logits, so the logits returned must be the ones the draft was drawn from. Greedy decoding compares
        tokens only, so no logits are built for it (unless an ensemble weight or the confidence rule asks for them).
        """
        proposal = self.drafter.propose(
            block_states,
            self.draft_head,
            input_ids[:, -1],
            prefix_ids=input_ids,
            logits_processor=self.logits_processor,
            do_sample=self.do_sample,
            return_logits=self.return_logits,
        )
        return torch.cat([input_ids, proposal.tokens.to(input_ids.device)], dim=-1), proposal.logits


def _cut(
    input_ids: torch.LongTensor, candidate_ids: torch.LongTensor, candidate_logits: torch.Tensor, rule: ConfidenceRule
) -> tuple[torch.LongTensor, torch.Tensor, bool]:
    """The candidates up to the first draft `rule` does not keep, and whether any was dropped."""
    start = input_ids.shape[1]
    keep = rule.keep(candidate_ids[:, start:], candidate_logits)
    if keep >= candidate_ids.shape[1] - start:
        return candidate_ids, candidate_logits, False
    return candidate_ids[:, : start + keep], candidate_logits[:, :keep], True


def lookup_candidates(
    input_ids: torch.LongTensor, drafts: torch.LongTensor, vocab_size: int, return_logits: bool
) -> tuple[torch.LongTensor, torch.Tensor | None]:
    """A context lookup's candidates: the drafts after the sequence (the drafter does not run; its verified rows wait
    for the next drafter proposal, as after a plain step). Under sampling they come with one-hot distributions (q = 1
    at the draft): speculative sampling then accepts draft j with the target's probability of it and otherwise samples
    from the target's distribution without it, which is the target's distribution."""
    candidate_ids = torch.cat([input_ids, drafts.unsqueeze(0)], dim=-1)
    if not return_logits:
        return candidate_ids, None
    candidate_logits = torch.full((1, drafts.numel(), vocab_size), float("-inf"), device=drafts.device)
    candidate_logits.scatter_(-1, drafts.view(1, -1, 1), 0.0)
    return candidate_ids, candidate_logits


def drafts_in_budget(block_size: int, max_length: int, length: int) -> int:
    """How many drafts a drafter proposal offers from a sequence of `length` tokens: as many of its drafts as
    Transformers' DFlash path (`DFlashTokenCandidateGenerator`) proposes and its assisted loop can keep, so the two
    propose the same count in every round.

    That path proposes nothing when one token is left (the target's plain step fills it), else `block_size - 1`
    drafts uncapped; the loop keeps at most `max_length - length` tokens of a round (`tokens_budget`), so the last
    token of the budget may be a draft (in place of the target's bonus token). Drafts past the budget are never kept
    and are not proposed here. Transformers 5.17-5.25 all do this. 0: the round is the final plain step."""
    left = max_length - length
    return 0 if left <= 1 else min(block_size - 1, left)


@dataclass
class RoundPlan:
    """What a round does: `"draft"` (a drafter proposal of up to `num_drafts`), `"lookup"` (propose `drafts`, copied
    from the context), `"plain"` (no proposal: Transformers runs a plain target step, its own distribution at T > 0),
    `"skip"` (a plain step because `proposal_backoff` holds proposals back) or `"end"` (a plain step that fills the
    length budget: generation ends there). `lookup_skipped`: `lookup_backoff` held this round's lookup back."""

    kind: str
    num_drafts: int = 0
    drafts: torch.LongTensor | None = None
    lookup_skipped: bool = False


class ProposalPolicy:
    """The policy of a round: a plain step, a context lookup or a drafter proposal, and how many drafts; it holds the
    two backoffs (`proposal_backoff`, `lookup_backoff`) and the confidence rule (`draft_confidence_threshold`, applied
    by the proposer row by row). Lossless: every choice depends only on tokens already verified."""

    def __init__(
        self,
        block_size: int,
        max_length: int,
        *,
        lookup_drafts: int | None = None,
        lookup_backoff: int | None = None,
        proposal_backoff: int | None = None,
        confidence_threshold: float | None = None,
    ):
        self.block_size, self.max_length = block_size, max_length
        self.lookup_drafts = lookup_drafts
        self.lookup_backoff = Backoff.of(lookup_backoff)
        self.backoff = Backoff.of(proposal_backoff)
        self.confidence = None if confidence_threshold is None else ConfidenceRule(float(confidence_threshold))
        self.last_num_drafts = 0  # drafts of the last drafter proposal (0 after a plain step or a lookup)
        self.last_from_lookup = False  # whether the round just verified proposed a context lookup

    def plan(
        self, input_ids: torch.LongTensor, first_draft_accepted: bool, accepted_drafts: int | None = None
    ) -> RoundPlan:
        """This round's plan, given the sequence and whether the round just verified accepted its first draft (these
        rules need no more; `accepted_drafts`, how many it accepted, is for policies that estimate acceptance)."""
        # A drafter proposal offers as many drafts as Transformers' DFlash path would (its last may fill the budget's
        # last token); a context lookup (no native counterpart) only those before that token (`room`).
        room = self.max_length - input_ids.shape[1] - 1
        num_drafts = drafts_in_budget(self.block_size, self.max_length, input_ids.shape[1])
        if self.lookup_backoff is not None and self.last_from_lookup:
            self.lookup_backoff.record(first_draft_accepted)
        last_num_drafts, self.last_num_drafts, self.last_from_lookup = self.last_num_drafts, 0, False
        if num_drafts <= 0:
            return RoundPlan("end")  # the next target step fills the length budget: no proposal is needed
        lookup_skipped = False
        if self.lookup_drafts is not None:
            lookup_skipped = self.lookup_backoff is not None and self.lookup_backoff.skips()
            drafts = None if lookup_skipped else lookup_continuation(input_ids[0], min(self.lookup_drafts, room))
            if drafts is not None:
                self.last_from_lookup = True
                return RoundPlan("lookup", drafts=drafts)
        # `proposal_backoff`: after a proposal whose first draft the target rejected, the next 1, 2, 4, ... rounds
        # (at most `proposal_backoff`) are plain target steps with no drafter forward; an accepted draft resets it.
        if self.backoff is not None:
            if last_num_drafts > 0:  # the round just verified had a drafter proposal: update the streak
                self.backoff.record(first_draft_accepted)
            if self.backoff.skips():
                return RoundPlan("skip", lookup_skipped=lookup_skipped)
        return RoundPlan("draft", num_drafts=num_drafts, lookup_skipped=lookup_skipped)

    def drafted(self, num_drafts: int) -> None:
        """The drafter proposed `num_drafts` drafts this round (after the confidence rule)."""
        self.last_num_drafts = num_drafts


class CarryoverCandidateGenerator(CandidateGenerator):
    """Proposes one block per round from the target's verified states: `ProposalPolicy` decides what each round does,
    `DrafterProposer` holds the drafter's context and carry and runs its proposals.

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
        check: bool = True,
        observer: RoundObserver | None = None,
    ):
        """`check=False` skips the drafter/target checks (the generate hook has already run them). `observer`
        (default: the one `observing_rounds` gave the drafter, if any) is told of every round's boundaries."""
        if check:
            check_pair(target, drafter)
            check_generation_options(generation_config)
        check_single_sequence(input_ids, model_kwargs.get("attention_mask"))
        check_empty_cache(model_kwargs.get(CACHE_ARGUMENT, model_kwargs.get("past_key_values")))

        self.drafter = drafter
        self.config = drafter.config
        self.device = drafter.device
        self.observer = observer or getattr(drafter, "round_observer", None) or RoundObserver()
        self.model_kwargs_overrides = {"output_hidden_states": hidden_state_indices(self.config.target_layer_ids)}
        self.max_length = generation_config.max_length
        defaults = drafter_defaults(drafter)  # its generation_config
        threshold = defaults["draft_confidence_threshold"]
        confidence_threshold = _option(generation_config, "draft_confidence_threshold", threshold)
        if confidence_threshold is not None and not 0.0 <= float(confidence_threshold) <= 1.0:
            raise ValueError(f"draft_confidence_threshold must lie in [0, 1] or be None, got {confidence_threshold}.")
        if confidence_threshold is not None and float(confidence_threshold) == 0.0:
            confidence_threshold = None  # 0 never cuts a proposal: the same as off (and turns off a config default)
        # 0 never skips / never looks up: the same as off (and turns off a config default).
        self.policy = ProposalPolicy(
            self.config.block_size,
            self.max_length,
            lookup_drafts=_count_option(generation_config, defaults, "lookup_drafts"),
            lookup_backoff=_count_option(generation_config, defaults, "lookup_backoff"),
            proposal_backoff=_count_option(generation_config, defaults, "proposal_backoff"),
            confidence_threshold=confidence_threshold,
        )
        if check_round_policy(_option(generation_config, "round_policy", defaults["round_policy"])) == "cost":
            self.policy = cost_aware_policy(target, drafter, input_ids, generation_config)
        do_sample = bool(generation_config.do_sample)
        lm_head = target.get_output_embeddings()
        self.vocab_size = lm_head.weight.shape[0]
        self.proposer = DrafterProposer(
            drafter,
            target.get_input_embeddings(),
            drafter.draft_head(lm_head),
            self.max_length,
            use_carryover=_option(generation_config, "use_carryover", defaults["use_carryover"]),
            do_sample=do_sample,
            # Speculative sampling, Transformers' lossy ensemble mode and the confidence rule read the candidate
            # logits; plain greedy decoding does not.
            return_logits=do_sample
            or getattr(generation_config, "assistant_ensemble_weight", None) is not None
            or confidence_threshold is not None,
            logits_processor=logits_processor,
            observer=self.observer,
        )
        self.timing = bool(_option(generation_config, "carryover_timing", False))
        eos = getattr(generation_config, "_eos_token_tensor", None)
        self.stop_token_ids = None if ASSISTED_LOOP_CROPS_AT_EOS or eos is None else eos.reshape(-1).to(drafter.device)
        if self.stop_token_ids is not None and bool(torch.isin(input_ids[0, -1].to(drafter.device), self.stop_token_ids)):
            raise ValueError(
                "The prompt ends with an end-of-sequence token, and Transformers 5.17's assisted loop then stops before "
                "generating anything (plain generate does not): drop the trailing token, or use Transformers >= 5.18."
            )
        self.finished_drafting = False
        self.stats = GenerationStats(timed=self.timing)
        drafter.last_generation_stats = self.stats  # the generator owns it; the drafter keeps a reference for users
        self._sync = device_synchronizer(self.device)
        self._clock = time.perf_counter() if self.timing else 0.0
        self.observer.generation_started(self)

    @property
    def num_drafting_tokens(self) -> int:
        """The most drafts one round proposes (Transformers 5.25+ sizes the target cache's recording by it)."""
        return max(self.config.block_size - 1, self.policy.lookup_drafts or 0)

    def _lap(self) -> float:
        """Seconds since the last lap (0 unless timing was asked for: timing synchronises the device)."""
        if not self.timing:
            return 0.0
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
        self.observer.round_started(input_ids)
        self._lap()  # closes the bookkeeping between rounds (or the setup before the prefill)
        if is_first_iteration:  # the target's prefill runs first: there are no states to draft from yet
            return self._finish(input_ids, input_ids, None)
        if self.finished_drafting:
            raise RuntimeError("The drafter was asked for candidates after the length budget ran out.")
        verified = gather_target_features(model_outputs.hidden_states, self.config.target_layer_ids).to(self.device)
        num_accepted = self.proposer.accepted_rows(input_ids.shape[1], verified.shape[1])
        self.proposer.observe(verified, num_accepted)
        planning = time.perf_counter()
        plan = self.policy.plan(input_ids, first_draft_accepted=num_accepted > 1, accepted_drafts=num_accepted - 1)
        self.stats.planning_time += time.perf_counter() - planning
        candidate_ids, candidate_logits = input_ids, None  # a plain target step unless the plan proposes
        if plan.kind == "lookup":
            candidate_ids, candidate_logits = lookup_candidates(
                input_ids, plan.drafts, self.vocab_size, self.proposer.return_logits
            )
        elif plan.kind == "draft":
            proposal = self.proposer.propose(input_ids, plan.num_drafts, self.policy.confidence)
            self.policy.drafted(proposal.num_drafts)
            candidate_ids, candidate_logits = proposal.candidate_ids, proposal.candidate_logits
            self.stats.carry_rows.append(proposal.carry_rows)
            self.stats.stopped_by_confidence += int(proposal.cut_by_confidence)
        self.finished_drafting = plan.kind == "end"
        self.stats.skipped_by_backoff += int(plan.kind == "skip")
        self.stats.lookups_skipped_by_backoff += int(plan.lookup_skipped)
        self.stats.lookup_proposals += int(plan.kind == "lookup")
        if self.stop_token_ids is not None:
            candidate_ids, candidate_logits = self._cut_after_stop_token(input_ids, candidate_ids, candidate_logits)
        self.stats.draft_lengths.append(candidate_ids.shape[1] - input_ids.shape[1])
        self.stats.drafting_time += self._lap()
        return self._finish(input_ids, candidate_ids, candidate_logits)

    def _finish(
        self, input_ids: torch.LongTensor, candidate_ids: torch.LongTensor, candidate_logits: torch.Tensor | None
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """The round's candidates, as Transformers takes them (no drafts: the sequence itself and no logits)."""
        if candidate_ids.shape[1] == input_ids.shape[1]:
            candidate_ids, candidate_logits = input_ids, None
        self.observer.round_finished(input_ids, candidate_ids, candidate_logits)
        return candidate_ids, candidate_logits

    def _cut_after_stop_token(
        self, input_ids: torch.LongTensor, candidate_ids: torch.LongTensor, candidate_logits: torch.Tensor | None
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Ends a proposal at its first end-of-sequence draft, for Transformers loops that keep accepted drafts past
        one (`compatibility.ASSISTED_LOOP_CROPS_AT_EOS`): generation stops there, so nothing after it is needed."""
        start = input_ids.shape[1]
        hits = torch.isin(candidate_ids[0, start:], self.stop_token_ids).nonzero()
        if hits.numel() == 0:
            return candidate_ids, candidate_logits
        keep = int(hits[0, 0]) + 1
        logits = None if candidate_logits is None else candidate_logits[:, :keep]
        return candidate_ids[:, : start + keep], logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        elapsed = self._lap()
        if not self.proposer.started:  # the target's prefill produced the first token
            self.stats.prefill_time += elapsed
            return
        self.stats.verification_time += elapsed
        self.stats.acceptance_lengths.append(int(num_matches) + 1)


# n-gram sizes a context lookup tries, longest first.
LOOKUP_NGRAM_SIZES = (3, 2)


def lookup_continuation(sequence: torch.LongTensor, max_tokens: int) -> torch.LongTensor | None:
    """`max_tokens` tokens predicted by the latest earlier occurrence of the last 3 tokens of `sequence` (1-D), else
    of its last 2; `None` when neither occurred before.

    The occurrence says the text repeats with period d (its distance to the end): token L + j is token L + j - d.
    So the drafts are the d tokens that followed it, cycled (a loop goes on looping)."""
    length = sequence.numel()
    if max_tokens < 1:
        return None
    for n in LOOKUP_NGRAM_SIZES:
        if length <= n:
            continue
        windows = sequence[:-1].unfold(0, n, 1)  # every n-gram followed by at least one token
        hits = (windows == sequence[-n:]).all(dim=1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n
            period = length - start
            return sequence[start + torch.arange(max_tokens, device=sequence.device) % period]
    return None


def check_pair(target: PreTrainedModel, drafter: CarryoverDrafterModel) -> None:
    """The target can feed the drafter, and the drafter was made for this target (name mismatches only warn)."""
    check_target(target)
    check_compatibility(drafter.config, target.config, check_name=False)
    recorded, actual = drafter.config.target_name_or_path, target.config._name_or_path
    if recorded and actual and recorded != actual:
        logger.warning_once(f"The drafter records target {recorded!r}; generating with {actual!r}.")


def cost_aware_policy(target, drafter, input_ids, generation_config):
    """`round_policy="cost"`: a `round_policy.CostAwarePolicy` over the drafter and, unless `suffix_match=False`, a
    suffix match (the drafter's `suffix_cache` when one is set, shared across calls; else this call's sequence alone),
    with the verification cost of `verification_cost`."""
    from .round_policy import ROUND_POLICY_STATE_ATTRIBUTE, AcceptanceMemory, CostAwarePolicy, VerificationCost, calibrate
    from .suffix_cache import SuffixCache

    suffix_match = getattr(generation_config, "suffix_match", None)
    if suffix_match not in (None, True, False):
        raise ValueError(f"suffix_match must be True, False or None (default: True), got {suffix_match!r}.")
    block_size = drafter.config.block_size
    max_drafts = max(block_size - 1, 16)
    sampling = bool(generation_config.do_sample)
    cost = getattr(generation_config, "verification_cost", None)
    if cost is None:  # a curve fixed once per machine: fitted online, a round's cost drifted with the draft counts the
        cost = "calibrate"  # policy happened to try and locked it into one (docs/generate.md); a seed reproduces a sample
    measured = cost == "measured"
    # What earlier calls learnt goes on with the next, kept on the drafter (runtime state, never saved): acceptance per
    # source, per target and temperature (`AcceptanceMemory`), and measured round costs. Only where that cannot change
    # the output (greedy) or the call asked for timings to decide (measured): else a seed gives the same sample twice.
    learnt = drafter.__dict__.setdefault(ROUND_POLICY_STATE_ATTRIBUTE, {})
    temperature = generation_config.temperature if sampling else 0.0
    shared = measured or not sampling
    memory = learnt.setdefault(("acceptance", id(target), temperature), AcceptanceMemory()) if shared else None
    if measured:  # the calibrated curve's shape, scaled by the rounds' own timings
        # Round costs are the machine's, not the call's: a call goes on from what earlier calls with this target
        # measured (per target, device, dtype and thread count), calibrated shape included.
        key = ("cost", id(target), str(target.device), str(target.dtype), torch.get_num_threads())
        earlier = learnt.get(key)
        cost = earlier.prior.verification if earlier is not None else calibrate(target, max_drafts)
    elif cost == "calibrate":
        cost = calibrate(target, max_drafts)
    elif cost == "flat":
        cost = VerificationCost.flat(max_drafts)
    elif isinstance(cost, (list, tuple)) and len(cost) >= 2 and all(float(c) > 0 for c in cost):
        cost = VerificationCost([float(c) for c in cost])
    else:
        raise ValueError(
            f"verification_cost must be None (default), 'measured', 'calibrate', 'flat' or a list of positive costs, "
            f"got {cost!r}."
        )
    # Without a shared cache, this call's own: it offers up to `max_drafts` after any match, the policy's estimate
    # per match length choosing how many to take (a shared cache keeps its own `alpha`).
    session = None
    if suffix_match is not False:
        cache = getattr(drafter, "suffix_cache", None) or SuffixCache(keep_outputs=False, alpha=float(max_drafts))
        session = cache.session(input_ids[0].tolist())
    if not measured:
        return CostAwarePolicy(block_size, generation_config.max_length, cost, session, memory=memory)
    policy = CostAwarePolicy(block_size, generation_config.max_length, cost, session, memory=memory,
                             measured=earlier if earlier is not None else True)  # fmt: skip
    learnt[key] = policy.cost
    return policy


def declare_generation_options(model: PreTrainedModel) -> PreTrainedModel:
    """Let `model.generate(...)` take the Carryover options as plain keyword arguments.

    Transformers passes a `generate` keyword on to the generation config only if the model's `generation_config` has
    that attribute (otherwise it is rejected as an unused model kwarg). This declares each option of
    `CARRYOVER_GENERATION_OPTIONS` there as `None` (= the drafter's default), on this model only; it is also what
    `save_pretrained` would then write. Without it the options travel in a `GenerationConfig` passed to the call.
    """
    for name in CARRYOVER_GENERATION_OPTIONS:
        if not hasattr(model.generation_config, name):
            setattr(model.generation_config, name, None)
    return model


def drafter_defaults(drafter: CarryoverDrafterModel) -> dict[str, Any]:
    """The proposal defaults a call starts from (`PROPOSAL_DEFAULTS`): the drafter's `generation_config` (saved as
    generation_config.json beside the model; an older checkpoint's config.json values are read into it on load)."""
    saved = getattr(drafter, "generation_config", None)
    return {name: getattr(saved, name, default) for name, default in PROPOSAL_DEFAULTS.items()}


def _option(generation_config: GenerationConfig, name: str, default: Any) -> Any:
    """A per-call option (see `CARRYOVER_GENERATION_OPTIONS`) from the call's generation config, else `default`."""
    value = getattr(generation_config, name, None)
    return default if value is None else value


def _count_option(generation_config: GenerationConfig, defaults: dict[str, Any], name: str) -> int | None:
    """A count option (`COUNT_OPTIONS`) of this call, else the drafter's default; checked."""
    return check_count_option(name, _option(generation_config, name, defaults[name]))


def check_empty_cache(cache: Any) -> None:
    """A pre-filled target cache is refused before any work.

    Transformers 5.23's assisted-decoding loop runs its first forward over the whole prompt even when
    `past_key_values` already holds part of it (unlike its plain greedy/sampling path, which skips the cached
    tokens): the prompt is processed twice and the output differs from the target alone, for every assistant kind
    (prompt lookup and draft models included). A Carryover drafter cannot repair that pass, so it refuses instead.
    """
    cached = int(cache.get_seq_length()) if cache is not None else 0
    if cached > 0:
        raise ValueError(
            f"`past_key_values` already holds {cached} tokens. Transformers' assisted decoding (which Carryover "
            "drafting runs in) re-processes the whole prompt on top of a pre-filled cache and would not return what "
            "the target alone returns. Call generate with the full conversation and without `past_key_values` (or "
            "with an empty cache); see docs/generate.md."
        )


def check_generation_options(generation_config: GenerationConfig) -> None:
    """A Carryover drafter is the candidate generator: another speculation option set next to it is an error."""
    conflicting = {
        name: getattr(generation_config, name, None)
        for name in CONFLICTING_SPECULATION_OPTIONS
        if getattr(generation_config, name, None) not in (None, False)
    }
    if conflicting:
        settings = ", ".join(f"{k}={v!r}" for k, v in conflicting.items())
        raise ValueError(
            f"A Carryover drafter was passed as `assistant_model` together with {settings}, which selects another "
            "candidate generator. Use one speculation method per call: drop the option to draft with the Carryover "
            "drafter, or drop `assistant_model` to use that method (for Transformers' own DFlash path pass a "
            "`MuseGlimmerAssistantModel`, e.g. from `carryover_hf.hub.native.to_native_dflash(drafter)`)."
        )


_transformers_validate_generation_mode = GenerationMixin._validate_generation_mode
_transformers_get_candidate_generator = GenerationMixin._get_candidate_generator
_VALIDATE_SIGNATURE = inspect.signature(_transformers_validate_generation_mode)
_GET_CANDIDATE_GENERATOR_SIGNATURE = inspect.signature(_transformers_get_candidate_generator)


def _bound(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The named arguments of a call (read only: the call itself is forwarded untouched)."""
    try:
        return signature.bind(*args, **kwargs).arguments
    except TypeError:  # let Transformers raise its own error for a malformed call
        return {}


@functools.wraps(_transformers_validate_generation_mode)
def _validate_generation_mode(*args, **kwargs):
    # Carryover checks run first: Transformers' vocabulary check would otherwise ask a drafter for another target
    # (different vocabulary) to come with two tokenizers, which cannot help; see docs/generate.md.
    arguments = _bound(_VALIDATE_SIGNATURE, args, kwargs)
    assistant = (arguments.get("generation_mode_kwargs") or {}).get("assistant_model")
    if isinstance(assistant, CarryoverDrafterModel):
        check_pair(arguments["self"], assistant)
        check_generation_options(arguments["generation_config"])
    return _transformers_validate_generation_mode(*args, **kwargs)


@functools.wraps(_transformers_get_candidate_generator)
def _get_candidate_generator(*args, **kwargs):
    arguments = _bound(_GET_CANDIDATE_GENERATOR_SIGNATURE, args, kwargs)
    if isinstance(arguments.get("assistant_model"), CarryoverDrafterModel):
        return CarryoverCandidateGenerator(
            target=arguments["self"],
            drafter=arguments["assistant_model"],
            input_ids=arguments["input_ids"],
            generation_config=arguments["generation_config"],
            logits_processor=arguments["logits_processor"],
            model_kwargs=arguments["model_kwargs"],
            check=False,  # `_validate_generation_mode` ran the checks at the start of `generate`
        )
    return _transformers_get_candidate_generator(*args, **kwargs)


def install_generation_hook() -> None:
    """Route Carryover drafters passed as `assistant_model` to `CarryoverCandidateGenerator`. Idempotent."""
    if getattr(GenerationMixin._get_candidate_generator, "_carryover_hook", False):
        return
    _get_candidate_generator._carryover_hook = True
    GenerationMixin._validate_generation_mode = _validate_generation_mode
    GenerationMixin._get_candidate_generator = _get_candidate_generator


__all__ = [
    "CARRYOVER_GENERATION_OPTIONS",
    "CarryoverCandidateGenerator",
    "ConfidenceRule",
    "DraftProposal",
    "DrafterProposer",
    "GenerationStats",
    "ProposalPolicy",
    "RoundObserver",
    "RoundPlan",
    "check_empty_cache",
    "check_generation_options",
    "check_pair",
    "declare_generation_options",
    "drafts_in_budget",
    "install_generation_hook",
    "lookup_candidates",
    "lookup_continuation",
    "observing_rounds",
]
