"""`run_benchmark`: every method on the same prompts in one process, interleaved per prompt, with a correctness gate.

Methods (see `METHOD_KINDS`): the target alone, Transformers' prompt lookup decoding, and per drafter: Transformers'
native DFlash path with the drafter's weights, the drafter with its carry segment off and with it on (full blocks
every round), the drafter's own rule-based proposal defaults (`rules`: its lookup, backoffs and confidence cut) and
the cost-aware round policy (`policy`: `round_policy="cost"`; `policy_alone`: the same with the drafter as its only
source, `suffix_match=False` and carry off: the drafter alone with the length chosen per round). For each
prompt all methods run back to back, starting at a different method for each prompt, so that machine drift and
warm caches affect all of them alike.

Each speculative `generate` call is observed through two hooks that do not change what it computes: a streamer (the
time of every batch of new tokens) and a thin wrapper around whatever candidate generator Transformers picked (drafts
proposed, drafts accepted and time per round). The first forward of the target (the prefill; for prompt lookup it
also verifies drafts found in the prompt) is kept apart: acceptance and decode statistics start after it, for every
method alike.

The cost-aware policy learns across calls (`CarryoverDrafterModel.round_policy_state`: acceptance memories and
measured round costs), so a prompt's rounds would depend on the prompts measured before it in the process.
`--policy_memory` (`POLICY_MEMORY_MODES`) fixes what every timed call starts from: by default the state learnt on the
warm-up generations, restored before each call, so per-prompt rounds do not depend on the order, the shard or a
`--resume`.
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import itertools
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, set_seed
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.streamers import BaseStreamer

from ...compatibility import check_compatibility
from ...hub.native import NativeDFlashUnavailable, to_native_dflash
from ...modeling_carryover import CarryoverDrafterModel
from ...round_policy import RoundPolicyState
from ...utils import device_synchronizer, model_fingerprint, pad_token_id
from .journal import RunJournal
from .overhead import check_new_context_rows
from .prompts import Prompt, encode_prompt

GLOBAL_METHODS = ("target", "prompt_lookup")
DRAFTER_METHODS = ("dflash_native", "carry_off", "carry_on", "rules", "policy", "policy_alone")
METHOD_KINDS = GLOBAL_METHODS + DRAFTER_METHODS
DEFAULT_METHODS = tuple(kind for kind in METHOD_KINDS if kind != "policy_alone")  # a diagnostic: asked for by name
# What a drafter's round policy starts each timed call from (see `--policy_memory`).
POLICY_MEMORY_MODES = {
    "warmup": "what it learnt on the warm-up generations (the same state, restored before every timed call)",
    "reset": "nothing: a fresh drafter's state before every timed call",
    "carry": "whatever the calls before it left (the prompts measured earlier in this process: order-dependent)",
}
# Default greedy tie tolerance (in logits) per dtype: 0 means outputs must be token-identical.
DEFAULT_TIE_TOLERANCE = {"float32": 0.0, "float64": 0.0, "bfloat16": 1.0, "float16": 0.25}


class CorrectnessError(RuntimeError):
    """A speculative method produced text the target alone would not have produced (see the report's `correctness`)."""


@dataclass
class BenchmarkSettings:
    """What to measure. Every field is recorded in the report."""

    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0], metadata={"help": "Sampling temperatures; 0 is greedy."})
    max_new_tokens: int = field(default=128, metadata={"help": "New tokens per prompt (fewer if the target stops)."})
    seed: int = field(default=0, metadata={"help": "Seed: prompt i of every method is generated after set_seed(seed + i)."})
    methods: list[str] = field(
        default_factory=lambda: list(DEFAULT_METHODS),
        metadata={"help": f"Methods to run, from {list(METHOD_KINDS)}; drafter methods run for every drafter."},
    )
    prompt_lookup_num_tokens: int = field(default=10, metadata={"help": "Drafts per round of prompt lookup decoding."})
    max_matching_ngram_size: int = field(default=2, metadata={"help": "Longest n-gram prompt lookup matches."})
    tie_tolerance: float | None = field(
        default=None,
        metadata={"help": "Greedy gate: largest logit gap allowed where a speculative output departs from the target "
                  f"alone (defaults per dtype: {DEFAULT_TIE_TOLERANCE}); 0 demands identical tokens."},
    )
    warmup: int = field(default=1, metadata={"help": "Untimed warm-up generations per method before measuring."})
    policy_memory: str = field(
        default="warmup",
        metadata={"help": "What the cost-aware round policy (learning across generate calls) starts each timed call "
                  "from: 'warmup' (what it learnt on the warm-up generations, restored before every call), 'reset' "
                  "(nothing, as a fresh drafter) or 'carry' (whatever earlier prompts left: order-dependent, as "
                  "before this option). With 'warmup' and 'reset' per-prompt rounds do not depend on the order of the "
                  "prompts, on --shard or on --resume."},
    )
    bootstrap_resamples: int = field(default=9999, metadata={"help": "Bootstrap resamples per interval."})
    confidence: float = field(default=0.95, metadata={"help": "Confidence level of the intervals."})
    compare: list[str] = field(
        default_factory=list,
        metadata={"help": "Extra paired comparisons 'A,B' of method names (A minus B); defaults cover carry on vs off, "
                  "off vs native DFlash, and drafters against each other."},
    )
    draft_confidence_thresholds: list[float] = field(
        default_factory=list,
        metadata={"help": "Also run each Carryover method with these adaptive-length thresholds (drafter methods "
                  "'<kind>@<threshold>': a proposal ends at the first draft below the threshold); the plain methods "
                  "always run with the threshold off."},
    )
    proposal_backoffs: list[int] = field(
        default_factory=list,
        metadata={"help": "Also run each Carryover method (and each thresholded one) with these proposal backoffs "
                  "(methods '<kind>[@<threshold>]+backoff<N>': after a rejected first draft, skip proposing for 1, 2, "
                  "4, ... rounds, at most N in a row)."},
    )
    lookup_drafts: list[int] = field(
        default_factory=list,
        metadata={"help": "Also run each Carryover method (and each thresholded / backoff one) with context lookup "
                  "(methods '...+lookup<N>': when the last 3 or 2 tokens occurred before, propose up to N tokens "
                  "copied from there instead of running the drafter)."},
    )
    lookup_backoffs: list[int] = field(
        default_factory=list,
        metadata={"help": "Also run each lookup method with these lookup backoffs (methods '...+lookup<N>+lookupbackoff"
                  "<M>': after a lookup whose first draft is rejected, do not look up for 1, 2, 4, ... rounds, at most "
                  "M in a row; the drafter proposes in them). Needs --lookup_drafts."},
    )
    keep_methods: list[str] = field(
        default_factory=list,
        metadata={"help": "Run only the methods whose names match one of these patterns (fnmatch, e.g. "
                  "'carry/carry_on*' 'base/carry_off'), out of everything the options above make; the target alone "
                  "always runs. Default: all."},
    )
    verification_cost: str | None = field(
        default=None,
        metadata={"help": "Verification cost of the 'policy' methods: unset (generate's default: measured from each "
                  "call's own rounds when greedy, calibrated when sampling), 'measured', 'calibrate', 'flat' (every "
                  "forward costs one step, as on a GPU) or comma-separated relative costs of verifying 0, 1, 2, ... "
                  "drafts."},
    )
    overhead: bool = field(default=True, metadata={"help": "Measure the carry overhead of each drafter in isolation."})
    overhead_context_lengths: list[int] = field(
        default_factory=lambda: [128, 512, 2048], metadata={"help": "Context lengths of the overhead measurement."}
    )
    overhead_repeats: int = field(default=30, metadata={"help": "Timed proposals per setting in the overhead measurement."})
    overhead_new_context_rows: int = field(
        default=1,
        metadata={"help": "New context rows each timed proposal fuses, as every round of generate does (0: none, a "
                  "proposal generate never makes)."},
    )
    fail_on_mismatch: bool = field(
        default=True, metadata={"help": "Raise after writing the report when a greedy output fails the gate."}
    )

    def validate(self) -> None:
        bad = [m for m in self.methods if m not in METHOD_KINDS]
        if bad:
            raise ValueError(f"unknown methods {bad}; choose from {list(METHOD_KINDS)}")
        if self.policy_memory not in POLICY_MEMORY_MODES:
            raise ValueError(f"policy_memory must be one of {list(POLICY_MEMORY_MODES)}, got {self.policy_memory!r}")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty list of values >= 0, got {self.temperatures}")
        if len(set(self.temperatures)) != len(self.temperatures):
            raise ValueError(f"temperatures are repeated: {self.temperatures}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {self.confidence}")
        if self.bootstrap_resamples < 100:
            raise ValueError(f"bootstrap_resamples must be at least 100, got {self.bootstrap_resamples}")
        if self.tie_tolerance is not None and self.tie_tolerance < 0:
            raise ValueError(f"tie_tolerance must be >= 0, got {self.tie_tolerance}")
        if self.overhead and (not self.overhead_context_lengths or min(self.overhead_context_lengths) < 1):
            raise ValueError(f"overhead_context_lengths must be positive, got {self.overhead_context_lengths}")
        if self.overhead and self.overhead_repeats < 2:
            raise ValueError(f"overhead_repeats must be at least 2, got {self.overhead_repeats}")
        if self.overhead:
            check_new_context_rows(self.overhead_new_context_rows, self.overhead_context_lengths,
                                   name="overhead_new_context_rows")  # fmt: skip
        bad = [t for t in self.draft_confidence_thresholds if not 0 < t <= 1]
        if bad:
            raise ValueError(f"draft_confidence_thresholds must lie in (0, 1], got {bad}")
        bad = [b for b in self.proposal_backoffs if b < 1]
        if bad:
            raise ValueError(f"proposal_backoffs must be at least 1 round, got {bad}")
        bad = [n for n in self.lookup_drafts if n < 1]
        if bad:
            raise ValueError(f"lookup_drafts must be at least 1 token, got {bad}")
        bad = [b for b in self.lookup_backoffs if b < 1]
        if bad:
            raise ValueError(f"lookup_backoffs must be at least 1 round, got {bad}")
        if self.lookup_backoffs and not self.lookup_drafts:
            raise ValueError("lookup_backoffs hold back a context lookup: give --lookup_drafts too")
        verification_cost(self)
        for pair in self.compare:
            if len(pair.split(",")) != 2:
                raise ValueError(f"--compare takes 'A,B' (two method names), got {pair!r}")


