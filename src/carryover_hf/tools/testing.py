"""Test fixtures: the tiny targets and drafters of `carryover_hf.tools.tiny`, handed on, hub configs and a skewed head.

Also z-lab DFlash checkpoints in their published layout (`save_zlab_checkpoint`), and the tiny stand-ins of the
recipes' Hub repositories (`build_rehearsal_hub`; `python -m carryover_hf.tools.testing rehearsal-hub CACHE [RECIPE]`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import PreTrainedModel

from .tiny import TINY_ARCHITECTURES, tiny_drafter, tiny_target


def tiny_hub_config(
    folder: str | Path, target: PreTrainedModel, kind: str = "markov", repo_id: str | None = None
) -> Path:
    """A hub config file (`carryover-hf init`'s input, as the shipped `assets/hub_configs/*.json`) for a 1-layer drafter
    of a tiny `target`, recorded as `org/tiny-target`; written to `folder/tiny-<kind>.json`."""
    text = target.config
    path = Path(folder) / f"tiny-{kind}.json"
    path.write_text(json.dumps({
        "repo_id": repo_id or f"org/tiny-carryover-{kind}",
        "target": "org/tiny-target",
        "drafter_config": dict(
            target_name_or_path="org/tiny-target", target_hidden_size=text.hidden_size,
            target_num_hidden_layers=text.num_hidden_layers, vocab_size=text.vocab_size, target_layer_ids=[0, 2],
            block_size=4, mask_token_id=text.vocab_size - 1, drafter_type=kind, markov_rank=8,
            hidden_size=text.hidden_size, intermediate_size=2 * text.hidden_size, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, head_dim=text.hidden_size // 4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    }))  # fmt: skip
    return path


def skew_towards_token(target: PreTrainedModel, token_id: int, strength: float) -> PreTrainedModel:
    """Bias the (shared) LM head so that `token_id` wins for most hidden states, in place.

    Random targets and drafters rarely agree on a long run of tokens; with a skew they often do, so tests reach full
    acceptance as well as zero and partial acceptance. The head is shared, so target and drafter are skewed alike.
    """
    with torch.no_grad():
        directions = torch.nn.functional.normalize(target.get_input_embeddings().weight.float(), dim=-1).sum(0)
        head = target.get_output_embeddings().weight
        head[token_id] += (strength * directions / directions.norm()).to(head.dtype)
    return target


def zlab_config(
    *,
    hidden_size: int,
    num_hidden_layers: int,
    num_target_layers: int,
    target_layer_ids: list[int],
    vocab_size: int,
    block_size: int,
    mask_token_id: int,
    intermediate_size: int | None = None,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    head_dim: int | None = None,
    rope_theta: float = 1_000_000.0,
    rms_norm_eps: float = 1e-6,
    max_position_embeddings: int = 512,
    torch_dtype: str = "float32",
    **overrides,
) -> dict:
    """A `config.json` of a z-lab DFlash drafter (`DFlashDraftModel`, `model_type: qwen3`, `dflash_config`), with the
    fields z-lab publishes (SPEC section 4); `overrides` replace or add top-level keys."""
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": block_size, "num_target_layers": num_target_layers,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids)},
        "hidden_size": hidden_size, "intermediate_size": intermediate_size or 2 * hidden_size,
        "num_hidden_layers": num_hidden_layers, "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads, "head_dim": head_dim or hidden_size // num_attention_heads,
        "hidden_act": "silu", "rms_norm_eps": rms_norm_eps, "rope_theta": rope_theta, "rope_scaling": None,
        "max_position_embeddings": max_position_embeddings, "vocab_size": vocab_size, "attention_bias": False,
        "layer_types": ["full_attention"] * num_hidden_layers, "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": False, "torch_dtype": torch_dtype,
    }  # fmt: skip
    config.update(overrides)
    return config


def save_zlab_checkpoint(folder: str | Path, weights: dict[str, torch.Tensor], config: dict) -> Path:
    """Writes `config.json` and `model.safetensors` (z-lab tensor names: `fc`, `hidden_norm`, `norm`, `layers.N.*`)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in weights.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def tiny_zlab_checkpoint(
    folder: str | Path,
    target: PreTrainedModel,
    target_layer_ids: list[int],
    mask_token_id: int,
    num_hidden_layers: int = 1,
    block_size: int = 4,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Path:
    """A random z-lab-format DFlash drafter for `target`, with z-lab's layout rule (the drafter copies the target's
    attention and MLP widths). Its weights are those of a fresh drafter; E_carry is not part of the format."""
    text = target.config.get_text_config()
    drafter = tiny_drafter(target, num_hidden_layers=num_hidden_layers, block_size=block_size, seed=seed,
                           target_layer_ids=list(target_layer_ids), mask_token_id=mask_token_id)  # fmt: skip
    weights = {k: v.to(dtype) for k, v in drafter.state_dict().items() if k != "carry_embedding"}
    rope = (getattr(text, "rope_parameters", None) or {}).get("rope_theta", 1_000_000.0)
    config = zlab_config(
        hidden_size=text.hidden_size, intermediate_size=text.intermediate_size, num_hidden_layers=num_hidden_layers,
        num_target_layers=text.num_hidden_layers, target_layer_ids=target_layer_ids, vocab_size=text.vocab_size,
        block_size=block_size, mask_token_id=mask_token_id, num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads, head_dim=text.head_dim, rope_theta=float(rope),
        rms_norm_eps=text.rms_norm_eps, max_position_embeddings=text.max_position_embeddings,
        torch_dtype=str(dtype).removeprefix("torch."),
    )  # fmt: skip
    return save_zlab_checkpoint(folder, weights, config)


# The recipes' Hub repositories, as tiny stand-ins: examples/qwen3_4b/recipe.sh (a Qwen3 target and z-lab's drafter)
# and examples/smollm2_135m/gpu.sh (a Llama target with SmolLM2's chat template), with CARRYOVER_REHEARSAL=1.
REHEARSAL_TARGET = "carryover-hf-rehearsal/tiny-qwen3"
REHEARSAL_ZLAB_DRAFTER = "carryover-hf-rehearsal/tiny-qwen3-dflash-b4"
REHEARSAL_LAYER_IDS = [0, 2]
REHEARSAL_SMOLLM2_TARGET = "carryover-hf-rehearsal/tiny-smollm2"
REHEARSAL_RECIPES = ("qwen3", "smollm2")


def build_rehearsal_hub(
    cache_dir: str | Path, work_dir: str | Path | None = None, recipe: str = "qwen3"
) -> dict[str, Path]:
    """Puts a recipe's tiny stand-ins into the Hub cache `cache_dir`; returns their snapshot folders by repo id.

    `recipe="qwen3"`: a tiny random Qwen3 target (with a chat tokenizer and a `<|mask|>` token, as Qwen3-4B has one)
    and a tiny z-lab-format DFlash drafter for it (bfloat16, as z-lab publishes), under `REHEARSAL_TARGET` and
    `REHEARSAL_ZLAB_DRAFTER`. `recipe="smollm2"`: a tiny random Llama with SmolLM2's special tokens, chat template,
    tied embeddings and pad token (= EOS, the default mask token of a new drafter), under `REHEARSAL_SMOLLM2_TARGET`.
    Idempotent: the same seeds give the same files and revision."""
    import tempfile

    from .data.chat import tiny_chat_tokenizer
    from ..hub.local_cache import add_to_hub_cache

    if recipe not in REHEARSAL_RECIPES:
        raise ValueError(f"recipe must be one of {REHEARSAL_RECIPES}, got {recipe!r}")
    tokenizer = tiny_chat_tokenizer()
    shape = dict(hidden_size=64, num_hidden_layers=4, max_position_embeddings=4096, seed=0)
    if recipe == "qwen3":
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|mask|>"]})
        name, target = REHEARSAL_TARGET, tiny_target("qwen3", vocab_size=len(tokenizer), **shape)
    else:
        # Tied embeddings at the default init make greedy decoding repeat the last token forever; a wider init gives
        # varied answers, so the drafters meet rejected drafts (carry rows) in training.
        special = {key: getattr(tokenizer, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
        name = REHEARSAL_SMOLLM2_TARGET
        target = tiny_target("llama", vocab_size=len(tokenizer), tie_word_embeddings=True, initializer_range=0.3,
                             **shape, **special)  # fmt: skip
    with tempfile.TemporaryDirectory(dir=work_dir) as scratch:
        scratch = Path(scratch)
        target.save_pretrained(scratch / "target")
        tokenizer.save_pretrained(scratch / "target")
        built = {name: add_to_hub_cache(scratch / "target", name, cache_dir)}
        if recipe == "qwen3":
            mask = tokenizer.convert_tokens_to_ids("<|mask|>")
            tiny_zlab_checkpoint(scratch / "zlab", target, REHEARSAL_LAYER_IDS, mask, num_hidden_layers=1,
                                 block_size=4, dtype=torch.bfloat16, seed=1)  # fmt: skip
            built[REHEARSAL_ZLAB_DRAFTER] = add_to_hub_cache(scratch / "zlab", REHEARSAL_ZLAB_DRAFTER, cache_dir)
        return built


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) not in (2, 3) or argv[0] != "rehearsal-hub" or argv[2:] and argv[2] not in REHEARSAL_RECIPES:
        print(f"usage: python -m carryover_hf.tools.testing rehearsal-hub HF_HUB_CACHE [{'|'.join(REHEARSAL_RECIPES)}]",
              file=sys.stderr)  # fmt: skip
        return 2
    for repo, snapshot in build_rehearsal_hub(argv[1], recipe=argv[2] if len(argv) == 3 else "qwen3").items():
        print(f"built {repo} at {snapshot}")
    return 0


__all__ = [
    "REHEARSAL_LAYER_IDS", "REHEARSAL_RECIPES", "REHEARSAL_SMOLLM2_TARGET", "REHEARSAL_TARGET",
    "REHEARSAL_ZLAB_DRAFTER", "TINY_ARCHITECTURES", "build_rehearsal_hub",
    "save_zlab_checkpoint", "skew_towards_token", "tiny_drafter", "tiny_hub_config", "tiny_target",
    "tiny_zlab_checkpoint", "zlab_config",
]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
