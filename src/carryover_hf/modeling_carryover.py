"""The Carryover drafter: a DFlash-style block-diffusion drafter that can also read carried (rejected) target states.

A proposal is one forward pass over a block `[anchor, MASK x (B-1)]`. Every drafter layer attends from the block rows
to the key/value rows

    [ context rows (cached) ; carry rows (this proposal only) ; block rows ]

where context rows are the fused target states of committed tokens, and carry rows are the fused target states of the
previous round's rejected draft tokens plus the learned vector `E_carry`. Context and carry rows only feed `k_proj` and
`v_proj`; they skip the query, output projection and MLP. Attention is not causal inside the block.

The drafter shares the target's input embedding and LM head and stores neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    eager_attention_forward,
    rotate_half,
)
from transformers.utils import ModelOutput

from .configuration_carryover import (
    CALL_ONLY_OPTIONS,
    PROPOSAL_DEFAULTS,
    CarryoverDrafterConfig,
    check_proposal_defaults,
    proposal_generation_config,
    proposal_option_error,
)
from .masks import additive_mask
from .round_policy import ROUND_POLICY_STATE_ATTRIBUTE, RoundPolicyState


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `x` (b, heads, n, head_dim) with `cos`/`sin` (b, n, head_dim)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class CarryoverDrafterAttention(nn.Module):
    """Queries from the block rows; keys/values from `[context ; carry ; block]` rows. Not causal."""

    def __init__(self, config: CarryoverDrafterConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = False
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def key_values(
        self, rows: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values of `rows` (b, n, d) -> two (b, kv_heads, n, head_dim) tensors."""
        shape = (*rows.shape[:-1], -1, self.head_dim)
        keys = self.k_norm(self.k_proj(rows).view(shape)).transpose(1, 2)
        values = self.v_proj(rows).view(shape).transpose(1, 2)
        return _rope(keys, *position_embeddings), values

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        extra_rows: torch.Tensor | None = None,
        num_context: int = 0,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | DrafterContextBuffer | None = None,
    ) -> torch.Tensor:
        """
        hidden_states (`(b, Q, d)`): the normed block rows (the only queries).
        position_embeddings: cos/sin of the rows `[new context ; carry ; block]`, in that order.
        extra_rows (`(b, C + R, d)`, *optional*): fused new-context rows followed by carry rows (keys/values only).
        num_context: C, how many of `extra_rows` are context (the only rows a cache keeps).
        """
        batch, q_len, _ = hidden_states.shape
        cos, sin = position_embeddings
        queries = self.q_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        queries = _rope(self.q_norm(queries).transpose(1, 2), cos[:, -q_len:], sin[:, -q_len:])
        # One projection over all non-cached rows; the cached context joins without a second copy where possible.
        rows = hidden_states if extra_rows is None else torch.cat([extra_rows, hidden_states], dim=1)
        keys, values = self.key_values(rows, position_embeddings)
        if isinstance(past_key_values, DrafterContextBuffer):
            keys, values = past_key_values.write(self.layer_idx, keys, values)
        elif past_key_values is not None:
            # A `Cache` keeps the new context rows; carry and block rows are rebuilt for every proposal.
            cached_k, cached_v = past_key_values.update(keys[:, :, :num_context], values[:, :, :num_context], self.layer_idx)
            keys = torch.cat([cached_k, keys[:, :, num_context:]], dim=2)
            values = torch.cat([cached_v, values[:, :, num_context:]], dim=2)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, _ = attention_interface(
            self,
            queries,
            keys,
            values,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
        )
        return self.o_proj(attn_output.reshape(batch, q_len, -1).contiguous())