def verification_cost(settings: BenchmarkSettings) -> str | list[float] | None:
    """`--verification_cost` as `generate` takes it (checked: a clear error before any model is loaded)."""
    value = settings.verification_cost
    if value in (None, "measured", "calibrate", "flat"):
        return value
    try:
        costs = [float(v) for v in value.split(",")]
    except ValueError:
        costs = []
    if len(costs) < 2 or min(costs) <= 0:
        raise ValueError(f"--verification_cost must be 'measured', 'calibrate', 'flat' or at least two positive numbers 'c0,c1,..."
                         f"', got {value!r}")  # fmt: skip
    return costs


@dataclass
class Method:
    """One way of generating. `drafter` is the Carryover drafter (or its native DFlash copy) it uses, if any."""

    name: str
    kind: str
    drafter_name: str | None = None
    assistant: PreTrainedModel | None = None
    use_carryover: bool | None = None
    confidence_threshold: float | None = None
    proposal_backoff: int | None = None
    lookup_drafts: int | None = None
    lookup_backoff: int | None = None

    @property
    def speculative(self) -> bool:
        return self.kind != "target"

    def generation_options(self, settings: BenchmarkSettings) -> dict[str, Any]:
        """`GenerationConfig` fields of this method (Carryover's per-call options included: the drafter's own config
        is never changed between methods)."""
        if self.kind == "prompt_lookup":
            return {
                "prompt_lookup_num_tokens": settings.prompt_lookup_num_tokens,
                "max_matching_ngram_size": settings.max_matching_ngram_size,
            }
        if self.kind == "dflash_native":
            return {"speculation_type": "dflash"}
        if self.kind in ("carry_off", "carry_on"):
            # 0 turns the adaptive length off whatever the drafter's config says.
            return {"use_carryover": bool(self.use_carryover), "draft_confidence_threshold": self.confidence_threshold or 0.0,
                    "proposal_backoff": self.proposal_backoff or 0, "lookup_drafts": self.lookup_drafts or 0,
                    "lookup_backoff": self.lookup_backoff or 0, "round_policy": "rules"}
        if self.kind == "rules":  # the drafter's own proposal defaults, under the rule-based policy
            return {"round_policy": "rules"}
        if self.kind == "policy":  # the drafter's own defaults (its carry setting included), under the cost policy
            return {"round_policy": "cost", "verification_cost": verification_cost(settings), "suffix_match": True}
        if self.kind == "policy_alone":
            # The plain draft as the only source, whatever the drafter's config says: no suffix match and carry off
            # (before 2026-12-07 the carry setting came from the drafter's generation_config, so a drafter saved with
            # `use_carryover: true`, as campaign milestones are, ran with its carry segment on).
            return {"round_policy": "cost", "verification_cost": verification_cost(settings), "suffix_match": False,
                    "use_carryover": False}  # fmt: skip
        return {}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "drafter": self.drafter_name,
                "use_carryover": self.use_carryover, "draft_confidence_threshold": self.confidence_threshold,
                "proposal_backoff": self.proposal_backoff, "lookup_drafts": self.lookup_drafts,
                "lookup_backoff": self.lookup_backoff}  # fmt: skip


