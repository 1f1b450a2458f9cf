"""A benchmark that survives its session: the run journal, `resume`, partial reports and the fingerprint check."""

import json

import pytest
import torch

from carryover_hf.tools.bench import BenchmarkSettings, run_benchmark, tiny_prompts
from carryover_hf.tools.bench import runner as runner_module
from carryover_hf.tools.bench.journal import FILE_NAME, JournalError
from carryover_hf.tools.bench.prompts import Prompt
from carryover_hf.tools.bench.report import machine
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target

VOCAB = 32


@pytest.fixture(scope="module")
def models():
    target = skew_towards_token(tiny_target("qwen3", vocab_size=VOCAB, seed=3), 5, 1.0)
    return target, {"d": tiny_drafter(target, block_size=4, seed=0)}


def _settings(**overrides):
    base = dict(temperatures=[0.0, 1.0], max_new_tokens=10, methods=["target", "prompt_lookup", "carry_on"],
                bootstrap_resamples=200, overhead_context_lengths=[8], overhead_repeats=2, warmup=0)  # fmt: skip
    return BenchmarkSettings(**{**base, **overrides})


def _bench(models, out, **kwargs):
    target, drafters = models
    settings = kwargs.pop("settings", None) or _settings()
    return run_benchmark(target, kwargs.pop("drafters", drafters), tiny_prompts(4, vocab_size=VOCAB),
                         settings=settings, output_dir=str(out), progress=False, **kwargs)  # fmt: skip


def _measured(report):
    """What a run measured apart from times: (temperature, method, prompt) -> tokens, rounds, drafts, gate."""
    return {
        (r["temperature"], r["method"], r["prompt_id"]): (r["new_tokens"], r["acceptance_lengths"], r["draft_lengths"],
                                                          None if r["check"] is None else r["check"]["identical"])
        for r in report["runs"]
    }  # fmt: skip


class _Killed(Exception):
    pass


def _kill_after(monkeypatch, calls):
    """Make the benchmark process 'die' at its `calls`-th generation (the middle of a prompt group)."""
    original, count = runner_module.run_method, [0]

    def dying(*args, **kwargs):
        count[0] += 1
        if count[0] == calls:
            raise _Killed
        return original(*args, **kwargs)

    monkeypatch.setattr(runner_module, "run_method", dying)


def test_an_interrupted_run_resumes_to_what_one_run_measures(models, tmp_path, monkeypatch):
    whole = _bench(models, tmp_path / "whole")
    assert whole["progress"]["complete"] and whole["progress"]["prompt_groups"] == 8

    out = tmp_path / "resumed"
    _kill_after(monkeypatch, 3 * 3 + 2)  # 3 methods a group: dies inside the fourth group
    with pytest.raises(_Killed):
        _bench(models, out)
    lines = (out / FILE_NAME).read_text().splitlines()
    assert [next(iter(json.loads(line))) for line in lines] == ["journal", "segment", "group", "group", "group"]
    monkeypatch.undo()

    # Nothing measured yet in this invocation: a report of the three journaled groups, marked partial.
    partial = _bench(models, out, resume=True, time_limit=0.0)
    assert partial["progress"] == {**partial["progress"], "complete": False, "prompt_groups": 3, "prompt_groups_total": 8}
    assert len(partial["runs"]) == 9 and not partial["overhead"]
    # The first groups alternate between the two categories (a run stopped early covers both).
    assert sorted(partial["prompts"]["by_category"]) == ["mixed", "repeat"]
    assert {r["category"] for r in partial["runs"]} == {"mixed", "repeat"}
    assert "**Partial run**: 3 of 8 prompt groups" in (out / "results.md").read_text()

    resumed = _bench(models, out, resume=True)
    assert resumed["progress"]["complete"] and resumed["overhead"]  # the overhead runs once all groups are in
    assert len(resumed["runs"]) == len(whole["runs"]) == 24
    assert _measured(resumed) == _measured(whole)  # same tokens, rounds and gate: each group once, none lost
    assert resumed["correctness"] == whole["correctness"]
    segments = resumed["progress"]["segments"]
    assert [s["segment"] for s in segments] == [1, 2]  # the time-limited call measured nothing, so no segment
    assert "Measured in 2 invocations" in (out / "results.md").read_text()
    for block, other in zip(resumed["results"], whole["results"]):
        assert block["summary"]["d/carry_on"]["all"]["acceptance_length_micro"] == \
            other["summary"]["d/carry_on"]["all"]["acceptance_length_micro"]  # fmt: skip


