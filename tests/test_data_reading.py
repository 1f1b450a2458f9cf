"""Reading rows (`carryover-hf prompts reading`): text the target only reads, labelled by its own distribution."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from carryover_hf.tools.data import tiny_chat_tokenizer
from carryover_hf.tools.data.cli import main as prompts_main
from carryover_hf.tools.data.reading import reading_row, reading_rows, write_reading
from carryover_hf.tools.testing import tiny_target
from carryover_hf.training.cli import load_rows
from carryover_hf.training.feature_store import FeatureBuildConfig, FeatureStore, build_features

TRANSLATION = {"id": "translation/train/00007", "category": "translation", "system": None,
               "turns": ["Translate into English: Das ist gut."], "reference": "That is good."}  # fmt: skip
WRITING = {"id": "writing/train/00003", "category": "writing", "system": None,
           "turns": ["Write a poem about rain.", "Now make it rhyme."], "reference": None}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_chat_tokenizer()


def _masked_text(tokenizer, ids, mask, keep):
    return tokenizer.decode([i for i, m in zip(ids, mask) if m == keep])


def test_the_mask_marks_exactly_the_read_contents(tokenizer):
    ids, mask = reading_row(tokenizer, TRANSLATION, use_reference=True)
    assert len(ids) == len(mask)
    messages = [{"role": "user", "content": TRANSLATION["turns"][0]},
                {"role": "assistant", "content": TRANSLATION["reference"]}]  # fmt: skip
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(ids) == rendered.removesuffix("\n")  # the row ends with the EOS of the answer
    assert _masked_text(tokenizer, ids, mask, 1) == "Translate into English: Das ist gut.That is good.<|im_end|>"
    template = _masked_text(tokenizer, ids, mask, 0)
    assert "Das" not in template and "good" not in template and template.endswith("<|im_start|>assistant\n")

    # without a reference: only the first user turn is read (the second presupposes an answer), and the row ends there
    ids, mask = reading_row(tokenizer, WRITING, use_reference=False)
    assert _masked_text(tokenizer, ids, mask, 1) == "Write a poem about rain."
    assert mask[-1] == 1 and "rhyme" not in tokenizer.decode(ids)


def test_rows_leave_out_answered_and_long_prompts_and_never_truncate(tokenizer):
    other = {**TRANSLATION, "id": "translation/train/00008", "turns": ["Translate into English: " + "ja " * 200]}
    prompts = [TRANSLATION, WRITING, other, {**WRITING, "id": "writing/train/00004"}]
    records, summary = reading_rows(tokenizer, prompts, rows=2, skip={"writing/train/00003"}, max_length=120)
    assert [r["id"] for r in records] == ["translation/train/00007", "writing/train/00004"]
    assert summary["skipped_answered"] == 1 and summary["skipped_too_long"] == 1
    assert summary["rows_with_reference"] == 1  # translation's reference is prose; writing has none
    assert summary["read_tokens"] == sum(sum(r["loss_mask"]) for r in records)
    assert set(summary["read_tokens_per_category"]) == {"translation", "writing"}
    with pytest.raises(ValueError, match="only 2 reading rows are left .* --rows 2 or fewer"):
        reading_rows(tokenizer, prompts, rows=3, skip={"writing/train/00003"}, max_length=120)


def test_written_rows_are_a_dataset_the_feature_store_encodes(tokenizer, tmp_path):
    records, summary = reading_rows(tokenizer, [TRANSLATION, WRITING], rows=2)
    path = write_reading(records, summary, {"rows": 2}, tmp_path / "reading.parquet")
    assert json.loads((tmp_path / "reading.parquet.json").read_text())["summary"]["rows"] == 2
    assert not (tmp_path / "reading.parquet.partial").exists()
    rows = load_rows(str(path))
    assert [list(r) for r in rows["input_ids"]] == [r["input_ids"] for r in records]

    target = tiny_target("llama", vocab_size=len(tokenizer), seed=0)
    config = FeatureBuildConfig(output=str(tmp_path / "store"), dataset=str(path), target_layer_ids=[0, 1],
                                dtype="float32", top_k=4, shard_rows=2)  # fmt: skip
    build_features(config, target=target, rows=rows, progress=False)
    store = FeatureStore(tmp_path / "store")
    assert len(store) == 2 and store[1]["loss_mask"].tolist() == records[1]["loss_mask"]
    assert store[0]["target_topk_ids"].shape[-1] == 4  # the label of a reading row: the target's own top-k


def test_cli_refuses_bad_arguments_before_any_work(tmp_path, capsys):
    assert prompts_main(["reading", "--output", str(tmp_path / "rows.jsonl"), "--rows", "3"]) == 2
    assert "must be a .parquet file" in capsys.readouterr().err
    assert prompts_main(["reading", "--output", str(tmp_path / "rows.parquet"), "--rows", "0"]) == 2
    assert "--rows must be positive" in capsys.readouterr().err
    assert prompts_main(["reading", "--output", str(tmp_path / "r.parquet"), "--rows", "3", "--after", str(tmp_path)]) == 2
    assert "not a regeneration run folder" in capsys.readouterr().err


def _sweep():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "learning_efficiency.py"
    spec = importlib.util.spec_from_file_location("learning_efficiency", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_learning_efficiency_trains_on_reading_rows_alone_and_mixed(tokenizer, tmp_path):
    sweep = _sweep()
    target = tiny_target("llama", vocab_size=len(tokenizer), seed=0).requires_grad_(False)
    stores = {}
    for name, prompts in {"regenerated": [TRANSLATION, WRITING] * 3, "read": [WRITING, TRANSLATION]}.items():
        rows = [{"input_ids": ids, "loss_mask": mask} for ids, mask in
                (reading_row(tokenizer, p, p["reference"] is not None) for p in prompts)]  # fmt: skip
        config = FeatureBuildConfig(output=str(tmp_path / name), target_layer_ids=[0, 1], dtype="float32", top_k=4)
        build_features(config, target=target, rows=rows, progress=False)
        stores[name] = FeatureStore(tmp_path / name)
    regenerated, read = stores["regenerated"], stores["read"]

    mixed = sweep.training_rows("mixed", regenerated, read)
    assert len(mixed) == 8
    assert torch.equal(mixed[6]["input_ids"], read[0]["input_ids"])
    assert torch.equal(mixed[5]["input_ids"], regenerated[5]["input_ids"])
    assert [r["loss_mask"].tolist() for r in mixed.token_rows()][6] == read[0]["loss_mask"].tolist()
    with pytest.raises(SystemExit, match="needs --read-features"):
        sweep.training_rows("read", regenerated, None)

    base = {**sweep.BASE, "vocab": None, "block": 4, "batch": 2}
    for name in ("read_only", "read_mixed"):
        run = sweep.train_run(name, sweep.RUNS[name], target, regenerated, regenerated, budget=0.2, marks=[0.2],
                              seed=0, base=base, read=read)  # fmt: skip
        assert run["options"]["distill_weight"] == 1.0
        assert run["options"]["data"] == {"read_only": "read", "read_mixed": "mixed"}[name]
        assert run["steps"] > 0 and len(run["curve"]) == 2 and all(p["tau"] >= 1.0 for p in run["curve"])
