"""Model cards: Hub metadata, evaluation table, and a usage snippet that runs against tiny models offline."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from carryover_hf.configuration_carryover import CarryoverDrafterConfig
from carryover_hf.hub import render_model_card
from carryover_hf.hub.card import format_evaluation
from carryover_hf.hub.local_cache import add_to_hub_cache
from carryover_hf.tools.testing import tiny_drafter, tiny_target

PROMPT_WORDS = ["speculative", "decoding", "works", "by"]


def save_tiny_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", *PROMPT_WORDS] + [f"w{i}" for i in range(len(PROMPT_WORDS) + 1, vocab_size)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", model_input_names=["input_ids", "attention_mask"]
    ).save_pretrained(folder)


def offline_env(cache: Path, home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_CACHE": str(cache),
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }


@pytest.fixture(scope="module")
def drafter():
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    return tiny_drafter(target, num_hidden_layers=1, block_size=4, target_name_or_path="org/tiny-target")


def test_card_carries_hub_metadata_and_the_evaluation_table(drafter, tmp_path):
    evaluation = [
        {
            "category": "translation",
            "acceptance_length": 2.5,
            "acceptance_length_ci": [2.41, 2.6],
            "speedup": 2.5,
            "speedup_ci": [2.4, 2.61],
        },
        {"category": "rag", "acceptance_length": 1.9},
    ]
    card = render_model_card(
        drafter.config,
        repo_id="org/tiny-carryover-dflash",
        evaluation=evaluation,
        training_data="recorded target responses to 1k prompts",
    )
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    assert loaded.data.base_model == "org/tiny-target"
    assert loaded.data.library_name == "transformers"
    assert loaded.data.pipeline_tag == "text-generation"
    assert loaded.data.license == "apache-2.0"
    assert {"carryover-hf", "speculative-decoding", "dflash", "carryover-dflash"} <= set(loaded.data.tags)
    text = loaded.text
    assert "| translation | 2.50 [2.41, 2.60] | 2.50x [2.40, 2.61] |" in text
    assert "| rag | 1.90 | — |" in text
    assert "recorded target responses to 1k prompts" in text
    assert "DFlash block objective" in text  # trained_with_carryover is False
    assert 'AutoModel.from_pretrained("org/tiny-carryover-dflash"' in text
    assert "assistant_model=drafter" in text


def test_card_without_evaluation_says_so_and_rejects_unknown_columns(drafter):
    assert "No evaluation results were recorded" in render_model_card(drafter.config).text
    with pytest.raises(ValueError, match="acceptance"):
        format_evaluation([{"category": "qa", "acceptence_length": 2.0}])


def test_card_names_the_proposal_defaults_the_drafter_is_published_with(drafter):
    assert "Proposal defaults" not in render_model_card(drafter.config).text  # none set: no row
    defaults = copy.deepcopy(drafter.generation_config)
    defaults.lookup_drafts, defaults.proposal_backoff = 10, 8
    text = render_model_card(drafter.config, generation_config=defaults).text
    assert ("| Proposal defaults | context lookup of 10 tokens in front of the drafter; proposal backoff 8 (a "
            "`generate` call that passes its own options overrides them) |") in text
    assert "Proposal defaults" not in render_model_card(drafter.config, generation_config=defaults,
                                                        export_format="speculators").text
    defaults.round_policy = "cost"  # the policy first, then what the rules would run
    assert ('| Proposal defaults | cost-aware round policy (`round_policy="cost"`: each round\'s source and number of '
            'drafts chosen by expected tokens per unit of cost on the machine it runs on); with `round_policy="rules"`: '
            "context lookup of 10 tokens") in render_model_card(drafter.config, generation_config=defaults).text
    # An old config.json that still holds them: the card reads them from there.
    old = CarryoverDrafterConfig.from_dict({**drafter.config.to_dict(), "lookup_drafts": 10, "proposal_backoff": 8})
    assert "context lookup of 10 tokens in front of the drafter; proposal backoff 8" in render_model_card(old).text


def test_markov_and_speculators_export_cards(tmp_path):
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    markov = tiny_drafter(target, drafter_type="markov", target_name_or_path="org/tiny-target")
    markov.config.trained_with_carryover = True
    text = render_model_card(markov.config, repo_id="org/tiny-carryover-markov").text
    assert "Markov" in text and "draft-verify-draft" in text
    plain = {"use_carryover": False}  # as export_speculators(carry=False) renders it
    export = render_model_card(markov.config, repo_id="org/tiny-speculators", export_format="speculators",
                               generation_config=plain)  # fmt: skip
    assert "speculators" in export.data.tags
    assert "without carryover" in export.text and "without the Markov head" in export.text
    assert '"method": "dflash"' in export.text and '"num_speculative_tokens": 3' in export.text
    carry = render_model_card(markov.config, repo_id="org/tiny-speculators", export_format="speculators",
                              generation_config={"use_carryover": True}).text  # fmt: skip
    assert "**with carryover**" in carry and "pip install carryover-hf" in carry and "without the Markov head" in carry


def test_card_of_a_draft_vocabulary_drafter_names_it_and_its_vllm_export():
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    drafter = tiny_drafter(target, target_name_or_path="org/tiny-target")
    full = render_model_card(drafter.config, repo_id="org/full").text
    assert "Draft vocabulary" not in full and "OUT --to vllm`" in full
    drafter.set_draft_vocabulary(list(range(0, 64, 2)))
    reduced = render_model_card(drafter.config, repo_id="org/reduced").text
    assert "| Draft vocabulary | 32 target token ids" in reduced
    assert "OUT --to vllm --target org/tiny-target`" in reduced and "the 32 draft ids" in reduced


def test_usage_snippet_runs_against_tiny_models_offline(tmp_path):
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    drafter = tiny_drafter(target, num_hidden_layers=1, block_size=4, target_name_or_path="org/tiny-target")
    target.save_pretrained(tmp_path / "target")
    save_tiny_tokenizer(tmp_path / "target", 64)
    drafter.save_pretrained(tmp_path / "drafter")
    card = render_model_card(drafter.config, repo_id="org/tiny-carryover-dflash")
    card.save(tmp_path / "drafter" / "README.md")
    cache = tmp_path / "cache"
    add_to_hub_cache(tmp_path / "target", "org/tiny-target", cache)
    add_to_hub_cache(tmp_path / "drafter", "org/tiny-carryover-dflash", cache)

    snippet = re.search(r"```python\n(.*?)```", card.text, re.DOTALL).group(1)
    (tmp_path / "snippet.py").write_text(snippet)
    result = subprocess.run(
        [sys.executable, str(tmp_path / "snippet.py")],
        env=offline_env(cache, tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    decoded, acceptance = result.stdout.strip().splitlines()[-2:]
    assert decoded.startswith("speculative decoding works by")
    assert float(acceptance) >= 1.0


def test_card_rows_from_a_bench_report_and_push_cli(drafter, tmp_path):
    import json

    from carryover_hf.hub.card import evaluation_from_bench
    from carryover_hf.hub.push import main as push_main

    report_path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "tiny-smoke" / "results.json"
    report = json.loads(report_path.read_text())
    rows = evaluation_from_bench(report, "tiny/carry_on", 0.0)
    summary = next(e for e in report["results"] if e["temperature"] == 0.0)["summary"]["tiny/carry_on"]
    assert [row["category"] for row in rows][-1] == "all" and len(rows) == len(summary)
    for row in rows:
        stats = summary[row["category"]]
        assert row["acceptance_length"] == stats["acceptance_length_per_prompt"]["estimate"]
        assert row["speedup_ci"] == [stats["speedup"]["ci_low"], stats["speedup"]["ci_high"]]
    with pytest.raises(ValueError, match="no method 'nope'"):
        evaluation_from_bench(report, "nope")
    with pytest.raises(ValueError, match="no results at temperature 0.5"):
        evaluation_from_bench(report, "tiny/carry_on", 0.5)

    drafter.save_pretrained(tmp_path / "saved")
    assert push_main([str(tmp_path / "saved"), "org/x", "--evaluation", str(report_path), "--dry-run", str(tmp_path / "a")]) == 1
    out = tmp_path / "b"
    assert push_main([str(tmp_path / "saved"), "org/x", "--evaluation", str(report_path), "--evaluation-method",
                      "tiny/carry_on", "--dtype", "bfloat16", "--carry", "off", "--dry-run", str(out)]) == 0  # fmt: skip
    assert json.loads((out / "generation_config.json").read_text())["use_carryover"] is False
    card = (out / "README.md").read_text()
    assert f"{rows[-1]['acceptance_length']:.2f} [{rows[-1]['acceptance_length_ci'][0]:.2f}" in card
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as weights:
        assert {str(weights.get_tensor(k).dtype) for k in weights.keys()} == {"torch.bfloat16"}