class DrafterContextBuffer:
    """The drafter's context keys/values for one `generate` call, preallocated from its length budget.

    Per layer one `(batch, kv_heads, capacity, head_dim)` tensor for keys and one for values. Rows `[0, length)` are
    the committed context (fused target states of committed tokens, at their absolute positions). A proposal writes
    its new context rows, its carry rows and its block rows right after them (the tail slots, reused by every
    proposal) and attends over the one contiguous view `[0, length + C + R + Q)`; only the C context rows are
    committed (`length += C` after the forward). Nothing is concatenated or reallocated during generation.

    It also holds the rotary cos/sin table of every position the call can reach, so no proposal recomputes them.
    Drop-in for a `Cache` as `past_key_values` of `CarryoverDrafterModel.forward` (`get_seq_length()`).
    """

    def __init__(self, drafter: "CarryoverDrafterModel", max_positions: int, batch_size: int = 1):
        config = drafter.config
        # Context rows sit at positions < max_positions; a proposal adds at most B - 1 carry rows and B block rows.
        self.capacity = max_positions + 2 * config.block_size
        self.max_positions = max_positions + config.block_size
        weight = drafter.fc.weight
        shape = (batch_size, config.num_key_value_heads, self.capacity, config.head_dim)
        self.keys = [weight.new_empty(shape) for _ in range(config.num_hidden_layers)]
        self.values = [weight.new_empty(shape) for _ in range(config.num_hidden_layers)]
        self.length = 0
        positions = torch.arange(self.max_positions, device=weight.device).unsqueeze(0)
        cos, sin = drafter.rotary_emb(weight, positions)
        self.cos, self.sin = cos[0], sin[0]  # (positions, head_dim)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def rotary(self, position_ids: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of `position_ids` (b, n) from the table -> two (b, n, head_dim) tensors."""
        if int(position_ids.max()) >= self.max_positions:
            raise ValueError(f"position {int(position_ids.max())} is beyond this buffer's {self.max_positions} positions")
        return self.cos[position_ids], self.sin[position_ids]

    def write(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the rows `[new context ; carry ; block]` after the committed context; return views over all rows."""
        end = self.length + keys.shape[2]
        if end > self.capacity:
            raise ValueError(f"the drafter context buffer holds {self.capacity} rows; this proposal needs {end}")
        self.keys[layer_idx][:, :, self.length : end].copy_(keys)
        self.values[layer_idx][:, :, self.length : end].copy_(values)
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def commit(self, num_context: int) -> None:
        self.length += num_context


class CarryoverDrafterLayer(GradientCheckpointingLayer):
    """Pre-norm Qwen3-style layer. Context and carry rows enter attention as keys/values only."""

    def __init__(self, config: CarryoverDrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = CarryoverDrafterAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, **attention_kwargs) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), **attention_kwargs)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


def _find_sorted(table: torch.LongTensor, token_ids: torch.LongTensor) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """Position of each of `token_ids` in the sorted id `table`, and whether it is there (positions of absent ids
    are meaningless: callers mask them)."""
    position = torch.searchsorted(table, token_ids.contiguous()).clamp(max=table.numel() - 1)
    return position, table[position] == token_ids


def _check_token_ids(ids: torch.LongTensor, vocab_size: int, what: str) -> None:
    """`ids` must be a non-empty, sorted, duplicate-free set of ids of a `vocab_size` vocabulary."""
    if ids.numel() == 0:
        raise ValueError(f"{what} needs at least one token id.")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"{what}: ids must lie in [0, {vocab_size}); got min {int(ids.min())}, max {int(ids.max())}.")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError(f"{what}: ids must be sorted and unique: pass `sorted(set(ids))`.")


class CarryoverMarkovHead(nn.Module):
    """Rank-r first-order token transition: `W2 · W1[x_{j-1}]` added to the LM-head logits of row j.

    `W2` writes the draft vocabulary (the full one unless `draft_vocab_size` is set). `W1` reads any target token:
    one row per token, or, with `markov_input_vocab_size = n`, one row for each of n sorted target ids
    (`input_token_ids`, saved with the weights) plus one shared row for every other token, which keeps a Markov
    drafter of a large-vocabulary target small (see `CarryoverDrafterModel.restrict_markov_inputs`).
    """

    def __init__(self, config: CarryoverDrafterConfig):
        super().__init__()
        inputs = config.markov_input_vocab_size
        rows = config.vocab_size if inputs is None else inputs + 1
        self.token_embedding = nn.Embedding(rows, config.markov_rank)  # W1: V x r (or (n + 1) x r)
        self.proj = nn.Linear(config.markov_rank, config.draft_vocab_size or config.vocab_size, bias=False)  # W2
        if inputs is not None:  # placeholder until `restrict_markov_inputs` or a checkpoint fills it
            self.register_buffer("input_token_ids", torch.arange(inputs), persistent=True)
        else:
            self.input_token_ids = None

    def rows(self, token_ids: torch.LongTensor) -> torch.LongTensor:
        """The `W1` row of each target id."""
        if self.input_token_ids is None:
            return token_ids
        position, inside = _find_sorted(self.input_token_ids, token_ids)
        return position.masked_fill(~inside, self.input_token_ids.numel())

    def forward(self, previous_token_ids: torch.LongTensor) -> torch.Tensor:
        return self.proj(self.token_embedding(self.rows(previous_token_ids)))


# Logits processors whose output for a row does not depend on the tokens before it: drafts can be drawn for all
# rows at once under them. Anything else (repetition penalty, n-gram bans, length-dependent EOS rules) runs row by row.
POSITION_FREE_PROCESSORS = (
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "MinPLogitsWarper",
    "TypicalLogitsWarper",
    "EpsilonLogitsWarper",
    "EtaLogitsWarper",
)


# Most logits a head product builds at once (float32: 64 MB); larger products run in chunks of rows.
HEAD_CHUNK_ELEMENTS = 1 << 24


class DraftHead:
    """The target's LM head over the drafter's draft vocabulary, as one 2-D matmul over contiguous rows.

    Built once per pairing (`drafter.draft_head(target.get_output_embeddings())`): with a reduced vocabulary the
    head's rows are gathered once here, not on every call. Logits are float32 over the *draft* vocabulary;
    `token_ids` maps draft indices to target ids (`None`: the identity), `to_full` scatters draft logits into the
    target vocabulary with `-inf` elsewhere. `linear`, when given, computes the product instead of `F.linear`
    (a `PackedLinear` over the same weight when the target's linears are packed: a proposal's few rows would
    otherwise stream the head's weight several times).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        token_ids: torch.LongTensor | None,
        vocab_size: int,
        linear: nn.Module | None = None,
    ):
        self.weight = weight  # (V_draft, d)
        self.bias = bias
        self.token_ids = token_ids  # (V_draft,) sorted target ids, or None for the full vocabulary
        self.vocab_size = vocab_size
        self.linear = linear

    @property
    def size(self) -> int:
        return self.weight.shape[0]

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., V_draft) float32. The product runs on a contiguous (rows, d) view: a broadcast `bmm`
        over a strided (anchors, rows, d) slice is several times slower on CPU."""
        rows = hidden_states.reshape(-1, hidden_states.shape[-1]).to(self.weight.dtype).contiguous()
        if self.linear is not None:
            logits = self.linear(rows)
        else:
            logits = torch.nn.functional.linear(rows, self.weight, self.bias)
        return logits.float().view(*hidden_states.shape[:-1], -1)

    def argmax(self, hidden_states: torch.Tensor, max_chunk_elements: int = HEAD_CHUNK_ELEMENTS) -> torch.LongTensor:
        """Target ids of the most likely draft token per row, in chunks of rows (no (rows x V) tensor at once)."""
        rows = hidden_states.reshape(-1, hidden_states.shape[-1])
        step = max(1, max_chunk_elements // self.size)
        picks = torch.cat([self(rows[i : i + step]).argmax(-1) for i in range(0, rows.shape[0], step)])
        return self.to_token_ids(picks).view(hidden_states.shape[:-1])

    def to_token_ids(self, indices: torch.LongTensor) -> torch.LongTensor:
        return indices if self.token_ids is None else self.token_ids[indices]

    def to_draft_indices(self, token_ids: torch.LongTensor) -> tuple[torch.LongTensor, torch.BoolTensor]:
        """Draft indices of target ids, and whether each id is in the draft vocabulary (indices of others: 0)."""
        if self.token_ids is None:
            return token_ids, torch.ones_like(token_ids, dtype=torch.bool)
        position, inside = _find_sorted(self.token_ids, token_ids)
        return position.masked_fill(~inside, 0), inside

    def to_full(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V_draft) -> (..., V) with `-inf` outside the draft vocabulary."""
        if self.token_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.token_ids, logits)


