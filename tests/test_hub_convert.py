"""Import of z-lab / Muse / speculators DFlash checkpoints, and export to the speculators layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel
from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

import carryover_hf
from carryover_hf import CarryoverDrafterModel
from carryover_hf.generation import RoundObserver, drafts_in_budget
from carryover_hf.hub import CheckpointError, detect_format, export_speculators, import_checkpoint
from carryover_hf.hub.convert import drafter_config_from_checkpoint
from carryover_hf.hub.convert import main as convert_main
from carryover_hf.hub.formats import parse_source
from carryover_hf.tools.testing import save_zlab_checkpoint, tiny_drafter, tiny_target, zlab_config


VOCAB, HIDDEN, BLOCK = 8, 64, 5


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("target")
    tiny_target("llama", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=4).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def target(target_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target_dir).eval()


def make_muse(sliding_window: int = 4096, layer_types=None, seed: int = 1) -> MuseGlimmerAssistantModel:
    """A random Muse assistant for the tiny target. Its defaults (rope theta 500000, rms eps 1e-5) are kept."""
    config = MuseGlimmerAssistantConfig(
        hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, block_size=BLOCK, mask_token_id=VOCAB - 1, target_layer_ids=[0, 2],
        bos_token_id=None, eos_token_id=None, pad_token_id=None, max_position_embeddings=512,
        sliding_window=sliding_window, layer_types=layer_types,
    )
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = MuseGlimmerAssistantModel(config).eval()
        for parameter in model.parameters():  # larger than the default init, so proposals depend on the context
            torch.nn.init.normal_(parameter, std=0.3)
    return model


@pytest.fixture(scope="module")
def muse(tmp_path_factory):
    model = make_muse()
    folder = tmp_path_factory.mktemp("muse")
    model.save_pretrained(folder)
    return model, folder


class Recorder:
    """Records, per round, the proposals and drafter logits of the native and the Carryover candidate generators."""

    def __init__(self, monkeypatch, drafter):
        self.native, self.ours, self.native_lengths = [], [], []
        native_get = DFlashTokenCandidateGenerator.get_candidates
        native_update = DFlashTokenCandidateGenerator.update_candidate_strategy

        def native_candidates(gen, input_ids, *args, **kwargs):
            ids, logits = native_get(gen, input_ids, *args, **kwargs)
            # The native generator proposes block_size - 1 tokens whenever two or more are left; generate keeps at most
            # the `max_length - n` inside the length budget (the last one may be a draft), and the Carryover
            # generator proposes exactly those.
            n = gen.main_model_max_length - input_ids.shape[1]
            proposals, logits = ids[0, input_ids.shape[1]:][:n].tolist(), None if logits is None else logits[:, :n]
            self.native.append((input_ids.shape[1], proposals, logits))
            return ids, logits

        ours = self.ours

        class Ours(RoundObserver):
            def generation_started(self, generator):
                generator.proposer.return_logits = True  # greedy decoding needs none; ask for them to compare them

            def round_finished(self, input_ids, ids, logits):
                ours.append((input_ids.shape[1], ids[0, input_ids.shape[1]:].tolist(), logits))

        def native_strategy(gen, input_ids, scores, num_matches):
            self.native_lengths.append(int(num_matches) + 1)
            return native_update(gen, input_ids, scores, num_matches)

        monkeypatch.setattr(DFlashTokenCandidateGenerator, "get_candidates", native_candidates)
        monkeypatch.setattr(drafter, "round_observer", Ours(), raising=False)
        monkeypatch.setattr(DFlashTokenCandidateGenerator, "update_candidate_strategy", native_strategy)

    def clear(self):
        self.native.clear(), self.ours.clear(), self.native_lengths.clear()


def skewed(target_dir: Path, strength: float):
    """The tiny target with its LM head pushed towards token 3 for most hidden states. The drafter shares that head,
    so both often pick token 3 and rounds accept 0..all drafts, not mostly none as with a plain random pair."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    with torch.no_grad():
        direction = torch.nn.functional.normalize(target.get_input_embeddings().weight, dim=-1).sum(0)
        target.get_output_embeddings().weight[3] += strength * direction / direction.norm()
    return target


