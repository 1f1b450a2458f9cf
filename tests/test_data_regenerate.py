"""`carryover-hf regenerate` on a tiny model: rows, loss masks, length limits, resuming."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from carryover_hf.tools.data import regenerate as regen
from carryover_hf.tools.data.chat import first_prompt_ids, tiny_chat_tokenizer
from carryover_hf.tools.data.regenerate import RegenerationConfig, RegenerationError, load_regenerated, regenerate
from carryover_hf.tools.testing import tiny_target

CATS = ["writing", "mt_bench", "qa"]


@pytest.fixture(scope="module")
def prompts_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("prompts")
    (folder / "train").mkdir()
    for category in CATS:
        with open(folder / "train" / f"{category}.jsonl", "w") as handle:
            for i in range(5):
                turns = [f"Tell me about the number {i} in {category}."]
                if category == "mt_bench":
                    turns.append(f"Now say it again, {i}.")
                system = "Answer briefly." if category == "qa" else None
                record = {"id": f"{category}/train/{i:05d}", "category": category, "split": "train", "system": system,
                          "turns": turns, "source": "test", "license": "Apache-2.0", "groups": [f"g{i}"],
                          "template": "t", "reference": None, "meta": {}}  # fmt: skip
                handle.write(json.dumps(record) + "\n")
    return folder


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_chat_tokenizer()


def _stop_by_position(target, eos: int, period: int = 4):
    """Makes `target` emit EOS whenever the token it predicts lands on a position that is a multiple of
    `period` (a random model alone never stops). The rule depends only on a row's own length, so responses get
    varied lengths (1 to `period` tokens) that are the same under `generate` and batched decoding."""
    forward = target.forward

    def stopping_forward(input_ids=None, attention_mask=None, **kwargs):
        if attention_mask is not None:  # tokens seen so far = position of the predicted token
            next_position = attention_mask.sum(-1)
        else:  # no padding: `generate` on one row may pass no mask (Transformers 5.25 passes none to this wrapper)
            cache = kwargs.get("past_key_values", kwargs.get("cache"))  # 5.25's generate names the cache `cache`
            seen = cache.get_seq_length() if cache is not None else 0
            next_position = torch.full((input_ids.shape[0],), seen + input_ids.shape[1])
        output = forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        stop = (next_position % period == 0).to(output.logits.device)
        output.logits[stop, -1, :] = -torch.inf
        output.logits[stop, -1, eos] = 0.0
        return output

    target.forward = stopping_forward
    return target


@pytest.fixture()
def model(tokenizer):
    """A tiny target whose responses end with EOS after 1 to 4 tokens, depending on the context length."""
    return _stop_by_position(tiny_target(vocab_size=len(tokenizer)), tokenizer.eos_token_id)


def _config(tmp_path, prompts_dir, **overrides) -> RegenerationConfig:
    values = dict(output=str(tmp_path / "run"), prompts_dir=str(prompts_dir), categories=CATS, batch_size=2,
                  chunk_size=4, max_new_tokens=8, max_length=256)  # fmt: skip
    values.update(overrides)
    return RegenerationConfig(**values)


def test_rows_hold_generated_tokens_under_the_template(tmp_path, prompts_dir, model, tokenizer):
    summary = regenerate(_config(tmp_path, prompts_dir), model=model, tokenizer=tokenizer, show_progress=False)
    rows = load_regenerated(tmp_path / "run")
    assert summary["complete"] and summary["rows"] == len(rows) == 15 and summary["unfinished"] == 0
    assert summary["response_tokens"] == sum(rows["num_response_tokens"])
    for row in rows:
        ids, mask = row["input_ids"], row["loss_mask"]
        assert row["finished"] and row["text"] == tokenizer.decode(ids)
        assert len(row["responses"]) == len(row["turns"])
        # The prompt part is the template's rendering up to the first generation prompt.
        first = mask.index(1)
        assert ids[:first] == first_prompt_ids(tokenizer, row["turns"], row["system"])
        # Masked spans: one per assistant turn, each ending with EOS and equal to the recorded response.
        spans, start = [], None
        for i, m in enumerate(mask + [0]):
            if m and start is None:
                start = i
            elif not m and start is not None:
                spans.append(ids[start:i])
                start = None
        assert len(spans) == len(row["turns"])
        for span, response in zip(spans, row["responses"]):
            assert span[-1] == tokenizer.eos_token_id and tokenizer.eos_token_id not in span[:-1]
            assert tokenizer.decode(span, skip_special_tokens=True) == response
        if len(row["turns"]) == 2:  # the second user turn sits between the two responses, unmasked
            between = tokenizer.decode(ids[ids.index(tokenizer.eos_token_id, first) + 1 : len(ids) - len(spans[1])])
            assert between == f"\n<|im_start|>user\n{row['turns'][1]}<|im_end|>\n<|im_start|>assistant\n"
        generation = json.loads(row["generation"])
        assert generation["do_sample"] is False and generation["max_new_tokens"] == 8


def test_run_order_interleaves_categories(tmp_path, prompts_dir):
    order = regen.ordered_prompts(_config(tmp_path, prompts_dir))
    assert len(order) == 15
    assert {r["category"] for r in order[:3]} == set(CATS)
    assert len({r["id"] for r in order}) == 15


def test_skip_per_category_leaves_out_the_first_prompts_of_each_category(tmp_path, prompts_dir, model, tokenizer):
    everything = regen.ordered_prompts(_config(tmp_path, prompts_dir))
    rest = regen.ordered_prompts(_config(tmp_path, prompts_dir, skip_per_category=2, limit_per_category=2))
    first_two = {r["id"] for c in CATS for r in regen.load_prompts("train", [c], prompts_dir)[:2]}
    assert len(rest) == 2 * len(CATS) and not first_two & {r["id"] for r in rest}
    assert {r["id"] for r in rest} < {r["id"] for r in everything}
    with pytest.raises(RegenerationError, match="skip_per_category must be 0 or more"):
        regenerate(_config(tmp_path, prompts_dir, skip_per_category=-1), model=model, tokenizer=tokenizer)
    # A run recorded before the setting existed resumes: its record was made without skipping.
    config = _config(tmp_path, prompts_dir, max_chunks=1)
    regenerate(config, model=model, tokenizer=tokenizer, show_progress=False)
    state = Path(config.output) / regen.STATE_FILE
    record = json.loads(state.read_text())
    del record["identity"]["skip_per_category"]
    state.write_text(json.dumps(record))
    assert regenerate(config, model=model, tokenizer=tokenizer, show_progress=False)["chunks_done"] == 2
    with pytest.raises(RegenerationError, match="skip_per_category: 0 there, 1 now"):
        regenerate(_config(tmp_path, prompts_dir, skip_per_category=1), model=model, tokenizer=tokenizer)


def test_resume_after_interruption_has_no_duplicates_or_gaps(tmp_path, prompts_dir, model, tokenizer, monkeypatch):
    reference = _config(tmp_path, prompts_dir, output=str(tmp_path / "reference"))
    regenerate(reference, model=model, tokenizer=tokenizer, show_progress=False)
    expected = load_regenerated(tmp_path / "reference").to_list()

    config = _config(tmp_path, prompts_dir)
    write_chunk = regen._write_chunk
    written = []

    def crash_on_third_chunk(output, index, rows, stats):
        if len(written) == 2:
            # Leave a half-written file behind, as a killed process would.
            (Path(output) / regen.DATA_DIR / f".chunk-{index:05d}.parquet.tmp").write_bytes(b"partial")
            raise KeyboardInterrupt
        written.append(index)
        write_chunk(output, index, rows, stats)

    monkeypatch.setattr(regen, "_write_chunk", crash_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        regenerate(config, model=model, tokenizer=tokenizer, show_progress=False)
    partial = regen.summarize(config.output)
    assert partial["chunks_done"] == 2 and not partial["complete"]
    monkeypatch.setattr(regen, "_write_chunk", write_chunk)
    summary = regenerate(config, model=model, tokenizer=tokenizer, show_progress=False)
    assert summary["complete"] and summary["rows"] == 15
    rows = load_regenerated(config.output).to_list()
    assert [r["id"] for r in rows] == [r["id"] for r in regen.ordered_prompts(config)]
    assert rows == expected  # greedy: the resumed run equals an uninterrupted one


def test_resume_with_other_settings_is_refused(tmp_path, prompts_dir, model, tokenizer):
    regenerate(_config(tmp_path, prompts_dir, max_chunks=1), model=model, tokenizer=tokenizer, show_progress=False)
    with pytest.raises(RegenerationError, match="max_new_tokens: 8 there, 16 now"):
        regenerate(_config(tmp_path, prompts_dir, max_new_tokens=16), model=model, tokenizer=tokenizer)


def test_length_limits_are_reported_not_hidden(tmp_path, prompts_dir, tokenizer):
    target = tiny_target(vocab_size=len(tokenizer))  # a random model: it never emits EOS in a few tokens
    prompt_lengths = {
        r["id"]: len(first_prompt_ids(tokenizer, r["turns"], r["system"]))
        for r in regen.ordered_prompts(_config(tmp_path, prompts_dir))
    }
    max_length = sorted(prompt_lengths.values())[7] + 1  # some prompts do not fit at all
    config = _config(tmp_path, prompts_dir, max_length=max_length, max_new_tokens=6)
    summary = regenerate(config, model=target, tokenizer=tokenizer, show_progress=False)
    too_long = sorted(i for i, n in prompt_lengths.items() if n >= max_length)
    assert summary["skipped_prompt_too_long"] == len(too_long) > 0
    rows = load_regenerated(config.output)
    assert not set(rows["id"]) & set(too_long)
    assert summary["unfinished"] == len(rows) > 0
    for row in rows:
        assert not row["finished"]
        assert len(row["input_ids"]) <= max_length
        assert row["num_response_tokens"] == min(6, max_length - prompt_lengths[row["id"]])
    stats = json.loads(next((Path(config.output) / regen.DATA_DIR).glob("chunk-*.json")).read_text())
    assert {"skipped_prompt_too_long", "unfinished", "prompt_ids"} <= set(stats)

    dropped = _config(tmp_path, prompts_dir, output=str(tmp_path / "dropped"), max_length=max_length,
                      max_new_tokens=6, drop_unfinished=True)  # fmt: skip
    summary = regenerate(dropped, model=target, tokenizer=tokenizer, show_progress=False)
    assert summary["rows"] == 0 and summary["dropped_unfinished"] == summary["unfinished"] > 0


def test_bad_options_fail_before_loading(tmp_path, prompts_dir):
    with pytest.raises(RegenerationError, match="--batch_size must be positive"):
        regenerate(_config(tmp_path, prompts_dir, batch_size=0))
    with pytest.raises(RegenerationError, match="unknown categories"):
        regenerate(_config(tmp_path, prompts_dir, categories=["poems"]))
    with pytest.raises(FileNotFoundError, match="prompts build"):
        regenerate(_config(tmp_path, prompts_dir, categories=["rag"]))


def test_cli_on_a_local_target_folder(tmp_path, prompts_dir, tokenizer, capsys):
    folder = tmp_path / "target"
    tiny_target(vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    argv = ["--output", str(tmp_path / "cli"), "--target", str(folder), "--prompts_dir", str(prompts_dir),
            "--categories", "writing", "qa", "--limit_per_category", "2", "--max_new_tokens", "3", "--do_sample",
            "--temperature", "0.8", "--batch_size", "4"]  # fmt: skip
    assert regen.main(argv) == 0
    out = capsys.readouterr().out
    assert '"rows": 4' in out and "kept, with finished=False" in out
    rows = load_regenerated(tmp_path / "cli")
    assert sorted(rows["category"]) == ["qa", "qa", "writing", "writing"]
    assert json.loads(rows[0]["generation"])["temperature"] == 0.8
    assert regen.main(argv[:-2] + ["--batch_size", "0"]) == 2


def _turn_spans(row) -> list[tuple[int, int]]:
    """(start, end) of each generated span (loss mask 1) of a row."""
    from carryover_hf.regenerated import response_spans

    return response_spans(row["loss_mask"])


def _check_against_plain_generate(target, tokenizer, rows, max_new_tokens: int, max_length: int) -> int:
    """Every generated turn of every row equals `target.generate` on that turn's context alone (batch 1, greedy),
    token for token. Returns the number of turns checked."""
    checked = 0
    for row in rows:
        ids = row["input_ids"]
        for start, end in _turn_spans(row):
            context = torch.tensor([ids[:start]])
            budget = min(max_new_tokens, max_length - start)
            with torch.inference_mode():
                output = target.generate(context, attention_mask=torch.ones_like(context), do_sample=False,
                                         max_new_tokens=budget, eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
            assert ids[start:end] == output[0, start:].tolist(), (row["id"], start)
            checked += 1
    return checked


@pytest.mark.parametrize("batch_size,prefill_tokens", [(1, 4096), (2, 4096), (3, 4096), (16, 4096), (16, 100)])
def test_rows_equal_plain_greedy_generate_token_for_token(tmp_path, prompts_dir, tokenizer, batch_size,
                                                          prefill_tokens, monkeypatch):  # fmt: skip
    monkeypatch.setattr(regen, "PREFILL_TOKENS", prefill_tokens)  # 100: prefill in several groups, then stacked
    # Responses of 1-6 tokens (EOS by position) and a budget of 5: some rows stop early, some hit the budget, so
    # rows leave the batch and are refilled at different steps, and chunks overlap.
    target = _stop_by_position(tiny_target(vocab_size=len(tokenizer)), tokenizer.eos_token_id, period=6)
    config = _config(tmp_path, prompts_dir, batch_size=batch_size, max_new_tokens=5)
    summary = regenerate(config, model=target, tokenizer=tokenizer, show_progress=False)
    rows = load_regenerated(config.output).to_list()
    assert summary["rows"] == 15 and 0 < summary["unfinished"] < 15
    assert _check_against_plain_generate(target, tokenizer, rows, 5, config.max_length) > 15  # mt_bench: 2 turns


def test_rows_equal_plain_generate_when_length_limits_differ_per_row(tmp_path, prompts_dir, tokenizer):
    target = tiny_target(vocab_size=len(tokenizer))  # never stops: each row runs to its own max_length budget
    lengths = sorted(len(first_prompt_ids(tokenizer, r["turns"], r["system"]))
                     for r in regen.ordered_prompts(_config(tmp_path, prompts_dir)))  # fmt: skip
    max_length = lengths[-1] + 3
    config = _config(tmp_path, prompts_dir, batch_size=4, max_new_tokens=64, max_length=max_length)
    regenerate(config, model=target, tokenizer=tokenizer, show_progress=False)
    rows = load_regenerated(config.output).to_list()
    assert len({len(row["input_ids"]) - row["num_response_tokens"] for row in rows}) >= 3  # varied budgets
    assert all(len(row["input_ids"]) == max_length for row in rows)
    _check_against_plain_generate(target, tokenizer, rows, 64, max_length)


@pytest.mark.slow
def test_real_target_rows_equal_plain_greedy_generate(tmp_path):
    """SmolLM2-135M, float32: regenerated turns (batched, compacted, refilled) equal batch-1 `generate`."""
    from carryover_hf.targets import load_target

    target, tokenizer = load_target("smollm2-135m", dtype="float32")
    config = RegenerationConfig(output=str(tmp_path / "run"), limit_per_category=1, batch_size=4, chunk_size=5,
                                max_new_tokens=48, max_length=2048)  # fmt: skip
    regenerate(config, model=target, tokenizer=tokenizer, show_progress=False)
    rows = load_regenerated(config.output).to_list()
    assert len(rows) == 9
    assert _check_against_plain_generate(target, tokenizer, rows, 48, 2048) >= 9


@pytest.mark.parametrize("decoder", ["generate", "generate-static"])
def test_generate_decoders_give_the_same_rows(tmp_path, prompts_dir, tokenizer, decoder):
    target = tiny_target(vocab_size=len(tokenizer))
    if decoder == "generate":  # (the stop rule reads 2D attention masks; the static cache passes others)
        target = _stop_by_position(target, tokenizer.eos_token_id, period=6)
    reference = _config(tmp_path, prompts_dir, output=str(tmp_path / "refill"), batch_size=3, max_new_tokens=5)
    regenerate(reference, model=target, tokenizer=tokenizer, show_progress=False)
    config = _config(tmp_path, prompts_dir, batch_size=3, max_new_tokens=5, decoder=decoder)
    regenerate(config, model=target, tokenizer=tokenizer, show_progress=False)
    assert load_regenerated(config.output).to_list() == load_regenerated(reference.output).to_list()
    stats = json.loads((Path(config.output) / regen.DATA_DIR / "chunk-00000.json").read_text())
    assert stats["decoder"] == decoder
    with pytest.raises(RegenerationError, match="--decoder must be one of"):
        regenerate(_config(tmp_path, prompts_dir, decoder="beam"))


def test_several_runs_load_in_order_memory_mapped(tmp_path, prompts_dir, model, tokenizer):
    from carryover_hf.training.cli import load_rows

    first = _config(tmp_path, prompts_dir, output=str(tmp_path / "a"), categories=["writing", "qa"])
    second = _config(tmp_path, prompts_dir, output=str(tmp_path / "b"), categories=["mt_bench"], max_chunks=1)
    for config in (first, second):
        regenerate(config, model=model, tokenizer=tokenizer, show_progress=False)
    expected = list(load_regenerated(first.output)["id"]) + list(load_regenerated(second.output)["id"])
    assert len(expected) == 10 + 4
    for given in ([first.output, second.output], f"{first.output},{second.output}"):
        rows = load_regenerated(given)
        assert list(rows["id"]) == expected
        # Backed by one Arrow file per chunk (memory-mapped), not by tables in memory.
        assert len(rows.cache_files) == 3 + 1
    rows = load_rows(f"{first.output},{second.output}")
    assert list(rows["id"]) == expected
    assert rows[len(rows) - 1]["input_ids"] == load_regenerated(second.output)[-1]["input_ids"]
    assert list(load_rows(first.output)["id"]) == expected[:10]  # one folder, as before


def test_several_runs_bad_input_is_refused(tmp_path, prompts_dir, model, tokenizer):
    config = _config(tmp_path, prompts_dir, max_chunks=1)
    regenerate(config, model=model, tokenizer=tokenizer, show_progress=False)
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="plain is not a regeneration run folder"):
        load_regenerated([config.output, str(tmp_path / "plain")])
    with pytest.raises(ValueError, match="the same run folder is given twice"):
        load_regenerated(f"{config.output},{config.output}/")
    other = tmp_path / "other"
    other.mkdir()
    state = json.loads((Path(config.output) / regen.STATE_FILE).read_text())
    state["identity"]["target"] = "another-target"
    (other / regen.STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(ValueError, match="different targets"):
        load_regenerated([config.output, other])
    with pytest.raises(FileNotFoundError, match="no finished chunks"):
        state["identity"]["target"] = config.target
        (other / regen.STATE_FILE).write_text(json.dumps(state))
        load_regenerated([config.output, other])


def test_chunks_are_written_in_about_run_order(tmp_path, prompts_dir, model, tokenizer, monkeypatch):
    # Later chunks join while a chunk's last rows run, but the oldest chunk's contexts go first: long prompts of
    # an early chunk are not overtaken for ever by the short prompts of later ones, so every chunk ends soon.
    written = []
    write_chunk = regen._write_chunk

    def record(output, index, rows, stats):
        written.append(index)
        write_chunk(output, index, rows, stats)

    monkeypatch.setattr(regen, "_write_chunk", record)
    config = _config(tmp_path, prompts_dir, batch_size=2, chunk_size=2, max_new_tokens=8)
    regenerate(config, model=model, tokenizer=tokenizer, show_progress=False)
    assert sorted(written) == list(range(8))
    assert all(abs(index - position) <= 1 for position, index in enumerate(written)), written


# -- --decoder vllm ---------------------------------------------------------------------------------------------------
class _FakeVllmSession:
    """Stands in for `vllm_check.VllmSession` where vLLM is not installed: what vLLM does with each request (stop at
    the first given stop id, kept; else after max_tokens; its own EOS off), with the target's batch-1 greedy
    `generate` in place of the engine. Records every call."""

    vllm_version, start_seconds = "0.0-fake", 0.5

    def __init__(self, target):
        self.target, self.calls, self.closed = target, [], False

    def generate(self, prompts, max_tokens, *, stop_token_ids, temperature=0.0, top_p=1.0, top_k=0, seeds=None):
        self.calls.append({"prompts": prompts, "max_tokens": max_tokens, "stop_token_ids": stop_token_ids,
                           "temperature": temperature, "seeds": seeds})  # fmt: skip
        outputs = []
        for ids, budget in zip(prompts, max_tokens):
            context = torch.tensor([ids])
            with torch.inference_mode():
                new = self.target.generate(context, attention_mask=torch.ones_like(context), do_sample=False,
                                           max_new_tokens=budget, eos_token_id=list(stop_token_ids),
                                           pad_token_id=stop_token_ids[0])[0, len(ids) :].tolist()  # fmt: skip
            stop = next((i for i, token in enumerate(new) if token in stop_token_ids), None)
            new = new[: stop + 1] if stop is not None else new[:budget]
            outputs.append({"tokens": new, "finish_reason": "stop" if stop is not None else "length",
                            "stop_reason": new[-1] if stop is not None else None})  # fmt: skip
        return outputs

    def cpu_seconds(self):
        return 1.0 + len(self.calls)

    def close(self):
        self.closed = True


@pytest.fixture()
def fake_vllm(monkeypatch, tokenizer):
    """`--decoder vllm` on the fake session (the test's model stands in for the engine); returns the sessions made."""
    from carryover_hf.tools import vllm_check

    sessions = []

    def open_session(python, served, config):
        sessions.append(_FakeVllmSession(open_session.target))
        return sessions[-1]

    monkeypatch.setattr(vllm_check, "find_vllm_python", lambda explicit=None: Path("/fake/python"))
    monkeypatch.setattr(regen, "_open_vllm_session", open_session)
    return open_session, sessions


def _without_generation(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "generation"} for row in rows]


