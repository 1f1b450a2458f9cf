"""The benchmark harness end to end on tiny random models: every method runs, the report is complete, the gate works.

Timing values are recorded but never asserted.
"""

import copy
import json

import pytest
import torch

import carryover_hf
from carryover_hf.tools.bench import BenchmarkSettings, CorrectnessError, check_greedy_output, run_benchmark, tiny_prompts
from carryover_hf.tools.bench import runner as runner_module
from carryover_hf.hub.native import NativeDFlashUnavailable, to_native_dflash
from carryover_hf.tools.bench.runner import Method, run_method
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target

VOCAB = 32
TEMPERATURES = [0.0, 1.0]


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    # A skewed head makes target and drafter agree on runs of tokens, so acceptance is neither all 1 nor all full.
    target = skew_towards_token(tiny_target("qwen3", vocab_size=VOCAB, seed=3), 5, 1.0)
    drafters = {
        "d": tiny_drafter(target, block_size=4, seed=0),
        "m": tiny_drafter(target, block_size=4, drafter_type="markov", seed=1),
    }
    return target, drafters


@pytest.fixture(scope="module")
def bench(models, tmp_path_factory):
    target, drafters = models
    out = tmp_path_factory.mktemp("bench")
    settings = BenchmarkSettings(
        temperatures=TEMPERATURES,
        max_new_tokens=12,
        bootstrap_resamples=200,
        overhead_context_lengths=[8, 16],
        overhead_repeats=3,
    )
    prompts = tiny_prompts(4, vocab_size=VOCAB)
    report = run_benchmark(target, drafters, prompts, settings=settings, output_dir=str(out), progress=False,
                           run_info={"test": True})
    return report, out, prompts


