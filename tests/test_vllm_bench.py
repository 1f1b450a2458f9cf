"""`carryover-hf vllm bench` without vLLM: the checks of its options, and what it makes of the worker's records (tokens
per second, latencies, greedy identity, acceptance length, ratios, the written results), with a fake worker.
`tests/test_vllm.py` runs vLLM itself."""

import json

import pytest

import carryover_hf.targets
from carryover_hf.errors import UsageError
from carryover_hf.tools import vllm_bench
from carryover_hf.tools.cli import main as cli_main
from carryover_hf.tools.vllm_check import VllmError


REFERENCE = [[1, 2, 3, 4], [5, 6, 7, 8]]


@pytest.mark.parametrize(
    "configs, concurrency, per_category, message",
    [
        (["vllm", "eagle"], [1], 1, "--configs: unknown eagle"),
        (["vllm"], [1, 0], 1, "--concurrency takes positive integers"),
        (["vllm"], [4, 16], 1, "--concurrency must include 1"),
        (["vllm"], [1], 0, "--per-category must be at least 1"),
    ],
)
def test_bad_settings_are_refused_with_the_option_named(configs, concurrency, per_category, message):
    with pytest.raises(UsageError, match=message):
        vllm_bench.check_settings(configs, concurrency, per_category, max_new_tokens=128)


def test_settings_run_vllm_first_and_each_level_once_in_order():
    configs, concurrency = vllm_bench.check_settings(["carry", "ngram"], [16, 1, 4, 16], 1, max_new_tokens=8)
    assert configs == ("vllm", "ngram", "carry")  # vLLM alone, the reference, always runs and runs first
    assert concurrency == (1, 4, 16)