def test_each_invocation_records_its_machine_and_a_mixed_run_says_so(models, tmp_path, monkeypatch):
    out = tmp_path / "two-machines"
    _kill_after(monkeypatch, 3 * 2 + 1)  # dies inside the third group: two groups journaled
    with pytest.raises(_Killed):
        _bench(models, out)
    monkeypatch.undo()
    first = json.loads((out / FILE_NAME).read_text().splitlines()[1])
    assert first["segment"] == 1 and first["machine"] == machine(torch.device("cpu")) != ""
    _bench(models, out, resume=True, time_limit=0.0)  # a report of the journaled groups: one machine so far
    assert "more than one machine" not in (out / "results.md").read_text()

    monkeypatch.setattr("carryover_hf.tools.bench.report.machine", lambda device: "Other CPU @ 1.00GHz")
    report = _bench(models, out, resume=True)
    assert [s["machine"] for s in report["progress"]["segments"]] == [first["machine"], "Other CPU @ 1.00GHz"]
    assert report["environment"]["machine"] == "Other CPU @ 1.00GHz"
    text = (out / "results.md").read_text()
    assert "**Timed on more than one machine**" in text and "invocation 2: Other CPU @ 1.00GHz" in text


def test_a_journal_of_another_benchmark_is_refused(models, tmp_path):
    out = tmp_path / "run"
    _bench(models, out, settings=_settings(temperatures=[0.0]), time_limit=0.0)
    with pytest.raises(JournalError, match="already holds a benchmark run; pass --resume"):
        _bench(models, out, settings=_settings(temperatures=[0.0]))
    with pytest.raises(JournalError, match=r"another benchmark \(different settings\)"):
        _bench(models, out, settings=_settings(temperatures=[0.0], max_new_tokens=11), resume=True)
    target, _ = models
    retrained = {"d": tiny_drafter(target, block_size=4, seed=1)}
    with pytest.raises(JournalError, match=r"different drafters\)"):
        _bench(models, out, settings=_settings(temperatures=[0.0]), drafters=retrained, resume=True)
    # Settings that only change the summary may differ; --overwrite starts again.
    report = _bench(models, out, settings=_settings(temperatures=[0.0], bootstrap_resamples=300), resume=True)
    assert report["progress"]["complete"]
    report = _bench(models, out, settings=_settings(temperatures=[0.0], max_new_tokens=11), overwrite=True)
    assert report["settings"]["max_new_tokens"] == 11 and report["progress"]["segments"][0]["segment"] == 1


def test_a_cut_off_last_line_is_measured_again_and_damage_is_an_error(models, tmp_path):
    out = tmp_path / "run"
    settings = _settings(temperatures=[0.0])
    first = _bench(models, out, settings=settings)
    journal = out / FILE_NAME
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # killed while writing the last group
    again = _bench(models, out, settings=settings, resume=True)
    assert again["progress"]["complete"] and _measured(again) == _measured(first)
    assert len(journal.read_text().splitlines()) == len(lines) + 1  # the group again, after a new segment line
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:2]) + "{not json\n" + "".join(lines[2:]))
    with pytest.raises(JournalError, match="line 3, does not parse"):
        _bench(models, out, settings=settings, resume=True)


def test_shards_fill_one_journal_to_what_one_run_measures(models, tmp_path):
    whole = _bench(models, tmp_path / "whole")
    out = tmp_path / "sharded"
    first = _bench(models, out, resume=True, shard=(1, 2))  # creates the journal, measures every other group
    assert first["progress"] == {**first["progress"], "complete": False, "prompt_groups": 4} and not first["overhead"]
    second = _bench(models, out, resume=True, shard=(2, 2))
    assert second["progress"]["complete"] and second["overhead"]  # the last shard to finish reports every group
    assert _measured(second) == _measured(whole) and len(second["runs"]) == 24
    groups = [json.loads(line)["group"] for line in (out / FILE_NAME).read_text().splitlines()[1:] if '"group"' in line]
    by_segment = {}
    for group in groups:
        by_segment.setdefault(group["segment"], []).append(group["index"])
    whole_order = [json.loads(line)["group"]["index"] for line in (tmp_path / "whole" / FILE_NAME).read_text()
                   .splitlines()[1:] if '"group"' in line]  # fmt: skip
    assert by_segment == {1: whole_order[0::2], 2: whole_order[1::2]}  # the k-th of every n in measuring order
    again = _bench(models, out, resume=True, shard=(1, 2))  # a finished share measures nothing more
    assert len((out / FILE_NAME).read_text().splitlines()) == 1 + 2 + 8 and again["progress"]["complete"]
    with pytest.raises(ValueError, match="1 <= K <= N"):
        _bench(models, out, resume=True, shard=(3, 2))
    with pytest.raises(ValueError, match="run every shard with resume=True"):
        _bench(models, tmp_path / "new", shard=(1, 2))


