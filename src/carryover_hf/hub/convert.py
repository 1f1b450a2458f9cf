"""`carryover-hf convert`: import public DFlash checkpoints as Carryover drafters, or export a drafter to speculators.

Import (`convert SRC OUT`) detects z-lab DFlash, Transformers' `MuseGlimmerAssistantModel` and vLLM speculators DFlash
checkpoints from `config.json`, maps every tensor by name, reports tensors it skipped (target-owned copies), and fails
naming every unknown, missing or misshapen tensor. `E_carry` starts at zero and `use_carryover` is off, so the imported
drafter proposes exactly what its source proposes.

Export (`convert SRC OUT --to vllm`, the same as `--to speculators`) writes a drafter's backbone in the speculators
DFlash layout, which vLLM's `method: "dflash"` loads. A drafter that proposes with carry (`use_carryover` in its
generation config; `--carry` / `--no-carry` decide otherwise) keeps `E_carry` as `carry_embedding` and marks its layer
config (`"carryover": {"carry": true}`): vLLM serves it with carry through carryover-hf's plugin
(`carryover_hf.integrations.vllm_plugin`) and refuses it without. Otherwise the export is plain DFlash, which vLLM serves as is. A
Markov head has no place in that format and is dropped. A drafter with a reduced draft vocabulary is written the way
vLLM drafts over one: its own `lm_head` (the target's LM-head rows at the draft ids, read from `--target`), `d2t`
(draft id -> offset to the target id) and `t2d` (mask over the target vocabulary).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import save_torch_state_dict
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from ..compatibility import DrafterTargetMismatchError, check_compatibility
from ..configuration_carryover import CarryoverDrafterConfig, proposal_generation_config
from ..modeling_carryover import CarryoverDrafterModel
from .card import render_model_card
from .checkpoints import CheckpointError, read_config, read_weights, resolve_checkpoint, safetensors_files
from .formats import SOURCE_FORMATS, SourceCheckpoint, detect_format, parse_source


CARRY_EMBEDDING = "carry_embedding"
# The carry mark of a vLLM export, read by `carryover_hf.integrations.vllm_plugin` (CARRY_CONFIG_KEY, CARRY_FORMAT there).
VLLM_CARRY_KEY = "carryover"
VLLM_CARRY_FORMAT = 1
# Targets whose input embedding module applies a norm that DFlash drafters were trained without (checked: muse_glimmer).


@dataclass
class ConversionReport:
    """What a conversion did with every tensor."""

    source: str
    source_format: str
    output_format: str
    output_dir: str
    mapped: dict[str, str] = field(default_factory=dict)  # source tensor -> output tensor
    skipped: dict[str, str] = field(default_factory=dict)  # source tensor -> why it is not written
    initialised: dict[str, str] = field(default_factory=dict)  # output tensor -> how it was set
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            (
                f"Converted {self.source} ({self.source_format}) -> {self.output_dir} ({self.output_format}): "
                f"{len(self.mapped)} tensors mapped, {len(self.skipped)} skipped, {len(self.initialised)} initialised."
            )
        ]
        renamed = {src: dst for src, dst in self.mapped.items() if src != dst}
        lines += [f"  renamed  {src} -> {dst}" for src, dst in renamed.items()]
        lines += [f"  skipped  {name}: {why}" for name, why in self.skipped.items()]
        lines += [f"  set      {name}: {how}" for name, how in self.initialised.items()]
        lines += [f"  note     {note}" for note in self.notes]
        return "\n".join(lines)


def _expected_tensors(config: CarryoverDrafterConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the drafter's state dict, from a model on the meta device (no memory, no init)."""
    with torch.device("meta"):
        model = CarryoverDrafterModel(config)
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def _prepare_output(out: str | Path) -> Path:
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"{out} is not empty; write the converted checkpoint to a new folder.")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _load_target_config(target: str | PretrainedConfig | None) -> PretrainedConfig | None:
    if target is None or isinstance(target, PretrainedConfig):
        return target
    try:  # configs only: no weights are loaded and no remote code runs
        return AutoConfig.from_pretrained(str(target))
    except Exception as error:
        raise CheckpointError(f"Cannot read the target config {target!r}: {error}") from error