@dataclass
class PromptRun:
    """What one method did on one prompt at one temperature. Times in seconds."""

    prompt_id: str
    category: str
    method: str
    temperature: float
    prompt_tokens: int
    new_tokens: int
    total_time: float
    prefill_time: float
    prefill_tokens: int  # tokens produced by the first target forward
    decode_tokens: int
    decode_time: float
    acceptance_lengths: list[int] = field(default_factory=list)  # per decoding round, bonus included
    draft_lengths: list[int] = field(default_factory=list)
    drafting_time: float = 0.0
    verification_time: float = 0.0
    rest_time: float = 0.0  # the rest of the decoding loop: acceptance decision -> next proposal (or the end)
    carry_rows: list[int] | None = None
    planning_time: float | None = None  # the round policy's own time, part of drafting_time (None: not recorded)
    check: dict[str, Any] | None = None  # greedy gate result (speculative methods at T=0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- observing a generate call -----------------------------------------------------------------------------------
class _TokenClock(BaseStreamer):
    """Streamer recording when each batch of tokens arrives: the prompt first, then one batch per target forward."""

    def __init__(self, sync: Callable[[], None]):
        self.sync, self.times, self.counts, self.end_time = sync, [], [], None

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())
        self.counts.append(int(value.numel()))

    def end(self) -> None:
        self.sync()
        self.end_time = time.perf_counter()


class _RoundRecorder(CandidateGenerator):
    """Delegates to Transformers' chosen candidate generator and logs drafts, acceptances and times of each round.

    A round is: proposal (inside `get_candidates`), verification (candidates -> `update_candidate_strategy`: target
    forward, acceptance, cache crop) and the rest of the loop (from there to the next `get_candidates`, or to the end
    of `generate` for the last round: streamer, stopping criteria, bookkeeping).
    """

    def __init__(self, inner: CandidateGenerator, sync: Callable[[], None]):
        self.inner, self.sync = inner, sync
        self.rounds: list[dict[str, float]] = []
        self._pending: dict[str, float] | None = None
        self._verified_at: float | None = None

    def __getattr__(self, name: str) -> Any:
        """Whatever else the assisted loop reads of its generator (`num_drafting_tokens` on Transformers 5.25)."""
        if name == "inner":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def requires_model_outputs(self) -> bool:  # type: ignore[override]
        return getattr(self.inner, "requires_model_outputs", False)

    @property
    def model_kwargs_overrides(self) -> dict[str, Any]:
        return getattr(self.inner, "model_kwargs_overrides", {})

    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs):
        self.sync()
        start = time.perf_counter()
        self.close_round(start)
        candidates, logits = self.inner.get_candidates(input_ids, *args, **kwargs)
        self.sync()
        end = time.perf_counter()
        self._pending = {"drafts": candidates.shape[1] - input_ids.shape[1], "drafting": end - start, "verify_start": end}
        return candidates, logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        self.sync()
        pending, self._pending = self._pending, None
        self._verified_at = time.perf_counter()
        pending["verification"] = self._verified_at - pending.pop("verify_start")
        pending["accepted"] = int(num_matches)
        pending["rest"] = 0.0
        self.rounds.append(pending)
        self.inner.update_candidate_strategy(input_ids, scores, num_matches)

    def close_round(self, now: float) -> None:
        """The rest of the loop after the last acceptance decision ends at `now`."""
        if self._verified_at is not None and self.rounds:
            self.rounds[-1]["rest"] = now - self._verified_at
        self._verified_at = None


