"""Configuration of the Carryover drafter.

No `from __future__ import annotations` here: `@strict` checks a field's type on assignment from its annotation, and
an annotation kept as a string passes every value.
"""

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import GenerationConfig, PreTrainedConfig
from transformers.modeling_rope_utils import RopeParameters

from .errors import ProposalOptionError


DRAFTER_TYPES = ("dflash", "markov")


def default_target_layer_ids(num_target_layers: int, num_layer_ids: int) -> list[int]:
    """Layer ids spread from layer 1 to layer L-3, as the public DFlash drafters do.

    Qwen3-4B (36 layers) with 5 ids gives ``[1, 9, 17, 25, 33]``. Small targets are clamped into range.
    """
    if num_target_layers < 1 or num_layer_ids < 1:
        raise ValueError("num_target_layers and num_layer_ids must be positive")
    if num_layer_ids == 1:
        return [num_target_layers // 2]
    start = min(1, num_target_layers - 1)
    end = max(start, num_target_layers - 3)
    span = end - start
    return [int(round(start + i * span / (num_layer_ids - 1))) for i in range(num_layer_ids)]


COUNT_OPTIONS = {"proposal_backoff": "rounds", "lookup_drafts": "tokens", "lookup_backoff": "rounds"}
# The proposal settings a generate call may pass (with `use_carryover`). Their defaults (a published drafter carries
# its measured best ones) are the drafter's `generation_config`, saved as generation_config.json beside the model:
# they are not part of what the drafter is, and the config holds architecture and training facts only.
PROPOSAL_OPTIONS = ("draft_confidence_threshold", *COUNT_OPTIONS)
# `round_policy`: None (or "rules") for the rule-based policy those options drive, "cost" for the cost-aware one.
PROPOSAL_DEFAULTS = {"use_carryover": True, "round_policy": None, **dict.fromkeys(PROPOSAL_OPTIONS)}
ROUND_POLICIES = ("rules", "cost")
# Options a generate call takes that have no drafter default (`generation.CARRYOVER_GENERATION_OPTIONS` lists all).
CALL_ONLY_OPTIONS = ("carryover_timing", "verification_cost", "suffix_match")


def proposal_option_error(name: str, value: Any = ..., owner: str = "CarryoverDrafterConfig") -> ProposalOptionError:
    """The one-line error for a proposal option read (`value` omitted) or set on a drafter's config: it names where
    the option lives instead (`drafter.generation_config.<name>`, or the generate call)."""
    shown = "..." if value is ... else repr(value)
    if name in CALL_ONLY_OPTIONS:
        return ProposalOptionError(
            f"{owner} has no `{name}`: it is a per-call option; pass `{name}={shown}` to the generate call (in its "
            "GenerationConfig, or as a keyword after `carryover_hf.generation.declare_generation_options(target)`)."
        )
    if value is ...:
        where = f"read `drafter.generation_config.{name}`"
    else:
        where = f"set `drafter.generation_config.{name} = {shown}`"
    return ProposalOptionError(
        f"{owner} has no `{name}`: proposal defaults live in the drafter's generation config; {where} instead "
        f"(or pass `{name}=...` to the generate call)."
    )


def check_count_option(name: str, value) -> int | None:
    """A count option (`COUNT_OPTIONS`) as the generator uses it (`None`: off; 0 means off too), or a clear error."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be a whole number of {COUNT_OPTIONS[name]} >= 0 or None (off), got {value!r}.")
    return value or None


def proposal_generation_config(config: "CarryoverDrafterConfig | None" = None, **overrides: Any) -> GenerationConfig:
    """A drafter's `generation_config`: the proposal defaults (`PROPOSAL_DEFAULTS`), those an older config.json held
    (`config.legacy_proposal_defaults`), then `overrides`."""
    legacy = getattr(config, "legacy_proposal_defaults", None) or {}
    return GenerationConfig(**{**PROPOSAL_DEFAULTS, **legacy, **overrides})


def check_proposal_defaults(values: dict[str, Any]) -> None:
    """Proposal defaults (`PROPOSAL_DEFAULTS`: a drafter's generation config, or an old config.json) are valid."""
    if "use_carryover" in values and not isinstance(values["use_carryover"], bool):
        raise ValueError(f"use_carryover must be True or False, got {values['use_carryover']!r}.")
    threshold = values.get("draft_confidence_threshold")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ValueError(f"draft_confidence_threshold must lie in [0, 1] or be None (off), got {threshold}.")
    for name in COUNT_OPTIONS:
        check_count_option(name, values.get(name))
    check_round_policy(values.get("round_policy"))


def check_round_policy(name: str | None) -> str:
    """A `round_policy` value as the generator uses it ("rules" for None), or a clear error."""
    if name is not None and name not in ROUND_POLICIES:
        raise ValueError(f"round_policy must be one of {ROUND_POLICIES} or None (rules), got {name!r}.")
    return name or "rules"


@strict
class CarryoverDrafterConfig(PreTrainedConfig):
    r"""
    Configuration of a [`CarryoverDrafterModel`]: a DFlash-style block-diffusion drafter that reads the target's
    hidden states as context and, with `use_carryover`, the target's states at the previous round's rejected draft
    positions.

    Architecture and training facts only: the proposal defaults a `generate` call starts from (`PROPOSAL_DEFAULTS`:
    `use_carryover`, `round_policy`, `draft_confidence_threshold`, `proposal_backoff`, `lookup_drafts`,
    `lookup_backoff`; docs/generate.md) are the model's `generation_config` (generation_config.json). A config.json
    saved before holds them (and the constructor takes them as keywords): they are read into
    `legacy_proposal_defaults` (and from there into the generation config of a model built from it), not kept as
    fields. Reading or setting one on a config afterwards (`drafter.config.use_carryover = False`) raises a
    `ProposalOptionError` naming `drafter.generation_config.<option>`: it would otherwise change nothing.

    The defaults describe a 5-layer drafter for Qwen3-4B (the public DFlash layout). Use
    [`CarryoverDrafterConfig.from_target_config`] to build a config matched to any causal LM.

    Args:
        target_name_or_path (`str`, *optional*): name or path of the target the drafter belongs to.
        target_hidden_size (`int`): hidden size of the target.
        target_num_hidden_layers (`int`): number of decoder layers of the target.
        target_layer_ids (`list[int]`): zero-based target decoder layers whose outputs are fused as context
            (the output of layer `i` is `hidden_states[i + 1]` in Transformers).
        block_size (`int`): rows per proposal block: the anchor plus `block_size - 1` mask rows.
        mask_token_id (`int`): token whose (target) embedding fills the mask rows.
        drafter_type (`str`): `"dflash"` (parallel block) or `"markov"` (block plus a rank-r token-transition head).
        markov_rank (`int`): rank r of the Markov head.
        markov_input_vocab_size (`int`, *optional*): the Markov head's `W1` has a row for each of this many target
            ids (saved with the weights) plus one shared row for all others; `None` (default): one row per token.
        trained_with_carryover (`bool`): whether the weights were trained with the draft-verify-draft objective.
        vocab_size (`int`): vocabulary size of the target (the drafter shares its embedding and LM head).
        draft_vocab_size (`int`, *optional*): size of a reduced draft vocabulary (EAGLE-3 / speculators style): the
            LM head runs over these target token ids only (`drafter.draft_token_ids`, set with
            `drafter.set_draft_vocabulary(ids)`), and tokens outside it are never proposed (lossless all the same:
            they get probability 0 in the returned candidate distributions). `None` (default): the full vocabulary.
    """

    model_type = "carryover_drafter"
    keys_to_ignore_at_inference = ["past_key_values"]
    default_theta = 1_000_000.0

    # The target this drafter belongs to
    target_name_or_path: str | None = None
    target_hidden_size: int = 2560
    target_num_hidden_layers: int = 36
    target_layer_ids: list[int] | None = None
    vocab_size: int = 151936
    draft_vocab_size: int | None = None

    # Drafting
    block_size: int = 16
    mask_token_id: int = 151669
    drafter_type: str = "dflash"
    markov_rank: int = 256
    markov_input_vocab_size: int | None = None
    trained_with_carryover: bool = False

    # Qwen3-style layer hyperparameters
    hidden_size: int = 2560
    intermediate_size: int = 9728
    num_hidden_layers: int = 5
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 40960
    rms_norm_eps: float = 1e-6
    rope_parameters: RopeParameters | dict | None = None
    attention_bias: bool = False
    attention_dropout: float | int = 0.0
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        # Checkpoints saved before the proposal defaults moved to generation_config.json kept them here: they are
        # taken out (the model puts them into its generation config) and not written back.
        self.legacy_proposal_defaults = {k: kwargs.pop(k) for k in PROPOSAL_DEFAULTS if k in kwargs}
        if self.target_layer_ids is None:
            self.target_layer_ids = default_target_layer_ids(self.target_num_hidden_layers, self.num_hidden_layers)
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        super().__post_init__(**kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        # A proposal option set here would be ignored (generate reads `drafter.generation_config`): refuse it.
        if name in PROPOSAL_DEFAULTS or name in CALL_ONLY_OPTIONS:
            raise proposal_option_error(name, value, type(self).__name__)
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes that do not exist: say where a proposal option lives instead.
        if name in PROPOSAL_DEFAULTS or name in CALL_ONLY_OPTIONS:
            raise proposal_option_error(name, owner=type(self).__name__)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def validate_carryover(self):
        """Checks the drafting fields; each message says how to fix the value."""
        if self.drafter_type not in DRAFTER_TYPES:
            raise ValueError(f"drafter_type must be one of {DRAFTER_TYPES}, got {self.drafter_type!r}.")
        if self.block_size < 2:
            raise ValueError(f"block_size must be at least 2 (anchor + one mask row), got {self.block_size}.")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must name at least one target layer.")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.target_num_hidden_layers]
        if bad:
            raise ValueError(
                f"target_layer_ids {bad} are out of range for a target with {self.target_num_hidden_layers} layers; "
                f"use ids in [0, {self.target_num_hidden_layers - 1}]."
            )
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary (size {self.vocab_size}).")
        if self.hidden_size != self.target_hidden_size:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must equal target_hidden_size ({self.target_hidden_size}): the "
                "drafter uses the target's input embedding and LM head."
            )
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"draft_vocab_size must be in [1, vocab_size={self.vocab_size}] or None (full vocabulary), got "
                f"{self.draft_vocab_size}."
            )
        if self.markov_rank < 1:
            raise ValueError(f"markov_rank must be positive, got {self.markov_rank}.")
        if self.markov_input_vocab_size is not None and not 1 <= self.markov_input_vocab_size <= self.vocab_size:
            raise ValueError(
                f"markov_input_vocab_size must be in [1, vocab_size={self.vocab_size}] or None (a row per token), got "
                f"{self.markov_input_vocab_size}."
            )
        check_proposal_defaults(self.legacy_proposal_defaults)

    def to_dict(self) -> dict[str, Any]:
        output = super().to_dict()
        output.pop("legacy_proposal_defaults", None)
        return output

    @property
    def num_target_features(self) -> int:
        """Width of the fused context features: one target hidden state per layer id."""
        return len(self.target_layer_ids) * self.target_hidden_size

    @classmethod
    def from_target_config(
        cls,
        target_config: PreTrainedConfig,
        num_hidden_layers: int = 1,
        block_size: int = 16,
        drafter_type: str = "dflash",
        target_layer_ids: list[int] | None = None,
        **overrides: Any,
    ) -> "CarryoverDrafterConfig":
        """A drafter config matched to `target_config`: same hidden size, vocabulary, heads and RoPE base.

        `target_layer_ids` defaults to one id per drafter layer spread as DFlash does; `mask_token_id` defaults to
        the target's pad token, else its last vocabulary id. Any other field can be overridden by keyword.
        """
        text = target_config.get_text_config()
        num_heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // num_heads
        rope = dict(getattr(text, "rope_parameters", None) or {})
        rope_theta = rope.get("rope_theta", getattr(text, "rope_theta", cls.default_theta))
        pad = text.pad_token_id if isinstance(getattr(text, "pad_token_id", None), int) else None
        values: dict[str, Any] = dict(
            target_name_or_path=getattr(target_config, "_name_or_path", None) or None,
            target_hidden_size=text.hidden_size,
            target_num_hidden_layers=text.num_hidden_layers,
            target_layer_ids=target_layer_ids
            if target_layer_ids is not None
            else default_target_layer_ids(text.num_hidden_layers, num_hidden_layers),
            vocab_size=text.vocab_size,
            block_size=block_size,
            mask_token_id=pad if pad is not None and pad < text.vocab_size else text.vocab_size - 1,
            drafter_type=drafter_type,
            hidden_size=text.hidden_size,
            intermediate_size=getattr(text, "intermediate_size", 4 * text.hidden_size),
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            hidden_act=getattr(text, "hidden_act", "silu"),
            max_position_embeddings=getattr(text, "max_position_embeddings", 40960),
            rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
            rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)},
            eos_token_id=getattr(text, "eos_token_id", None),
        )
        values.update(overrides)
        return cls(**values)


__all__ = ["CarryoverDrafterConfig", "default_target_layer_ids"]
