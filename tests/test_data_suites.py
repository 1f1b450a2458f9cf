"""Prompt suites: the committed suites' sizes and leakage rules, and the builder's logic on small inputs."""

from __future__ import annotations

import hashlib
import json

import pytest

from carryover_hf.tools.data import suites
from carryover_hf.tools.data.suites import (
    CATEGORIES,
    EVAL_SIZES,
    MIN_TRAIN_SIZE,
    NEAR_DUPLICATE_THRESHOLD,
    PROMPTS_DIR,
    build_suites,
    load_prompts,
    max_jaccard,
)

pytest.importorskip("scipy")  # near-duplicate detection uses sparse matrices (dev extra)


@pytest.fixture(scope="module")
def committed():
    if not (PROMPTS_DIR / suites.MANIFEST).is_file():
        pytest.fail(f"the committed prompt suites are missing from {PROMPTS_DIR}")
    return {category: {split: load_prompts(split, [category]) for split in suites.SPLITS} for category in CATEGORIES}


def test_every_category_meets_its_size(committed):
    assert len(CATEGORIES) >= 8
    for category in CATEGORIES:
        assert len(committed[category]["eval"]) == EVAL_SIZES[category] >= 80, category
        assert len(committed[category]["train"]) >= MIN_TRAIN_SIZE, category


def test_records_are_complete(committed):
    ids = set()
    for category, splits in committed.items():
        for split, records in splits.items():
            for record in records:
                assert record["category"] == category and record["split"] == split
                assert record["turns"] and all(isinstance(t, str) and t.strip() for t in record["turns"])
                assert record["source"] and record["license"] and record["groups"]
                ids.add(record["id"])
    assert len(ids) == sum(len(r) for s in committed.values() for r in s.values())


def test_train_and_eval_do_not_overlap(committed):
    def text(record):
        return " ".join(((record["system"] or "") + " " + " ".join(record["turns"])).split())

    eval_texts = {text(r) for s in committed.values() for r in s["eval"]}
    train_texts = {text(r) for s in committed.values() for r in s["train"]}
    assert not eval_texts & train_texts
    # No source document, template or topic used by an eval prompt (of any category) is used for training.
    eval_groups = {g for s in committed.values() for r in s["eval"] for g in r["groups"]}
    leaked = {g for s in committed.values() for r in s["train"] for g in r["groups"]} & eval_groups
    assert not leaked, sorted(leaked)[:10]


def test_no_near_duplicates_between_splits(committed):
    for category, splits in committed.items():
        train = ["\n".join(([r["system"]] if r["system"] else []) + r["turns"]) for r in splits["train"]]
        evals = ["\n".join(([r["system"]] if r["system"] else []) + r["turns"]) for r in splits["eval"]]
        worst = max(max_jaccard(train, evals))
        assert worst < NEAR_DUPLICATE_THRESHOLD, (category, worst)


def test_manifest_matches_files(committed):
    manifest = json.loads((PROMPTS_DIR / suites.MANIFEST).read_text())
    assert manifest["command"].startswith("carryover-hf prompts build --seed")
    for category in CATEGORIES:
        for split in suites.SPLITS:
            entry = manifest["categories"][category][split]
            path = PROMPTS_DIR / entry["file"]
            assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
            assert entry["size"] == len(committed[category][split])
            assert sum(info["prompts"] for info in entry["sources"].values()) == entry["size"]
            assert all(info["licenses"] for info in entry["sources"].values())


def test_max_jaccard():
    scores = max_jaccard(
        ["the quick brown fox jumps", "completely different words here", "The quick brown fox jumps!"],
        ["the quick brown fox jumps", "lorem ipsum dolor"],
    )
    assert scores[0] == pytest.approx(1.0)
    assert scores[2] == pytest.approx(1.0)  # case and punctuation do not hide a duplicate
    assert scores[1] < 0.2
    assert max_jaccard([], ["a"]) == [] and max_jaccard(["abc"], []) == [0.0]


def test_dedupe_keeps_punctuation_differences():
    make = lambda text: suites.Prompt([text], "s", "l", ["g"], "t")
    kept = suites._dedupe([make('brackets "("'), make('brackets "<"'), make('brackets  "("')], set())
    assert [p.turns[0] for p in kept] == ['brackets "("', 'brackets "<"']


TEMPLATE_ONLY = ("mt_bench", "writing")  # built from the project's templates alone: no system sources needed


def _as_dicts(built):
    return {c: {s: [suites.prompt_record(p, c, s, i) for i, p in enumerate(v)] for s, v in d.items()} for c, d in built.items()}


def test_builder_is_deterministic_and_seeded():
    quiet = lambda message: None
    first = _as_dicts(build_suites(seed=1, categories=TEMPLATE_ONLY, train_size=400, progress=quiet))
    again = _as_dicts(build_suites(seed=1, categories=TEMPLATE_ONLY, train_size=400, progress=quiet))
    other = _as_dicts(build_suites(seed=2, categories=TEMPLATE_ONLY, train_size=400, progress=quiet))
    assert first == again
    assert first["writing"]["eval"] != other["writing"]["eval"]
    for category in TEMPLATE_ONLY:
        assert len(first[category]["eval"]) == EVAL_SIZES[category]
        assert len(first[category]["train"]) == 400
        eval_groups = {g for r in first[category]["eval"] for g in r["groups"]}
        assert not eval_groups & {g for r in first[category]["train"] for g in r["groups"]}
    # mt_bench prompts are multi-turn.
    assert all(len(r["turns"]) == 2 for r in first["mt_bench"]["eval"])


def test_write_and_load_round_trip(tmp_path):
    built = build_suites(seed=3, categories=("writing",), train_size=300, progress=lambda m: None)
    suites.write_suites(built, tmp_path, seed=3, train_size=300)
    loaded = load_prompts("eval", ["writing"], tmp_path)
    assert [r["turns"] for r in loaded] == [p.turns for p in built["writing"]["eval"]]
    manifest = json.loads((tmp_path / suites.MANIFEST).read_text())
    assert manifest["command"] == "carryover-hf prompts build --seed 3 --train-size 300 --categories writing"
    with pytest.raises(FileNotFoundError, match="carryover-hf prompts build"):
        load_prompts("eval", ["qa"], tmp_path)


def test_unknown_category_and_split():
    with pytest.raises(ValueError, match="unknown categories"):
        build_suites(categories=("poetry",), progress=lambda m: None)
    with pytest.raises(ValueError, match="split must be one of"):
        load_prompts("test")


def test_math_reasoning_holds_out_whole_templates():
    pytest.importorskip("reasoning_gym")
    built = build_suites(seed=4, categories=("math_reasoning",), train_size=300, progress=lambda m: None)
    eval_templates = {p.template for p in built["math_reasoning"]["eval"]}
    train_templates = {p.template for p in built["math_reasoning"]["train"]}
    assert eval_templates and not eval_templates & train_templates
    assert all(p.reference for p in built["math_reasoning"]["eval"])
