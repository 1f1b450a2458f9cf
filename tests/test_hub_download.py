"""Save/load round trips, loading by repo id from an offline Hub cache, and the target check when loading."""

from __future__ import annotations

import huggingface_hub.constants
import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

from carryover_hf import CarryoverDrafterModel, DrafterTargetMismatchError
from carryover_hf.hub import CheckpointError, import_checkpoint, load_drafter
from carryover_hf.hub.local_cache import add_to_hub_cache
from carryover_hf.tools.testing import tiny_drafter, tiny_target


@pytest.fixture(scope="module")
def target():
    model = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    model.config._name_or_path = "org/tiny-target"
    return model


@pytest.fixture(scope="module")
def drafter(target):
    return tiny_drafter(target, num_hidden_layers=2, block_size=4, target_name_or_path="org/tiny-target")


def drafter_outputs(drafter: CarryoverDrafterModel, target) -> tuple[torch.Tensor, list, list]:
    """A forward with context and carry rows, and a generate run (carry on) with its acceptance lengths."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(1, 6, drafter.config.num_target_features, generator=generator)
    carry = torch.randn(1, 2, drafter.config.num_target_features, generator=generator)
    with torch.no_grad():
        hidden = drafter(
            block_embeds=target.get_input_embeddings()(torch.tensor([[5, 63, 63, 63]])),
            block_position_ids=torch.arange(6, 10)[None],
            context_features=features,
            context_position_ids=torch.arange(6)[None],
            carry_features=carry,
            carry_position_ids=torch.arange(6, 8)[None],
        ).last_hidden_state
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    output = target.generate(ids, assistant_model=drafter, max_new_tokens=16, do_sample=False)
    return hidden, output.tolist(), list(drafter.last_generation_stats.acceptance_lengths)


def test_save_load_round_trip_gives_identical_outputs(target, drafter, tmp_path):
    drafter.save_pretrained(tmp_path / "drafter")
    assert {p.name for p in (tmp_path / "drafter").iterdir()} == {"config.json", "generation_config.json",
                                                                  "model.safetensors"}
    loaded = CarryoverDrafterModel.from_pretrained(tmp_path / "drafter").eval()
    expected_hidden, expected_output, expected_lengths = drafter_outputs(drafter, target)
    hidden, output, lengths = drafter_outputs(loaded, target)
    assert torch.equal(hidden, expected_hidden)
    assert output == expected_output and lengths == expected_lengths


@pytest.fixture
def offline_cache(tmp_path, monkeypatch, target, drafter):
    """org/tiny-target and org/tiny-carryover-dflash in a Hub cache, with the Hub switched offline."""
    cache = tmp_path / "cache"
    target.save_pretrained(tmp_path / "target")
    drafter.save_pretrained(tmp_path / "drafter")
    add_to_hub_cache(tmp_path / "target", "org/tiny-target", cache)
    add_to_hub_cache(tmp_path / "drafter", "org/tiny-carryover-dflash", cache)
    # huggingface_hub reads HF_HUB_CACHE / HF_HUB_OFFLINE at import; set the variables and the values read from them.
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def test_load_by_repo_id_offline_from_the_hub_cache(offline_cache, target, drafter):
    expected = drafter_outputs(drafter, target)
    by_auto = AutoModel.from_pretrained("org/tiny-carryover-dflash").eval()
    assert isinstance(by_auto, CarryoverDrafterModel)
    by_class = CarryoverDrafterModel.from_pretrained("org/tiny-carryover-dflash").eval()
    cached_target = AutoModelForCausalLM.from_pretrained("org/tiny-target").eval()
    by_helper = load_drafter("org/tiny-carryover-dflash", cached_target)
    for loaded in (by_auto, by_class, by_helper):
        hidden, output, lengths = drafter_outputs(loaded, target)
        assert torch.equal(hidden, expected[0]) and output == expected[1] and lengths == expected[2]
    with pytest.raises(OSError):  # not in the cache, and the Hub is offline: nothing is fetched
        AutoModel.from_pretrained("org/not-in-cache")


def test_loading_next_to_a_mismatching_target_fails_clearly(target, drafter, tmp_path):
    drafter.save_pretrained(tmp_path / "drafter")
    narrow = tiny_target("llama", vocab_size=32, hidden_size=32, num_hidden_layers=4)
    with pytest.raises(DrafterTargetMismatchError) as error:
        load_drafter(tmp_path / "drafter", narrow, ignore_target_name=True)  # the override covers the name only
    assert "hidden size: drafter expects 64, target has 32" in str(error.value)
    assert "vocabulary: drafter expects 64, target has 32" in str(error.value)

    renamed = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    renamed.config._name_or_path = "someone/else"
    with pytest.raises(DrafterTargetMismatchError, match="name: drafter was trained for 'org/tiny-target'"):
        load_drafter(tmp_path / "drafter", renamed)
    loaded = load_drafter(tmp_path / "drafter", renamed, ignore_target_name=True)
    assert loaded.dtype == renamed.dtype and loaded.device == renamed.device

    shallow = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=2)
    with pytest.raises(DrafterTargetMismatchError, match="layer count: drafter expects 4, target has 2"):
        load_drafter(tmp_path / "drafter", shallow, ignore_target_name=True)


def test_loading_a_foreign_checkpoint_points_to_convert(target, tmp_path):
    target.save_pretrained(tmp_path / "not-a-drafter")
    with pytest.raises(CheckpointError, match="carryover-hf convert"):
        load_drafter(tmp_path / "not-a-drafter", target)


def test_convert_reads_a_repo_id_from_the_offline_cache(offline_cache, tmp_path):
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    muse = MuseGlimmerAssistantModel(
        MuseGlimmerAssistantConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            block_size=4,
            mask_token_id=63,
            target_layer_ids=[1, 2],
            layer_types=["full_attention"],
        )
    )
    muse.save_pretrained(tmp_path / "muse")
    (tmp_path / "muse" / "notes.bin").write_bytes(b"not fetched")  # only config, safetensors and README are read
    add_to_hub_cache(tmp_path / "muse", "org/tiny-muse-assistant", offline_cache)
    report = import_checkpoint("org/tiny-muse-assistant", tmp_path / "out", target="org/tiny-target")
    assert report.source == "org/tiny-muse-assistant" and len(report.mapped) == len(muse.state_dict())
    drafter = CarryoverDrafterModel.from_pretrained(tmp_path / "out")
    assert drafter.config.target_name_or_path == "org/tiny-target"
    assert drafter.config.imported_from["source"] == "org/tiny-muse-assistant"
    with pytest.raises(CheckpointError, match="neither a local folder nor a Hub repository"):
        import_checkpoint("org/not-cached", tmp_path / "out2")
