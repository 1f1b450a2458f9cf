"""The export for vLLM's DFlash (`convert --to vllm`, the speculators layout) of reduced-vocabulary drafters, without
vLLM: what the config and the tensors hold. `tests/test_vllm.py` serves the export in vLLM itself."""

import json

import pytest
import torch
from safetensors.torch import load_file

from carryover_hf import DrafterTargetMismatchError
from carryover_hf.hub import CheckpointError, export_speculators
from carryover_hf.hub.convert import main as convert_main
from carryover_hf.hub.convert import target_lm_head_rows
from carryover_hf.tools.tiny import tiny_drafter, tiny_target


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
    assert "draft_token_ids" not in tensors and "carry_embedding" not in tensors
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
