"""Offline target features, the reduced draft vocabulary in training, chunked (memory-safe) losses, init from target."""

import json
import os

import pytest
import torch

from carryover_hf import CarryoverDrafterConfig, CarryoverDrafterModel
from carryover_hf.tools.testing import tiny_target
from carryover_hf.training import CarryoverTrainer, CarryoverTrainingArguments
from carryover_hf.training.collator import CarryoverDataCollator
from carryover_hf.training.feature_store import (
    FeatureBuildConfig,
    FeatureStore,
    FeatureStoreError,
    build_features,
)
from carryover_hf.training.initialization import grow_layers, initialize_from_target
from carryover_hf.training.losses import (
    DenseTeacher,
    TopKTeacher,
    draft_losses,
    head_row_losses,
    sampled_acceptance_metrics,
)
from carryover_hf.training.objectives import DrafterObjective
from carryover_hf.training.synthetic import regenerate_random_prompts
from carryover_hf.training.vocabulary import build_draft_vocabulary, draft_vocabulary, response_token_counts

BLOCK = 4
LAYERS = [0, 1]


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", seed=0)


@pytest.fixture(scope="module")
def rows(target):
    return regenerate_random_prompts(target, num_rows=10, prompt_length=6, response_length=20, seed=1)


def make_drafter(target, drafter_type="dflash", seed=0, draft_ids=None):
    config = CarryoverDrafterConfig.from_target_config(
        target.config, block_size=BLOCK, drafter_type=drafter_type, target_layer_ids=LAYERS
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    drafter = CarryoverDrafterModel(config)
    if drafter.markov_head is not None:
        torch.nn.init.normal_(drafter.markov_head.proj.weight, std=0.3)
    if draft_ids is not None:
        drafter.set_draft_vocabulary(draft_ids)
    return drafter


def build(target, rows, folder, **overrides):
    values = dict(output=str(folder), target_layer_ids=LAYERS, dtype="float32", shard_rows=4, batch_size=3)
    values.update(overrides)
    return build_features(FeatureBuildConfig(**values), target=target, rows=rows, progress=False)


@pytest.fixture(scope="module")
def store_dir(target, rows, tmp_path_factory):
    folder = tmp_path_factory.mktemp("features")
    build(target, rows, folder, top_k=8)
    return folder


def loss_and_grads(target, drafter, batch, **objective_options):
    objective = DrafterObjective(target, "dflash", gamma=3.0, **objective_options)
    drafter.zero_grad()
    output = objective(drafter, drafter, batch)
    loss = output.loss_sum / output.num_anchors
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}


def collate(rows_list, num_anchors=6):
    return CarryoverDataCollator(num_anchors=num_anchors, seed=3)(rows_list)


# -- offline features --------------------------------------------------------------------------------------------
def test_store_rows_equal_the_dataset_and_the_target_features(target, rows, store_dir):
    store = FeatureStore(store_dir)
    assert len(store) == len(rows)
    manifest = json.loads((store_dir / "features.json").read_text())
    assert manifest["complete"] and len(manifest["shards"]) == 3  # 10 rows in shards of 4
    for i in (0, 5, 9):
        row = store[i]
        assert row["input_ids"].tolist() == list(rows[i]["input_ids"])
        assert row["loss_mask"].tolist() == list(rows[i]["loss_mask"])
        ids = torch.tensor([rows[i]["input_ids"]])
        with torch.no_grad():
            out = target(input_ids=ids, output_hidden_states=True)
        expected = torch.cat([out.hidden_states[j + 1] for j in LAYERS], dim=-1)[0]
        torch.testing.assert_close(row["target_features"], expected, atol=1e-5, rtol=1e-5)
        top = torch.log_softmax(out.logits[0].float(), -1).topk(8, dim=-1)
        assert torch.equal(row["target_topk_ids"], top.indices)
        torch.testing.assert_close(row["target_topk_logprobs"], top.values, atol=1e-5, rtol=1e-5)


