"""`carryover-hf bench` and its inputs: prompt files, drafter specs, bad input caught before loading models."""

import json

import pytest
import torch

from carryover_hf.tools.bench.cli import _drafter_spec, main
from carryover_hf.tools.bench.overhead import measure_carry_overhead
from carryover_hf.tools.bench.prompts import Prompt, encode_prompt, load_prompts
from carryover_hf.tools.testing import tiny_drafter, tiny_target


def _write_suite(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture
def suite(tmp_path):
    rows = [{"id": f"c{i}", "category": "code", "split": "test", "input_ids": [1, 2, 3, i]} for i in range(3)]
    rows += [{"id": f"m{i}", "category": "math", "split": "test" if i else "train", "input_ids": [4, 5, i]} for i in range(3)]
    return _write_suite(tmp_path / "suite.jsonl", rows)


def test_load_prompts_filters_and_takes_the_first_of_each_category(suite):
    prompts = load_prompts(suite, split="test", num_per_category=2)
    assert [p.id for p in prompts] == ["c0", "c1", "m1", "m2"]
    assert [p.id for p in load_prompts(suite, categories=["math"])] == ["m0", "m1", "m2"]


def test_load_prompts_errors_name_the_problem(suite, tmp_path):
    with pytest.raises(ValueError, match="fewer than 3 prompts in categories"):
        load_prompts(suite, split="test", num_per_category=3)
    with pytest.raises(ValueError, match="no category \\['poetry'\\]"):
        load_prompts(suite, categories=["poetry"])
    with pytest.raises(ValueError, match="no prompts in split 'dev'"):
        load_prompts(suite, split="dev")
    bad = _write_suite(tmp_path / "bad.jsonl", [{"category": "x"}])
    with pytest.raises(ValueError, match="bad.jsonl:1: each line needs"):
        load_prompts(bad)
    with pytest.raises(FileNotFoundError, match="No prompt file"):
        load_prompts(tmp_path / "missing.jsonl")


def test_suite_folder_with_turns_and_system(tmp_path):
    """The layout of `carryover-hf prompts build`: <split>/<category>.jsonl with `turns` and `system`."""
    for split in ("train", "eval"):
        (tmp_path / split).mkdir()
        for category in ("qa", "mt_bench"):
            rows = [{"id": f"{category}/{split}/{i}", "category": category, "split": split, "system": "Be brief." if i else None,
                     "turns": [f"question {i}", "follow-up"] if category == "mt_bench" else [f"question {i}"]}
                    for i in range(3)]
            _write_suite(tmp_path / split / f"{category}.jsonl", rows)
    prompts = load_prompts(tmp_path, num_per_category=2)
    assert [p.id for p in prompts] == ["mt_bench/eval/0", "mt_bench/eval/1", "qa/eval/0", "qa/eval/1"]
    assert prompts[0].text == [{"role": "user", "content": "question 0"}]
    assert prompts[1].text == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "question 1"}]
    assert prompts[0].meta["num_turns"] == 2 and prompts[2].meta["num_turns"] == 1
    assert [p.id for p in load_prompts(tmp_path, categories=["qa"], split="train")] == [f"qa/train/{i}" for i in range(3)]
    with pytest.raises(ValueError, match="no category \\['code'\\]"):
        load_prompts(tmp_path, categories=["code"])
    with pytest.raises(ValueError, match="no test/<category>.jsonl"):
        load_prompts(tmp_path, split="test")


def test_encode_prompt_needs_a_tokenizer_for_text():
    assert encode_prompt(Prompt("a", input_ids=[3, 4])).tolist() == [[3, 4]]
    with pytest.raises(ValueError, match="no tokenizer"):
        encode_prompt(Prompt("b", text="hello"))


def test_drafter_spec():
    assert _drafter_spec("base=ckpt/run1") == ("base", "ckpt/run1")
    assert _drafter_spec("ckpt/run1/") == ("run1", "ckpt/run1/")
    assert _drafter_spec("tiny-markov") == ("tiny-markov", "tiny-markov")