def _drafter_config(
    source: SourceCheckpoint,
    source_name: str,
    target_config: PretrainedConfig | None,
    target_name_or_path: str | None,
    target_num_hidden_layers: int | None,
    vocab_size: int | None,
    use_carryover: bool,
    sliding_window_as_full: bool,
) -> tuple[CarryoverDrafterConfig, list[str]]:
    layers = source.layers
    text = target_config.get_text_config() if target_config is not None else None
    num_target_layers = target_num_hidden_layers or source.target_num_hidden_layers or (text and text.num_hidden_layers)
    vocab = vocab_size or source.vocab_size or (text and text.vocab_size)
    missing = [name for name, value in (("the target's layer count", num_target_layers), ("the vocabulary size", vocab))
               if not value]
    if missing:
        raise CheckpointError(
            f"This {source.format} checkpoint does not record {' or '.join(missing)}. Pass --target (a target model "
            "folder or Hub id; only its config is read), or --target-num-layers / --vocab-size."
        )
    notes = []
    if source.sliding_layers and source.sliding_window and source.sliding_window < layers.max_position_embeddings:
        if not sliding_window_as_full:
            raise CheckpointError(
                f"Layers {source.sliding_layers} of this {source.format} checkpoint use sliding-window attention "
                f"(window {source.sliding_window}, context up to {layers.max_position_embeddings}). The Carryover "
                "drafter attends to its whole context, so it proposes exactly what the source proposes only while "
                "the sequence stays inside the window. Pass --sliding-window-as-full (sliding_window_as_full=True) "
                "to import with full attention."
            )
        notes.append(
            f"layers {source.sliding_layers} used sliding-window attention (window {source.sliding_window}); imported "
            "with full attention, which proposes exactly what the source proposes while the sequence length n "
            f"(prompt + generated) satisfies n + block_size - 2 <= {source.sliding_window} (the farthest query-key "
            "distance in a block)."
        )
    rope = dict(layers.rope_parameters or {})
    if "rope_type" not in rope:
        raise CheckpointError(f"Unsupported rope_parameters {rope}: one RoPE setting for all layers is needed.")
    head_dim = getattr(layers, "head_dim", None) or layers.hidden_size // layers.num_attention_heads
    name = target_name_or_path or (target_config._name_or_path if target_config is not None else None)
    try:
        config = CarryoverDrafterConfig(
            target_name_or_path=name or source.target_name_or_path,
            target_hidden_size=source.target_hidden_size or layers.hidden_size,
            target_num_hidden_layers=int(num_target_layers),
            target_layer_ids=source.target_layer_ids,
            vocab_size=int(vocab),
            block_size=source.block_size,
            mask_token_id=source.mask_token_id,
            drafter_type="dflash",
            use_carryover=use_carryover,
            trained_with_carryover=False,
            hidden_size=layers.hidden_size,
            intermediate_size=layers.intermediate_size,
            num_hidden_layers=layers.num_hidden_layers,
            num_attention_heads=layers.num_attention_heads,
            num_key_value_heads=getattr(layers, "num_key_value_heads", None) or layers.num_attention_heads,
            head_dim=head_dim,
            hidden_act=layers.hidden_act,
            max_position_embeddings=layers.max_position_embeddings,
            rms_norm_eps=layers.rms_norm_eps,
            rope_parameters=rope,
            attention_bias=bool(getattr(layers, "attention_bias", False)),
            imported_from={
                "format": source.format,
                "source": source_name,
                "sliding_window": source.sliding_window if source.sliding_layers else None,
            },
        )
    except (ValueError, StrictDataclassClassValidationError) as error:  # the config validates itself; report the cause, not the validator plumbing
        raise CheckpointError(f"The {source.format} checkpoint does not fit: {error.__cause__ or error}") from error
    if source.dtype is not None:
        config.dtype = source.dtype
    if target_config is not None:
        check_compatibility(config, target_config, check_name=False)
    return config, notes