def test_rows_of_mixed_lengths_are_batched_by_length_and_stored_in_order(target, rows, tmp_path, monkeypatch):
    from carryover_hf.training import verification

    cut = [26, 9, 22, 11, 18, 7]  # rows of mixed lengths, not in length order
    mixed = [{"input_ids": list(rows[i]["input_ids"])[:n], "loss_mask": list(rows[i]["loss_mask"])[:n]}
             for i, n in enumerate(cut)]  # fmt: skip
    widths, forward = [], verification.target_forward

    def recording(model, ids, *args, **kwargs):
        widths.append(tuple(ids.shape))
        return forward(model, ids, *args, **kwargs)

    monkeypatch.setattr(verification, "target_forward", recording)
    build(target, mixed, tmp_path / "mixed", batch_size=2, shard_rows=6)
    assert widths == [(2, 9), (2, 18), (2, 26)]  # pairs of similar length: 7+9, 11+18, 22+26
    monkeypatch.setattr(verification, "target_forward", forward)
    store = FeatureStore(tmp_path / "mixed")
    for i, row in enumerate(mixed):
        assert store[i]["input_ids"].tolist() == row["input_ids"]  # the dataset's order is kept
        with torch.no_grad():
            out = target(input_ids=torch.tensor([row["input_ids"]]), output_hidden_states=True)
        expected = torch.cat([out.hidden_states[j + 1] for j in LAYERS], dim=-1)[0]
        torch.testing.assert_close(store[i]["target_features"], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,tolerance", [("float32", 1e-5), ("bfloat16", 3e-2), ("float16", 5e-3)])
def test_offline_loss_and_gradients_equal_the_online_path(target, rows, tmp_path, dtype, tolerance):
    build(target, rows, tmp_path, dtype=dtype)
    store = FeatureStore(tmp_path)
    online_batch = collate([rows[i] for i in range(4)])
    offline_batch = collate([store[i] for i in range(4)])
    assert torch.equal(online_batch["anchors"], offline_batch["anchors"])  # same rows draw the same anchors
    drafter = make_drafter(target)
    online_loss, online_grads = loss_and_grads(target, drafter, online_batch)
    offline_loss, offline_grads = loss_and_grads(target, drafter, offline_batch)
    torch.testing.assert_close(offline_loss, online_loss, atol=tolerance, rtol=tolerance)
    assert online_grads.keys() == offline_grads.keys() and online_grads
    for name in online_grads:
        scale = online_grads[name].abs().max().clamp(min=1e-6)
        assert (offline_grads[name] - online_grads[name]).abs().max() / scale < 10 * tolerance, name


def test_offline_training_runs_no_target_forward(target, store_dir, tmp_path, monkeypatch):
    drafter = make_drafter(target)
    args = CarryoverTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_anchors=6, max_steps=3, learning_rate=3e-3,
        warmup_steps=0, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=1,
    )  # fmt: skip
    trainer = CarryoverTrainer(model=drafter, target_model=target, args=args, train_dataset=FeatureStore(store_dir))
    calls = []
    handle = target.register_forward_pre_hook(lambda *a, **k: calls.append(1))
    try:
        trainer.train()
    finally:
        handle.remove()
    assert calls == []
    assert any("loss" in entry for entry in trainer.state.log_history)


def test_length_grouped_batches_read_lengths_from_the_offsets_alone(target, rows, store_dir, tmp_path, monkeypatch):
    store = FeatureStore(store_dir)
    lengths = [len(ids) for ids in rows["input_ids"]]
    assert store.row_lengths() == lengths and store.head(7).row_lengths() == lengths[:7]
    args = CarryoverTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_anchors=4, max_steps=2, warmup_steps=0,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, train_sampling_strategy="group_by_length",
    )  # fmt: skip
    trainer = CarryoverTrainer(model=make_drafter(target), target_model=target, args=args, train_dataset=store)
    monkeypatch.setattr(FeatureStore, "__getitem__", lambda *a: pytest.fail("a row was read to find its length"))
    sampler = trainer._get_train_sampler()
    assert sampler.lengths == lengths
    order = list(sampler)
    assert sorted(order) == list(range(len(rows)))
    # Transformers' grouping: megabatches of 50 batches, each sorted longest first (here all 10 rows in one).
    assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
    monkeypatch.undo()
    trainer.train()  # and it trains
    assert trainer.state.global_step == 2


