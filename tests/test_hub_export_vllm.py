"""The export for vLLM's DFlash (`convert --to vllm`, the speculators layout) of reduced-vocabulary drafters and of
drafters with carry, and the folder that gives vLLM carryover-hf's plugin, without vLLM: what the config, the tensors
and the files hold. `tests/test_vllm.py` serves the exports in vLLM itself."""

import json

import pytest
import torch
from safetensors.torch import load_file

from carryover_hf import DrafterTargetMismatchError
from carryover_hf.hub import CheckpointError, export_speculators
from carryover_hf.hub.convert import main as convert_main
from carryover_hf.hub.convert import target_lm_head_rows
from carryover_hf.tools.tiny import tiny_drafter, tiny_target
from carryover_hf.tools.vllm_check import PLUGIN_MODULE, is_carry_export, plugin_dir


VOCAB, HIDDEN, BLOCK = 32, 64, 4
DRAFT_IDS = [0, 3, 4, 9, 17, 30]


@pytest.fixture(scope="module", params=[False, True], ids=["own_head", "tied_head"])
def target_dir(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    model = tiny_target("llama", vocab_size=VOCAB, hidden_size=HIDDEN, tie_word_embeddings=request.param)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def target(target_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target_dir).eval()


def reduced_drafter(target):
    drafter = tiny_drafter(target, num_hidden_layers=2, block_size=BLOCK, target_layer_ids=[0, 2],
                           target_name_or_path="org/tiny-target")  # fmt: skip
    drafter.set_draft_vocabulary(DRAFT_IDS)
    return drafter


def test_reduced_vocabulary_export_gives_vllm_the_draft_head_and_maps(target, target_dir, tmp_path):
    drafter = reduced_drafter(target)
    drafter.save_pretrained(tmp_path / "drafter")
    report = export_speculators(tmp_path / "drafter", tmp_path / "vllm", target=target_dir)
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert config["draft_vocab_size"] == len(DRAFT_IDS)
    assert config["transformer_layer_config"]["vocab_size"] == VOCAB  # the target's: vLLM shares its embedding
    assert config["sliding_window_non_causal"] is True  # vLLM: dflash_config.causal = not this, for every layer
    assert config["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]  # from the target
    tensors = load_file(tmp_path / "vllm" / "model.safetensors")
    assert "draft_token_ids" not in tensors
    assert {"lm_head.weight", "d2t", "t2d"} <= set(report.initialised) and "draft_token_ids" in report.skipped
    ids = torch.tensor(DRAFT_IDS)
    head = target.get_output_embeddings().weight
    assert torch.equal(tensors["lm_head.weight"], head[ids])
    assert tensors["d2t"].dtype == torch.int64 and torch.equal(tensors["d2t"] + torch.arange(len(ids)), ids)
    assert tensors["t2d"].dtype == torch.bool and tensors["t2d"].nonzero().flatten().tolist() == DRAFT_IDS

    # vLLM's logits (own head, scattered to target ids at arange + d2t, -inf elsewhere) are the drafter's
    states = torch.randn(5, HIDDEN)
    theirs = torch.full((5, VOCAB), float("-inf"))
    theirs[:, torch.arange(len(ids)) + tensors["d2t"]] = states @ tensors["lm_head.weight"].T
    ours = drafter.proposal_logits(states, target.get_output_embeddings())
    torch.testing.assert_close(theirs, ours)


def test_rows_from_a_folder_equal_those_of_the_loaded_model(target, target_dir):
    ids = torch.tensor(DRAFT_IDS)
    from_folder, config = target_lm_head_rows(target_dir, ids)
    from_model, _ = target_lm_head_rows(target, ids)
    assert torch.equal(from_folder, from_model) and config.vocab_size == VOCAB


def test_reduced_vocabulary_export_needs_the_target(target, tmp_path):
    with pytest.raises(CheckpointError, match="reduced vocabulary.*--target"):
        export_speculators(reduced_drafter(target), tmp_path / "vllm")
    assert not (tmp_path / "vllm").exists()


def test_export_checks_the_drafter_against_the_target(target, tmp_path):
    other = tmp_path / "other"
    tiny_target("llama", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2).save_pretrained(other)
    with pytest.raises(DrafterTargetMismatchError, match="layer count"):
        export_speculators(reduced_drafter(target), tmp_path / "vllm", target=other)


def test_convert_to_vllm_command(target, target_dir, tmp_path, capsys):
    reduced_drafter(target).save_pretrained(tmp_path / "drafter")
    args = [str(tmp_path / "drafter"), str(tmp_path / "vllm"), "--to", "vllm"]
    assert convert_main(args) == 1
    assert "--target" in capsys.readouterr().err
    assert convert_main([*args, "--target", str(target_dir)]) == 0
    assert "set      lm_head.weight" in capsys.readouterr().out
    assert json.loads((tmp_path / "vllm" / "config.json").read_text())["draft_vocab_size"] == len(DRAFT_IDS)


@pytest.mark.parametrize("proposes_with_carry", [True, False])
def test_the_export_keeps_carry_when_the_drafter_proposes_with_it(target, tmp_path, proposes_with_carry):
    drafter = tiny_drafter(target, num_hidden_layers=2, block_size=BLOCK, target_layer_ids=[0, 2],
                           target_name_or_path="org/tiny-target")  # fmt: skip
    drafter.carry_embedding.data.normal_()
    drafter.generation_config.use_carryover = proposes_with_carry
    drafter.save_pretrained(tmp_path / "drafter")
    for carry, folder in ((None, "default"), (True, "carry"), (False, "plain")):
        export_speculators(tmp_path / "drafter", tmp_path / folder, carry=carry)
    expected = {"default": proposes_with_carry, "carry": True, "plain": False}
    for folder, carried in expected.items():
        config = json.loads((tmp_path / folder / "config.json").read_text())
        tensors = load_file(tmp_path / folder / "model.safetensors")
        assert is_carry_export(tmp_path / folder) is carried, folder
        assert ("carryover" in config["transformer_layer_config"]) is carried
        assert config["speculators_model_type"] == "dflash"  # vLLM's own method: the plugin only adds the carry
        if carried:
            assert config["transformer_layer_config"]["carryover"] == {"carry": True, "format": 1}
            assert torch.equal(tensors["carry_embedding"], drafter.carry_embedding.detach())
        else:
            assert "carry_embedding" not in tensors
        card = (tmp_path / folder / "README.md").read_text()
        assert ("**with carryover**" in card) is carried and ("**without carryover**" in card) is not carried
    # the command line: --no-carry / --carry override the drafter's setting
    flag = "--no-carry" if proposes_with_carry else "--carry"
    assert convert_main([str(tmp_path / "drafter"), str(tmp_path / "cli"), "--to", "vllm", flag]) == 0
    assert is_carry_export(tmp_path / "cli") is not proposes_with_carry


def test_plugin_dir_gives_vllm_the_plugin_by_its_entry_point(tmp_path):
    import importlib.metadata
    from importlib.resources import files

    folder = plugin_dir(tmp_path / "plugin")
    assert plugin_dir(tmp_path / "plugin") == folder  # written again, same content
    plugin = (folder / f"{PLUGIN_MODULE}.py").read_text()
    assert plugin == files("carryover_hf.integrations").joinpath("vllm_plugin.py").read_text()
    (entry,) = [e for d in importlib.metadata.distributions(path=[str(folder)])
                for e in d.entry_points if e.group == "vllm.general_plugins"]  # fmt: skip
    assert entry.value == f"{PLUGIN_MODULE}:register"
    # a record left by another version is replaced, not kept beside it
    stale = folder / f"{PLUGIN_MODULE}-0.0.1.dist-info"
    stale.mkdir()
    (stale / "METADATA").write_text("Metadata-Version: 2.1\nName: x\nVersion: 0.0.1\n")
    plugin_dir(folder)
    assert not stale.exists() and len(list(folder.glob("*.dist-info"))) == 1


def test_the_plugin_reads_the_carry_mark_the_export_writes():
    """The plugin imports only torch and vLLM (it is loaded from the plugin folder, where carryover-hf may not be
    installed), so it spells the carry mark itself: read its constants from its source and compare."""
    import ast
    from importlib.resources import files

    from carryover_hf.hub.convert import VLLM_CARRY_FORMAT, VLLM_CARRY_KEY

    source = files("carryover_hf.integrations").joinpath("vllm_plugin.py").read_text()
    constants = {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(source).body
                 if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                 and node.targets[0].id in ("CARRY_CONFIG_KEY", "CARRY_FORMAT")}  # fmt: skip
    assert constants == {"CARRY_CONFIG_KEY": VLLM_CARRY_KEY, "CARRY_FORMAT": VLLM_CARRY_FORMAT}