def test_report_files_are_complete(bench):
    _, out, _ = bench
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["schema"] == "carryover-hf-bench/1"
    for key in ("settings", "environment", "target", "drafters", "prompts", "methods", "correctness", "results", "overhead", "runs"):
        assert key in on_disk, key
    assert on_disk["environment"]["packages"]["transformers"] == __import__("transformers").__version__
    assert on_disk["settings"]["max_new_tokens"] == 12 and on_disk["settings"]["dtype"] == "float32"
    assert on_disk["run"] == {"test": True}
    markdown = (out / "results.md").read_text()
    for heading in ("## Temperature 0", "## Temperature 1", "Paired comparisons", "Speedup by category", "Carry overhead", "## Correctness"):
        assert heading in markdown
    for png in ("acceptance_by_position.png", "speedup_by_category.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_every_method_ran_on_every_prompt(bench):
    report, _, prompts = bench
    names = [m["name"] for m in report["methods"]]
    assert names == ["target", "prompt_lookup", "d/dflash_native", "d/carry_off", "d/carry_on", "d/rules", "d/policy",
                     "m/carry_off", "m/carry_on", "m/rules", "m/policy"]  # fmt: skip
    assert report["skipped_methods"] == [
        {"name": "m/dflash_native", "reason": "drafter_type='markov': Transformers' DFlash path has no Markov head"}
    ]
    assert len(report["runs"]) == len(TEMPERATURES) * len(prompts) * len(names)
    assert report["groups"] == ["all", "mixed", "repeat"]
    for block in report["results"]:
        assert set(block["summary"]) == set(names)
        for name, groups in block["summary"].items():
            overall = groups["all"]
            assert overall["prompts"] == len(prompts)
            for key in ("decode_tokens_per_second", "speedup", "end_to_end_tokens_per_second", "prefill_ms"):
                assert overall[key]["estimate"] is not None and overall[key]["ci_low"] is not None
            if name == "target":
                assert overall["speedup"]["estimate"] == pytest.approx(1.0)
                assert "acceptance_length_micro" not in overall
                continue
            for key in ("acceptance_length_micro", "acceptance_length_per_prompt", "drafting_ms_per_round", "verification_ms_per_round"):
                assert overall[key]["estimate"] is not None, (name, key)
            assert 1.0 <= overall["acceptance_length_micro"]["estimate"] <= 4.0
            rates = overall["position_acceptance"]["rates"]
            assert all(r is None or 0.0 <= r <= 1.0 for r in rates)
        assert len(block["summary"]["d/carry_on"]["all"]["position_acceptance"]["rates"]) == 3  # block_size - 1
        assert "mean_carry_rows" in block["summary"]["d/carry_on"]["all"]


def test_token_accounting_is_consistent(bench):
    report, _, _ = bench
    for run in report["runs"]:
        assert run["new_tokens"] == run["prefill_tokens"] + run["decode_tokens"] == 12
        if run["method"] != "target":
            # every decoding round adds its acceptance length, bonus included
            assert sum(run["acceptance_lengths"]) == run["decode_tokens"]
            assert len(run["acceptance_lengths"]) == len(run["draft_lengths"])
            assert all(a - 1 <= d for a, d in zip(run["acceptance_lengths"], run["draft_lengths"]))
        if run["method"].endswith("carry_off"):
            assert set(run["carry_rows"]) == {0}
        if run["method"].endswith("carry_on") and run["temperature"] == 0.0:
            assert run["carry_rows"][0] == 0  # nothing to carry before the first verification


def test_greedy_outputs_pass_the_gate_identically_in_fp32(bench):
    report, _, prompts = bench
    correctness = report["correctness"]
    assert correctness["passed"] and correctness["tolerance"] == 0.0 and correctness["failures"] == []
    for method, result in correctness["by_method"].items():
        assert result["identical"] == result["prompts"] == len(prompts), method
    greedy = [r for r in report["runs"] if r["temperature"] == 0.0 and r["method"] != "target"]
    assert greedy and all(r["check"]["identical"] for r in greedy)
    assert all(r["check"] is None for r in report["runs"] if r["temperature"] > 0 or r["method"] == "target")


def test_native_dflash_and_carry_off_draft_the_same_greedy_rounds(bench):
    """Same weights, carry off: Transformers' DFlash path and ours must accept exactly the same drafts."""
    report, _, _ = bench
    greedy = {(r["method"], r["prompt_id"]): r for r in report["runs"] if r["temperature"] == 0.0}
    prompts = {r["prompt_id"] for r in report["runs"]}
    for prompt in prompts:
        native, ours = greedy[("d/dflash_native", prompt)], greedy[("d/carry_off", prompt)]
        assert native["acceptance_lengths"] == ours["acceptance_lengths"]
    assert any(a > 1 for r in greedy.values() if r["method"] == "d/carry_off" for a in r["acceptance_lengths"])


def test_comparisons_are_paired_and_signed(bench):
    report, _, _ = bench
    block = report["results"][0]
    pairs = {(c["a"], c["b"]): c for c in block["comparisons"]}
    assert ("d/carry_on", "d/carry_off") in pairs and ("d/carry_off", "d/dflash_native") in pairs
    assert ("m/carry_on", "d/carry_off") in pairs
    assert ("d/policy", "d/rules") in pairs and ("d/policy", "d/carry_on") in pairs
    summary = block["summary"]
    for (a, b), comparison in pairs.items():
        overall = comparison["all"]
        tau_a = summary[a]["all"]["acceptance_length_micro"]["estimate"]
        tau_b = summary[b]["all"]["acceptance_length_micro"]["estimate"]
        assert overall["acceptance_length_micro_difference"]["estimate"] == pytest.approx(tau_a - tau_b)
        assert overall["acceptance_length_relative_gain"]["estimate"] == pytest.approx(tau_a / tau_b - 1)
        assert overall["speed_ratio"]["estimate"] > 0


def test_overhead_is_measured_per_drafter_and_context_length(bench):
    report, _, _ = bench
    for name in ("d", "m"):
        result = report["overhead"][name]
        assert [row["context_length"] for row in result["by_context_length"]] == [8, 16]
        for row in result["by_context_length"]:
            assert row["carry_rows"] == 3
            assert len(row["times_ms_with_carry"]) == len(row["times_ms_without_carry"]) == 3
            assert row["overhead_ms"]["estimate"] == pytest.approx(
                row["ms_with_carry"]["estimate"] - row["ms_without_carry"]["estimate"]
            )
            # The target's 1-token step, timed in the same loop, and the proposal as a fraction of it.
            # (one before each proposal: 3 repeats x 2 proposals)
            assert len(row["times_ms_target_step"]) == 6 and row["target_step_ms"]["estimate"] > 0
            # Each proposal over the step right before it: the first half of the steps precede the proposals without carry.
            before_without_carry = row["times_ms_target_step"][:3]
            assert row["proposal_without_carry_per_target_step"]["estimate"] == pytest.approx(
                row["ms_without_carry"]["estimate"] / (sum(before_without_carry) / 3)
            )
        assert "target-alone greedy outputs" in result["context_source"]


def test_round_recorder_matches_the_drafters_own_statistics(models):
    target, drafters = models
    drafter = drafters["d"]
    settings = BenchmarkSettings(max_new_tokens=16)
    ids = torch.tensor([tiny_prompts(1, vocab_size=VOCAB)[0].input_ids])
    for carry in (False, True):
        method = Method("d/carry", "carry_on" if carry else "carry_off", "d", drafter, carry)
        _, measured = run_method(target, method, ids, 0.0, settings, seed=0)
        stats = drafter.last_generation_stats
        assert measured["acceptance_lengths"] == stats.acceptance_lengths
        assert measured["draft_lengths"] == stats.draft_lengths
        assert measured["carry_rows"] == stats.carry_rows
        assert drafter.generation_config.use_carryover is True  # restored after the call
        assert "_get_candidate_generator" not in vars(target)  # the per-call hook is removed


def test_gate_rules(models):
    target, _ = models
    prompt = torch.tensor([tiny_prompts(1, vocab_size=VOCAB)[0].input_ids])
    reference = target.generate(prompt, max_new_tokens=8, do_sample=False)[0, prompt.shape[1]:]
    assert check_greedy_output(target, prompt, reference, reference.clone(), 0.0)["passed"]

    logits = target(torch.cat([prompt[0], reference[:3]]).unsqueeze(0)).logits[0, -1]
    wrong = reference.clone()
    wrong[3] = int(logits.argmin())  # a token the target would never pick greedily
    strict = check_greedy_output(target, prompt, reference, wrong, 0.0)
    assert not strict["passed"] and strict["first_divergence"] == 3 and strict["agreement"] == pytest.approx(3 / 8)
    loose = check_greedy_output(target, prompt, reference, wrong, 1e-3)
    assert not loose["passed"] and loose["candidate_token_gap"] > 1e-3 and "tolerance" in loose["reason"]
    assert check_greedy_output(target, prompt, reference, wrong, 1e6)["passed"]  # within a (huge) tolerance
    shorter = check_greedy_output(target, prompt, reference, reference[:5], 1.0)
    assert not shorter["passed"] and "different lengths" in shorter["reason"]


def test_wrong_text_withholds_speed_and_raises(models, tmp_path, monkeypatch):
    target, _ = models
    original = runner_module.run_method

    def corrupting(target, method, input_ids, temperature, settings, seed, max_new_tokens=None):
        tokens, measured = original(target, method, input_ids, temperature, settings, seed, max_new_tokens)
        if method.name == "prompt_lookup":
            tokens = tokens.clone()
            tokens[-1] = (tokens[-1] + 1) % VOCAB
        return tokens, measured

    monkeypatch.setattr(runner_module, "run_method", corrupting)
    settings = BenchmarkSettings(temperatures=[0.0], max_new_tokens=6, methods=["target", "prompt_lookup"],
                                 bootstrap_resamples=200, overhead=False, warmup=0)
    with pytest.raises(CorrectnessError, match="speed withheld"):
        run_benchmark(target, {}, tiny_prompts(2, vocab_size=VOCAB), settings=settings, output_dir=str(tmp_path), progress=False)
    report = json.loads((tmp_path / "results.json").read_text())
    assert not report["correctness"]["passed"]
    assert {f["method"] for f in report["correctness"]["failures"]} == {"prompt_lookup"}
    summary = report["results"][0]["summary"]["prompt_lookup"]["all"]
    assert "speed_withheld" in summary and "speedup" not in summary and "decode_tokens_per_second" not in summary
    assert "FAILED" in (tmp_path / "results.md").read_text()


def test_native_export_refuses_markov_drafters(models):
    _, drafters = models
    with pytest.raises(NativeDFlashUnavailable, match="Markov"):
        to_native_dflash(drafters["m"])


def test_native_export_refuses_a_draft_vocabulary_with_the_reason(models):
    _, drafters = models
    drafter = copy.deepcopy(drafters["d"])
    drafter.set_draft_vocabulary(list(range(0, drafter.config.vocab_size, 2)))
    with pytest.raises(NativeDFlashUnavailable, match="draft_vocab_size=.*proposals differ"):
        to_native_dflash(drafter)


def test_bad_settings_fail_before_any_generation(models, monkeypatch):
    target, drafters = models
    monkeypatch.setattr(runner_module, "run_method", lambda *a, **k: pytest.fail("generation started"))
    prompts = tiny_prompts(2, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="unknown methods"):
        run_benchmark(target, drafters, prompts, settings=BenchmarkSettings(methods=["target", "medusa"]), progress=False)
    with pytest.raises(ValueError, match="unknown method"):
        run_benchmark(target, drafters, prompts, settings=BenchmarkSettings(compare=["d/carry_on,x/carry_off"], overhead=False),
                      progress=False)
    other = tiny_drafter(tiny_target("qwen3", vocab_size=VOCAB + 8), block_size=4)
    with pytest.raises(carryover_hf.DrafterTargetMismatchError):
        run_benchmark(target, {"other": other}, prompts, settings=BenchmarkSettings(overhead=False), progress=False)
    with pytest.raises(ValueError, match="exceed the target's 512 positions"):
        run_benchmark(target, drafters, prompts, settings=BenchmarkSettings(max_new_tokens=600, overhead=False), progress=False)
    with pytest.raises(ValueError, match="temperatures are repeated"):
        run_benchmark(target, drafters, prompts, settings=BenchmarkSettings(temperatures=[0.0, 0.0]), progress=False)


def test_bfloat16_greedy_outputs_may_only_part_at_near_ties():
    target = skew_towards_token(tiny_target("qwen3", vocab_size=VOCAB, seed=3, dtype=torch.bfloat16), 5, 1.0)
    drafter = tiny_drafter(target, block_size=4)
    settings = BenchmarkSettings(temperatures=[0.0], max_new_tokens=16, methods=["target", "carry_on"],
                                 bootstrap_resamples=200, overhead=False, warmup=0)
    report = run_benchmark(target, {"d": drafter}, tiny_prompts(4, vocab_size=VOCAB), settings=settings, progress=False)
    correctness = report["correctness"]
    assert correctness["passed"] and correctness["tolerance"] == 1.0  # the stated bf16 default
    for run in report["runs"]:
        if run["check"] and not run["check"]["identical"]:
            assert run["check"]["reference_token_gap"] <= 1.0 and run["check"]["max_gap_after_divergence"] <= 1.0


def test_overhead_context_beyond_the_target_fails_before_generation(models, monkeypatch):
    target, drafters = models
    monkeypatch.setattr(runner_module, "run_method", lambda *a, **k: pytest.fail("generation started"))
    settings = BenchmarkSettings(overhead_context_lengths=[128, 1024])
    with pytest.raises(ValueError, match="lower --overhead-context-lengths"):
        run_benchmark(target, drafters, tiny_prompts(2, vocab_size=VOCAB), settings=settings, progress=False)


def test_round_profile_and_adaptive_length_methods(models, tmp_path):
    """Per round: proposal, verification and rest of the loop, each over the target's 1-token step of the same run;
    `--draft-confidence-thresholds` adds adaptive-length methods compared with their full-block counterparts."""
    target, drafters = models
    drafter = drafters["d"]
    settings = BenchmarkSettings(temperatures=[0.0], max_new_tokens=12, methods=["target", "carry_on"],
                                 draft_confidence_thresholds=[0.3], proposal_backoffs=[2], bootstrap_resamples=200,
                                 overhead=False, warmup=0)  # fmt: skip
    report = run_benchmark(target, {"d": drafter}, tiny_prompts(4, vocab_size=VOCAB), settings=settings,
                           output_dir=str(tmp_path), progress=False)
    assert [m["name"] for m in report["methods"]] == [
        "target", "d/carry_on", "d/carry_on+backoff2", "d/carry_on@0.3", "d/carry_on@0.3+backoff2"]
    assert report["methods"][3]["draft_confidence_threshold"] == 0.3 and report["methods"][1]["draft_confidence_threshold"] is None
    assert report["methods"][4]["proposal_backoff"] == 2 and report["methods"][3]["proposal_backoff"] is None
    assert report["correctness"]["passed"]
    block = report["results"][0]
    target_step = block["summary"]["target"]["all"]
    runs = [r for r in report["runs"] if r["method"] == "target"]
    step_ms = 1000 * sum(r["decode_time"] for r in runs) / sum(r["decode_tokens"] for r in runs)
    for name in ("d/carry_on", "d/carry_on@0.3"):
        summary = block["summary"][name]["all"]
        profile = summary["round_profile"]
        assert profile["target_step_ms"]["estimate"] == pytest.approx(step_ms)
        for part, key in (("proposal", "drafting_ms_per_round"), ("verification", "verification_ms_per_round"),
                          ("rest", "rest_ms_per_round")):
            assert profile[f"{part}_per_target_step"]["estimate"] == pytest.approx(summary[key]["estimate"] / step_ms)
    assert "round_profile" not in target_step
    pairs = {(c["a"], c["b"]) for c in block["comparisons"]}
    assert {("d/carry_on@0.3", "d/carry_on"), ("d/carry_on+backoff2", "d/carry_on"), ("d/carry_on@0.3+backoff2", "d/carry_on")} <= pairs
    backed_off = [r for r in report["runs"] if r["method"] == "d/carry_on+backoff2"]
    assert sum(r["draft_lengths"].count(0) for r in backed_off) > 0  # skipped rounds are plain steps
    adaptive = [r for r in report["runs"] if r["method"] == "d/carry_on@0.3"]
    full = [r for r in report["runs"] if r["method"] == "d/carry_on"]
    assert sum(sum(r["draft_lengths"]) for r in adaptive) < sum(sum(r["draft_lengths"]) for r in full)
    assert all(r["rest_time"] > 0 for r in adaptive + full)
    assert drafter.generation_config.draft_confidence_threshold is None and drafter.generation_config.use_carryover  # never changed
    assert "### Round profile" in (tmp_path / "results.md").read_text()


def test_lookup_methods_are_compared_with_the_plain_drafter_and_prompt_lookup(models):
    target, drafters = models
    drafter = drafters["d"]
    settings = BenchmarkSettings(temperatures=[0.0], max_new_tokens=16, methods=["target", "prompt_lookup", "carry_off"],
                                 lookup_drafts=[6], bootstrap_resamples=200, overhead=False, warmup=0)  # fmt: skip
    report = run_benchmark(target, {"d": drafter}, tiny_prompts(3, vocab_size=VOCAB), settings=settings, progress=False)
    assert [m["name"] for m in report["methods"]] == ["target", "prompt_lookup", "d/carry_off", "d/carry_off+lookup6"]
    assert report["methods"][3]["lookup_drafts"] == 6 and report["methods"][2]["lookup_drafts"] is None
    assert report["correctness"]["passed"]
    pairs = {(c["a"], c["b"]) for c in report["results"][0]["comparisons"]}
    assert {("d/carry_off+lookup6", "d/carry_off"), ("d/carry_off+lookup6", "prompt_lookup")} <= pairs
    looked_up = [r for r in report["runs"] if r["method"] == "d/carry_off+lookup6"]
    assert max(max(r["draft_lengths"], default=0) for r in looked_up) > drafter.config.block_size - 1  # lookups ran
    assert drafter.generation_config.lookup_drafts is None  # per-call option: the drafter's config is never changed


def test_methods_ignore_the_proposal_defaults_a_drafter_is_published_with(models):
    """The shipped drafters carry lookup and backoff defaults; a benchmark's methods set every option themselves, so
    the plain method still measures the drafter alone and +lookup exactly the lookup it names: the rounds are those of
    the same drafter without defaults."""
    target, drafters = models
    drafter = drafters["d"]
    settings = BenchmarkSettings(temperatures=[0.0], max_new_tokens=16, methods=["target", "carry_off"],
                                 lookup_drafts=[6], bootstrap_resamples=200, overhead=False, warmup=0)  # fmt: skip

    def rounds() -> dict:
        report = run_benchmark(target, {"d": drafter}, tiny_prompts(3, vocab_size=VOCAB), settings=settings,
                               progress=False)  # fmt: skip
        assert report["correctness"]["passed"]
        return {(r["method"], r["prompt_id"]): (r["draft_lengths"], r["acceptance_lengths"]) for r in report["runs"]}

    without = rounds()
    drafter.generation_config.lookup_drafts, drafter.generation_config.proposal_backoff = 9, 2
    try:
        assert rounds() == without
    finally:
        drafter.generation_config.lookup_drafts, drafter.generation_config.proposal_backoff = None, None
    assert all(9 not in lengths for lengths, _ in without.values())


def test_lookup_drafts_must_be_positive():
    with pytest.raises(ValueError, match="lookup_drafts must be at least 1 token"):
        BenchmarkSettings(lookup_drafts=[0]).validate()


def test_lookup_backoff_methods(models):
    from carryover_hf.tools.bench.runner import _measures, build_methods, default_comparisons

    target, drafters = models
    base = dict(methods=["target", "carry_on"], lookup_drafts=[6], overhead=False, warmup=0)
    settings = BenchmarkSettings(**base, lookup_backoffs=[4])
    methods, _ = build_methods(drafters, settings)
    names = [m.name for m in methods]
    assert {"d/carry_on", "d/carry_on+lookup6", "d/carry_on+lookup6+lookupbackoff4"} <= set(names)
    assert not any(n.endswith("carry_on+lookupbackoff4") for n in names)  # no lookup, nothing to hold back
    held = next(m for m in methods if m.name == "d/carry_on+lookup6+lookupbackoff4")
    assert held.generation_options(settings)["lookup_backoff"] == 4 and held.describe()["lookup_backoff"] == 4
    assert ("d/carry_on+lookup6+lookupbackoff4", "d/carry_on+lookup6") in default_comparisons(methods, ["d"])

    # What a run measures names every setting and method field (no journal-resume shims).
    plain, _ = build_methods(drafters, BenchmarkSettings(**base))
    measures = _measures(target, drafters, plain, [], {}, BenchmarkSettings(**base), 0.0, None)
    assert measures["settings"]["lookup_backoffs"] == [] and all("lookup_backoff" in m for m in measures["methods"])

    with pytest.raises(ValueError, match="give --lookup_drafts too"):
        BenchmarkSettings(lookup_backoffs=[4]).validate()
    with pytest.raises(ValueError, match="lookup_backoffs must be at least 1 round"):
        BenchmarkSettings(lookup_drafts=[6], lookup_backoffs=[0]).validate()


def test_keep_methods_trims_the_cross_product_of_variants(models):
    from carryover_hf.tools.bench.runner import build_methods

    _, drafters = models
    settings = BenchmarkSettings(methods=["target", "prompt_lookup", "dflash_native", "carry_off", "carry_on"],
                                 proposal_backoffs=[8], lookup_drafts=[10],
                                 keep_methods=["prompt_lookup", "d/carry_on", "d/carry_off", "*+backoff8+lookup10",
                                               "m/dflash_native"])  # fmt: skip
    methods, skipped = build_methods(drafters, settings)
    assert [m.name for m in methods] == [
        "target", "prompt_lookup", "d/carry_off", "d/carry_off+backoff8+lookup10", "d/carry_on",
        "d/carry_on+backoff8+lookup10", "m/carry_off+backoff8+lookup10", "m/carry_on+backoff8+lookup10",
    ]  # fmt: skip
    assert [s["name"] for s in skipped] == ["m/dflash_native"]  # kept, but a Markov drafter has no native path: said
    with pytest.raises(ValueError, match=r"--keep_methods \['d/carry_on@0.5'\] match no method; the options make"):
        build_methods(drafters, BenchmarkSettings(keep_methods=["d/carry_on@0.5"]))


def test_rules_and_policy_run_what_a_plain_generate_call_runs(models):
    """`rules` is the drafter's own proposal defaults (here a 9-token lookup), `policy` the cost-aware round policy
    with the verification cost the run names; both pass the greedy gate."""
    target, drafters = models
    drafter = drafters["d"]
    settings = BenchmarkSettings(temperatures=[0.0], max_new_tokens=16, methods=["target", "rules", "policy"],
                                 verification_cost="flat", bootstrap_resamples=200, overhead=False, warmup=0)  # fmt: skip
    drafter.generation_config.lookup_drafts = 9
    try:
        report = run_benchmark(target, {"d": drafter}, tiny_prompts(3, vocab_size=VOCAB), settings=settings,
                               progress=False)  # fmt: skip
    finally:
        drafter.generation_config.lookup_drafts = None
    assert [m["name"] for m in report["methods"]] == ["target", "d/rules", "d/policy"]
    assert report["correctness"]["passed"]
    assert ("d/policy", "d/rules") in {(c["a"], c["b"]) for c in report["results"][0]["comparisons"]}
    lengths = {m: [n for r in report["runs"] if r["method"] == m for n in r["draft_lengths"]] for m in ("d/rules", "d/policy")}
    assert 9 in lengths["d/rules"]  # the drafter's lookup default ran
    # Verification costs nothing: the policy drafts in every round, a full block or more; only a last round with one
    # token left to generate has nothing to draft.
    policy_runs = [r["draft_lengths"] for r in report["runs"] if r["method"] == "d/policy"]
    assert all(n >= 1 for lengths_ in policy_runs for n in lengths_[:-1])
    assert max(lengths["d/policy"]) >= drafter.config.block_size - 1  # a suffix match may offer more
    # The policy's own time is recorded per run and set against the target's step in the round profile.
    assert all(r["planning_time"] > 0 for r in report["runs"] if r["method"] != "target")
    profile = report["results"][0]["summary"]["d/policy"]["all"]["round_profile"]
    assert profile["planning_per_target_step"]["estimate"] > 0


def test_policy_alone_runs_the_cost_policy_with_the_drafter_as_its_only_source(models):
    """`policy_alone` (asked for by name: not in the default methods) is `round_policy="cost"` with
    `suffix_match=False` and carry off whatever the drafter's config says: never more drafts than a block holds, no
    carry rows, compared with full blocks and with the policy."""
    target, drafters = models
    drafter = drafters["d"]
    assert "policy_alone" not in BenchmarkSettings().methods
    settings = BenchmarkSettings(temperatures=[0.0], max_new_tokens=16, verification_cost="flat", warmup=0,
                                 methods=["target", "carry_on", "policy", "policy_alone"], bootstrap_resamples=200,
                                 overhead=False)  # fmt: skip
    report = run_benchmark(target, {"d": drafter}, tiny_prompts(3, vocab_size=VOCAB), settings=settings, progress=False)
    assert [m["name"] for m in report["methods"]] == ["target", "d/carry_on", "d/policy", "d/policy_alone"]
    assert report["correctness"]["passed"]
    runs = [r["draft_lengths"] for r in report["runs"] if r["method"] == "d/policy_alone"]
    assert all(1 <= n <= drafter.config.block_size - 1 for lengths in runs for n in lengths[:-1]), runs
    pairs = {(c["a"], c["b"]) for c in report["results"][0]["comparisons"]}
    assert {("d/policy_alone", "d/carry_on"), ("d/policy", "d/policy_alone")} <= pairs
    # The drafter's config carries (`use_carryover` True, as a campaign milestone's): `policy` follows it, the
    # drafter alone does not.
    assert drafter.generation_config.use_carryover is True
    carried = {m: [n for r in report["runs"] if r["method"] == m for n in r["carry_rows"] or []]
               for m in ("d/policy", "d/policy_alone")}  # fmt: skip
    assert any(carried["d/policy"]) and carried["d/policy_alone"] and not any(carried["d/policy_alone"]), carried


@pytest.mark.parametrize("value", ["0.5", "1,0", "a,b", "cheap"])
def test_verification_cost_is_checked_before_loading(value):
    with pytest.raises(ValueError, match="--verification_cost must be"):
        BenchmarkSettings(verification_cost=value).validate()
    BenchmarkSettings(verification_cost="1,1.2,1.4").validate()
    BenchmarkSettings(verification_cost="flat").validate()