def test_topk_distillation_from_the_store_matches_dense_on_the_same_support(target, rows, store_dir):
    """With K = vocabulary size the stored top-k is the whole distribution: sparse KL equals the online dense KL."""
    full = store_dir.parent / "full_topk"
    build(target, rows, full, top_k=target.config.vocab_size)
    store = FeatureStore(full)
    drafter = make_drafter(target)
    for kind in ("kl", "tv"):
        online, _ = loss_and_grads(target, drafter, collate([rows[i] for i in range(3)]), distillation=kind, distillation_weight=0.7)
        offline, _ = loss_and_grads(target, drafter, collate([store[i] for i in range(3)]), distillation=kind, distillation_weight=0.7)
        torch.testing.assert_close(offline, online, atol=1e-4, rtol=1e-4)


def test_resumed_build_equals_one_build(target, rows, tmp_path):
    build(target, rows, tmp_path / "one")
    build(target, rows, tmp_path / "two", max_shards=1)
    with pytest.raises(FeatureStoreError, match="unfinished"):
        FeatureStore(tmp_path / "two")
    build(target, rows, tmp_path / "two")
    one, two = FeatureStore(tmp_path / "one"), FeatureStore(tmp_path / "two")
    for i in range(len(rows)):
        assert torch.equal(one[i]["target_features"], two[i]["target_features"])


def test_store_grows_with_its_dataset_and_encodes_only_the_new_rows(target, rows, tmp_path, monkeypatch):
    """A regeneration run gains chunks: rerunning the build keeps the full shards, redoes the short last one, and
    ends equal to a build of the grown dataset in one go."""
    import carryover_hf.training.feature_store as feature_store

    first = rows.select(range(6))  # shards of 4: one full, one short (2 rows)
    build(target, first, tmp_path / "grown")
    kept = (tmp_path / "grown" / "shard-00000.safetensors").stat().st_mtime_ns
    encoded = []
    original = feature_store._encode_rows
    monkeypatch.setattr(feature_store, "_encode_rows", lambda t, shard, *a: encoded.append(len(shard)) or original(t, shard, *a))
    manifest = build(target, rows, tmp_path / "grown")
    assert encoded == [4, 2]  # rows 4-7 (the short shard, redone with its new rows) and 8-9; rows 0-3 kept
    assert (tmp_path / "grown" / "shard-00000.safetensors").stat().st_mtime_ns == kept
    assert manifest["complete"] and manifest["num_rows"] == len(rows)
    build(target, rows, tmp_path / "once")
    grown, once = FeatureStore(tmp_path / "grown"), FeatureStore(tmp_path / "once")
    assert grown.manifest["data_fingerprint"] == once.manifest["data_fingerprint"]
    grown.check_compatible(dataset=rows)
    for i in range(len(rows)):
        assert torch.equal(grown[i]["target_features"], once[i]["target_features"])
        assert torch.equal(grown[i]["input_ids"], once[i]["input_ids"])
    encoded.clear()
    build(target, rows, tmp_path / "grown")  # nothing new: nothing encoded
    assert encoded == []