def test_cli_tiny_smoke_run_writes_a_report(tmp_path, suite):
    out = tmp_path / "report"
    code = main([
        "--target", "tiny", "--drafter", "tiny", "--prompts", str(suite), "--split", "test", "--num-prompts", "2",
        "--temperatures", "0", "--max-new-tokens", "6", "--methods", "target", "carry_off", "carry_on",
        "--bootstrap-resamples", "200", "--overhead-context-lengths", "8", "--overhead-repeats", "2",
        "--warmup", "0", "--no-progress", "--output-dir", str(out),
    ])
    assert code == 0
    report = json.loads((out / "results.json").read_text())
    assert [m["name"] for m in report["methods"]] == ["target", "tiny/carry_off", "tiny/carry_on"]
    assert report["prompts"]["by_category"] == {"code": 2, "math": 2}
    assert report["run"]["command"].startswith("carryover-hf bench --target tiny")
    kernels = report["run"]["cpu_kernels"]  # auto: float32 on CPU
    assert kernels["packed_linears"] > 0 and kernels["grouped_attention"] is True
    assert " · CPU kernels (packed linears, grouped-query attention) · " in (out / "results.md").read_text()
    assert (out / "results.md").is_file() and (out / "speedup_by_category.png").is_file()

    # The journaled run is not measured over by accident; the same command resumes it (nothing left to measure).
    again = ["--target", "tiny", "--drafter", "tiny", "--prompts", str(suite), "--split", "test", "--num-prompts", "2",
             "--temperatures", "0", "--max-new-tokens", "6", "--methods", "target", "carry_off", "carry_on",
             "--no-overhead", "--warmup", "0", "--no-progress", "--output-dir", str(out)]  # fmt: skip
    assert main(again) == 2
    assert main(again + ["--resume"]) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["progress"]["complete"] and resumed["runs"] == report["runs"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target", "tiny", "--methods", "medusa"], "unknown methods"),
        (["--target", "tiny", "--prompts", "no/such/file.jsonl"], "No prompt file"),
        (["--target", "tiny", "--drafter", "a=tiny", "a=tiny-markov"], "repeated"),
        (["--target", "tiny", "--drafter", "./no/such/drafter"], "does not exist"),
        (["--target", "tiny", "--packed_linears", "yes"], "'auto', 'on' or 'off'"),
        (["--target", "tiny", "--dtype", "bfloat16", "--packed_linears", "on"], "needs float32 on CPU"),
        (["--target", "tiny", "--dtype", "bfloat16", "--cpu_kernels", "on"], "--cpu_kernels on needs float32 on CPU"),
        (["--target", "tiny", "--resume"], "--resume needs the --output_dir"),
        (["--target", "tiny", "--output_dir", "x", "--resume", "--overwrite"], "exclude each other"),
        (["--target", "tiny", "--stop_after_minutes", "0"], "--stop_after_minutes must be positive"),
        (["--target", "tiny", "--output_dir", "x", "--resume", "--shard", "2"], "--shard takes K/N"),
        (["--target", "tiny", "--output_dir", "x", "--resume", "--shard", "3/2"], "a shard is K/N with 1 <= K <= N"),
        (["--target", "tiny", "--output_dir", "x", "--shard", "1/2"], "run every shard with resume=True (--resume)"),
        (["--target", "tiny", "--shard", "1/2"], "a shard needs an output_dir (--output_dir)"),
    ],
)
def test_cli_rejects_bad_input(argv, message, capsys):
    assert main(argv + ["--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_overhead_requires_a_long_enough_recording():
    target = tiny_target("qwen3", vocab_size=32)
    drafter = tiny_drafter(target, block_size=4)
    with pytest.raises(ValueError, match="needs 19"):
        measure_carry_overhead(target, drafter, torch.zeros(1, 10, dtype=torch.long), context_lengths=[16], repeats=2)
    result = measure_carry_overhead(
        target, drafter, torch.arange(24).remainder(32).unsqueeze(0), context_lengths=[4, 16], repeats=2, warmup=1,
        n_resamples=200, progress=False,
    )
    assert [row["context_length"] for row in result["by_context_length"]] == [4, 16]
    assert result["block_size"] == 4 and result["by_context_length"][0]["carry_rows"] == 3
    assert result["new_context_rows"] == 1 and {r["new_context_rows"] for r in result["by_context_length"]} == {1}
    with pytest.raises(ValueError, match=r"new_context_rows must lie in \[0, 4\)"):
        measure_carry_overhead(target, drafter, torch.arange(24).remainder(32).unsqueeze(0), context_lengths=[4, 16],
                               repeats=2, new_context_rows=4, progress=False)  # fmt: skip


def test_overhead_times_every_proposal_right_after_a_target_step(monkeypatch):
    """As in generate, where each proposal follows the target's verification forward: with and without carry, every
    timed proposal comes straight after a target step, so neither finds the drafter's weights left in the caches by
    the other (the earlier order ran the proposal without carry after another proposal in every repeat)."""
    target = tiny_target("qwen3", vocab_size=32)
    drafter = tiny_drafter(target, block_size=4)
    calls = []
    drafter_forward, target_forward = type(drafter).forward, type(target).forward

    def drafter_recording(self, *args, **kwargs):
        calls.append("carry" if kwargs.get("carry_features") is not None else "no carry")
        return drafter_forward(self, *args, **kwargs)

    def target_recording(self, *args, **kwargs):
        calls.append("target")
        return target_forward(self, *args, **kwargs)

    monkeypatch.setattr(type(drafter), "forward", drafter_recording)
    monkeypatch.setattr(type(target), "forward", target_recording)
    measure_carry_overhead(target, drafter, torch.arange(24).remainder(32).unsqueeze(0), context_lengths=[12],
                           repeats=3, warmup=1, n_resamples=200, progress=False)  # fmt: skip
    # recording pass, buffer fill, target cache prefill; then 4 steps (1 warm-up + 3) x 2 (target step, proposal)
    setup, timed = calls[:3], calls[3:]
    assert setup == ["target", "no carry", "target"]
    assert timed[0::2] == ["target"] * 8
    assert timed[1::2] == ["no carry", "carry", "carry", "no carry", "no carry", "carry", "carry", "no carry"]


def test_overhead_proposals_fuse_the_new_context_rows_a_round_brings(monkeypatch):
    """Each timed proposal passes the round's new context rows (the last before L, at their positions) to the drafter
    with or without carry, and the buffer is set back after it, so every proposal sees the same committed context."""
    target = tiny_target("qwen3", vocab_size=32)
    drafter = tiny_drafter(target, block_size=4)
    seen = []
    original = type(drafter).forward

    def recording(self, *args, **kwargs):
        context, cache = kwargs.get("context_features"), kwargs.get("past_key_values")
        seen.append((None if context is None else context.shape[1], cache.get_seq_length(),
                     None if kwargs.get("carry_features") is None else kwargs["carry_features"].shape[1],
                     None if context is None else kwargs["context_position_ids"][0].tolist()))  # fmt: skip
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(drafter), "forward", recording)
    for rows in (2, 0):
        seen.clear()
        measure_carry_overhead(target, drafter, torch.arange(24).remainder(32).unsqueeze(0), context_lengths=[12],
                               repeats=2, warmup=1, n_resamples=200, progress=False, new_context_rows=rows)  # fmt: skip
        fill, timed = seen[0], seen[1:]
        assert fill[:2] == (12 - rows, 0)  # the buffer is filled up to the new rows
        assert len(timed) == 6 and {t[2] for t in timed} == {None, 3}  # 3 rounds x (no carry, B-1 carry rows)
        if rows:
            assert {(t[0], t[1], tuple(t[3])) for t in timed} == {(2, 10, (10, 11))}
        else:
            assert {(t[0], t[1]) for t in timed} == {(None, 12)}


def test_text_prompts_go_through_the_chat_template_end_to_end(tmp_path):
    from carryover_hf.tools.bench import BenchmarkSettings, run_benchmark
    from carryover_hf.tools.data import tiny_chat_tokenizer

    tokenizer = tiny_chat_tokenizer()
    prompt = Prompt("t0", category="qa", text="What is the capital of France?")
    ids = encode_prompt(prompt, tokenizer)
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt.text}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert ids.tolist() == [list(expected)]
    assert encode_prompt(prompt, tokenizer, chat_template=False).tolist() == [tokenizer(prompt.text)["input_ids"]]

    target = tiny_target("llama", vocab_size=len(tokenizer))
    target.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [prompt, Prompt("t1", category="qa", text="Name three rivers.")]
    settings = BenchmarkSettings(temperatures=[0.0], max_new_tokens=8, methods=["target", "prompt_lookup", "carry_on"],
                                 bootstrap_resamples=200, overhead=False, warmup=0)
    report = run_benchmark(target, {"d": tiny_drafter(target, block_size=4)}, prompts, tokenizer=tokenizer,
                           settings=settings, output_dir=str(tmp_path), progress=False)
    assert report["correctness"]["passed"]
    assert {r["prompt_tokens"] for r in report["runs"] if r["prompt_id"] == "t0"} == {ids.shape[1]}


def test_suite_names_resolve_to_the_shipped_suites(tmp_path):
    from carryover_hf.tools.bench.prompts import default_suite_dir, resolve_suite
    from carryover_hf.resources import PROMPT_SUITES_DIR

    assert default_suite_dir() == PROMPT_SUITES_DIR and (PROMPT_SUITES_DIR / "manifest.json").is_file()
    # "assets/prompts", the suites' former folder in the repository, names them from any working directory.
    for name in ("suites", "assets/prompts", "assets/prompts/"):
        assert resolve_suite(name) == PROMPT_SUITES_DIR
    for name in ("eval/qa", "eval/qa.jsonl", "assets/prompts/eval/qa.jsonl"):
        assert resolve_suite(name) == PROMPT_SUITES_DIR / "eval" / "qa.jsonl"
    with pytest.raises(FileNotFoundError, match="No prompt file or suite folder '/eval/qa'"):
        resolve_suite("/eval/qa")  # a path that is not there is not a name
    assert resolve_suite(str(tmp_path)) == tmp_path