def sampling_kwargs(temperature: float) -> dict[str, Any]:
    """Greedy at 0; otherwise plain temperature sampling (top-k and top-p off, so T alone sets the distribution)."""
    if temperature == 0:
        return {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
    return {"do_sample": True, "temperature": float(temperature), "top_k": 0, "top_p": 1.0}


@torch.no_grad()
def run_method(
    target: PreTrainedModel,
    method: Method,
    input_ids: torch.LongTensor,
    temperature: float,
    settings: BenchmarkSettings,
    seed: int,
    max_new_tokens: int | None = None,
) -> tuple[torch.LongTensor, dict[str, Any]]:
    """One `generate` call, timed and observed. Returns the new tokens and the raw measurements."""
    sync = device_synchronizer(target.device)
    clock = _TokenClock(sync)
    recorder: _RoundRecorder | None = None
    if method.speculative:
        original = target._get_candidate_generator  # bound method; an instance attribute shadows it for this call only

        def observed(self, **kwargs):
            nonlocal recorder
            recorder = _RoundRecorder(original(**kwargs), sync)
            return recorder

        target._get_candidate_generator = types.MethodType(observed, target)
    drafter = method.assistant if isinstance(method.assistant, CarryoverDrafterModel) else None
    # Every option of this method travels in the call's own generation config; nothing on the models is changed.
    generation_config = copy.deepcopy(target.generation_config)
    unused = generation_config.update(
        max_new_tokens=max_new_tokens or settings.max_new_tokens,
        pad_token_id=pad_token_id(target.generation_config, fallback=0),
        **sampling_kwargs(temperature),
    )
    for name, value in {**unused, **method.generation_options(settings)}.items():
        setattr(generation_config, name, value)
    assistant = {"assistant_model": method.assistant} if method.assistant is not None else {}
    try:
        set_seed(seed)
        input_ids = input_ids.to(target.device)
        sync()
        start = time.perf_counter()
        output = target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            generation_config=generation_config,
            streamer=clock,
            **assistant,
        )
        sync()
        total = time.perf_counter() - start
    finally:
        if method.speculative:
            del target._get_candidate_generator
    new_tokens = output[0, input_ids.shape[1] :].cpu()
    if len(clock.times) < 2 or clock.end_time is None:
        raise RuntimeError(f"{method.name}: the streamer saw no generated tokens; cannot time this run")
    end = clock.end_time
    if recorder is not None:
        recorder.close_round(end)
    rounds = recorder.rounds[1:] if recorder is not None else []  # round 0 is the prefill forward
    measured = {
        "total_time": total,
        "prefill_time": clock.times[1] - start,
        "prefill_tokens": clock.counts[1],
        "decode_tokens": int(new_tokens.numel()) - clock.counts[1],
        "decode_time": end - clock.times[1],
        "acceptance_lengths": [r["accepted"] + 1 for r in rounds],
        "draft_lengths": [r["drafts"] for r in rounds],
        "drafting_time": sum(r["drafting"] for r in rounds),
        "verification_time": sum(r["verification"] for r in rounds),
        "rest_time": sum(r["rest"] for r in rounds),
        "carry_rows": list(drafter.last_generation_stats.carry_rows) if drafter is not None else None,
        # the round policy's own host time (inside drafting_time): its overhead against a target step
        "planning_time": drafter.last_generation_stats.planning_time if drafter is not None else None,
    }
    if method.speculative and recorder is None:
        raise RuntimeError(f"{method.name}: generate did not use a candidate generator; the method is misconfigured")
    return new_tokens, measured


