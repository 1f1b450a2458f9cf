"""`carryover-hf regenerate` on a tiny model: rows, loss masks, length limits, resuming."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from carryover_hf.data import regenerate as regen
from carryover_hf.data.chat import first_prompt_ids, tiny_chat_tokenizer
from carryover_hf.data.regenerate import RegenerationConfig, RegenerationError, load_regenerated, regenerate
from carryover_hf.testing import tiny_target

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


class _EosAfter(LogitsProcessor):
    """Forces EOS once a row has generated `lengths[row % len(lengths)]` tokens (varied response lengths)."""

    def __init__(self, prompt_width: int, eos: int, lengths: list[int]):
        self.prompt_width, self.eos, self.lengths = prompt_width, eos, lengths

    def __call__(self, input_ids, scores):
        generated = input_ids.shape[1] - self.prompt_width
        for row in range(scores.shape[0]):
            if generated >= self.lengths[row % len(self.lengths)]:
                scores[row] = -torch.inf
                scores[row, self.eos] = 0.0
        return scores


@pytest.fixture()
def model(tokenizer):
    """A tiny target whose responses end with EOS after 2, 5 or 3 tokens (the random model alone never stops)."""
    target = tiny_target(vocab_size=len(tokenizer))
    original = target.generate

    def generate(input_ids=None, **kwargs):
        processor = _EosAfter(input_ids.shape[1], tokenizer.eos_token_id, [2, 5, 3])
        return original(input_ids=input_ids, logits_processor=LogitsProcessorList([processor]), **kwargs)

    target.generate = generate
    return target


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