@pytest.mark.parametrize("strength", [0.0, 1.0])
def test_muse_import_proposes_exactly_what_transformers_dflash_proposes(target_dir, muse, tmp_path, monkeypatch,
                                                                       strength):
    model, folder = muse
    report = import_checkpoint(folder, tmp_path / "converted", target=target_dir)
    assert report.source_format == "muse"
    assert report.mapped["encoder.fc.weight"] == "fc.weight"
    assert report.mapped["encoder.output_norm_enc.weight"] == "hidden_norm.weight"
    assert len(report.mapped) == len(model.state_dict()) and not report.skipped

    drafter = CarryoverDrafterModel.from_pretrained(tmp_path / "converted").eval()
    assert drafter.generation_config.use_carryover is False
    assert drafter.config.rope_parameters["rope_theta"] == 500000.0 and drafter.config.rms_norm_eps == 1e-5
    assert torch.equal(drafter.carry_embedding, torch.zeros(HIDDEN))

    target = skewed(target_dir, strength)
    recorder = Recorder(monkeypatch, drafter)
    generator = torch.Generator().manual_seed(5)
    all_lengths = []
    for prompt in range(10):
        ids = torch.randint(0, VOCAB - 1, (1, 3 + prompt), generator=generator)
        recorder.clear()
        native = target.generate(ids, assistant_model=model, speculation_type="dflash", max_new_tokens=24,
                                 do_sample=False)
        ours = target.generate(ids, assistant_model=drafter, max_new_tokens=24, do_sample=False)
        assert ours.tolist() == native.tolist()
        # The native loop also calls update_candidate_strategy after the prefill (no drafts); ours does not count it.
        assert drafter.last_generation_stats.acceptance_lengths == recorder.native_lengths[1:]
        assert [p for _, p, _ in recorder.ours] == [p for _, p, _ in recorder.native]
        compared = 0
        for (_, _, ours_logits), (_, _, native_logits) in zip(recorder.ours, recorder.native):
            if native_logits is not None and native_logits.numel():
                torch.testing.assert_close(ours_logits, native_logits, rtol=1e-5, atol=1e-5)
                compared += 1
        assert compared > 0
        all_lengths += recorder.native_lengths[1:]
    assert max(all_lengths) > 1, "the comparison must include rounds that accept drafts"
    if strength:
        assert set(all_lengths) == set(range(1, BLOCK + 1)), "no, some and all drafts accepted"


def test_proposal_counts_match_transformers_dflash_at_the_length_budget(target_dir, muse, tmp_path, monkeypatch):
    """Near `max_new_tokens`, every round proposes as many drafts as Transformers' DFlash path proposes inside the
    length budget, the last proposals included: budgets from 1 to 3 blocks cut them at every place, and a cut proposal
    may fill the budget's last token with a draft (the native path's count), not leave it to the bonus token."""
    model, folder = muse
    import_checkpoint(folder, tmp_path / "converted", target=target_dir)
    drafter = CarryoverDrafterModel.from_pretrained(tmp_path / "converted").eval()
    target = skewed(target_dir, 1.0)
    recorder = Recorder(monkeypatch, drafter)
    generator = torch.Generator().manual_seed(11)
    left_at_cut, filled = set(), 0
    for prompt in range(3):
        ids = torch.randint(0, VOCAB - 1, (1, 3 + prompt), generator=generator)
        for budget in range(1, 3 * BLOCK + 1):
            recorder.clear()
            native = target.generate(ids, assistant_model=model, speculation_type="dflash", max_new_tokens=budget,
                                     do_sample=False)  # fmt: skip
            ours = target.generate(ids, assistant_model=drafter, max_new_tokens=budget, do_sample=False)
            assert ours.tolist() == native.tolist()
            max_length = ids.shape[1] + budget
            counts = [(n, len(p)) for n, p, _ in recorder.ours]
            assert counts == [(n, len(p)) for n, p, _ in recorder.native], budget
            stats = drafter.last_generation_stats
            assert stats.acceptance_lengths == recorder.native_lengths[1:]
            assert stats.draft_lengths == [c for _, c in counts[1:]]  # the prefill's call proposes nothing
            for (n, count), accepted in zip(counts[1:], stats.acceptance_lengths):
                assert count == drafts_in_budget(BLOCK, max_length, n)
                if max_length - n < BLOCK:  # the budget cuts this proposal (1 left: the final plain step)
                    left_at_cut.add(max_length - n)
                    filled += count == max_length - n and accepted == count  # its last draft ends the output
    assert left_at_cut == set(range(1, BLOCK)), left_at_cut
    assert filled > 0, "some cut proposal must be accepted up to the budget's last token"