@dataclass
class Proposal:
    """Drafts chosen from block states.

    tokens (`(..., R)`): target ids of the drafts.
    logits (`(..., R, V)`, *optional*): the processed full-vocabulary logits each draft was drawn from (what
        Transformers' speculative sampling needs); `None` when not asked for.
    """

    tokens: torch.LongTensor
    logits: torch.Tensor | None = None


def _choose(logits: torch.Tensor, do_sample: bool) -> torch.LongTensor:
    """Argmax or one sample per row of `(..., V)` logits -> `(...)` indices."""
    if not do_sample:
        return logits.argmax(-1)
    flat = torch.softmax(logits.reshape(-1, logits.shape[-1]), dim=-1)
    return torch.multinomial(flat, num_samples=1).view(logits.shape[:-1])


@dataclass
class CarryoverDrafterOutput(ModelOutput):
    """
    last_hidden_state (`torch.Tensor` of shape `(batch, block_rows, hidden_size)`): final-norm states of the block
        rows; the LM head of the target turns rows 1.. into proposal logits.
    past_key_values (`Cache`, *optional*): the context key/value cache (context rows only).
    """

    last_hidden_state: torch.Tensor | None = None
    past_key_values: Cache | None = None


class CarryoverDrafterPreTrainedModel(PreTrainedModel):
    config: CarryoverDrafterConfig
    config_class = CarryoverDrafterConfig
    base_model_prefix = "drafter"
    main_input_name = "block_embeds"
    supports_gradient_checkpointing = True
    _no_split_modules = ["CarryoverDrafterLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = False
    _supports_attention_backend = True

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        # `transformers.initialization` leaves weights loaded from a checkpoint alone.
        if isinstance(module, CarryoverDrafterModel):
            # E_carry starts at zero: an untrained carry row is tagged like a context row.
            init.zeros_(module.carry_embedding)
            if module.draft_token_ids is not None:  # placeholder until `set_draft_vocabulary` or a checkpoint
                init.copy_(module.draft_token_ids, torch.arange(module.draft_token_ids.shape[0]))
        elif module is getattr(getattr(self, "markov_head", None), "proj", None):
            # W2 starts at zero (here, on the Linear itself: a module without direct parameters is skipped by
            # Transformers' init), so a fresh Markov head leaves the backbone's proposals unchanged.
            init.zeros_(module.weight)


# `from_pretrained` keywords that say where a checkpoint's files are (its generation_config.json is read with them).
HUB_KWARGS = ("revision", "cache_dir", "token", "local_files_only", "force_download", "subfolder")


class CarryoverDrafterModel(CarryoverDrafterPreTrainedModel):
    """Block-diffusion drafter with context fusion, a carry segment and an optional Markov head."""

    def __init__(self, config: CarryoverDrafterConfig):
        super().__init__(config)
        self.fc = nn.Linear(config.num_target_features, config.hidden_size, bias=False)  # W_fc: k*H_target -> d
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.carry_embedding = nn.Parameter(torch.zeros(config.hidden_size))  # E_carry
        self.layers = nn.ModuleList([CarryoverDrafterLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.markov_head = CarryoverMarkovHead(config) if config.drafter_type == "markov" else None
        if config.draft_vocab_size is not None:
            # Target ids of the draft vocabulary, sorted; saved with the weights (see `set_draft_vocabulary`).
            self.register_buffer("draft_token_ids", torch.arange(config.draft_vocab_size), persistent=True)
        else:
            self.draft_token_ids = None
        self.gradient_checkpointing = False
        # Filled by `target.generate(..., assistant_model=drafter)`; see `carryover_hf.generation`.
        self.last_generation_stats = None
        # The proposal defaults a generate call starts from (saved as generation_config.json; see `from_pretrained`).
        self.generation_config = proposal_generation_config(config)
        self.post_init()

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Saves as Transformers does, plus the proposal defaults as generation_config.json (Transformers writes it
        only for models that generate themselves)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        self.generation_config.save_pretrained(save_directory)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """Loads as Transformers does, then the proposal defaults from generation_config.json; a checkpoint saved
        before it existed keeps the defaults its config.json held (read into `generation_config` at init).

        Proposal defaults given as keywords (`from_pretrained(path, use_carryover=False, lookup_drafts=10)`) replace
        the saved ones in the loaded drafter's `generation_config`; they are checked before anything loads."""
        for name in CALL_ONLY_OPTIONS:
            if name in kwargs:
                raise proposal_option_error(name, kwargs[name], f"{cls.__name__}.from_pretrained")
        options = {name: kwargs.pop(name) for name in PROPOSAL_DEFAULTS if name in kwargs}
        check_proposal_defaults(options)
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        hub = {k: kwargs[k] for k in HUB_KWARGS if k in kwargs}
        try:
            model.generation_config = GenerationConfig.from_pretrained(pretrained_model_name_or_path, **hub)
        except OSError:  # saved before generation_config.json: config.json held the defaults (read at init)
            pass
        for name, value in options.items():
            setattr(model.generation_config, name, value)
        return model

    def can_generate(self) -> bool:  # a drafter proposes through its target, it has no `generate` of its own
        return False

    # -- what the cost-aware round policy learns across generate calls (runtime state, never saved) -------------
    def round_policy_state(self) -> RoundPolicyState:
        """A snapshot (a copy) of what `round_policy="cost"` has learnt across this drafter's `generate` calls in
        this process: acceptance memories per target and temperature, measured round costs per target, device, dtype
        and thread count (`carryover_hf.round_policy.RoundPolicyState`). A later call's proposals depend on it, so
        a benchmark that wants each prompt's rounds independent of the prompts before it restores one snapshot
        before every prompt (`carryover-hf bench --policy_memory`)."""
        return RoundPolicyState(self.__dict__.get(ROUND_POLICY_STATE_ATTRIBUTE, {}))

    def restore_round_policy_state(self, state: RoundPolicyState) -> None:
        """Make the next `generate` call start from `state` (a copy of it: the snapshot itself never changes)."""
        if not isinstance(state, RoundPolicyState):
            raise TypeError(f"expected a RoundPolicyState (from round_policy_state()), got {type(state).__name__}")
        self.__dict__[ROUND_POLICY_STATE_ATTRIBUTE] = state.copy_learnt()

    def reset_round_policy_state(self) -> None:
        """Forget what earlier `generate` calls taught the round policy: the next call starts as on a fresh drafter."""
        self.__dict__.pop(ROUND_POLICY_STATE_ATTRIBUTE, None)

    # -- the two entry points of target features -------------------------------------------------------------
    def fuse_context(self, features: torch.Tensor) -> torch.Tensor:
        """Context rows: `RMSNorm(W_fc f)`, (b, n, k*H_target) -> (b, n, d)."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def fuse_carry(self, features: torch.Tensor) -> torch.Tensor:
        """Carry rows: fused like context, then tagged with `E_carry`."""
        return self.fuse_context(features) + self.carry_embedding

    # -- the draft vocabulary and the LM head ----------------------------------------------------------------
    def set_draft_vocabulary(self, token_ids) -> None:
        """Restrict proposals to `token_ids` (sorted unique target ids; saved in the checkpoint).

        Sets `config.draft_vocab_size`. A Markov head's `W2` is resized to the new vocabulary (its rows for kept ids
        are kept), so call this before training it.
        """
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten().cpu()
        vocab = self.config.vocab_size
        _check_token_ids(ids, vocab, "set_draft_vocabulary")
        device = self.fc.weight.device
        if self.markov_head is not None:
            old_ids = self.draft_token_ids.cpu() if self.draft_token_ids is not None else torch.arange(vocab)
            weight = self.markov_head.proj.weight.data
            kept = torch.zeros(ids.numel(), weight.shape[1], dtype=weight.dtype, device=weight.device)
            position, found = _find_sorted(old_ids, ids)
            kept[found.to(weight.device)] = weight[position[found].to(weight.device)]
            self.markov_head.proj = nn.Linear(weight.shape[1], ids.numel(), bias=False, device=weight.device, dtype=weight.dtype)
            self.markov_head.proj.weight.data.copy_(kept)
        self._buffers.pop("draft_token_ids", None)
        self.__dict__.pop("draft_token_ids", None)  # the plain `None` of a full-vocabulary drafter
        self.register_buffer("draft_token_ids", ids.to(device), persistent=True)
        self.config.draft_vocab_size = int(ids.numel())

    @torch.no_grad()
    def restrict_markov_inputs(self, token_ids=None) -> None:
        """Give the Markov head's `W1` one row per id of `token_ids` (sorted unique target ids; default: the draft
        vocabulary) and one shared row for all other tokens, instead of one row per target token.

        Kept ids keep their trained rows; the shared row starts as the mean of the rows it replaces. Sets
        `config.markov_input_vocab_size`. For SmolLM2 (49,152 ids) and an 8,192-id draft vocabulary this takes
        `W1` from 12.6M to 2.1M parameters (25 to 4 MB in bf16).
        """
        head = self.markov_head
        if head is None:
            raise ValueError("restrict_markov_inputs needs a Markov drafter (drafter_type='markov').")
        if token_ids is None:
            if self.draft_token_ids is None:
                raise ValueError("This drafter has no draft vocabulary: pass the token ids W1 should keep rows for.")
            token_ids = self.draft_token_ids
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten().to(head.token_embedding.weight.device)
        _check_token_ids(ids, self.config.vocab_size, "restrict_markov_inputs")
        old = head.token_embedding.weight
        every = torch.arange(self.config.vocab_size, device=ids.device)
        rows = head.rows(every)  # the current row of every target id
        others = torch.ones(self.config.vocab_size, dtype=torch.bool, device=ids.device)
        others[ids] = False
        weight = torch.cat([old[rows[ids]], old[rows[others]].mean(dim=0, keepdim=True)])
        head.token_embedding = nn.Embedding.from_pretrained(weight.clone(), freeze=False)
        head._buffers.pop("input_token_ids", None)
        head.__dict__.pop("input_token_ids", None)
        head.register_buffer("input_token_ids", ids.clone(), persistent=True)
        self.config.markov_input_vocab_size = int(ids.numel())

    def draft_head(self, lm_head: nn.Module) -> DraftHead:
        """The target's LM head restricted to the draft vocabulary; build it once per pairing and reuse it.

        The head is the frozen target's: its weights are detached here, so no gradient reaches them. If the
        target's linears are packed (`cpu_kernels.pack_linears`), so is the head's product: a head whose class makes
        layers `over(weight, bias)` (`cpu_kernels.PackedLinear` does) makes the one over the draft rows.
        """
        weight, bias = lm_head.weight.detach(), getattr(lm_head, "bias", None)
        bias = None if bias is None else bias.detach()
        ids = self.draft_token_ids
        over = getattr(type(lm_head), "over", None)
        linear = lm_head if over is not None else None
        if ids is not None:
            ids = ids.to(weight.device)
            weight = weight.index_select(0, ids)
            bias = None if bias is None else bias.index_select(0, ids)
            linear = None if linear is None else over(weight, bias)
        return DraftHead(weight, bias, ids, self.config.vocab_size, linear)

    def proposal_logits(
        self,
        hidden_states: torch.Tensor,
        lm_head: nn.Module | DraftHead,
        previous_token_ids: torch.LongTensor | None = None,
    ) -> torch.Tensor:
        """Float32 full-vocabulary logits of block rows (`-inf` outside a reduced draft vocabulary).

        With a Markov head and `previous_token_ids` (the token at the row before, e.g. teacher-forced labels in
        training), the transition term `W2 W1[x_{j-1}]` is added. `propose` is what chooses drafts; this is the
        reference form of the same logits.
        """
        head = lm_head if isinstance(lm_head, DraftHead) else self.draft_head(lm_head)
        logits = head(hidden_states)
        if self.markov_head is not None and previous_token_ids is not None:
            logits = logits + self.markov_head(previous_token_ids).float()
        return head.to_full(logits)

    @torch.no_grad()
    def propose(
        self,
        block_states: torch.Tensor,
        head: DraftHead,
        anchor_ids: torch.LongTensor,
        *,
        prefix_ids: torch.LongTensor | None = None,
        logits_processor=None,
        do_sample: bool = False,
        return_logits: bool = True,
    ) -> Proposal:
        """Choose the drafts of block rows 1.. from their final-norm states: the one place that does it, for
        generation and for training's first draft alike.

        Args:
            block_states (`(..., R, d)`): states of the proposal rows (leading dims: `(1,)` in generation,
                `(b, A)` for packed training blocks).
            head: `self.draft_head(target.get_output_embeddings())`.
            anchor_ids (`(...)`): the token before row 1 (the Markov head's first "previous" token).
            prefix_ids (`(1, n)`): the sequence so far; logits processors that read it see it extended by the drafts.
            logits_processor: the target's processors; drafts are drawn from the processed distributions.
            do_sample: sample instead of taking the argmax.
            return_logits: return the full-vocabulary logits each draft was drawn from (needed for sampling).

        Rows are drafted all at once unless a Markov head or a processor that reads the prefix makes row j depend on
        the draft of row j-1; then they go one by one (still vectorised over leading dims). Greedy drafts without
        processors never build a (rows x V) tensor when `return_logits=False`.
        """
        processors = list(logits_processor or [])
        parallel = self.markov_head is None and all(type(p).__name__ in POSITION_FREE_PROCESSORS for p in processors)
        if parallel and not processors and not do_sample and not return_logits:
            return Proposal(head.argmax(block_states))
        if parallel:
            logits = head(block_states)
            if processors:
                full = head.to_full(logits)
                flat = full.reshape(-1, full.shape[-1])
                rows = prefix_ids.expand(flat.shape[0], -1) if prefix_ids is not None else None
                for processor in processors:  # position-free: the prefix is not read
                    flat = processor(rows, flat)
                logits = flat.view_as(full)
                tokens = _choose(logits, do_sample)
            else:
                tokens = head.to_token_ids(_choose(logits, do_sample))
                logits = head.to_full(logits) if return_logits else None
            return Proposal(tokens, logits if return_logits else None)

        # Row by row: row j's logits depend on the draft of row j - 1 (the Markov term, processors that read the
        # prefix). Their head term does not: it is computed for a group of rows in one product, so the head's weight
        # is streamed once per group instead of once per row (groups of at most HEAD_CHUNK_ELEMENTS logits).
        tokens, rows, previous = [], [], anchor_ids
        candidate_ids = prefix_ids
        num_rows = block_states.shape[-2]
        logits_per_row = max(1, previous.numel() * head.size)
        group = max(1, min(num_rows, HEAD_CHUNK_ELEMENTS // logits_per_row))
        for j in range(num_rows):
            if j % group == 0:
                head_logits = head(block_states[..., j : j + group, :])
            logits = head_logits[..., j % group, :]
            if self.markov_head is not None:
                logits = logits + self.markov_head(previous).float()
            if processors:
                logits = head.to_full(logits)
                logits = logits_processor(candidate_ids, logits.view(-1, logits.shape[-1])).view_as(logits)
                previous = _choose(logits, do_sample)
            else:
                previous = head.to_token_ids(_choose(logits, do_sample))
                logits = head.to_full(logits) if return_logits else None
            if candidate_ids is not None:
                candidate_ids = torch.cat([candidate_ids, previous.view(candidate_ids.shape[0], 1)], dim=-1)
            tokens.append(previous)
            rows.append(logits)
        logits = torch.stack(rows, dim=-2) if return_logits else None
        return Proposal(torch.stack(tokens, dim=-1), logits)

    def forward(
        self,
        block_embeds: torch.Tensor,
        block_position_ids: torch.LongTensor,
        context_features: torch.Tensor | None = None,
        context_position_ids: torch.LongTensor | None = None,
        carry_features: torch.Tensor | None = None,
        carry_position_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | DrafterContextBuffer | None = None,
        use_cache: bool = False,
    ) -> CarryoverDrafterOutput:
        r"""
        block_embeds (`(batch, Q, d)`): target embeddings of block rows (one block `[anchor, MASK...]`, or several
            packed blocks in training).
        block_position_ids (`(batch, Q)`): absolute positions of block rows (`anchor_pos + j`).
        context_features (`(batch, C, k * H_target)`, *optional*): fused-layer target states of rows new to the
            context; with a cache they are appended to it.
        carry_features (`(batch, R, k * H_target)`, *optional*): target states of the previous round's rejected
            rows; visible to this forward only, never cached.
        attention_mask (`(batch, 1, Q, P + C + R + Q)`, *optional*): boolean (True = visible) or additive mask over
            `[cached context ; new context ; carry ; block]`. `None` lets every block row see every row.
        past_key_values (`Cache` or `DrafterContextBuffer`, *optional*): the context cache; `generate` uses a
            `DrafterContextBuffer` (preallocated, no concatenation), any `Cache` works the same way.
        """
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        cache = past_key_values if use_cache else None
        buffered = isinstance(cache, DrafterContextBuffer)

        hidden_states = block_embeds.to(self.fc.weight.dtype)
        batch = hidden_states.shape[0]
        has_context = context_features is not None and context_features.shape[1] > 0
        has_carry = carry_features is not None and carry_features.shape[1] > 0
        num_context = context_features.shape[1] if has_context else 0
        # Keys/values of [new context ; carry ; block] rows are computed together, at their absolute positions.
        positions = [p.expand(batch, -1) for p, used in ((context_position_ids, has_context),
                                                          (carry_position_ids, has_carry)) if used]
        positions = torch.cat([*positions, block_position_ids.expand(batch, -1)], dim=1) if positions else block_position_ids
        if buffered:
            position_embeddings = cache.rotary(positions)
        else:
            position_embeddings = self.rotary_emb(hidden_states, positions)
        extra_rows = None
        if has_context and has_carry and buffered:
            # Inference: the few new rows go through `W_fc` in one product (its weight is read once per proposal).
            fused = self.fuse_context(torch.cat([context_features, carry_features.to(context_features.device)], dim=1))
            extra_rows = torch.cat([fused[:, :num_context], fused[:, num_context:] + self.carry_embedding], dim=1)
        elif has_context and has_carry:
            extra_rows = torch.cat([self.fuse_context(context_features), self.fuse_carry(carry_features)], dim=1)
        elif has_context:
            extra_rows = self.fuse_context(context_features)
        elif has_carry:
            extra_rows = self.fuse_carry(carry_features)
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.bool and self.config._attn_implementation == "eager":
            attention_mask = additive_mask(attention_mask, hidden_states.dtype)

        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                position_embeddings=position_embeddings,
                extra_rows=extra_rows,
                num_context=num_context,
                attention_mask=attention_mask,
                past_key_values=cache,
            )
        if buffered:
            cache.commit(num_context)
        return CarryoverDrafterOutput(last_hidden_state=self.norm(hidden_states), past_key_values=past_key_values)


__all__ = [
    "CarryoverDrafterModel",
    "CarryoverDrafterOutput",
    "CarryoverDrafterPreTrainedModel",
    "DraftHead",
    "DrafterContextBuffer",
    "Proposal",
]