def drafter_config_from_checkpoint(
    checkpoint_config: dict,
    *,
    source_format: str = "auto",
    source_name: str = "",
    target: str | PretrainedConfig | None = None,
    target_name_or_path: str | None = None,
    target_num_hidden_layers: int | None = None,
    vocab_size: int | None = None,
    use_carryover: bool = False,
    sliding_window_as_full: bool = False,
) -> tuple[CarryoverDrafterConfig, list[str]]:
    """The Carryover drafter config a z-lab / Muse / speculators `config.json` imports as, and notes on the mapping.

    No weights are read; `import_checkpoint` takes its config from here.
    """
    source = parse_source(checkpoint_config, source_format)
    return _drafter_config(
        source, source_name, _load_target_config(target), target_name_or_path, target_num_hidden_layers, vocab_size,
        use_carryover, sliding_window_as_full,
    )


def import_checkpoint(
    src: str | Path,
    out: str | Path,
    *,
    source_format: str = "auto",
    target: str | PretrainedConfig | None = None,
    target_name_or_path: str | None = None,
    target_num_hidden_layers: int | None = None,
    vocab_size: int | None = None,
    use_carryover: bool = False,
    sliding_window_as_full: bool = False,
    revision: str | None = None,
    token: str | bool | None = None,
) -> ConversionReport:
    """Import a z-lab / Muse / speculators DFlash checkpoint as a Carryover drafter in `out`.

    Args:
        src: checkpoint folder or Hub repo id (only `config.json` and safetensors are fetched).
        target: the target's folder, Hub id or config; its config fills what the source does not record (layer count,
            vocabulary, name) and is checked against what it does record. Muse checkpoints need it (or the two
            numbers below).
        use_carryover: record `use_carryover=True` (the imported weights were not trained with carryover).
        sliding_window_as_full: import sliding-window layers with full attention (exact inside the window).
    """
    folder = resolve_checkpoint(src, revision=revision, token=token)
    source = parse_source(read_config(folder), source_format)
    target_config = _load_target_config(target)
    config, notes = _drafter_config(
        source, str(src), target_config, target_name_or_path, target_num_hidden_layers, vocab_size, use_carryover,
        sliding_window_as_full,
    )
    expected = _expected_tensors(config)
    weights = read_weights(folder)

    report = ConversionReport(str(src), source.format, "carryover", str(out), notes=notes)
    tensors: dict[str, torch.Tensor] = {}
    unknown, misshapen = [], []
    for name in sorted(weights):
        if name in source.target_owned:
            report.skipped[name] = source.target_owned[name]
            continue
        destination = source.rename(name)
        if destination not in expected or destination == CARRY_EMBEDDING or destination in tensors:
            unknown.append(name)
        elif tuple(weights[name].shape) != expected[destination]:
            misshapen.append(f"{name} {tuple(weights[name].shape)} (drafter expects {expected[destination]})")
        else:
            tensors[destination] = weights[name]
            report.mapped[name] = destination
    missing = sorted(set(expected) - set(tensors) - {CARRY_EMBEDDING})
    if unknown or missing or misshapen:
        problems = [f"{label}: {names}" for label, names in (
            ("unknown tensors (no counterpart in the Carryover drafter)", unknown),
            ("missing tensors (the drafter needs them)", missing),
            ("shape mismatches", misshapen),
        ) if names]
        raise CheckpointError(f"Cannot import {src} ({source.format}):\n  - " + "\n  - ".join(problems))

    # With use_carryover=False E_carry is never read; zero also leaves a carry row tagged like a context row.
    reference = tensors["fc.weight"]
    tensors[CARRY_EMBEDDING] = torch.zeros(config.hidden_size, dtype=reference.dtype)
    report.initialised[CARRY_EMBEDDING] = "zeros (E_carry; unused while use_carryover=False, learned by carryover training)"

    out = _prepare_output(out)
    config.save_pretrained(out)
    proposal_generation_config(config).save_pretrained(out)
    save_torch_state_dict(tensors, out)
    render_model_card(
        config,
        repo_id=str(out),
        training_data=f"as trained for the source checkpoint `{src}` (imported weight for weight)",
        objective=f"that of the source {source.format} checkpoint; not trained with carryover",
    ).save(out / "README.md")
    return report