# -- the greedy correctness gate -----------------------------------------------------------------------------------
@torch.no_grad()
def check_greedy_output(
    target: PreTrainedModel,
    prompt_ids: torch.LongTensor,
    reference: torch.LongTensor,
    candidate: torch.LongTensor,
    tolerance: float,
) -> dict[str, Any]:
    """Compare a speculative greedy output with the target-alone output.

    Identical outputs pass. With `tolerance == 0` any difference fails. Otherwise the outputs may part only at a
    near-tie: on the shared prefix the target's logits of both tokens must lie within `tolerance` of its top logit;
    and every later token of the candidate must also be a near-argmax of the target on the candidate's own prefix
    (one forward over the whole candidate), so that nothing past the split is wrong either.
    """
    reference, candidate = reference.tolist(), candidate.tolist()
    length = max(len(reference), len(candidate))
    split = next((i for i, (a, b) in enumerate(zip(reference, candidate)) if a != b), None)
    if split is None and len(reference) == len(candidate):
        return {"identical": True, "agreement": 1.0, "first_divergence": None, "passed": True}
    result: dict[str, Any] = {"identical": False, "first_divergence": split, "tolerance": tolerance}
    if split is None:  # one output is a proper prefix of the other: they stopped differently
        result.update(agreement=min(len(reference), len(candidate)) / length, passed=False,
                      reason=f"outputs agree but stop at different lengths ({len(reference)} vs {len(candidate)} tokens)")
        return result
    result["agreement"] = split / length
    sequence = torch.cat([prompt_ids[0].cpu(), torch.tensor(candidate)]).unsqueeze(0).to(target.device)
    logits = target(sequence).logits[0, prompt_ids.shape[1] - 1 : -1].float()  # row j predicts candidate token j
    top2 = logits.topk(2, dim=-1).values
    top = top2[:, 0]
    chosen_gap = (top - logits[torch.arange(len(candidate)), torch.tensor(candidate, device=logits.device)]).cpu()
    reference_gap = float(top[split] - logits[split, reference[split]])
    worst = int(chosen_gap[split:].argmax()) + split
    result.update(
        top_two_gap_at_divergence=float(top2[split, 0] - top2[split, 1]),
        reference_token_gap=reference_gap,
        candidate_token_gap=float(chosen_gap[split]),
        max_gap_after_divergence=float(chosen_gap[split:].max()),
        passed=bool(tolerance > 0 and max(reference_gap, float(chosen_gap[split:].max())) <= tolerance),
    )
    if tolerance == 0:
        result["reason"] = f"outputs differ at new token {split} and the tolerance is 0 (exact dtype)"
    elif not result["passed"]:
        result["reason"] = (
            f"at new token {worst} the token chosen is {float(chosen_gap[worst]):.4g} logits below the target's top "
            f"(reference token gap at the split: {reference_gap:.4g}); tolerance {tolerance}"
        )
    return result


# -- the benchmark -------------------------------------------------------------------------------------------------
def build_methods(
    drafters: Mapping[str, CarryoverDrafterModel],
    settings: BenchmarkSettings,
    native_dflash: Callable[[CarryoverDrafterModel], PreTrainedModel] | None = to_native_dflash,
) -> tuple[list[Method], list[dict[str, Any]]]:
    """The methods to run, and the ones skipped with the reason."""
    methods, skipped = [Method("target", "target")], []
    if "prompt_lookup" in settings.methods:
        methods.append(Method("prompt_lookup", "prompt_lookup"))
    for name, drafter in drafters.items():
        if "dflash_native" in settings.methods:
            try:
                if native_dflash is None:
                    raise NativeDFlashUnavailable("no exporter to Transformers' DFlash model was given")
                methods.append(Method(f"{name}/dflash_native", "dflash_native", name, native_dflash(drafter), False))
            except NativeDFlashUnavailable as error:
                skipped.append({"name": f"{name}/dflash_native", "reason": str(error)})
        for kind, carry in (("carry_off", False), ("carry_on", True)):
            if kind not in settings.methods:
                continue
            variants = itertools.product(
                [None, *settings.draft_confidence_thresholds],
                [None, *settings.proposal_backoffs],
                [None, *settings.lookup_drafts],
                [None, *settings.lookup_backoffs],
            )
            for threshold, backoff, lookup, lookup_backoff in variants:
                if lookup_backoff and not lookup:
                    continue  # nothing to hold back
                label = (f"{name}/{kind}" + (f"@{threshold:g}" if threshold else "")
                         + (f"+backoff{backoff}" if backoff else "") + (f"+lookup{lookup}" if lookup else "")
                         + (f"+lookupbackoff{lookup_backoff}" if lookup_backoff else ""))  # fmt: skip
                methods.append(
                    Method(label, kind, name, drafter, carry, threshold and float(threshold), backoff, lookup, lookup_backoff)
                )
        # The drafter's own defaults (carry included) under each round policy: what a plain generate call runs.
        methods += [Method(f"{name}/{kind}", kind, name, drafter) for kind in ("rules", "policy", "policy_alone")
                    if kind in settings.methods]  # fmt: skip
    if settings.keep_methods:
        names = [m.name for m in methods] + [s["name"] for s in skipped]
        unmatched = [p for p in settings.keep_methods if not fnmatch.filter(names, p)]
        if unmatched:
            raise ValueError(f"--keep_methods {unmatched} match no method; the options make {names}")

        def kept(name: str) -> bool:
            return any(fnmatch.fnmatchcase(name, p) for p in settings.keep_methods)

        methods = [m for m in methods if m.kind == "target" or kept(m.name)]
        skipped = [s for s in skipped if kept(s["name"])]
    return methods, skipped


