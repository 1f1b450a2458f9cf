"""Benchmarks whose per-prompt rounds do not depend on the prompts before them (`--policy_memory`).

The cost-aware round policy learns across `generate` calls (acceptance memories, measured round costs: runtime state
on the drafter). With `warmup` (default) or `reset`, every timed call starts from one fixed state, so the rounds of a
prompt are the same whatever the order of the prompts and after a `--resume`; with `carry` they are not. The policy
runs here on fixed verification costs, so that its choices depend on acceptance alone, not on timings.
"""

import copy
import json

import pytest
import torch

from carryover_hf.round_policy import RoundPolicyState
from carryover_hf.tools.bench import BenchmarkSettings, run_benchmark, tiny_prompts
from carryover_hf.tools.bench import runner as runner_module
from carryover_hf.tools.bench.cli import main
from carryover_hf.tools.bench.journal import FILE_NAME, JournalError
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target

VOCAB = 32
COSTS = {"flat": "flat", "curve": "1,1.3,1.6,2.0"}


@pytest.fixture(scope="module")
def models():
    target = skew_towards_token(tiny_target("qwen3", vocab_size=VOCAB, seed=3), 5, 1.0)
    return target, tiny_drafter(target, block_size=4, seed=0)


@pytest.fixture(scope="module")
def prompts():
    return tiny_prompts(6, vocab_size=VOCAB)


def _settings(mode, cost="flat", **overrides):
    base = dict(temperatures=[0.0], max_new_tokens=24, methods=["target", "policy"], verification_cost=COSTS[cost],
                policy_memory=mode, overhead=False, bootstrap_resamples=200, warmup=1)  # fmt: skip
    return BenchmarkSettings(**{**base, **overrides})


def _bench(models, prompts, settings, out=None, **kwargs):
    """A run as a new process would make it: a drafter that has learnt nothing yet."""
    target, drafter = models
    return run_benchmark(target, {"d": copy.deepcopy(drafter)}, prompts, settings=settings, progress=False,
                         output_dir=None if out is None else str(out), **kwargs)  # fmt: skip


def _rounds(report):
    """prompt -> (acceptance lengths, draft lengths) of the policy's greedy calls."""
    policy = [r for r in report["runs"] if r["method"] == "d/policy"]
    return {r["prompt_id"]: (r["acceptance_lengths"], r["draft_lengths"]) for r in policy}


class _Killed(Exception):
    pass