def _speculators_config(config: CarryoverDrafterConfig, verifier_architectures: list[str]) -> dict[str, Any]:
    rope = dict(config.rope_parameters or {})
    layers = {
        "model_type": "qwen3",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": rope,
        "attention_bias": config.attention_bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * config.num_hidden_layers,
        "use_sliding_window": False,
        "sliding_window": None,
    }
    if rope.get("rope_type") == "default":
        layers["rope_theta"] = rope["rope_theta"]  # older readers of the Qwen3 config take the flat key
    return {
        "architectures": ["DFlashDraftModel"],
        "speculators_model_type": "dflash",
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": config.block_size - 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": config.target_name_or_path, "architectures": verifier_architectures},
        },
        "transformer_layer_config": layers,
        # A reduced draft vocabulary: vLLM's drafter has an LM head of this many rows and maps them with d2t.
        "draft_vocab_size": config.draft_vocab_size or config.vocab_size,
        "block_size": config.block_size,
        "target_hidden_size": config.target_hidden_size,
        # vLLM captures the residual stream entering decoder layer k, i.e. the output of layer k - 1.
        "aux_hidden_state_layer_ids": [i + 1 for i in config.target_layer_ids],
        "mask_token_id": config.mask_token_id,
        "projector_type": "dflash",
        "sample_from_anchor": False,
        # The block is bidirectional in every layer, as the drafter was trained. vLLM reads this key for all layers,
        # not only sliding ones (`dflash_config.causal = not sliding_window_non_causal`): false would make every
        # draft layer causal inside the block.
        "sliding_window_non_causal": True,
        "dtype": str(config.dtype).removeprefix("torch.") if config.dtype is not None else "float32",
    }


def _target_folder(target: str | Path) -> Path:
    """A target's folder: the offline SmolLM2 alias (converted on first use), a folder, or a Hub id (config and
    safetensors only)."""
    from ..targets import TARGET_ALIASES, prepare_smollm2

    if str(target) in TARGET_ALIASES:
        return prepare_smollm2()
    return resolve_checkpoint(target)