def default_comparisons(methods: Sequence[Method], drafter_names: Sequence[str]) -> list[tuple[str, str]]:
    """Carry on vs off per drafter; off vs native DFlash; the cost-aware policy against the rules and full blocks (and
    with the drafter as its only source against full blocks and against the policy with the suffix match); and
    each later drafter against each earlier one."""
    names = {m.name for m in methods}
    pairs = []
    for d in drafter_names:
        pairs += [(f"{d}/carry_on", f"{d}/carry_off"), (f"{d}/carry_off", f"{d}/dflash_native")]
        pairs += [(f"{d}/policy", f"{d}/rules"), (f"{d}/policy", f"{d}/carry_on")]
        # The drafter alone with the length chosen per round against full blocks; what the suffix match adds to it.
        pairs += [(f"{d}/policy_alone", f"{d}/carry_off"), (f"{d}/policy_alone", f"{d}/carry_on"),
                  (f"{d}/policy", f"{d}/policy_alone")]  # fmt: skip
        # Adaptive proposal length and backoff against the same method with the full block, every round.
        pairs += [(m.name, f"{d}/{m.kind}") for m in methods
                  if m.drafter_name == d and (m.confidence_threshold or m.proposal_backoff or m.lookup_drafts)]  # fmt: skip
        # Context lookup in front of the drafter against prompt lookup alone; the lookup backoff against none.
        pairs += [(m.name, "prompt_lookup") for m in methods if m.drafter_name == d and m.lookup_drafts]
        pairs += [(m.name, m.name.rsplit("+lookupbackoff", 1)[0])
                  for m in methods if m.drafter_name == d and m.lookup_backoff]  # fmt: skip
    for i, later in enumerate(drafter_names):
        for earlier in drafter_names[:i]:
            pairs += [(f"{later}/carry_on", f"{earlier}/carry_off"), (f"{later}/carry_on", f"{earlier}/carry_on")]
    return [(a, b) for a, b in pairs if a in names and b in names]


def _require_bench_extras() -> None:
    import importlib.util

    missing = [name for name in ("scipy", "matplotlib") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"the benchmark needs {missing}; install them with `pip install 'carryover-hf[bench]'`")


def _tie_tolerance(settings: BenchmarkSettings, dtype: torch.dtype) -> float:
    if settings.tie_tolerance is not None:
        return settings.tie_tolerance
    return DEFAULT_TIE_TOLERANCE.get(str(dtype).removeprefix("torch."), 0.0)