@pytest.mark.parametrize("cost", sorted(COSTS))
@pytest.mark.parametrize("mode", ["warmup", "reset"])
def test_policy_rounds_do_not_depend_on_the_order_or_a_resume(models, prompts, mode, cost, tmp_path, monkeypatch):
    settings = _settings(mode, cost)
    forward = _bench(models, prompts, settings, tmp_path / "forward")
    backward = _bench(models, prompts[::-1], settings)
    assert _rounds(forward) == _rounds(backward) and len(_rounds(forward)) == len(prompts)

    # A run killed inside its third prompt group (2 warm-up calls, then 2 methods a group), resumed by a new process.
    out, original, calls = tmp_path / "resumed", runner_module.run_method, [0]

    def dying(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2 + 2 * 2 + 1:
            raise _Killed
        return original(*args, **kwargs)

    monkeypatch.setattr(runner_module, "run_method", dying)
    with pytest.raises(_Killed):
        _bench(models, prompts, settings, out)
    monkeypatch.undo()
    assert sum('"group"' in line for line in (out / FILE_NAME).read_text().splitlines()) == 2
    resumed = _bench(models, prompts, settings, out, resume=True)
    assert len(resumed["progress"]["segments"]) == 2
    assert _rounds(resumed) == _rounds(forward)

    memory = json.loads((tmp_path / "forward" / "results.json").read_text())["policy_memory"]
    assert memory["mode"] == mode and memory["order_independent"] and forward["settings"]["policy_memory"] == mode
    assert memory["warmup"] == ({"prompt": "tiny-0", "generations": 1, "max_new_tokens": 16, "temperature": 0.0}
                                if mode == "warmup" else None)  # fmt: skip
    assert f"--policy_memory {mode}" in (tmp_path / "forward" / "results.md").read_text()


@pytest.mark.parametrize("cost", sorted(COSTS))
def test_carrying_the_memory_over_makes_a_prompts_rounds_depend_on_the_ones_before(models, prompts, cost):
    """What the modes above prevent (and what every run did before them): the same prompts, in another order, draft
    other rounds."""
    settings = _settings("carry", cost)
    forward, backward = _rounds(_bench(models, prompts, settings)), _rounds(_bench(models, prompts[::-1], settings))
    assert any(forward[p] != backward[p] for p in forward)


def test_the_warm_up_is_what_every_timed_call_starts_from(models, prompts):
    """What the warm-up taught the policy is not a fresh drafter's state: `warmup` and `reset` draft other rounds."""
    warm = _rounds(_bench(models, prompts, _settings("warmup")))
    fresh = _rounds(_bench(models, prompts, _settings("reset")))
    assert any(warm[p] != fresh[p] for p in warm)


def test_a_drafter_snapshots_and_restores_what_its_round_policy_learnt(models):
    target, drafter = models
    drafter = copy.deepcopy(drafter)
    prompt = torch.tensor([tiny_prompts(3, vocab_size=VOCAB)[2].input_ids])
    config = copy.deepcopy(target.generation_config)
    config.update(max_new_tokens=24, do_sample=False, pad_token_id=0)
    # Carryover's options travel in the call's own config; fixed costs: the choices depend on acceptance alone
    config.round_policy, config.verification_cost = "cost", [1.0, 1.3, 1.6, 2.0]
    kwargs = dict(assistant_model=drafter, generation_config=config, attention_mask=torch.ones_like(prompt))

    def rounds():
        target.generate(prompt, **kwargs)
        stats = drafter.last_generation_stats
        return stats.acceptance_lengths, stats.draft_lengths

    empty = drafter.round_policy_state()
    assert len(empty) == 0 and repr(empty) == "RoundPolicyState(empty)"
    first = rounds()
    learnt = drafter.round_policy_state()
    assert len(learnt) == 1 and "acceptance" in repr(learnt)  # greedy with fixed costs: the acceptance memory only
    second = rounds()
    assert second != first  # the second call went on from the first
    drafter.restore_round_policy_state(learnt)
    assert rounds() == second and rounds() != second  # restored: the second call again, then the third
    drafter.restore_round_policy_state(learnt)
    assert rounds() == second
    drafter.reset_round_policy_state()
    assert len(drafter.round_policy_state()) == 0 and rounds() == first
    drafter.restore_round_policy_state(RoundPolicyState())
    assert rounds() == first
    with pytest.raises(TypeError, match="RoundPolicyState"):
        drafter.restore_round_policy_state({})


def test_the_journal_fingerprints_what_the_timed_calls_start_from(models, prompts, tmp_path):
    out = tmp_path / "run"
    _bench(models, prompts, _settings("warmup"), out, time_limit=0.0)
    with pytest.raises(JournalError, match=r"different settings"):  # the warm-up is what the policy starts from
        _bench(models, prompts, _settings("warmup", warmup=2), out, resume=True)
    with pytest.raises(JournalError, match=r"different settings"):
        _bench(models, prompts, _settings("reset"), out, resume=True)
    header = json.loads((out / FILE_NAME).read_text().splitlines()[0])
    measured = header["measures"]["settings"]
    assert measured["policy_memory"] == "warmup" and measured["warmup"] == 1

    out = tmp_path / "carry"  # as runs measured before the option: no policy_memory in the fingerprint
    _bench(models, prompts, _settings("carry"), out, time_limit=0.0)
    settings = json.loads((out / FILE_NAME).read_text().splitlines()[0])["measures"]["settings"]
    assert "policy_memory" not in settings and "warmup" not in settings
    _bench(models, prompts, _settings("reset", warmup=0), tmp_path / "reset", time_limit=0.0)
    # Under 'reset' the warm-up only warms kernels and caches: it may change on a resume
    _bench(models, prompts, _settings("reset", warmup=3), tmp_path / "reset", resume=True, time_limit=0.0)


def test_the_cli_takes_and_checks_the_option(capsys):
    assert main(["--target", "tiny", "--policy_memory", "sometimes", "--no-progress"]) == 2
    assert "policy_memory must be one of ['warmup', 'reset', 'carry'], got 'sometimes'" in capsys.readouterr().err