def target_lm_head_rows(
    target: str | Path | PreTrainedModel, token_ids: torch.Tensor
) -> tuple[torch.Tensor, PretrainedConfig]:
    """The target's LM-head rows at `token_ids` (in the target's stored dtype), and the target's config.

    From a folder or Hub id only the head's tensor is read (its own, or the input embedding's when the two are tied),
    found by name from a model built on the meta device; no other weight is loaded.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long).cpu()
    if isinstance(target, PreTrainedModel):
        head = target.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise CheckpointError("The target's LM head has a bias, which vLLM's DFlash drafter head does not have.")
        return head.weight.detach().cpu().index_select(0, ids), target.config
    folder = _target_folder(target)
    try:
        config = AutoConfig.from_pretrained(str(folder))
    except Exception as error:
        raise CheckpointError(f"Cannot read the target config in {folder}: {error}") from error
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception as error:  # an architecture AutoModelForCausalLM does not build: the caller can pass the model
        raise CheckpointError(
            f"Cannot find the LM head of the target in {folder} ({error}); pass the loaded target model instead "
            "(export_speculators(..., target=model))."
        ) from error
    names = {id(module): name for name, module in skeleton.named_modules()}
    head, embedding = skeleton.get_output_embeddings(), skeleton.get_input_embeddings()
    if head is None:
        raise CheckpointError(f"The target in {folder} has no output embedding (LM head) to draft through.")
    if getattr(head, "bias", None) is not None:
        raise CheckpointError("The target's LM head has a bias, which vLLM's DFlash drafter head does not have.")
    candidates = [names[id(head)] + ".weight"]
    if getattr(config.get_text_config(), "tie_word_embeddings", False) and embedding is not None:
        candidates.append(names[id(embedding)] + ".weight")  # tied: the checkpoint may store the embedding only
    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt") as tensors:
            for name in candidates:
                if name in tensors.keys():
                    weight = tensors.get_slice(name)
                    shape = tuple(weight.get_shape())
                    if len(shape) != 2 or shape[0] != config.get_text_config().vocab_size:
                        raise CheckpointError(f"{name} in {file} has shape {shape}, not (vocabulary, hidden size).")
                    return tensors.get_tensor(name).index_select(0, ids), config
    raise CheckpointError(
        f"None of {candidates} is stored in the target's safetensors ({folder}); cannot read its LM head. Pass the "
        "loaded target model instead (export_speculators(..., target=model))."
    )


def export_speculators(
    src: str | Path | CarryoverDrafterModel,
    out: str | Path,
    *,
    verifier_architectures: list[str] | None = None,
    target: str | Path | PreTrainedModel | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
    carry: bool | None = None,
) -> ConversionReport:
    """Write a drafter's backbone in the speculators DFlash layout, which vLLM (`method: "dflash"`) serves.

    Args:
        carry: keep E_carry and mark the export for carry (served with carry by `carryover_hf.integrations.vllm_plugin`, refused by
            vLLM without it); False: plain DFlash. Default: whether the drafter proposes with carry (`use_carryover`
            of its generation config).
        target: the target's folder, Hub id, `"smollm2-135m"` or loaded model. Needed for a drafter with a reduced
            draft vocabulary (its LM-head rows at the draft ids become the export's `lm_head`); when given, the
            drafter is checked against its config and its architectures are recorded as the verifier's (unless
            `verifier_architectures` is given).
    """
    if isinstance(src, CarryoverDrafterModel):
        config, name = src.config, src.name_or_path or "<model>"
        weights = {k: v.detach().cpu() for k, v in src.state_dict().items()}
        uses_carry = bool(getattr(src.generation_config, "use_carryover", False))
    else:
        folder = resolve_checkpoint(src, revision=revision, token=token)
        raw = read_config(folder)
        if detect_format(raw) != "carryover":
            raise CheckpointError(f"{src} is not a Carryover drafter; import it first (carryover-hf convert SRC OUT).")
        config, name = CarryoverDrafterConfig.from_dict(raw), str(src)
        weights = read_weights(folder)
        generation = folder / "generation_config.json"
        uses_carry = bool((json.loads(generation.read_text()) if generation.is_file() else raw).get("use_carryover"))
    carry = uses_carry if carry is None else carry
    last = config.target_num_hidden_layers - 1
    if last in config.target_layer_ids:
        raise CheckpointError(
            f"target_layer_ids {config.target_layer_ids} include the target's last layer ({last}), whose output "
            "Transformers returns after the final norm; vLLM cannot capture that state as an auxiliary layer, so the "
            "export would not draft the same way. Use a drafter whose layer ids stop before the last layer."
        )
    rope_type = (config.rope_parameters or {}).get("rope_type")
    if rope_type != "default":
        raise CheckpointError(f"Only the default RoPE exports to speculators; this drafter uses {rope_type!r}.")
    reduced = config.draft_vocab_size is not None
    if reduced and target is None:
        raise CheckpointError(
            f"This drafter drafts over a reduced vocabulary ({config.draft_vocab_size} of {config.vocab_size} ids) "
            "through the target's LM head rows; the export gives vLLM's drafter those rows as its own lm_head with "
            "d2t/t2d maps, so it needs the target: pass --target (target=) with its folder, Hub id or model."
        )

    report = ConversionReport(name, "carryover", "speculators", str(out))
    tensors = {}
    for key in sorted(weights):
        if key == CARRY_EMBEDDING and not carry:
            report.skipped[key] = "E_carry: a plain DFlash export has no carry segment"
        elif key.startswith("markov_head."):
            report.skipped[key] = "Markov head: vLLM's DFlash drafter has no token-transition head"
        elif key == "draft_token_ids":
            report.skipped[key] = "the draft vocabulary's target ids: written as d2t (offsets) and t2d (mask)"
        else:
            tensors[key] = weights[key].contiguous()
            report.mapped[key] = key
    target_config = None
    if reduced:
        ids = weights["draft_token_ids"].to(torch.long).cpu()
        rows, target_config = target_lm_head_rows(target, ids)
        tensors["lm_head.weight"] = rows.contiguous()
        tensors["d2t"] = ids - torch.arange(ids.numel())
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        tensors["t2d"] = t2d
        report.initialised["lm_head.weight"] = (
            f"the target's LM-head rows at the {ids.numel()} draft ids ({rows.dtype}; vLLM's drafter head)"
        )
        report.initialised["d2t"] = "draft id -> target id offset (target id = draft id + d2t)"
        report.initialised["t2d"] = f"mask of the draft ids over the target's {config.vocab_size} ids"
    elif target is not None:
        target_config = target.config if isinstance(target, PreTrainedModel) else _load_target_config(
            _target_folder(target)
        )
    if target_config is not None:
        check_compatibility(config, target_config, check_name=False)
        if verifier_architectures is None:
            verifier_architectures = list(getattr(target_config, "architectures", None) or [])
    if config.drafter_type == "markov":
        report.notes.append("the Markov head is dropped: vLLM drafts with the DFlash backbone alone")
    if carry:
        report.notes.append("carry: vLLM serves this export with carryover-hf's plugin installed in its environment "
                            "(pip install carryover-hf there), and refuses it without")
    else:
        report.notes.append("vLLM serves this export as plain DFlash, without carryover")

    out = _prepare_output(out)
    speculators = _speculators_config(config, list(verifier_architectures or []))
    if carry:
        speculators["transformer_layer_config"][VLLM_CARRY_KEY] = {"carry": True, "format": VLLM_CARRY_FORMAT}
    speculators["carryover_hf_export"] = {"source": name, "dropped_tensors": sorted(report.skipped)}
    (out / "config.json").write_text(json.dumps(speculators, indent=2) + "\n")
    save_torch_state_dict(tensors, out)
    render_model_card(config, repo_id=str(out), export_format="speculators",
                      generation_config={"use_carryover": carry}).save(out / "README.md")
    return report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="carryover-hf convert",
        description="Import z-lab / Transformers (MuseGlimmerAssistantModel) / vLLM speculators DFlash checkpoints as "
        "Carryover drafters, or export a drafter's backbone for vLLM's DFlash (--to vllm, the speculators DFlash "
        "layout; --to speculators is the same).",
    )
    parser.add_argument("src", help="checkpoint folder or Hub repo id (config.json + *.safetensors)")
    parser.add_argument("out", help="new folder for the converted checkpoint")
    parser.add_argument("--to", choices=("carryover", "speculators", "vllm"), default="carryover",
                        help="output layout (vllm, speculators: the same speculators DFlash layout, which vLLM loads)")
    parser.add_argument("--from", dest="source_format", choices=("auto", *SOURCE_FORMATS), default="auto",
                        help="source layout (default: detected from config.json)")
    parser.add_argument("--target", help="target model folder, Hub id or smollm2-135m; import: only its config is "
                        "read; export: its config, and for a reduced draft vocabulary its LM-head rows at the draft ids")
    parser.add_argument("--target-name", help="target name to record (default: --target, or what the source records)")
    parser.add_argument("--target-num-layers", type=int, help="target decoder layer count, if the source lacks it")
    parser.add_argument("--vocab-size", type=int, help="target vocabulary size, if the source lacks it")
    parser.add_argument("--use-carryover", action="store_true",
                        help="record use_carryover=True (default off: the imported weights were trained without it)")
    parser.add_argument("--sliding-window-as-full", action="store_true",
                        help="import sliding-window layers with full attention (exact inside the window)")
    parser.add_argument("--verifier-architectures", nargs="*", default=None,
                        help="--to speculators: the target's architectures to record (e.g. Qwen3ForCausalLM)")
    parser.add_argument("--carry", action=argparse.BooleanOptionalAction, default=None,
                        help="--to vllm: keep E_carry and mark the export for carry (served with carry by carryover-hf's "
                        "vLLM plugin); --no-carry: plain DFlash (default: whether the drafter proposes with carry)")
    parser.add_argument("--revision", help="Hub revision of SRC")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.to in ("speculators", "vllm"):
            report = export_speculators(
                args.src, args.out, verifier_architectures=args.verifier_architectures, target=args.target,
                revision=args.revision, carry=args.carry,
            )
        else:
            report = import_checkpoint(
                args.src,
                args.out,
                source_format=args.source_format,
                target=args.target,
                target_name_or_path=args.target_name or args.target,
                target_num_hidden_layers=args.target_num_layers,
                vocab_size=args.vocab_size,
                use_carryover=args.use_carryover,
                sliding_window_as_full=args.sliding_window_as_full,
                revision=args.revision,
            )
    except (CheckpointError, DrafterTargetMismatchError, ValueError) as error:
        print(f"carryover-hf convert: error: {error}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


__all__ = [
    "ConversionReport",
    "drafter_config_from_checkpoint",
    "export_speculators",
    "import_checkpoint",
    "main",
    "target_lm_head_rows",
]