def run_benchmark(
    target: PreTrainedModel,
    drafters: Mapping[str, CarryoverDrafterModel],
    prompts: Sequence[Prompt],
    tokenizer=None,
    settings: BenchmarkSettings | None = None,
    output_dir: str | None = None,
    progress: bool = True,
    chat_template: bool = True,
    native_dflash: Callable[[CarryoverDrafterModel], PreTrainedModel] | None = to_native_dflash,
    run_info: Mapping[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    time_limit: float | None = None,
    shard: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Benchmark `drafters` (name -> drafter) against the target alone and its peers; returns the report dict.

    With `output_dir`, writes `results.json`, `results.md` and the plots there (see `carryover_hf.tools.bench.report`),
    and journals every finished prompt group in `runs.jsonl` (`carryover_hf.tools.bench.journal`): with `resume` a run of
    the same benchmark continues where it stopped, with `overwrite` it starts again. With `time_limit` (seconds) no
    prompt group starts after that long; the report then covers the groups measured so far and says so.
    With `shard=(k, n)` (1 <= k <= n) this process measures the k-th of n shares of the prompt groups (every n-th in
    measuring order, from the k-th), so n processes, started alike with `resume`, fill one journal side by side; each
    group's methods still run back to back in one process. The report covers every group in the journal.
    A greedy output that fails the correctness gate has its speed withheld from the report; with
    `settings.fail_on_mismatch` a `CorrectnessError` is raised after the report is written.
    """
    from .report import build_report, machine, write_report

    settings = settings or BenchmarkSettings()
    settings.validate()
    check_shard(shard, output_dir, resume)
    _require_bench_extras()
    # Everything that can be wrong is checked before the first generate call.
    for name, drafter in drafters.items():
        if not isinstance(drafter, CarryoverDrafterModel):
            raise TypeError(f"drafter {name!r} is a {type(drafter).__name__}, expected a CarryoverDrafterModel")
        check_compatibility(drafter.config, target.config, check_name=False)
        if "/" in name or "," in name:
            raise ValueError(f"drafter name {name!r} may not contain '/' or ','")
    if not prompts:
        raise ValueError("no prompts to benchmark")
    encoded = {p.id: encode_prompt(p, tokenizer, chat_template) for p in prompts}
    limit = getattr(target.config.get_text_config(), "max_position_embeddings", None)
    too_long = [p for p, ids in encoded.items() if limit and ids.shape[1] + settings.max_new_tokens > limit]
    if too_long:
        raise ValueError(f"prompts {too_long[:5]} plus max_new_tokens exceed the target's {limit} positions")
    if settings.overhead and drafters and limit:
        longest = max(settings.overhead_context_lengths) + max(d.config.block_size for d in drafters.values())
        if longest > limit:
            raise ValueError(
                f"overhead context length {max(settings.overhead_context_lengths)} plus a block exceeds the target's "
                f"{limit} positions; lower --overhead-context-lengths"
            )
    methods, skipped = build_methods(drafters, settings, native_dflash)
    names = {m.name for m in methods}
    comparisons = default_comparisons(methods, list(drafters))
    for pair in settings.compare:
        a, b = (s.strip() for s in pair.split(","))
        for n in (a, b):
            if n not in names:
                raise ValueError(f"--compare names unknown method {n!r}; methods: {sorted(names)}")
        if (a, b) not in comparisons:
            comparisons.append((a, b))
    tolerance = _tie_tolerance(settings, target.dtype)
    target.eval()
    for drafter in drafters.values():
        drafter.eval()
    journal = None
    if output_dir is not None:
        measures = _measures(target, drafters, methods, prompts, encoded, settings, tolerance, run_info)
        journal = RunJournal.open(output_dir, measures, resume=resume, overwrite=overwrite)
    finished: dict[tuple[float, str], dict[str, Any]] = dict(journal.groups) if journal else {}
    order = [(float(t), index) for t in settings.temperatures for index in _interleaved_by_category(prompts)]
    if shard is not None:  # this process's share, fixed by the position in the whole order (not in what is left)
        order = order[shard[0] - 1 :: shard[1]]
    pending = [(temperature, index) for temperature, index in order if (temperature, prompts[index].id) not in finished]
    started = time.perf_counter()

    policy_states: dict[int, RoundPolicyState] = {}  # id(drafter) -> what its timed calls start from
    if pending:
        if settings.policy_memory != "carry":  # nothing learnt before this run counts
            for drafter in drafters.values():
                drafter.reset_round_policy_state()
        # Warm-up: kernels, allocator and caches settle before anything is timed.
        first = encoded[warmup_prompt(prompts, settings).id]
        for _ in range(settings.warmup):
            for method in methods:
                run_method(target, method, first, 0.0, settings, settings.seed, max_new_tokens=warmup_tokens(settings))
        if settings.policy_memory != "carry":  # 'reset': reset above, and the warm-up's learning is undone each call
            warm = settings.policy_memory == "warmup"
            policy_states = {id(d): d.round_policy_state() if warm else RoundPolicyState() for d in drafters.values()}
    timed_on = machine(target.device)
    bar = tqdm(total=len(pending) * len(methods), desc="bench", unit="gen", disable=not progress)
    for temperature, index in pending:
        if time_limit is not None and time.perf_counter() - started > time_limit:
            break
        group = _run_prompt_group(target, methods, prompts[index], index, encoded, temperature, settings, tolerance,
                                  bar, policy_states)
        if journal is not None:
            journal.record(group, command=(run_info or {}).get("command"), machine=timed_on)
        finished[(temperature, prompts[index].id)] = group
    bar.close()
    if journal is not None:  # the groups that processes sharing the journal measured meanwhile
        journal.refresh()
        finished = dict(journal.groups)

    complete = len(finished) == len(settings.temperatures) * len(prompts)
    overhead = {}
    if settings.overhead and complete:
        recorded = [
            torch.cat([encoded[p.id][0], torch.tensor(finished[(0.0, p.id)]["target_tokens"], dtype=torch.long)])
            for p in prompts
            if (0.0, p.id) in finished
        ]
        overhead = _measure_overheads(target, drafters, prompts, encoded, recorded, settings, progress)

    report = build_report(
        runs=[PromptRun(**r) for group in finished.values() for r in group["runs"]],
        methods=methods,
        skipped=skipped,
        comparisons=comparisons,
        prompts=prompts,
        settings=settings,
        tie_tolerance=tolerance,
        target=target,
        drafters=drafters,
        overhead=overhead,
        run_info=dict(run_info or {}),
        progress={
            "complete": complete,
            "prompt_groups": len(finished),
            "prompt_groups_total": len(settings.temperatures) * len(prompts),
            "segments": journal.segments if journal else [],
        },
    )
    report["policy_memory"] = describe_policy_memory(prompts, settings)
    if output_dir is not None:
        write_report(report, output_dir)
    if settings.fail_on_mismatch and not report["correctness"]["passed"]:
        failures = report["correctness"]["failures"]
        raise CorrectnessError(
            f"{len(failures)} greedy output(s) differ from the target alone beyond the tie tolerance; speed withheld. "
            f"First: {failures[0]}" + (f". Report written to {output_dir}" if output_dir else "")
        )
    return report


def check_shard(shard: tuple[int, int] | None, output_dir: str | None, resume: bool) -> None:
    """Refuses a shard (k, n) that cannot add to a run journal; the CLI's `--shard K/N` is checked here too."""
    from .journal import parallel_journals_supported

    if shard is None:
        return
    k, n = shard
    if not (isinstance(k, int) and isinstance(n, int) and 1 <= k <= n):
        raise ValueError(f"a shard is K/N with 1 <= K <= N (e.g. 1/2 and 2/2 for two processes), got {shard!r}")
    if output_dir is None:
        raise ValueError("a shard needs an output_dir (--output_dir): the shards of a run share its journal")
    if n > 1 and not resume:
        raise ValueError("shards of a run add to one journal: run every shard with resume=True (--resume)")
    if n > 1 and not parallel_journals_supported():
        raise ValueError("shards share a journal through POSIX file locks, which this platform lacks; run one process")


def _interleaved_by_category(prompts: Sequence[Prompt]) -> list[int]:
    """Prompt positions in the order they are measured: the first of each category, then the second of each, ...

    A run stopped part way (`time_limit`) has then measured every category about equally far."""
    by_category: dict[str, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_category.setdefault(prompt.category, []).append(index)
    rounds = itertools.zip_longest(*by_category.values())
    return [index for round_ in rounds for index in round_ if index is not None]


def warmup_prompt(prompts: Sequence[Prompt], settings: BenchmarkSettings) -> Prompt:
    """The prompt of the warm-up generations: the first by id (the same whatever the order of `prompts`, so that the
    state the round policy learns on it is too), or with `policy_memory="carry"` the first given (as before it)."""
    return prompts[0] if settings.policy_memory == "carry" else min(prompts, key=lambda p: p.id)


def warmup_tokens(settings: BenchmarkSettings) -> int:
    return min(16, settings.max_new_tokens)


def describe_policy_memory(prompts: Sequence[Prompt], settings: BenchmarkSettings) -> dict[str, Any]:
    """The report's account of what each timed call's round policy started from (`--policy_memory`)."""
    mode = settings.policy_memory
    warmup = {"prompt": warmup_prompt(prompts, settings).id, "generations": settings.warmup,
              "max_new_tokens": warmup_tokens(settings), "temperature": 0.0}  # fmt: skip
    return {"mode": mode, "starts_from": POLICY_MEMORY_MODES[mode], "order_independent": mode != "carry",
            "warmup": warmup if mode == "warmup" else None}  # fmt: skip


def _run_prompt_group(target, methods, prompt, index, encoded, temperature, settings, tolerance, bar,
                      policy_states: Mapping[int, RoundPolicyState] | None = None) -> dict[str, Any]:  # fmt: skip
    """Every method on one prompt at one temperature, back to back (starting at a different method for each prompt),
    with the greedy gate at temperature 0. Returns the journal's group record. A method whose drafter has a state in
    `policy_states` (by `id`) starts from it (see `--policy_memory`)."""
    ids = encoded[prompt.id]
    start = index % len(methods)
    outputs: dict[str, torch.LongTensor] = {}
    runs: dict[str, PromptRun] = {}
    for method in methods[start:] + methods[:start]:
        bar.set_postfix_str(f"T={temperature:g} {method.name}")
        if policy_states and id(method.assistant) in policy_states:
            method.assistant.restore_round_policy_state(policy_states[id(method.assistant)])
        new_tokens, measured = run_method(target, method, ids, temperature, settings, settings.seed + index)
        outputs[method.name] = new_tokens
        runs[method.name] = PromptRun(
            prompt_id=prompt.id,
            category=prompt.category,
            method=method.name,
            temperature=float(temperature),
            prompt_tokens=int(ids.shape[1]),
            new_tokens=int(new_tokens.numel()),
            **measured,
        )
        bar.update(1)
    if temperature == 0:
        for method in methods:
            if method.speculative:
                runs[method.name].check = check_greedy_output(
                    target, ids, outputs["target"], outputs[method.name], tolerance
                )
    return {
        "temperature": float(temperature),
        "prompt_id": prompt.id,
        "index": index,
        "runs": [runs[m.name].to_dict() for m in methods],
        # The target's greedy answer: the carry overhead measurement's context (also after a resume).
        "target_tokens": outputs["target"].tolist() if temperature == 0 else None,
    }


# Settings that change only how results are summarised, not what is measured: a resumed run may change them.
REPORT_ONLY_SETTINGS = (
    "warmup", "bootstrap_resamples", "confidence", "compare", "overhead", "overhead_context_lengths",
    "overhead_repeats", "overhead_new_context_rows", "fail_on_mismatch",
)  # fmt: skip


def _measures(target, drafters, methods, prompts, encoded, settings, tolerance, run_info) -> dict[str, Any]:
    """What a benchmark measures, for its journal's fingerprint: a resumed run must measure the same thing."""
    tokens = hashlib.sha256()
    for prompt in prompts:
        tokens.update(prompt.id.encode() + b"\0" + encoded[prompt.id].numpy().tobytes())
    measured_settings = {k: v for k, v in asdict(settings).items() if k not in REPORT_ONLY_SETTINGS}
    if settings.policy_memory == "carry":  # what runs before the option measured: their journals resume with it
        del measured_settings["policy_memory"]
    elif settings.policy_memory == "warmup":  # every timed call starts from what the warm-up taught the policy
        measured_settings["warmup"] = settings.warmup
    return {
        "settings": measured_settings,
        "tie_tolerance": tolerance,
        "methods": [m.describe() for m in methods],
        "prompts": {"ids": [p.id for p in prompts], "tokens": tokens.hexdigest()[:16]},
        "target": {"weights": model_fingerprint(target), "dtype": str(target.dtype), "device": target.device.type},
        "drafters": {name: model_fingerprint(d) for name, d in drafters.items()},
        "threads": torch.get_num_threads(),
        "cpu_kernels": (run_info or {}).get("cpu_kernels"),
    }


def _measure_overheads(target, drafters, prompts, encoded, recorded, settings, progress) -> dict[str, Any]:
    """Carry overhead per drafter on recorded contexts: the target's greedy answers after their prompts, joined."""
    from .overhead import measure_carry_overhead

    pieces = recorded or [encoded[p.id][0] for p in prompts]
    stream = torch.cat(pieces)
    results: dict[str, Any] = {}
    for name, drafter in drafters.items():
        needed = max(settings.overhead_context_lengths) + drafter.config.block_size - 1
        repeats = -(-needed // stream.numel())
        sequence = stream.repeat(repeats)[:needed].unsqueeze(0)
        result = measure_carry_overhead(
            target,
            drafter,
            sequence,
            context_lengths=settings.overhead_context_lengths,
            repeats=settings.overhead_repeats,
            n_resamples=settings.bootstrap_resamples,
            confidence=settings.confidence,
            seed=settings.seed,
            progress=progress,
            new_context_rows=settings.overhead_new_context_rows,
        )
        result["context_source"] = (
            "target-alone greedy outputs after their prompts" if recorded else "benchmark prompts"
        ) + (f", joined and cycled {repeats}x to reach {needed} tokens" if repeats > 1 else ", joined")
        results[name] = result
    return results


__all__ = [
    "DEFAULT_TIE_TOLERANCE",
    "METHOD_KINDS",
    "POLICY_MEMORY_MODES",
    "BenchmarkSettings",
    "CorrectnessError",
    "Method",
    "PromptRun",
    "build_methods",
    "check_greedy_output",
    "run_benchmark",
    "run_method",
    "sampling_kwargs",
]