def test_vllm_decoder_rows_equal_refill_rows(tmp_path, prompts_dir, tokenizer, fake_vllm):
    """Same rows as the refill decoder (turns that stop early, hit the budget, two-turn conversations), one generate
    call per chunk (its first turns, with the previous chunk's second turns), the chunk format and sidecar fields."""
    open_session, sessions = fake_vllm
    target = _stop_by_position(tiny_target(vocab_size=len(tokenizer)), tokenizer.eos_token_id, period=6)
    open_session.target = target
    common = dict(target="tiny-test-target", batch_size=3, max_new_tokens=5, chunk_size=4)
    reference = _config(tmp_path, prompts_dir, output=str(tmp_path / "refill"), **common)
    regenerate(reference, model=target, tokenizer=tokenizer, show_progress=False)
    config = _config(tmp_path, prompts_dir, decoder="vllm", **common)
    summary = regenerate(config, model=target, tokenizer=tokenizer, show_progress=False)
    rows, expected = load_regenerated(config.output).to_list(), load_regenerated(reference.output).to_list()
    assert summary["rows"] == 15 and 0 < summary["unfinished"] < 15
    assert _without_generation(rows) == _without_generation(expected)
    generation = json.loads(rows[0]["generation"])
    assert generation["decoder"] == "vllm" and generation["vllm"] == "0.0-fake"
    settings = {k: v for k, v in generation.items() if k not in ("decoder", "vllm")}
    assert settings == json.loads(expected[0]["generation"])
    # one engine, closed at the end; each call holds a whole chunk's first turns (4, 4, 4, 3) plus earlier second turns
    (session,) = sessions
    assert session.closed and len(session.calls) >= 4
    assert all(call["temperature"] == 0.0 and call["seeds"] is None for call in session.calls)
    assert all(call["stop_token_ids"] == [tokenizer.eos_token_id] for call in session.calls)
    ordered = regen.ordered_prompts(config)
    for start in range(0, len(ordered), config.chunk_size):  # every chunk's first turns go to vLLM in one call
        firsts = sorted(first_prompt_ids(tokenizer, r["turns"], r["system"]) for r in ordered[start : start + 4])
        assert any(all(ids in call["prompts"] for ids in firsts) for call in session.calls), start
    assert sum(map(len, (call["prompts"] for call in session.calls))) == 15 + 5  # 15 first turns, 5 second ones
    assert all(len(p) + n <= config.max_length for call in session.calls
               for p, n in zip(call["prompts"], call["max_tokens"]))  # fmt: skip
    stats = json.loads((Path(config.output) / regen.DATA_DIR / "chunk-00000.json").read_text())
    assert stats["decoder"] == "vllm" and stats["vllm"] == "0.0-fake" and stats["vllm_startup_seconds"] == 0.5
    assert stats["vllm_cpu_seconds"] >= 0 and stats["cpu_seconds"] >= stats["vllm_cpu_seconds"]
    later = json.loads((Path(config.output) / regen.DATA_DIR / "chunk-00001.json").read_text())
    assert "vllm_startup_seconds" not in later  # the engine's start is recorded once per invocation