@pytest.mark.parametrize("option", [["--concurrency", "4", "0"], ["--configs", "vllm", "eagle"]])
def test_the_command_refuses_bad_options_in_one_line_before_looking_for_vllm(option, capsys, monkeypatch):
    monkeypatch.setenv("CARRYOVER_HF_VLLM_PYTHON", "/nonexistent/python")  # would be the error if it came first
    assert cli_main(["vllm", "bench", *option]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("carryover-hf vllm: error: --") and "\n" not in error


def level(concurrency, seconds, tokens, drafts=None):
    """A worker's level record: request i took 1 + i seconds, its first token came after 0.1 s."""
    drafted, accepted = drafts or (0, 0)
    return {"concurrency": concurrency, "seconds": seconds,
            "requests": [{"tokens": ids, "latency": 1.0 + i, "first_token": 0.1} for i, ids in enumerate(tokens)],
            "spec_decode": {"drafts": drafted, "draft_tokens": 3 * drafted, "accepted_tokens": accepted,
                            "accepted_per_position": [accepted, 0, 0] if drafts else []}}  # fmt: skip


def test_level_summary_counts_tokens_latency_identity_and_acceptance():
    ours = [REFERENCE[0], [5, 6, 9, 8]]  # the second prompt differs from its third token on
    summary = vllm_bench.level_summary(level(4, 2.0, ours, drafts=(4, 6)), REFERENCE)
    assert summary["new_tokens"] == 8 and summary["tokens_per_second"] == 4.0
    assert summary["latency"] == {"p50": 1.5, "p90": pytest.approx(1.9), "mean": 1.5}
    assert summary["first_token"]["p50"] == pytest.approx(0.1)
    assert summary["identical"] == 1 and summary["differences"] == [{"prompt": 1, "first_difference": 2}]
    assert summary["acceptance_length"] == 2.5  # 1 + 6 accepted drafts over 4 verify steps
    assert "acceptance_length" not in vllm_bench.level_summary(level(1, 1.0, REFERENCE), REFERENCE)  # no drafter


def fake_worker(python, request, *, log_path, on_level, timeout=None):
    """vLLM alone gives `REFERENCE` at 8 tok/s at concurrency 1 and 16 at 4; n-gram is twice as fast, and at
    concurrency 4 its second output differs."""
    method = (request["speculative_config"] or {}).get("method")
    levels = []
    for concurrency in request["concurrency"]:
        seconds = 1.0 if concurrency == 1 else 0.5
        tokens = REFERENCE
        if method == "ngram":
            seconds /= 2
            tokens = REFERENCE if concurrency == 1 else [REFERENCE[0], [5, 6, 7, 0]]
        levels.append(level(concurrency, seconds, tokens, drafts=(4, 2) if method else None))
        on_level(levels[-1])
    return {"vllm_version": "0.32.0", "startup_seconds": 20.0, "levels": levels}


@pytest.fixture
def run_bench(monkeypatch):
    """`bench` on two prompts at concurrency 1 and 4, with a fake worker: no target, no drafter, no vLLM."""
    monkeypatch.setattr(carryover_hf.targets, "load_target", lambda target, dtype: (None, None))
    monkeypatch.setattr(vllm_bench, "held_out_prompts", lambda tokenizer, per_category, max_new_tokens: [[0], [1]])

    def run(worker, configs: list[str], progress=lambda line: None) -> dict:
        monkeypatch.setattr(vllm_bench, "run_worker", worker)
        return vllm_bench.bench(python="python", target="org/target", configs=configs, concurrency=[4, 1],
                                per_category=1, max_new_tokens=4, progress=progress)  # fmt: skip

    return run


@pytest.fixture
def result(run_bench):
    lines = []
    return run_bench(fake_worker, ["ngram", "suffix"], progress=lines.append), lines


def test_bench_compares_every_config_with_vllm_alone(result):
    result, lines = result
    configs = result["configs"]
    assert list(configs) == ["vllm", "ngram", "suffix"]
    assert [(lv["concurrency"], lv["tokens_per_second"], lv["ratio_to_vllm"]) for lv in configs["vllm"]["levels"]] == [
        (1, 8.0, 1.0), (4, 16.0, 1.0)]  # fmt: skip
    ngram = configs["ngram"]
    assert [lv["ratio_to_vllm"] for lv in ngram["levels"]] == [2.0, 2.0]
    assert [lv["identical"] for lv in ngram["levels"]] == [2, 1]  # against vLLM alone at concurrency 1
    assert ngram["levels"][0]["acceptance_length"] == 1.5
    assert ngram["speculative_config"] == vllm_bench.NGRAM and ngram["startup_seconds"] == 20.0
    assert "arctic-inference" in configs["suffix"]["unavailable"] and "levels" not in configs["suffix"]
    assert result["settings"]["concurrency"] == [1, 4] and result["settings"]["vllm"] == "0.32.0"
    assert len(lines) == 5 and "ngram c=4: 32.0 tok/s (2.00x vLLM)" in lines[3] and "identical 1/2" in lines[3]
    assert "suffix: not run" in lines[4]
    assert not vllm_bench.all_identical(result)


def test_results_are_written_as_json_markdown_and_a_plot(result, tmp_path):
    result, _ = result
    assert vllm_bench.write_results(result, tmp_path / "out") is None
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == result
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "| config | c = 1 | c = 4 |" in markdown
    assert "| n-gram (prompt lookup, 4 drafts) | 16.0 (2.00x) | 32.0 (2.00x) |" in markdown
    assert "| suffix decoding | unavailable | unavailable |" in markdown
    assert "| n-gram (prompt lookup, 4 drafts) | 2/2, τ 1.50 | 1/2, τ 1.50 |" in markdown
    assert (tmp_path / "out" / "throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_a_failed_config_is_recorded_with_the_levels_measured_before(run_bench):
    def failing_ngram(python, request, *, log_path, on_level, timeout=None):
        if (request["speculative_config"] or {}).get("method") == "ngram":
            on_level(level(1, 1.0, REFERENCE, drafts=(4, 2)))
            raise VllmError("vLLM's benchmark worker failed (exit 1)\nthe log")
        return fake_worker(python, request, log_path=log_path, on_level=on_level)

    result = run_bench(failing_ngram, ["ngram"])
    ngram = result["configs"]["ngram"]
    assert ngram["failed"].startswith("vLLM's benchmark worker failed") and len(ngram["levels"]) == 1
    assert "| n-gram (prompt lookup, 4 drafts) | 2/2, τ 1.50 | - |" in vllm_bench.format_markdown(result)
    assert not vllm_bench.all_identical(result)