def test_stores_read_together_are_their_rows_in_order(target, rows, tmp_path):
    """`FeatureStore([A, B])`: the rows of A then B, exactly as one store of the concatenated rows; checked against a
    dataset part by part; stores of other builds are refused together."""
    build(target, rows.select(range(6)), tmp_path / "a")
    build(target, rows.select(range(6, 10)), tmp_path / "b")
    build(target, rows, tmp_path / "whole")
    both, whole = FeatureStore([tmp_path / "a", tmp_path / "b"]), FeatureStore(tmp_path / "whole")
    assert len(both) == len(whole) == len(rows) and both.row_lengths() == whole.row_lengths()
    for i in range(len(rows)):
        assert torch.equal(both[i]["target_features"], whole[i]["target_features"])
        assert torch.equal(both[i]["input_ids"], whole[i]["input_ids"])
    both.check_compatible(dataset=rows)
    with pytest.raises(FeatureStoreError, match="other data"):
        both.check_compatible(dataset=rows.select([*range(6), 7, 6, 8, 9]))
    with pytest.raises(FeatureStoreError, match="other data"):
        both.check_compatible(dataset=rows.select(range(8)))
    build(target, rows.select(range(6, 10)), tmp_path / "other", top_k=2)
    with pytest.raises(FeatureStoreError, match="other settings"):
        FeatureStore([tmp_path / "a", tmp_path / "other"])


def test_store_refuses_a_dataset_with_other_or_fewer_rows(target, rows, tmp_path):
    build(target, rows.select(range(8)), tmp_path)
    reordered = rows.select([1, 0, *range(2, 10)])
    with pytest.raises(FeatureStoreError, match="other rows than the dataset given.*from row 0"):
        build(target, reordered, tmp_path)
    with pytest.raises(FeatureStoreError, match="other rows than the dataset given"):
        build(target, rows.select(range(4)), tmp_path)  # the store holds more rows than the dataset
    with pytest.raises(FeatureStoreError, match="other data than the --dataset given"):
        FeatureStore(tmp_path).check_compatible(dataset=rows)  # 10 rows given, 8 stored


def test_resume_with_other_settings_is_refused(target, rows, tmp_path):
    build(target, rows, tmp_path, max_shards=1)
    with pytest.raises(FeatureStoreError, match="another build.*dtype"):
        build(target, rows, tmp_path, dtype="bfloat16")


def test_damaged_stores_fail_before_the_first_step(target, rows, tmp_path):
    build(target, rows, tmp_path)
    shard = tmp_path / "shard-00001.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(FeatureStoreError, match="shard-00001.*truncated"):
        FeatureStore(tmp_path)
    shard.unlink()
    with pytest.raises(FeatureStoreError, match="shard-00001.*missing"):
        FeatureStore(tmp_path)


def test_store_for_other_layers_or_another_target_is_refused(target, store_dir, tmp_path):
    store = FeatureStore(store_dir)
    args = CarryoverTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    other_layers = CarryoverDrafterConfig.from_target_config(target.config, block_size=BLOCK, target_layer_ids=[1])
    with pytest.raises(FeatureStoreError, match="stores target layers"):
        CarryoverTrainer(model=CarryoverDrafterModel(other_layers), target_model=target, args=args, train_dataset=store)
    other_target = tiny_target("llama", seed=5)
    with pytest.raises(FeatureStoreError, match="another target"):
        CarryoverTrainer(model=make_drafter(other_target), target_model=other_target, args=args, train_dataset=store)


def test_distillation_without_stored_topk_is_refused(target, rows, tmp_path):
    build(target, rows, tmp_path)
    args = CarryoverTrainingArguments(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, distillation="kl"
    )
    with pytest.raises(ValueError, match="top-k"):
        CarryoverTrainer(model=make_drafter(target), target_model=target, args=args, train_dataset=FeatureStore(tmp_path))


# -- the reduced draft vocabulary in training -----------------------------------------------------------------------
def test_vocabulary_ranks_by_count_then_lowest_id():
    counts = torch.zeros(10, dtype=torch.long).numpy()
    counts[[7, 3, 9]] = [5, 2, 2]
    assert draft_vocabulary(counts, 2).tolist() == [3, 7]
    assert draft_vocabulary(counts, 5).tolist() == [0, 1, 3, 7, 9]  # every seen id, then the lowest unseen ones
    with pytest.raises(ValueError, match="draft_vocab_size"):
        draft_vocabulary(counts, 11)