def test_vllm_decoder_resumes_a_refill_run(tmp_path, prompts_dir, tokenizer, fake_vllm):
    """The decoder is not part of the run's identity: a refill run continues with vLLM (and back), rows as one run."""
    open_session, _ = fake_vllm
    target = _stop_by_position(tiny_target(vocab_size=len(tokenizer)), tokenizer.eos_token_id, period=6)
    open_session.target = target
    common = dict(target="tiny-test-target", batch_size=3, max_new_tokens=5)
    reference = _config(tmp_path, prompts_dir, output=str(tmp_path / "refill"), **common)
    regenerate(reference, model=target, tokenizer=tokenizer, show_progress=False)
    for decoder, max_chunks in (("refill", 1), ("vllm", 2), ("refill", None)):
        config = _config(tmp_path, prompts_dir, decoder=decoder, max_chunks=max_chunks, **common)
        regenerate(config, model=target, tokenizer=tokenizer, show_progress=False)
    rows = load_regenerated(config.output).to_list()
    assert _without_generation(rows) == _without_generation(load_regenerated(reference.output).to_list())
    decoders = [json.loads(path.read_text())["decoder"]
                for path in sorted((Path(config.output) / regen.DATA_DIR).glob("chunk-*.json"))]  # fmt: skip
    assert decoders == [regen.DECODER, "vllm", "vllm", regen.DECODER]


