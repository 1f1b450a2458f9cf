"""The GPU job's check and profile stages (gpu_job/checks.py, gpu_job/round_profile.py) on the CPU with tiny models."""

import sys
import time
from pathlib import Path

import pytest
import torch


GPU_JOB = Path(__file__).resolve().parents[1] / "gpu_job"
sys.path.insert(0, str(GPU_JOB))

import checks  # noqa: E402
import round_profile as profile  # noqa: E402


def test_greedy_identity_holds_for_both_kinds_with_and_without_carry():
    result = checks.greedy_identity("cpu", num_prompts=6, max_new_tokens=24)
    assert set(result["results"]) == {"dflash/carry_on", "dflash/carry_off", "markov/carry_on", "markov/carry_off"}
    for name, counts in result["results"].items():
        assert counts["prompts"] + sum(s["kind"] == name.split("/")[0] for s in result["skipped"]) == 6, name
        assert counts["identical"] == counts["prompts"] > 0, (name, result["mismatches"])
        assert counts["eos_stops"] > 0 and counts["rounds"] > 0 and counts["mean_acceptance_length"] >= 1.0
    outcomes = {k: sum(c["outcomes"][k] for c in result["results"].values()) for k in ("zero", "partial", "full")}
    assert outcomes["zero"] > 0 and outcomes["full"] > 0, outcomes
    assert result["all_identical"] and not result["mismatches"] and not result["incomplete"]
    assert result["device"] == "cpu" and result["dtype"] == "float32"

    late = checks.greedy_identity("cpu", num_prompts=6, deadline=time.monotonic() - 1)
    assert late["incomplete"] and all(c["prompts"] == 0 for c in late["results"].values())


def test_first_difference():
    assert checks._first_difference([1, 2, 3], [1, 2, 3]) is None
    assert checks._first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert checks._first_difference([1, 2], [1, 2, 3]) == 2


@pytest.fixture(scope="module")
def chat_pair():
    from carryover_hf.tools.data.chat import tiny_chat_tokenizer
    from carryover_hf.tools.testing import tiny_drafter, tiny_target

    tokenizer = tiny_chat_tokenizer()
    target = tiny_target("llama", vocab_size=len(tokenizer), num_hidden_layers=2, seed=3,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return target, tokenizer, tiny_drafter(target, block_size=4, seed=4)


def test_bf16_divergence_records_identical_outputs_in_float32(chat_pair):
    target, tokenizer, drafter = chat_pair
    prompts = ["What is 2 + 2?", "Summarize the answer", "Translate the following text into English: hello"]
    result = checks.bf16_divergence(target, tokenizer, drafter, prompts, 12, time.monotonic() + 60)
    assert result["prompts_done"] == result["identical"] == 3 and result["diverged"] == 0, result
    assert result["first_divergence_positions"] == [] and not result["errors"] and not result["incomplete"]
    assert result["dtype"] == "float32" and result["device"] == "cpu"
    assert all(p["plain_new_tokens"] == p["assisted_new_tokens"] > 0 for p in result["per_prompt"])

    ids = [[5, 6, 7, 8], [9, 10, 11]]  # token ids, no template
    plain_text = checks.bf16_divergence(target, None, drafter, ids, 6, time.monotonic() + 60, chat_template=False)
    assert plain_text["identical"] == 2

    late = checks.bf16_divergence(target, tokenizer, drafter, prompts, 12, time.monotonic() - 1)
    assert late["prompts_done"] == 0 and late["incomplete"] and late["prompts_total"] == 3


def test_round_profile_on_a_tiny_target():
    result = profile.round_profile("cpu", torch.float32, "tiny", time.monotonic() + 60, context_lengths=(32, 64),
                                   repeats=3, warmup=1, generate_tokens=(4, 24))  # fmt: skip
    assert not result["incomplete"]
    assert [row["context_length"] for row in result["by_context_length"]] == [32, 64]
    for row in result["by_context_length"]:
        for key in ("target_step_ms", "verify16_ms", "proposal_ms_without_carry", "proposal_ms_with_carry",
                    "generate_round_ms", "plain_generate_ms_per_token"):  # fmt: skip
            assert row[key] > 0, (key, row)
        assert row["generate"]["rounds"] > 0 and row["rest_from_context_length"] == row["context_length"]
        speedup = row["predicted_speedup"]
        assert set(speedup["over_step"]) == {str(t) for t in profile.TAUS} and speedup["over_step"]["6.5"] > 0
    assert result["drafter"]["block_size"] == 16 and result["target"]["architecture"] == "Qwen3ForCausalLM"
    assert result["torch"] and result["transformers"] and result["device_name"] == "cpu"
    assert "| 32 |" in result["markdown"] and "| 64 |" in result["markdown"]

    late = profile.round_profile("cpu", torch.float32, "tiny", time.monotonic() - 1)
    assert late["incomplete"] and late["by_context_length"] == [] and "markdown" in late