def test_sliding_window_is_rejected_or_exact_inside_the_window(target, target_dir, tmp_path, monkeypatch):
    window = 12
    model = make_muse(sliding_window=window)  # Muse's default layer_types: every layer sliding
    model.save_pretrained(tmp_path / "muse")
    with pytest.raises(CheckpointError, match="sliding-window-as-full") as error:
        import_checkpoint(tmp_path / "muse", tmp_path / "rejected", target=target_dir)
    assert "window 12" in str(error.value)

    report = import_checkpoint(tmp_path / "muse", tmp_path / "full", target=target_dir, sliding_window_as_full=True)
    assert "n + block_size - 2 <= 12" in report.notes[0]
    drafter = CarryoverDrafterModel.from_pretrained(tmp_path / "full").eval()
    assert drafter.config.imported_from["sliding_window"] == window

    recorder = Recorder(monkeypatch, drafter)
    ids = torch.tensor([[1, 2, 3, 4]])
    target.generate(ids, assistant_model=model, speculation_type="dflash", max_new_tokens=12, do_sample=False)
    target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=False)
    # A round drafting from n tokens has queries up to position n + BLOCK - 2 and keys from position 0: Muse's
    # bidirectional window (|q - k| <= window) hides nothing while n + BLOCK - 2 <= window.
    inside = beyond = 0
    for (n, _, native_logits), (n_ours, _, ours_logits) in zip(recorder.native, recorder.ours):
        if n != n_ours:  # once proposals differ the two runs may accept differently; stop comparing there
            break
        if native_logits is None or not native_logits.numel():
            continue
        if n + BLOCK - 2 <= window:
            torch.testing.assert_close(ours_logits, native_logits, rtol=1e-5, atol=1e-5)
            inside += 1
        else:
            beyond += not torch.allclose(ours_logits, native_logits, atol=1e-3)
    assert inside >= 3 and beyond >= 1


def _zlab_fixture(folder: Path, muse_model, extra: dict | None = None, drop: tuple = (), **config_overrides) -> None:
    """A z-lab DFlash checkpoint as z-lab publishes it (SPEC section 4 names), holding the Muse model's weights."""
    state = {
        {"encoder.fc.weight": "fc.weight", "encoder.output_norm_enc.weight": "hidden_norm.weight"}.get(k, k): v
        for k, v in muse_model.state_dict().items()
    }
    state.update(extra or {})
    for name in drop:
        state.pop(name)
    config = zlab_config(
        hidden_size=HIDDEN, num_hidden_layers=2, num_target_layers=4, target_layer_ids=[0, 2], vocab_size=VOCAB,
        block_size=BLOCK, mask_token_id=VOCAB - 1, head_dim=16, rms_norm_eps=1e-5, rope_theta=500000.0,
        **config_overrides,
    )
    save_zlab_checkpoint(folder, state, config)


def test_zlab_fixture_maps_every_tensor_and_matches_the_muse_import(target_dir, muse, tmp_path):
    model, muse_folder = muse
    _zlab_fixture(tmp_path / "zlab", model)
    assert detect_format(json.loads((tmp_path / "zlab" / "config.json").read_text())) == "zlab"
    report = import_checkpoint(tmp_path / "zlab", tmp_path / "from_zlab")
    source_names = set(load_file(tmp_path / "zlab" / "model.safetensors"))
    assert set(report.mapped) == source_names and all(k == v for k, v in report.mapped.items())
    assert not report.skipped
    import_checkpoint(muse_folder, tmp_path / "from_muse", target=target_dir)

    zlab = CarryoverDrafterModel.from_pretrained(tmp_path / "from_zlab")
    from_muse = CarryoverDrafterModel.from_pretrained(tmp_path / "from_muse")
    assert zlab.config.target_num_hidden_layers == 4 and zlab.config.target_layer_ids == [0, 2]
    for key in ("rope_parameters", "rms_norm_eps", "block_size", "mask_token_id", "vocab_size", "head_dim"):
        assert getattr(zlab.config, key) == getattr(from_muse.config, key), key
    for name, tensor in from_muse.state_dict().items():
        assert torch.equal(zlab.state_dict()[name], tensor), name