def test_vllm_decoder_seeds_each_sampled_turn(tmp_path, prompts_dir, tokenizer, fake_vllm):
    """Sampling: one seed per assistant turn, from --seed, the prompt id and the turn (not the batch or resume
    point)."""
    open_session, sessions = fake_vllm
    open_session.target = _stop_by_position(tiny_target(vocab_size=len(tokenizer)), tokenizer.eos_token_id)
    seeds = []
    for batch_size in (2, 5):  # different batches: the same seeds per turn
        config = _config(tmp_path, prompts_dir, output=str(tmp_path / f"b{batch_size}"), target="tiny-test-target",
                         decoder="vllm", do_sample=True, temperature=1.0, top_k=7, seed=3, batch_size=batch_size)
        regenerate(config, model=open_session.target, tokenizer=tokenizer, show_progress=False)
        calls = sessions[-1].calls
        assert all(call["temperature"] == 1.0 for call in calls)
        seeds.append(sorted(seed for call in calls for seed in call["seeds"]))
    assert seeds[0] == seeds[1] and len(set(seeds[0])) == len(seeds[0]) == 15 + 5  # mt_bench: two turns each
    record = regen.ordered_prompts(config)[0]
    assert regen._job_seed(3, {"record": record, "responses": []}) in seeds[0]