def test_vocabulary_record_reports_held_out_coverage(target, rows):
    ids, record = build_draft_vocabulary([rows[i] for i in range(8)], [rows[8], rows[9]], target.config.vocab_size, 20)
    counts = response_token_counts([rows[8], rows[9]], target.config.vocab_size)
    assert record["coverage_held_out"] == pytest.approx(counts[ids].sum() / counts.sum(), abs=1e-5)
    assert len(ids) == 20 and record["held_out_response_tokens"] == counts.sum()


@pytest.mark.parametrize("drafter_type", ["dflash", "markov"])
def test_reduced_vocabulary_loss_is_the_loss_over_the_draft_rows(target, rows, drafter_type):
    """Training over a draft vocabulary = the full-vocabulary computation restricted to those logits."""
    batch = collate([rows[i] for i in range(3)])
    seen = sorted(set(torch.as_tensor(batch["input_ids"]).flatten().tolist()))
    draft_ids = seen[: max(2, len(seen) * 2 // 3)]  # leaves out some response tokens on purpose
    drafter = make_drafter(target, drafter_type, draft_ids=draft_ids)
    objective = DrafterObjective(target, "dflash", gamma=3.0)
    output = objective(drafter, drafter, batch)

    # Reference: full-vocabulary logits (-inf outside), CE only on labels inside the draft vocabulary.
    from carryover_hf.training.losses import block_labels, position_weights
    from carryover_hf.training.objectives import block_ids

    blocks = block_ids(batch["input_ids"], batch["anchors"], BLOCK, drafter.config.mask_token_id)
    states = objective.run_drafter(drafter, drafter, blocks, batch["anchors"], _features(target, batch))
    labels, valid = block_labels(batch["input_ids"], batch["loss_mask"], batch["anchors"], batch["anchor_mask"], BLOCK)
    previous = torch.cat([blocks[..., :1], labels[..., :-1]], -1) if drafter_type == "markov" else None
    logits = drafter.proposal_logits(states[:, :, 1:], target.get_output_embeddings(), previous)
    inside = torch.isin(labels, torch.tensor(draft_ids))
    ce = torch.where(inside, draft_losses(logits, labels.clamp(min=0)), 0.0)
    ce = torch.nan_to_num(ce, posinf=0.0)
    weights = position_weights(BLOCK, 3.0)
    expected = (ce * valid * weights).sum() / weights.sum()
    torch.testing.assert_close(output.loss_sum, expected, atol=1e-5, rtol=1e-5)
    assert (~inside & valid).any(), "the test should exercise labels outside the draft vocabulary"


def _features(target, batch):
    with torch.no_grad():
        out = target(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    return torch.cat([out.hidden_states[j + 1] for j in LAYERS], dim=-1)


# -- memory-safe losses -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("distillation", [None, "kl", "tv"])
def test_chunked_losses_and_gradients_equal_one_chunk(target, distillation):
    torch.manual_seed(0)
    drafter = make_drafter(target, "markov", draft_ids=list(range(0, target.config.vocab_size, 2)))
    head = drafter.draft_head(target.get_output_embeddings())
    hidden = torch.randn(37, drafter.config.hidden_size, requires_grad=True)
    labels = torch.randint(0, target.config.vocab_size, (37,))
    previous = torch.randint(0, target.config.vocab_size, (37,))
    teacher = DenseTeacher(torch.randn(37, target.config.hidden_size), target.get_output_embeddings(), head.token_ids)
    results = []
    for chunk in (1 << 30, 3 * head.size):  # one chunk; chunks of 3 rows (checkpointed)
        drafter.zero_grad()
        hidden.grad = None
        markov = drafter.markov_head(previous).float()
        loss, picks = head_row_losses(
            hidden, head, labels, transition=lambda s, e: markov[s:e], teacher=teacher,
            distillation=distillation, distillation_weight=0.6 if distillation else 0.0, max_chunk_elements=chunk,
        )  # fmt: skip
        (loss * torch.linspace(0.5, 1.5, 37)).sum().backward()
        results.append((loss.detach(), picks, hidden.grad.clone(), drafter.markov_head.proj.weight.grad.clone()))
    (l1, p1, g1, w1), (l2, p2, g2, w2) = results
    torch.testing.assert_close(l2, l1)
    assert torch.equal(p1, p2)
    torch.testing.assert_close(g2, g1)
    torch.testing.assert_close(w2, w1)


def test_sparse_teacher_over_the_whole_vocabulary_equals_the_dense_teacher(target):
    torch.manual_seed(1)
    drafter = make_drafter(target)
    head = drafter.draft_head(target.get_output_embeddings())
    hidden, labels = torch.randn(9, drafter.config.hidden_size), torch.randint(0, target.config.vocab_size, (9,))
    teacher_logits = torch.randn(9, target.config.vocab_size) * 2
    log_p = torch.log_softmax(teacher_logits, -1)
    values, ids = log_p.topk(target.config.vocab_size, -1)
    for kind in ("kl", "tv"):
        dense, _ = head_row_losses(hidden, head, labels, teacher=DenseTeacher(teacher_logits, lambda s: s, None),
                                   distillation=kind, distillation_weight=1.0)  # fmt: skip
        sparse, _ = head_row_losses(hidden, head, labels, teacher=TopKTeacher(ids, values, head.to_draft_indices),
                                    distillation=kind, distillation_weight=1.0)  # fmt: skip
        torch.testing.assert_close(sparse, dense, atol=1e-5, rtol=1e-5)


def test_overlap_is_the_probability_that_a_sampled_draft_is_accepted(target):
    # Speculative sampling accepts a draft x ~ q with probability min(1, p(x) / q(x)): in expectation Σ min(p, q).
    torch.manual_seed(2)
    drafter = make_drafter(target, "markov", draft_ids=list(range(0, target.config.vocab_size, 2)))
    head = drafter.draft_head(target.get_output_embeddings())
    hidden, labels = torch.randn(11, drafter.config.hidden_size), torch.randint(0, target.config.vocab_size, (11,))
    markov = drafter.markov_head(torch.randint(0, target.config.vocab_size, (11,))).float()
    states = torch.randn(11, target.config.hidden_size)
    teacher = DenseTeacher(states, target.get_output_embeddings(), head.token_ids)
    with torch.no_grad():
        q = torch.softmax(head(hidden) + markov, -1)
        p = torch.softmax(target.get_output_embeddings()(states).index_select(-1, head.token_ids), -1)
        expected = torch.minimum(p, q).sum(-1)
        for chunk in (1 << 30, 3 * head.size):
            _, _, overlap = head_row_losses(hidden, head, labels, transition=lambda s, e: markov[s:e], teacher=teacher,
                                            max_chunk_elements=chunk, overlap=True)  # fmt: skip
            torch.testing.assert_close(overlap, expected)
        # The same from the stored top-k when it holds the whole draft vocabulary.
        values, ids = torch.log_softmax(target.get_output_embeddings()(states), -1).topk(target.config.vocab_size, -1)
        _, _, sparse = head_row_losses(hidden, head, labels, transition=lambda s, e: markov[s:e],
                                       teacher=TopKTeacher(ids, values, head.to_draft_indices), overlap=True)  # fmt: skip
        torch.testing.assert_close(sparse, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="teacher|distribution"):
        head_row_losses(hidden, head, labels, overlap=True)


def test_sampled_acceptance_length_multiplies_the_overlaps_along_the_block():
    overlap = torch.tensor([[[0.5, 0.5, 1.0], [0.2, 1.0, 1.0]]])
    valid = torch.tensor([[[True, True, True], [True, True, False]]])
    metrics = sampled_acceptance_metrics(overlap, valid, torch.tensor([[True, True]]))
    total, count = metrics["tau_t1_teacher_forced"]
    # 1 + 0.5 + 0.25 + 0.25 = 2.0 for the first anchor; 1 + 0.2 + 0.2 = 1.4 for the second (its row 3 is not valid).
    assert count == 2 and total.item() == pytest.approx(3.4)
    assert [v.item() for v in metrics["acceptance_t1_pos_01"]] == pytest.approx([0.7, 2.0])


# -- initialisation from the target ---------------------------------------------------------------------------------
def test_init_from_target_copies_the_final_norm_and_a_layer(target):
    drafter = make_drafter(target)
    copied = initialize_from_target(drafter, target, final_norm=True, layer=1)
    assert torch.equal(drafter.norm.weight, target.model.norm.weight)
    assert torch.equal(drafter.layers[0].mlp.up_proj.weight, target.model.layers[1].mlp.up_proj.weight)
    assert torch.equal(drafter.layers[0].self_attn.q_proj.weight, target.model.layers[1].self_attn.q_proj.weight)
    assert "layers.0.self_attn.q_norm.weight" not in copied  # Llama layers have no q/k norms
    with pytest.raises(ValueError, match="first copied layer"):
        initialize_from_target(drafter, target, layer=target.config.num_hidden_layers)


def test_a_grown_drafter_computes_what_it_did_until_trained(target):
    """grow_layers: the new layers start as the target's last layer with zeroed output projections, so the deeper
    drafter's outputs equal the trained one's; training then moves the new layers (their gradients are not zero)."""
    drafter = make_drafter(target, drafter_type="markov", seed=3, draft_ids=torch.arange(0, target.config.vocab_size, 2))
    grown = grow_layers(drafter, target, 3)
    assert grown.config.num_hidden_layers == 3 and drafter.config.num_hidden_layers == 1  # the original is untouched
    assert grown.generation_config.to_dict() == drafter.generation_config.to_dict()
    assert grown.generation_config is not drafter.generation_config
    source = target.model.layers[-1]
    assert torch.equal(grown.layers[2].self_attn.q_proj.weight, source.self_attn.q_proj.weight)
    assert not grown.layers[1].mlp.down_proj.weight.any() and not grown.layers[2].self_attn.o_proj.weight.any()
    hidden = target.config.hidden_size
    torch.manual_seed(0)
    inputs = {"block_embeds": torch.randn(1, BLOCK, hidden), "block_position_ids": torch.arange(9, 9 + BLOCK)[None],
              "context_features": torch.randn(1, 9, hidden * len(LAYERS)), "context_position_ids": torch.arange(9)[None]}  # fmt: skip
    before = drafter(**inputs).last_hidden_state
    after = grown(**inputs).last_hidden_state
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)
    after.square().sum().backward()
    assert grown.layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="cannot grow to 0"):
        grow_layers(drafter, target, 0)


def test_float16_storage_refuses_states_beyond_its_range(target, rows, tmp_path):
    loud = tiny_target("llama", seed=0)
    with torch.no_grad():
        loud.model.embed_tokens.weight.mul_(1e6)  # layer-0 outputs far beyond 65504
    with pytest.raises(FeatureStoreError, match="bfloat16"):
        build(loud, rows, tmp_path, dtype="float16")
    build(loud, rows, tmp_path / "bf16", dtype="bfloat16")  # bfloat16 holds them


def test_default_init_skips_layers_whose_shapes_differ(target):
    """The CLI's default (strict=False) keeps the final norm and copies no layer when shapes differ; explicit fails."""
    from carryover_hf.training.initialization import last_layers

    config = CarryoverDrafterConfig.from_target_config(
        target.config, block_size=BLOCK, target_layer_ids=LAYERS, intermediate_size=24
    )
    drafter = CarryoverDrafterModel(config)
    before = drafter.layers[0].mlp.up_proj.weight.clone()
    layer = last_layers(drafter, target)
    assert layer == target.config.num_hidden_layers - 1
    copied = initialize_from_target(drafter, target, final_norm=True, layer=layer, strict=False)
    assert list(copied) == ["norm.weight"] and torch.equal(drafter.layers[0].mlp.up_proj.weight, before)
    with pytest.raises(ValueError, match="shape"):
        initialize_from_target(drafter, target, layer=layer, strict=True)