def test_unknown_and_missing_tensors_are_reported_by_name(muse, tmp_path):
    model, _ = muse
    _zlab_fixture(tmp_path / "zlab", model, extra={"layers.0.self_attn.g_proj.weight": torch.zeros(4, 4)},
                  drop=("norm.weight",))
    with pytest.raises(CheckpointError) as error:
        import_checkpoint(tmp_path / "zlab", tmp_path / "out")
    message = str(error.value)
    assert "layers.0.self_attn.g_proj.weight" in message and "unknown" in message
    assert "norm.weight" in message and "missing" in message
    assert not (tmp_path / "out").exists()


def test_zlab_features_the_drafter_cannot_reproduce_are_rejected(muse, tmp_path):
    model, _ = muse
    _zlab_fixture(tmp_path / "dflash2", model, architectures=["DFlash2DraftModel"])
    with pytest.raises(CheckpointError, match="DFlash2"):
        import_checkpoint(tmp_path / "dflash2", tmp_path / "out")
    _zlab_fixture(tmp_path / "softcap", model,
                  dflash_config={"mask_token_id": VOCAB - 1, "target_layer_ids": [0, 2], "final_logit_softcapping": 20.0})
    with pytest.raises(CheckpointError, match="final_logit_softcapping"):
        import_checkpoint(tmp_path / "softcap", tmp_path / "out")


def test_pickle_weights_are_refused(muse, tmp_path):
    model, _ = muse
    _zlab_fixture(tmp_path / "zlab", model)
    (tmp_path / "zlab" / "model.safetensors").rename(tmp_path / "zlab" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="only read from safetensors"):
        import_checkpoint(tmp_path / "zlab", tmp_path / "out")