def _append_groups(path: str, worker: int, count: int) -> None:
    """One of several processes recording fake groups into one journal at once."""
    from carryover_hf.tools.bench.journal import RunJournal

    header = json.loads(open(path).readline())
    journal = RunJournal.open(path.rsplit("/", 1)[0], header["measures"], resume=True)
    for i in range(count):
        journal.record({"temperature": 0.0, "prompt_id": f"w{worker}/{i}", "runs": [], "pad": "x" * 20000})


def test_processes_sharing_a_journal_lose_and_garble_nothing(tmp_path):
    import multiprocessing

    from carryover_hf.tools.bench.journal import RunJournal, read_journal

    RunJournal.open(tmp_path, {"settings": {"x": 1}})
    # fork: the children touch no torch state, and start in milliseconds (spawn re-imports torch in each)
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    workers = [context.Process(target=_append_groups, args=(str(tmp_path / FILE_NAME), w, 30)) for w in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    _, segments, groups = read_journal(tmp_path / FILE_NAME)
    assert sorted(s["segment"] for s in segments) == [1, 2, 3]  # one number per process, none repeated
    assert sorted(g["prompt_id"] for g in groups) == sorted(f"w{w}/{i}" for w in range(3) for i in range(30))
    numbers = {w: {g["segment"] for g in groups if g["prompt_id"].startswith(f"w{w}/")} for w in range(3)}
    assert sorted(n for ns in numbers.values() for n in ns) == [1, 2, 3]  # each process's groups carry its number


def test_prompts_are_measured_round_robin_over_categories():
    prompts = [Prompt(id=str(i), category=c, input_ids=[1]) for i, c in enumerate("aaabbc")]
    assert runner_module._interleaved_by_category(prompts) == [0, 3, 5, 1, 4, 2]


def test_a_drafters_fingerprint_is_its_config_and_weights():
    """A journal fingerprints every drafter: other weights or another config field change it; its proposal defaults
    are not in its config (they are its generation_config: every method sets its own), so they cannot."""
    from pathlib import Path

    from transformers import AutoModel

    from carryover_hf.configuration_carryover import PROPOSAL_OPTIONS
    from carryover_hf.utils import model_fingerprint

    root = Path(__file__).resolve().parents[1]
    drafter = AutoModel.from_pretrained(root / "drafters/carryover-hf/smollm2-135m-carryover-dflash", dtype=torch.float32)
    recorded = model_fingerprint(drafter)
    for option, value in zip(PROPOSAL_OPTIONS, (0.5, 8, 10, 4)):
        setattr(drafter.generation_config, option, value)
    assert model_fingerprint(drafter) == recorded
    drafter.config.markov_rank = 128
    assert model_fingerprint(drafter) != recorded
    drafter.config.markov_rank = 256
    assert model_fingerprint(drafter) == recorded
    with torch.no_grad():
        drafter.fc.weight[0, 0] += 1.0
    assert model_fingerprint(drafter) != recorded


def _open_new_journal(output_dir: str, start) -> None:
    """One of several shards opening the same journal the moment `start` fires (none exists yet)."""
    from carryover_hf.tools.bench.journal import RunJournal

    start.wait(30)
    RunJournal.open(output_dir, {"settings": {"x": 1}}, resume=True)


def test_shards_creating_one_journal_at_once_all_open_it(tmp_path):
    """Shards started side by side on a fresh output folder: the journal appears whole or not at all, so the shards
    that lose the race read a complete header (an empty file made them fail with 'not a benchmark journal')."""
    import multiprocessing

    from carryover_hf.tools.bench.journal import read_journal

    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    for attempt in range(5):
        out = tmp_path / f"run{attempt}"
        start = context.Event()
        workers = [context.Process(target=_open_new_journal, args=(str(out), start)) for _ in range(4)]
        for worker in workers:
            worker.start()
        start.set()
        for worker in workers:
            worker.join(60)
        assert [worker.exitcode for worker in workers] == [0, 0, 0, 0]
        header, segments, groups = read_journal(out / FILE_NAME)
        assert header["measures"] == {"settings": {"x": 1}} and segments == [] and groups == []
        assert [p.name for p in out.iterdir()] == [FILE_NAME]  # no scratch file left behind
