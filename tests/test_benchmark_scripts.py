"""The journal analysis scripts under benchmarks/: what they compute from a journal's rounds."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sources = _load("journal_proposal_sources")


def test_round_kinds_follow_the_draft_count():
    assert sources.round_kind("carryover/carry_on+lookup10", 0, block_size=4) == "plain"
    assert sources.round_kind("carryover/carry_on+lookup10", 3, block_size=4) == "drafter"  # fits the block
    assert sources.round_kind("carryover/carry_on+lookup10", 10, block_size=4) == "lookup"
    assert sources.round_kind("prompt_lookup", 2, block_size=4) == "lookup"  # prompt lookup only looks up


def test_round_costs_are_recovered_from_whole_generation_times():
    rng = np.random.default_rng(1)
    rounds = rng.integers(0, 40, size=(30, 2)).astype(float)  # lookup and drafter rounds per prompt
    truth = np.array([1.7, 1.6])
    exact = sources.fit_round_costs(rounds, rounds @ truth, resamples=200)
    for cost, value in zip(exact, truth):
        assert cost["steps"] == pytest.approx(value)
        assert cost["interval"] == pytest.approx([value, value])  # no noise: every resample fits the same costs

    noisy = sources.fit_round_costs(rounds, rounds @ truth + rng.normal(0, 2.0, size=30), resamples=500)
    for cost, value in zip(noisy, truth):
        low, high = cost["interval"]
        assert low < cost["steps"] < high and high - low > 0.01
        assert low - 0.1 < value < high + 0.1


def test_a_kind_no_prompt_had_and_too_few_prompts_have_no_cost():
    rounds = np.array([[0.0, 5.0], [0.0, 9.0], [0.0, 2.0]])  # no lookup round anywhere
    lookup, drafter = sources.fit_round_costs(rounds, rounds[:, 1] * 1.8, resamples=50)
    assert lookup is None and drafter["steps"] == pytest.approx(1.8)
    assert sources.fit_round_costs(np.array([[3.0, 4.0], [1.0, 2.0]]), np.array([5.0, 2.0])) == [None, None]


def test_learning_efficiency_outputs_hold_one_base_and_one_budget(tmp_path):
    sweep = _load("learning_efficiency")
    recipe = {**sweep.BASE, **sweep.BASES["recipe"]}
    assert recipe["block"] == 4 and recipe["distillation"] == "kl" and recipe["distill_weight"] == 0.5
    path = tmp_path / "learning_efficiency.json"
    sweep._check_record(sweep._read(path), recipe, 600.0, path)  # a new output takes any sweep
    # the committed first sweep (its base was recorded before distill_weight existed) still counts as `first`
    first = sweep._read(SCRIPTS / "results" / "learning-efficiency" / "learning_efficiency.json")
    sweep._check_record(first, dict(sweep.BASE), first["budget_cpu_seconds"], path)
    with pytest.raises(SystemExit, match="holds runs of another base"):
        sweep._check_record(first, recipe, first["budget_cpu_seconds"], path)
    with pytest.raises(SystemExit, match="not 600; give another --output"):
        sweep._check_record(first, dict(sweep.BASE), 600.0, path)


multiturn = _load("suffix_cache_multiturn")


def test_the_second_pass_rewords_the_user_turn_only():
    from carryover_hf.tools.bench.prompts import Prompt

    chat = Prompt("code/eval/1", "code", [{"role": "system", "content": "S"}, {"role": "user", "content": "Sort a list."}])
    again = multiturn.rephrase(chat, 1)
    assert again.id == "code/eval/1/again" and again.text[0] == {"role": "system", "content": "S"}
    assert again.text[1]["content"] == "Sort a list.\n\nCould you answer this again?"
    assert chat.text[1]["content"] == "Sort a list."  # the first pass's prompt is not changed
    assert multiturn.rephrase(Prompt("x", text="Hi"), 0).text == "Once more, please. Hi"


def test_multiturn_summary_pairs_methods_over_the_same_prompts():
    runs = []
    for i in range(6):
        for method, time in (("target", 2.0), ("policy", 1.0), ("policy+cache", 0.5)):
            runs.append({"prompt_id": f"p{i}", "pass": "first" if i < 3 else "second", "method": method,
                         "decode_tokens": 10, "decode_time": time * (1 + i / 10), "acceptance_lengths": [2, 3],
                         "planning_time": 0.001})  # fmt: skip
    summary = multiturn.summarize(runs, resamples=200)
    for scope in ("first", "second", "both"):
        assert summary[scope]["policy / target"]["estimate"] == pytest.approx(2.0)
        assert summary[scope]["policy+cache / policy"]["estimate"] == pytest.approx(2.0)
        assert summary[scope]["tau policy"] == pytest.approx(2.5)
        assert summary[scope]["planning ms per round policy"] == pytest.approx(0.5)  # 1 ms over 2 rounds
    assert summary["both"]["prompts"] == 6 and summary["first"]["prompts"] == 3