def _speculators_fixture(folder: Path, drafter: CarryoverDrafterModel, target_owned: bool = True, **overrides) -> None:
    """A vLLM speculators DFlash checkpoint (speculators' DFlashSpeculatorConfig fields and weight names)."""
    config = drafter.config
    state = {k: v for k, v in drafter.state_dict().items() if k != "carry_embedding"}
    if target_owned:  # older exports also stored the verifier-owned tensors next to the drafter's
        state["embed_tokens.weight"] = torch.randn(VOCAB, HIDDEN)
        state["verifier_norm.weight"] = torch.ones(HIDDEN)
    layers = {
        "model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers, "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim, "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings, "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_parameters["rope_theta"], "attention_bias": False, "tie_word_embeddings": False,
    }
    raw = {
        "architectures": ["DFlashDraftModel"], "speculators_model_type": "dflash", "speculators_version": "0.3.0",
        "speculators_config": {
            "algorithm": "dflash", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": config.block_size - 1}],
            "verifier": {"name_or_path": "org/tiny-target", "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": layers, "draft_vocab_size": VOCAB, "block_size": config.block_size,
        "target_hidden_size": HIDDEN, "aux_hidden_state_layer_ids": [i + 1 for i in config.target_layer_ids],
        "mask_token_id": config.mask_token_id,
    }
    raw.update(overrides)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(raw))
    save_file({k: v.contiguous() for k, v in state.items()}, folder / "model.safetensors", metadata={"format": "pt"})


def test_speculators_fixture_maps_every_drafter_tensor_and_skips_target_owned_ones(target, target_dir, tmp_path):
    source = tiny_drafter(target, num_hidden_layers=2, block_size=BLOCK, target_layer_ids=[1, 3])
    _speculators_fixture(tmp_path / "spec", source)
    report = import_checkpoint(tmp_path / "spec", tmp_path / "out", target=target_dir, target_name_or_path="org/tiny-target")
    assert report.source_format == "speculators"
    assert set(report.skipped) == {"embed_tokens.weight", "verifier_norm.weight"}
    assert set(report.mapped.values()) == set(source.state_dict()) - {"carry_embedding"}
    drafter = CarryoverDrafterModel.from_pretrained(tmp_path / "out")
    assert drafter.config.target_layer_ids == [1, 3]  # aux ids [2, 4] shifted back by one
    assert drafter.config.target_name_or_path == "org/tiny-target"
    for name, tensor in source.state_dict().items():
        if name != "carry_embedding":
            assert torch.equal(drafter.state_dict()[name], tensor), name


def test_speculators_reduced_vocabulary_is_rejected(target, tmp_path):
    source = tiny_drafter(target, num_hidden_layers=1, block_size=BLOCK)
    _speculators_fixture(tmp_path / "spec", source, draft_vocab_size=4)
    with pytest.raises(CheckpointError, match="reduced vocabulary"):
        import_checkpoint(tmp_path / "spec", tmp_path / "out", target_num_hidden_layers=4)


def test_muse_needs_the_target_layer_count(muse, tmp_path):
    _, folder = muse
    with pytest.raises(CheckpointError, match="--target"):
        import_checkpoint(folder, tmp_path / "out")


def test_import_checks_the_source_against_the_target(muse, tmp_path):
    _, folder = muse
    other = tmp_path / "other"
    tiny_target("llama", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2).save_pretrained(other)
    with pytest.raises(CheckpointError, match=r"target_layer_ids \[2\] are out of range"):
        import_checkpoint(folder, tmp_path / "out", target=other)
    # a source that records its target is compared with the given target field by field
    _zlab_fixture(tmp_path / "zlab", muse[0])
    with pytest.raises(carryover_hf.DrafterTargetMismatchError, match="layer count: drafter expects 4, target has 2"):
        import_checkpoint(tmp_path / "zlab", tmp_path / "out", target=other)


@pytest.mark.parametrize("drafter_type", ["dflash", "markov"])
def test_speculators_export_round_trip(target, tmp_path, drafter_type):
    drafter = tiny_drafter(target, num_hidden_layers=2, block_size=BLOCK, drafter_type=drafter_type,
                           target_layer_ids=[0, 2], target_name_or_path="org/tiny-target")
    drafter.save_pretrained(tmp_path / "drafter")
    report = export_speculators(tmp_path / "drafter", tmp_path / "spec", verifier_architectures=["LlamaForCausalLM"],
                                carry=False)  # plain DFlash: E_carry dropped (tests/test_hub_export_vllm.py: carry)
    dropped = {"carry_embedding"} | ({"markov_head.token_embedding.weight", "markov_head.proj.weight"}
                                     if drafter_type == "markov" else set())
    assert set(report.skipped) == dropped
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash"
    assert config["aux_hidden_state_layer_ids"] == [1, 3]
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == BLOCK - 1
    assert config["speculators_config"]["verifier"] == {"name_or_path": "org/tiny-target",
                                                        "architectures": ["LlamaForCausalLM"]}
    assert config["transformer_layer_config"]["hidden_size"] == HIDDEN
    assert set(load_file(tmp_path / "spec" / "model.safetensors")) == set(drafter.state_dict()) - dropped
    assert "without carryover" in (tmp_path / "spec" / "README.md").read_text()

    import_checkpoint(tmp_path / "spec", tmp_path / "back", target_num_hidden_layers=4)
    back = CarryoverDrafterModel.from_pretrained(tmp_path / "back").eval()
    assert back.config.target_layer_ids == [0, 2] and back.config.drafter_type == "dflash"
    for name, tensor in back.state_dict().items():
        expected = torch.zeros_like(tensor) if name == "carry_embedding" else drafter.state_dict()[name]
        assert torch.equal(tensor, expected), name
    if drafter_type == "dflash":  # same backbone, carry off: the same proposals
        drafter.generation_config.use_carryover = False
        ids = torch.tensor([[1, 2, 3, 4, 5]])
        expected = target.generate(ids, assistant_model=drafter, max_new_tokens=16, do_sample=False)
        lengths = drafter.last_generation_stats.acceptance_lengths
        assert target.generate(ids, assistant_model=back, max_new_tokens=16, do_sample=False).tolist() == expected.tolist()
        assert back.last_generation_stats.acceptance_lengths == lengths


def test_export_refuses_the_last_target_layer(target, tmp_path):
    drafter = tiny_drafter(target, num_hidden_layers=1, block_size=BLOCK, target_layer_ids=[3])
    with pytest.raises(CheckpointError, match="last layer"):
        export_speculators(drafter, tmp_path / "spec")


def test_export_refuses_a_reduced_draft_vocabulary(target, tmp_path):
    drafter = tiny_drafter(target, num_hidden_layers=1, block_size=BLOCK, target_layer_ids=[1])
    drafter.set_draft_vocabulary([0, 1, 2, 5])
    with pytest.raises(CheckpointError, match="reduced vocabulary.*d2t/t2d"):
        export_speculators(drafter, tmp_path / "spec")
    assert not (tmp_path / "spec").exists()


def test_convert_command(muse, target_dir, tmp_path, capsys):
    _, folder = muse
    assert convert_main([str(folder), str(tmp_path / "out"), "--target", str(target_dir)]) == 0
    assert "encoder.fc.weight -> fc.weight" in capsys.readouterr().out
    assert convert_main([str(folder), str(tmp_path / "again")]) == 1
    assert "--target" in capsys.readouterr().err
    assert convert_main([str(tmp_path / "out"), str(tmp_path / "spec"), "--to", "speculators"]) == 0
    assert json.loads((tmp_path / "spec" / "config.json").read_text())["aux_hidden_state_layer_ids"] == [1, 3]


# config.json of the published Muse Glimmer assistant (MuseGlimmerAssistantModel, transformers 5.15), and its tensor
# names: encoder.fc / encoder.output_norm_enc, five Qwen3-style layers, norm.
MUSE_30B_CONFIG = {
    "architectures": ["MuseGlimmerAssistantModel"], "attention_dropout": 0, "block_size": 16, "bos_token_id": 200000,
    "dtype": "bfloat16", "eos_token_id": 200001, "head_dim": 128, "hidden_act": "silu", "hidden_size": 6656,
    "intermediate_size": 19968, "layer_types": ["sliding_attention"] * 5, "mask_token_id": 201818,
    "max_position_embeddings": 131072, "model_type": "muse_glimmer_assistant", "num_attention_heads": 32,
    "num_hidden_layers": 5, "num_key_value_heads": 8, "pad_token_id": 200018, "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "sliding_window": 2048,
    "target_layer_ids": [1, 13, 25, 37, 49],
}
LAYER_TENSORS = [
    "input_layernorm", "post_attention_layernorm", "mlp.down_proj", "mlp.gate_proj", "mlp.up_proj",
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
    "self_attn.k_norm",
]


def test_published_muse_assistant_layout_maps_onto_the_drafter():
    with pytest.raises(CheckpointError, match="window 2048"):
        drafter_config_from_checkpoint(MUSE_30B_CONFIG, target_num_hidden_layers=52, vocab_size=202048)
    config, notes = drafter_config_from_checkpoint(
        MUSE_30B_CONFIG, target_num_hidden_layers=52, vocab_size=202048, sliding_window_as_full=True
    )
    assert "n + block_size - 2 <= 2048" in notes[0]
    assert config.rope_parameters == {"rope_theta": 500000.0, "rope_type": "default"} and config.rms_norm_eps == 1e-5
    assert config.dtype == torch.bfloat16 and config.target_layer_ids == [1, 13, 25, 37, 49]
    names = ["encoder.fc.weight", "encoder.output_norm_enc.weight", "norm.weight"]
    names += [f"layers.{i}.{name}.weight" for i in range(5) for name in LAYER_TENSORS]
    rename = parse_source(MUSE_30B_CONFIG).rename
    with torch.device("meta"):
        expected = CarryoverDrafterModel(config).state_dict()
    assert {rename(name) for name in names} == set(expected) - {"carry_embedding"}
    assert tuple(expected["fc.weight"].shape) == (6656, 33280)  # as stored in the published checkpoint


def test_muse_glimmer_target_proposals_match(tmp_path, monkeypatch):
    from transformers import MuseGlimmerConfig, MuseGlimmerForConditionalGeneration

    text = dict(vocab_size=16, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                eos_token_id=None, bos_token_id=None, pad_token_id=None, sliding_window=4096)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        glimmer = MuseGlimmerForConditionalGeneration(MuseGlimmerConfig(
            text_config=text, vision_config=vision, out_hidden_size=HIDDEN, projector_hidden_size=32)).eval()
    glimmer.save_pretrained(tmp_path / "target")
    model = make_muse()
    model.config.mask_token_id = 15
    model.save_pretrained(tmp_path / "muse")
    import_checkpoint(tmp_path / "muse", tmp_path / "converted", target=tmp_path / "target")
    drafter = CarryoverDrafterModel.from_pretrained(tmp_path / "converted").eval()
    recorder = Recorder(monkeypatch, drafter)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    glimmer.generate(ids, assistant_model=model, speculation_type="dflash", max_new_tokens=8, do_sample=False)
    glimmer.generate(ids, assistant_model=drafter, max_new_tokens=8, do_sample=False)
    assert [p for _, p, _ in recorder.ours] == [p for _, p, _ in recorder.native]