def _vllm_python() -> Path | None:
    """The vLLM environment tests/test_vllm.py builds (.cache/vllm-env), else $CARRYOVER_HF_VLLM_PYTHON."""
    import os

    from carryover_hf.tools.vllm_check import ENV_RECORD, PYTHON_VARIABLE

    folder = Path(__file__).resolve().parents[1] / ".cache" / "vllm-env"
    if (folder / ENV_RECORD).is_file():
        return folder / "bin" / "python"
    return Path(os.environ[PYTHON_VARIABLE]) if os.environ.get(PYTHON_VARIABLE) else None


@pytest.mark.skipif(_vllm_python() is None, reason="no vLLM environment (carryover-hf vllm setup, tests/test_vllm.py)")
def test_vllm_decoder_on_the_real_target(tmp_path, monkeypatch):
    """vLLM itself, SmolLM2-135M in float32: greedy rows (9 prompts, 48 tokens) equal the refill decoder's; a sampled
    request's tokens depend on its seed, not on the batch it runs in. About 45 s here (engine start 20-30 s)."""
    pytest.importorskip("gguf")
    from carryover_hf.targets import load_target, prepare_smollm2
    from carryover_hf.tools.vllm_check import VllmSession

    served = prepare_smollm2()
    target, tokenizer = load_target("smollm2-135m", dtype="float32")
    session = VllmSession(_vllm_python(), served, max_model_len=2048, max_num_seqs=8, chunked_prefill=False)
    try:
        closes = []
        monkeypatch.setattr(session, "close", lambda: closes.append(True))  # kept open for the sampling check
        monkeypatch.setattr(regen, "_open_vllm_session", lambda python, served, config: session)
        common = dict(limit_per_category=1, chunk_size=5, max_new_tokens=48, max_length=2048, batch_size=8,
                      vllm_python=str(_vllm_python()))  # fmt: skip
        config = RegenerationConfig(output=str(tmp_path / "vllm"), decoder="vllm", **common)
        regenerate(config, show_progress=False)  # loads the tokenizer only; vLLM reads the weights
        reference = RegenerationConfig(output=str(tmp_path / "refill"), **common)
        regenerate(reference, model=target, tokenizer=tokenizer, show_progress=False)
        rows, expected = load_regenerated(config.output).to_list(), load_regenerated(reference.output).to_list()
        assert closes == [True] and len(rows) == 9
        assert _without_generation(rows) == _without_generation(expected)
        assert any(row["finished"] for row in rows) and any(not row["finished"] for row in rows)
        stats = json.loads((Path(config.output) / regen.DATA_DIR / "chunk-00000.json").read_text())
        assert stats["decoder"] == "vllm" and stats["vllm"] == session.vllm_version and stats["vllm_cpu_seconds"] > 0

        prompts = [row["input_ids"][: row["loss_mask"].index(1)] for row in rows[:4]]
        sampled = dict(stop_token_ids=[tokenizer.eos_token_id], temperature=1.0)
        alone = session.generate(prompts[:1], [24], seeds=[11], **sampled)
        together = session.generate(prompts[::-1], [24] * 4, seeds=[5, 6, 7, 11], **sampled)
        other_seed = session.generate(prompts[:1], [24], seeds=[12], **sampled)
        assert alone[0]["tokens"] == together[3]["tokens"] != other_seed[0]["tokens"]
    finally:
        VllmSession.close(session)  # the class's close: the instance's is stubbed above
