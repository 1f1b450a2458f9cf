"""`carryover-hf demo`: the timed comparison on tiny models, and loading a shipped drafter by repo id from the cache."""

from __future__ import annotations

import huggingface_hub.constants
import pytest
from transformers import AutoModel

import carryover_hf.generation
from carryover_hf import CarryoverDrafterModel
from carryover_hf.tools import demo
from carryover_hf.tools.bench.prompts import tiny_prompts
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target


def test_demo_reports_identical_greedy_outputs_speedup_and_acceptance():
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    drafter = tiny_drafter(target, num_hidden_layers=1, block_size=4, lookup_drafts=10, proposal_backoff=8)
    skew_towards_token(target, token_id=5, strength=4.0)  # long agreements: drafts get accepted
    prompts = tiny_prompts(3, vocab_size=64)
    args = demo.DemoArguments(max_new_tokens=12, categories=["qa"])
    summary = demo.run_demo(args, target=target, drafter=drafter, prompts=prompts)
    assert [row["id"] for row in summary["prompts"]] == ["tiny-0", "tiny-1", "tiny-2"]
    assert summary["all_identical"] and all(row["identical"] for row in summary["prompts"])
    assert all(row["new_tokens"] == 12 for row in summary["prompts"])
    assert summary["mean_acceptance_length"] > 1.0  # the skewed target accepts drafts
    assert summary["speedup"] > 0
    assert summary["cpu_kernels"] is True  # auto: float32 on CPU
    assert target.config._attn_implementation == "carryover_grouped_sdpa"
    assert summary["lookup_drafts"] == 10 and summary["proposal_backoff"] == 8  # the drafter's own defaults
    assert type(target.lm_head).__name__ == "PackedLinear"
    table = demo.format_summary(summary)
    assert "greedy outputs identical to the target alone: yes" in table and "tiny-2" in table
    assert "CPU kernels on, lookup 10, backoff 8" in table

    # Options given on the command line win over the drafter's; a drafter without defaults runs alone.
    override = demo.run_demo(demo.DemoArguments(max_new_tokens=12, lookup_drafts=0, proposal_backoff=2), target=target,
                             drafter=drafter, prompts=prompts[:1])  # fmt: skip
    assert (override["lookup_drafts"], override["proposal_backoff"]) == (0, 2) and override["all_identical"]
    plain = tiny_drafter(target, num_hidden_layers=1, block_size=4)
    alone = demo.run_demo(demo.DemoArguments(max_new_tokens=12), target=target, drafter=plain, prompts=prompts[:1])
    assert (alone["lookup_drafts"], alone["proposal_backoff"]) == (None, None) and alone["all_identical"]
    assert "lookup off, backoff off" in demo.format_summary(alone)


def test_demo_runs_the_drafters_own_round_policy(tmp_path, monkeypatch):
    from carryover_hf.round_policy import CostAwarePolicy

    monkeypatch.setenv("CARRYOVER_HF_CACHE", str(tmp_path))  # the calibration is timed here, in the warm-up
    target = skew_towards_token(tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4), 5, 4.0)
    drafter = tiny_drafter(target, num_hidden_layers=1, block_size=4, lookup_drafts=10, proposal_backoff=8)
    drafter.generation_config.round_policy = "cost"  # as the shipped drafters are published
    prompts = tiny_prompts(2, vocab_size=64)

    class Policies(carryover_hf.generation.RoundObserver):
        kinds = set()

        def generation_started(self, generator):
            self.kinds.add(type(generator.policy).__name__)

    with carryover_hf.generation.observing_rounds(drafter, Policies()) as seen:
        summary = demo.run_demo(demo.DemoArguments(max_new_tokens=12), target=target, drafter=drafter, prompts=prompts)
    assert seen.kinds == {CostAwarePolicy.__name__} and summary["round_policy"] == "cost"
    assert summary["all_identical"] and summary["lookup_drafts"] is None
    assert "CPU kernels on, cost-aware round policy, T=0.0" in demo.format_summary(summary)
    rules = demo.run_demo(demo.DemoArguments(max_new_tokens=12, round_policy="rules"), target=target, drafter=drafter,
                          prompts=prompts[:1])  # fmt: skip
    assert rules["round_policy"] == "rules" and (rules["lookup_drafts"], rules["proposal_backoff"]) == (10, 8)
    given = demo.run_demo(demo.DemoArguments(max_new_tokens=12, lookup_drafts=4), target=target, drafter=drafter,
                          prompts=prompts[:1])  # fmt: skip
    assert given["round_policy"] == "rules" and given["lookup_drafts"] == 4  # a rules option given: the rules


def test_demo_rejects_bad_options_before_loading_anything(capsys):
    assert demo.main(["--categories", "poetry", "--target", "/nonexistent"]) == 2
    assert "unknown categories ['poetry']" in capsys.readouterr().err
    assert demo.main(["--dtype", "bfloat16", "--packed_linears", "on", "--target", "/nonexistent"]) == 2
    assert "needs float32 on CPU" in capsys.readouterr().err
    assert demo.main(["--lookup_drafts", "-1", "--target", "/nonexistent"]) == 2
    assert "--lookup_drafts and --proposal_backoff must be >= 0" in capsys.readouterr().err
    assert demo.main(["--round_policy", "fast", "--target", "/nonexistent"]) == 2
    assert "--round_policy must be 'rules' or 'cost', got 'fast'" in capsys.readouterr().err
    assert demo.main(["--round_policy", "cost", "--lookup_drafts", "4", "--target", "/nonexistent"]) == 2
    assert "drive --round_policy rules" in capsys.readouterr().err


def test_shipped_drafter_loads_by_repo_id_from_the_local_hub_cache(tmp_path, monkeypatch):
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    drafter = tiny_drafter(target, num_hidden_layers=1, block_size=4)
    shipped = tmp_path / "drafters"
    drafter.save_pretrained(shipped / "org" / "tiny-carryover-dflash")
    monkeypatch.setattr(demo, "SHIPPED_DRAFTERS", shipped)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    source, options = demo.resolve_drafter("org/tiny-carryover-dflash")
    assert source == "org/tiny-carryover-dflash" and options == {"local_files_only": True}
    assert (tmp_path / "cache" / "models--org--tiny-carryover-dflash" / "refs" / "main").is_file()
    loaded = AutoModel.from_pretrained("org/tiny-carryover-dflash", cache_dir=tmp_path / "cache")
    assert isinstance(loaded, CarryoverDrafterModel)
    for name, tensor in drafter.state_dict().items():
        assert loaded.state_dict()[name].equal(tensor), name
    assert demo.resolve_drafter("org/tiny-carryover-dflash") == (source, options)  # a second install is a no-op

    with pytest.raises(FileNotFoundError, match="shipped drafters: \\['org/tiny-carryover-dflash'\\]"):
        demo.resolve_drafter("./missing-folder")
