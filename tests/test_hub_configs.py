"""The shipped hub configs (carryover_hf/assets/hub_configs/): ready drafter configs for real targets, and
`carryover-hf init`."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from carryover_hf import CarryoverDrafterModel
from carryover_hf.configuration_carryover import default_target_layer_ids
from carryover_hf.hub import available_hub_configs, init_drafter, load_hub_config
from carryover_hf.hub.configs import main as init_main
from carryover_hf.hub.convert import drafter_config_from_checkpoint
from carryover_hf.tools.testing import tiny_hub_config, tiny_target


# Published layouts (see docs/hub.md for the sources): z-lab/Qwen3-4B-DFlash-b16 and z-lab/Qwen3-8B-DFlash-b16,
# and the targets' own config.json.
QWEN_DFLASH = dict(num_hidden_layers=5, num_attention_heads=32, num_key_value_heads=8, head_dim=128, block_size=16,
                   mask_token_id=151669, target_layer_ids=[1, 9, 17, 25, 33], target_num_hidden_layers=36,
                   vocab_size=151936, rms_norm_eps=1e-6)
EXPECTED = {
    "qwen3-4b": dict(QWEN_DFLASH, target_name_or_path="Qwen/Qwen3-4B", hidden_size=2560, intermediate_size=9728),
    "qwen3-8b": dict(QWEN_DFLASH, target_name_or_path="Qwen/Qwen3-8B", hidden_size=4096, intermediate_size=12288),
    "gemma-4-12b": dict(target_name_or_path="google/gemma-4-12B-it", hidden_size=3840, target_num_hidden_layers=48,
                        vocab_size=262144, num_hidden_layers=5, block_size=16, mask_token_id=4,
                        target_layer_ids=default_target_layer_ids(48, 5)),
}


def test_shipped_configs_cover_the_targets_and_kinds():
    assert set(available_hub_configs()) == {f"{t}-{k}" for t in EXPECTED for k in ("dflash", "markov")}


@pytest.mark.parametrize("name", sorted(f"{t}-{k}" for t in EXPECTED for k in ("dflash", "markov")))
def test_shipped_config_matches_the_published_layout(name):
    hub = load_hub_config(name)
    target, kind = name.rsplit("-", 1)
    assert hub.repo_id == f"org/{target}-carryover-{kind}"
    assert hub.config.drafter_type == kind and not hub.config.legacy_proposal_defaults  # not in config.json
    for key, value in EXPECTED[target].items():
        assert getattr(hub.config, key) == value, key
    assert hub.config.rope_parameters["rope_theta"] == 1_000_000.0
    assert hub.config.target_hidden_size == hub.config.hidden_size
    if kind == "markov":
        assert hub.config.markov_rank == 256
    assert hub.sources, "each config cites where its values come from"
    with torch.device("meta"):  # the full-size drafter is built without memory
        drafter = CarryoverDrafterModel(hub.config)
    assert drafter.fc.in_features == len(hub.config.target_layer_ids) * hub.config.target_hidden_size


# config.json of z-lab/Qwen3-4B-DFlash-b16 (its drafting and layer fields, as published).
ZLAB_QWEN3_4B = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "block_size": 16, "num_target_layers": 36,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 5, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "rope_scaling": None, "max_position_embeddings": 40960, "vocab_size": 151936, "attention_bias": False,
    "layer_types": ["full_attention"] * 5, "sliding_window": None, "use_sliding_window": False,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_qwen3_4b_config_is_what_the_zlab_checkpoint_imports_as():
    imported, notes = drafter_config_from_checkpoint(ZLAB_QWEN3_4B, target_name_or_path="Qwen/Qwen3-4B")
    shipped = load_hub_config("qwen3-4b-dflash").config
    assert not notes
    for key in ("target_name_or_path", "target_hidden_size", "target_num_hidden_layers", "target_layer_ids",
                "vocab_size", "block_size", "mask_token_id", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings",
                "rms_norm_eps", "attention_bias"):
        assert getattr(imported, key) == getattr(shipped, key), key
    assert float(imported.rope_parameters["rope_theta"]) == shipped.rope_parameters["rope_theta"]


def test_init_command_builds_a_drafter_for_its_target(tmp_path, capsys):
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    target.save_pretrained(tmp_path / "target")
    config_file = tiny_hub_config(tmp_path, target)
    assert init_main([str(config_file), str(tmp_path / "drafter"), "--target", str(tmp_path / "target")]) == 0
    assert "org/tiny-carryover-markov" in capsys.readouterr().out
    files = {p.name for p in (tmp_path / "drafter").iterdir()}
    assert files == {"config.json", "generation_config.json", "model.safetensors", "README.md"}

    drafter = CarryoverDrafterModel.from_pretrained(tmp_path / "drafter").eval()
    assert torch.equal(drafter.carry_embedding, torch.zeros(64))  # E_carry starts at zero
    assert torch.equal(drafter.markov_head.proj.weight, torch.zeros_like(drafter.markov_head.proj.weight))
    target = AutoModelForCausalLM.from_pretrained(tmp_path / "target").eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    expected = target.generate(ids, max_new_tokens=12, do_sample=False)
    assert target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=False).tolist() == expected.tolist()


def test_init_rejects_a_mismatching_target(tmp_path, capsys):
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    config_file = tiny_hub_config(tmp_path, target)
    tiny_target("llama", vocab_size=64, hidden_size=32, num_hidden_layers=4).save_pretrained(tmp_path / "other")
    assert init_main([str(config_file), str(tmp_path / "drafter"), "--target", str(tmp_path / "other")]) == 1
    assert "hidden size: drafter expects 64, target has 32" in capsys.readouterr().err
    assert not (tmp_path / "drafter").exists()


def test_hub_config_repo_name_must_follow_the_convention(tmp_path):
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    with pytest.raises(ValueError, match="carryover-dflash"):
        load_hub_config(tiny_hub_config(tmp_path, target, kind="dflash", repo_id="org/tiny-drafter"))
    with pytest.raises(ValueError, match="carryover-dflash"):
        load_hub_config(tiny_hub_config(tmp_path, target, kind="dflash", repo_id="org/tiny-carryover-markov"))


def test_init_drafter_is_seeded(tmp_path):
    config_file = tiny_hub_config(tmp_path, tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4))
    first, again, other = (init_drafter(config_file, seed=seed).fc.weight for seed in (3, 3, 4))
    assert torch.equal(first, again) and not torch.equal(first, other)
