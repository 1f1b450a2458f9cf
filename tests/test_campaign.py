"""`carryover-hf campaign`: a training campaign that stops and resumes across sessions, on tiny models.

A campaign stopped at a checkpoint and resumed takes the same steps as one that never stopped (weights equal), its
log entries carry training core-hours that keep growing across the stop, milestones are taken at doublings of
compute and benchmarked, and the report writes the curve. Bad settings fail before any model work.
"""

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from carryover_hf.errors import UsageError
from carryover_hf.tools import campaign as campaign_module
from carryover_hf.tools.campaign import Campaign, CampaignConfig, extrapolate, milestone_core_hours, run, write_report
from carryover_hf.tools.testing import tiny_target
from carryover_hf.training.feature_store import FeatureStore
from carryover_hf.training.synthetic import regenerate_random_prompts


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", seed=0)


@pytest.fixture(scope="module")
def dataset(target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rows") / "rows"
    regenerate_random_prompts(target, num_rows=12, prompt_length=6, response_length=24, seed=1).save_to_disk(str(folder))
    return folder


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    rows = [{"id": f"c{c}/{i}", "input_ids": [(7 * i + c) % 60 + 1 for _ in range(1)] + list(range(3, 9)),
             "category": f"c{c}", "split": "eval"} for c in range(2) for i in range(1)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config_for(dataset, prompts=None, **overrides):
    values = dict(name="tiny", target="tiny", datasets=[str(dataset)], held_out_rows=[0, 3], target_layer_ids=[0, 1],
                  feature_dtype="float32", top_k=4, feature_shard_rows=4, drafter_type="markov", block_size=4,
                  draft_vocab_size=48, per_device_train_batch_size=2, num_anchors=4, save_steps=4, eval_steps=3,
                  logging_steps=1, warmup_steps=2, milestone_prompts_per_category=0, first_milestone_core_hours=1e6,
                  milestone_max_new_tokens=8, milestone_temperatures=[0.0])  # fmt: skip
    if prompts is not None:
        values["milestone_prompts"] = str(prompts)
    values.update(overrides)
    return CampaignConfig(**values)


def tick_clock(monkeypatch):
    """A clock that advances half a second per call stands in for CPU time, so milestones fall at known places."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(campaign_module.time, "process_time", lambda: 0.5 * next(ticks))


def start(folder, config):
    campaign = Campaign(folder)
    campaign.create_or_check(config)
    return campaign


def weights(campaign, step):
    return load_file(str(campaign.dir / "trunk" / f"checkpoint-{step}" / "model.safetensors"))


def test_stopped_and_resumed_campaign_equals_one_that_never_stopped(target, dataset, tmp_path):
    config = config_for(dataset)
    resumed = start(tmp_path / "resumed", config)
    run(resumed.dir, target=target, progress=False, stop_after_steps=6)
    first = resumed.log_history()
    run(resumed.dir, target=target, progress=False, stop_after_steps=10)
    whole = start(tmp_path / "whole", config)
    run(whole.dir, target=target, progress=False, stop_after_steps=10)

    a, b = weights(resumed, 10), weights(whole, 10)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-6, msg=name)
    # Core-hours on every log entry, growing across the stop; the held-out tau is evaluated.
    history = resumed.log_history()
    hours = [e["core_hours"] for e in history if "core_hours" in e]
    assert len(history) > len(first) and all(e.get("core_hours") for e in history)
    assert hours == sorted(hours) and hours[-1] > max(e["core_hours"] for e in first)
    evaluated = [e for e in history if "eval_tau_teacher_forced" in e]
    assert evaluated and all(1 <= e["eval_tau_decoding"] <= config.block_size for e in evaluated)
    # The held-out rows never enter the training store.
    train = json.loads((resumed.dir / "features-train" / "features.json").read_text())
    held_out = json.loads((resumed.dir / "features-eval" / "features.json").read_text())
    assert (train["num_rows"], held_out["num_rows"]) == (9, 3)


def test_milestones_at_doublings_are_decayed_benchmarked_and_reported(target, dataset, prompts, tmp_path, monkeypatch):
    tick_clock(monkeypatch)
    config = config_for(dataset, prompts, first_milestone_core_hours=2 / 3600, milestone_prompts_per_category=1,
                        milestone_decay_fraction=0.25, milestone_min_decay_steps=2)  # fmt: skip
    campaign = start(tmp_path / "c", config)
    run(campaign.dir, target=target, progress=False, stop_after_steps=8)

    milestones = campaign.milestones()
    assert len(milestones) >= 2
    assert [m["index"] for m in milestones] == list(range(len(milestones)))
    for m in milestones:
        assert m["core_hours"] >= milestone_core_hours(config, m["index"])
        assert m["decay_steps"] == max(2, round(0.25 * m["step"])) and m["final_learning_rate"] == pytest.approx(0.0)
        assert m["eval_tau"] >= 1 and m["eval_tau_decoding"] >= 1
        assert 1 <= m["eval_tau_t1"] <= config.block_size  # the expected acceptance length of sampled drafts
        bench = m["bench"]["T=0"]
        assert bench["prompts"] == 2 and bench["speedup"]["estimate"] > 0 and bench["tau"]["estimate"] >= 1
        adaptive = bench["adaptive"]  # the drafter alone, each round's length chosen by the cost policy
        assert adaptive["prompts"] == 2 and adaptive["speedup"]["estimate"] > 0 and adaptive["tau"]["estimate"] >= 1
        assert (campaign.dir / "milestones" / f"m{m['index']:02d}" / "model.safetensors").is_file()
        assert not (campaign.dir / "milestones" / f"m{m['index']:02d}" / "decay").exists()
    # The decay branches leave the trunk as it was: its weights equal those of a campaign without milestones.
    plain = start(tmp_path / "plain", config_for(dataset))
    run(plain.dir, target=target, progress=False, stop_after_steps=8)
    a, b = weights(campaign, 8), weights(plain, 8)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-6, msg=name)
    # ... and a milestone's weights differ from the trunk checkpoint it branched from (they were annealed further).
    first = load_file(str(campaign.dir / "milestones" / "m00" / "model.safetensors"))
    assert any(not torch.equal(first[name], weights(plain, 8)[name]) for name in first)

    # A milestone retaken after a stop finds the bench the stop cut short in its folder, and measures again from
    # scratch (the campaign crashed here once: the bench's journal refused to open a folder holding a run).
    assert (campaign.dir / "milestones" / "m00" / "bench" / "runs.jsonl").is_file()
    again = campaign_module.benchmark_milestone(config, campaign.dir / "milestones" / "m00", target, None, False)
    assert again["T=0"]["prompts"] == 2

    # A milestone recorded before the decoding tau and the tau at T = 1 existed gets them at the next start, from its
    # saved weights: the values its own evaluation gave.
    recorded = {key: milestones[0][key] for key in ("eval_tau_decoding", "eval_tau_t1")}
    campaign.add_milestone({**milestones[0], "eval_tau_decoding": None, "eval_tau_t1": None})
    rows = FeatureStore(campaign.dir / "features-eval")
    trainers = campaign_module._Trainers(config, target, None, FeatureStore(campaign.dir / "features-train"), rows,
                                         campaign.dir / "trunk")  # fmt: skip
    campaign_module.backfill_held_out(campaign, config, trainers)
    for key, value in recorded.items():
        assert campaign.milestones()[0][key] == pytest.approx(value, abs=1e-4), key
    assert not (campaign.dir / "backfill").exists()

    out, kept = tmp_path / "report", tmp_path / "weights"
    data = write_report(campaign, out, kept)
    assert {p.name for p in out.iterdir()} == {"curve.json", "curve.md", "curve.png"}
    assert data["eval"] and data["milestones"] == milestones
    assert "T=0" in (out / "curve.md").read_text() and "held-out τ (decoding)" in (out / "curve.md").read_text()
    # Every target of the issue gets a line, on the milestones that measured its metric.
    assert [(r["metric"], r["target"]) for r in data["extrapolation"]] == [(k, t) for k, _, t in campaign_module.CURVE_TARGETS]
    held_out = next(r for r in data["extrapolation"] if r["metric"] == "eval_tau_decoding")
    assert held_out["points"] == min(len(milestones), campaign_module.EXTRAPOLATION_WINDOW)
    assert "core-hours to the target" in (out / "curve.md").read_text()
    assert (kept / "model.safetensors").is_file() and (kept / "config.json").is_file()


@pytest.fixture(scope="module")
def validation(target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("validation") / "rows"
    regenerate_random_prompts(target, num_rows=4, prompt_length=5, response_length=16, seed=7).save_to_disk(str(folder))
    return folder


def test_a_validation_set_is_measured_every_validation_steps_and_at_milestones_outside_the_core_hours(
        target, dataset, validation, tmp_path, monkeypatch):  # fmt: skip
    tick_clock(monkeypatch)
    config = config_for(dataset, first_milestone_core_hours=4 / 3600, milestone_decay_fraction=0.25,
                        milestone_min_decay_steps=2)  # fmt: skip
    campaign = start(tmp_path / "c", config)
    run(campaign.dir, target=target, progress=False, stop_after_steps=2)
    assert not any("eval_validation_loss" in e for e in campaign.log_history())
    # Added on a resume (it only measures); replacing it later is refused (its curve would mix two sets).
    added = campaign.create_or_check(config_for(dataset, first_milestone_core_hours=4 / 3600,
                                                milestone_decay_fraction=0.25, milestone_min_decay_steps=2,
                                                validation_dataset=str(validation), validation_steps=2))  # fmt: skip
    assert added.validation_dataset == str(validation.resolve())
    with pytest.raises(UsageError, match="validation_dataset .*added, not replaced"):
        campaign.create_or_check(config_for(dataset, validation_dataset=str(dataset)))
    with pytest.raises(UsageError, match="validation_steps must be at least 1"):
        config_for(dataset, validation_steps=0).validate()
    run(campaign.dir, target=target, progress=False, stop_after_steps=6)

    store = json.loads((campaign.dir / "features-validation" / "features.json").read_text())
    assert store["num_rows"] == 4  # every row of the validation set, none held out of it
    history = campaign.log_history()
    validated = [e for e in history if "eval_validation_loss" in e]
    assert [e["step"] for e in validated] == [4, 6] and all(e.get("core_hours") for e in validated)
    # The trunk's own logging and held-out evaluation go on at the steps the validation set is measured at (step 6
    # has all three: eval_steps 3, logging_steps 1).
    assert {e["step"] for e in history if "loss" in e and "eval_loss" not in e} >= {3, 4, 5, 6}
    assert {e["step"] for e in history if "eval_tau_teacher_forced" in e} >= {3, 6}
    assert all(1 <= e["eval_validation_tau_decoding"] <= config.block_size for e in validated)
    assert all(1 <= e["eval_validation_tau_t1_teacher_forced"] <= config.block_size for e in validated)
    # The milestones (the ones before the set was added get it from their weights at the restart).
    milestones = campaign.milestones()
    assert milestones and all(m["validation_tau_decoding"] >= 1 and m["validation_loss"] > 0 for m in milestones)
    data = write_report(campaign, tmp_path / "report")
    assert [p["step"] for p in data["validation"]] == [4, 6]
    assert "validation τ (decoding)" in (tmp_path / "report" / "curve.md").read_text()
    by_metric = {r["metric"]: r for r in data["extrapolation"]}
    assert by_metric["validation_tau_decoding"]["points"] == min(len(milestones), campaign_module.EXTRAPOLATION_WINDOW)


def test_validation_time_is_not_training_time(monkeypatch):
    now = iter([10.0, 25.0, 40.0, 100.0])  # started; excluded block from 25 to 40; read at 100
    monkeypatch.setattr(campaign_module.time, "process_time", lambda: next(now))
    clock = campaign_module.CoreHours(spent_before=5.0)
    with clock.excluded():
        pass
    assert clock.seconds() == pytest.approx(5.0 + 90.0 - 15.0)


def test_a_dataset_that_grows_extends_its_own_store_and_leaves_the_next_datasets_store_alone(target, tmp_path):
    # The campaign here crashed once: its one training store held the datasets concatenated, so when the first
    # (a regeneration run) gained chunks, the second one's rows moved and the store refused the data.
    whole = regenerate_random_prompts(target, num_rows=12, prompt_length=6, response_length=24, seed=1)
    first, second = tmp_path / "first", tmp_path / "second"
    whole.select(range(8)).save_to_disk(str(first))
    regenerate_random_prompts(target, num_rows=6, prompt_length=6, response_length=24, seed=2).save_to_disk(str(second))
    campaign = start(tmp_path / "c", config_for(first, datasets=[str(first), str(second)]))
    run(campaign.dir, target=target, progress=False, stop_after_steps=2)
    manifest = lambda name: json.loads((campaign.dir / name / "features.json").read_text())  # noqa: E731
    before = manifest("features-train-1")
    assert (manifest("features-train")["num_rows"], before["num_rows"]) == (5, 6)

    grown = tmp_path / "grown"
    whole.save_to_disk(str(grown))
    first.rename(tmp_path / "old")
    grown.rename(first)
    run(campaign.dir, target=target, progress=False, stop_after_steps=4)
    assert manifest("features-train")["num_rows"] == 9 and manifest("features-train-1")["shards"] == before["shards"]
    assert manifest("features-eval")["num_rows"] == 3
    assert campaign.log_history()[-1]["step"] == 4


def test_feature_stores_may_be_built_with_more_threads_than_the_campaign_trains_with(target, dataset, tmp_path,
                                                                                     monkeypatch):
    from carryover_hf.training import feature_store

    built, original = [], feature_store.build_features

    def recording(build, **kwargs):
        built.append(build.num_threads)
        return original(build, **kwargs)

    monkeypatch.setattr(feature_store, "build_features", recording)
    threads = torch.get_num_threads()
    try:
        campaign = start(tmp_path / "c", config_for(dataset, threads=1))
        run(campaign.dir, target=target, progress=False, stop_after_steps=1, build_threads=2)
        assert built and set(built) == {2}  # every store, held-out and training
        assert torch.get_num_threads() == 1  # then training at the campaign's own
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(UsageError, match="--build_threads must be at least 1"):
        campaign_module.main(["start", "--dir", str(tmp_path / "c"), "--build_threads", "0"])


def test_the_trunk_trains_beside_an_unfinished_build_in_legs_and_the_rows_it_reads_grow(target, dataset, tmp_path,
                                                                                       monkeypatch):  # fmt: skip
    # A machine without the stores: each leg builds one more shard of the training store, then trains on half as many
    # rows as it added (one step of 2 rows for a shard of 4), drawn from the rows built so far.
    tick_clock(monkeypatch)
    read, call = [], campaign_module._Trainers.__call__

    def recording(self, args, callbacks, weights=None):
        if weights is None:  # the trunk's legs (a decay branch passes the weights it starts from)
            read.append((len(self.train_rows), args.ignore_data_skip, campaign.trunk_step()))
        return call(self, args, callbacks, weights)

    monkeypatch.setattr(campaign_module._Trainers, "__call__", recording)
    campaign = start(tmp_path / "c", config_for(dataset, build_passes=0.5, build_slice_shards=1))
    run(campaign.dir, target=target, progress=False, stop_after_steps=6)
    # 9 training rows in shards of 4: 4, then 8, then all 9, after which the trunk trains on to its stop as before.
    assert read == [(4, True, 0), (8, True, 1), (9, False, 2)]  # rows read, a new pass, the step each leg starts at
    assert json.loads((campaign.dir / "features-train" / "features.json").read_text())["complete"]
    history = campaign.log_history()
    assert history[-1]["step"] == 6 and [e["step"] for e in history if "loss" in e] == [1, 2, 3, 4, 5, 6]
    # The new drafter's draft vocabulary counted every training row, not only the first slice's.
    vocabulary = json.loads((campaign.dir / "trunk" / "draft_vocabulary.json").read_text())
    whole = start(tmp_path / "whole", config_for(dataset))
    run(whole.dir, target=target, progress=False, stop_after_steps=1)
    expected = json.loads((whole.dir / "trunk" / "draft_vocabulary.json").read_text())
    assert vocabulary["training_response_tokens"] == expected["training_response_tokens"]


def test_a_moved_campaign_builds_first_the_rows_the_last_machine_did_not_reach(target, dataset, tmp_path, monkeypatch):
    from carryover_hf.training.feature_store import shard_fingerprints

    tick_clock(monkeypatch)
    config = config_for(dataset, build_passes=0.5, build_slice_shards=1, save_steps=1)
    first = start(tmp_path / "first", config)
    run(first.dir, target=target, progress=False, stop_after_steps=1)  # one leg: the first shard of 4 rows, one step
    assert json.loads((first.dir / "features-train" / "features.json").read_text())["num_rows"] == 4
    export = tmp_path / "export"
    write_report(first, tmp_path / "report", export, trunk=True)
    assert json.loads((export / "campaign_state.json").read_text())["next_build_start"] == {"features-train": 4}

    moved = start(tmp_path / "moved", config)
    moved.seed_from(export, config)
    run(moved.dir, target=target, progress=False, stop_after_steps=2)
    assert moved.build_order() == {"features-train": {"start": 4, "rows": 9}}
    # Its store begins with the 5 rows the first machine did not build, then comes round to the first 4.
    _, rows, indices = campaign_module.store_rows(config)["train"][0]
    stored = [s["data_fingerprint"] for s in json.loads((moved.dir / "features-train" / "features.json").read_text())["shards"]]
    rotated = indices[4:] + indices[:4]
    assert stored == shard_fingerprints(rows.select(rotated[: 4 * len(stored)]), 4)[: len(stored)]
    assert stored[0] != json.loads((first.dir / "features-train" / "features.json").read_text())["shards"][0]["data_fingerprint"]
    # Where the moved store stands now is where a further move would start.
    built = json.loads((moved.dir / "features-train" / "features.json").read_text())["num_rows"]
    assert campaign_module.next_build_starts(moved, config) == {"features-train": (4 + built) % 9 if built < 9 else 4}


def test_a_bfloat16_built_store_trains_drafters_for_the_float32_target(target, dataset, tmp_path, monkeypatch):
    # "auto" on a CPU that computes bfloat16 natively: the target builds in bfloat16, the trunk trains with float32.
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    campaign = start(tmp_path / "c", config_for(dataset, feature_target_dtype="auto"))
    run(campaign.dir, target=target, progress=False, stop_after_steps=2)
    settings = json.loads((campaign.dir / "features-train" / "features.json").read_text())["settings"]
    assert settings["target_dtype"] == "bfloat16" and next(target.parameters()).dtype == torch.float32
    store = FeatureStore(campaign.dir / "features-train")
    assert store.built_by(target) and store.built_by(copy.deepcopy(target).to(torch.bfloat16))
    other = tiny_target("llama", seed=1)
    with pytest.raises(campaign_module.UsageError, match="another target"):
        store.check_compatible(target=other)
    assert campaign.log_history()[-1]["step"] == 2


def test_a_resume_with_other_settings_or_bad_settings_is_refused(dataset, tmp_path):
    campaign = start(tmp_path / "c", config_for(dataset))
    with pytest.raises(UsageError, match="other settings .*block_size"):
        campaign.create_or_check(config_for(dataset, block_size=8))
    assert campaign.create_or_check(None) == campaign.load_config()  # a plain resume
    with pytest.raises(UsageError, match="held_out_rows"):
        Campaign(tmp_path / "d").create_or_check(config_for(dataset, held_out_rows=[5, 2]))
    with pytest.raises(UsageError, match="do not exist"):
        Campaign(tmp_path / "e").create_or_check(config_for(tmp_path / "missing"))
    with pytest.raises(UsageError, match="unknown campaign settings"):
        CampaignConfig.from_dict({"blocksize": 8})
    with pytest.raises(UsageError, match="no campaign"):
        Campaign(tmp_path / "f").load_config()
    assert not (tmp_path / "d").exists()
    # The carryover comparison's settings never touch the trunk: a resume may change them (and records that it did).
    with pytest.raises(UsageError, match="other settings .*milestone_prompts_per_category"):
        campaign.create_or_check(config_for(dataset, carry_steps=5, milestone_prompts_per_category=1))
    with pytest.raises(UsageError, match="carry_steps needs milestone_prompts_per_category"):
        campaign.create_or_check(config_for(dataset, carry_steps=5))
    changed = campaign.create_or_check(config_for(dataset, carry_num_anchors=2, carry_learning_rate=1e-3))
    assert (changed.carry_num_anchors, changed.carry_learning_rate) == (2, 1e-3) and campaign.load_config() == changed
    assert json.loads(campaign.config_path.read_text())["changes"][-1]["changed"] == ["carry_learning_rate",
                                                                                     "carry_num_anchors"]


def test_a_resume_may_change_the_trunks_loss_and_the_curve_shows_where(target, dataset, tmp_path):
    config = config_for(dataset)
    campaign = start(tmp_path / "c", config)
    run(campaign.dir, target=target, progress=False, stop_after_steps=4)
    changed = campaign.create_or_check(config_for(dataset, distillation="tv", distillation_weight=0.9))
    assert (changed.distillation, changed.distillation_weight) == ("tv", 0.9)
    change = json.loads(campaign.config_path.read_text())["changes"][-1]
    assert change["trunk_step"] == 4 and change["from"] == {"distillation": "kl", "distillation_weight": 0.5}
    assert change["to"] == {"distillation": "tv", "distillation_weight": 0.9}
    run(campaign.dir, target=target, progress=False, stop_after_steps=8)
    # The trunk went on from its checkpoint under the new loss: its weights differ from a trunk that kept the old one.
    kept = start(tmp_path / "kept", config)
    run(kept.dir, target=target, progress=False, stop_after_steps=8)
    torch.testing.assert_close(weights(campaign, 4), weights(kept, 4), rtol=0, atol=0)
    assert any(not torch.equal(weights(campaign, 8)[k], weights(kept, 8)[k]) for k in weights(kept, 8))
    data = write_report(campaign, tmp_path / "report")
    first_after = next(p["core_hours"] for p in data["train"] if p["step"] == 5)  # where the new loss begins
    assert data["recipe_changes"] == [{**change, "core_hours": first_after}]
    assert not write_report(kept, tmp_path / "kept-report")["recipe_changes"]
    assert "Recipe changed after trunk step 4" in (tmp_path / "report" / "curve.md").read_text()


def test_rows_that_answer_a_held_out_prompt_again_are_not_trained_on():
    import datasets

    from carryover_hf.tools.campaign import split_held_out

    rows = datasets.Dataset.from_dict({"id": ["a", "b", "c", "d", "b", "e"], "input_ids": [[i] for i in range(6)]})
    train, held_out = split_held_out(rows, range(1, 3))
    assert held_out == [1, 2] and rows.select(train)["id"] == ["a", "d", "e"]
    with pytest.raises(UsageError, match="need more"):
        split_held_out(rows, range(4, 8))


def test_a_campaign_goes_on_elsewhere_from_an_exported_milestone(target, dataset, tmp_path, monkeypatch):
    tick_clock(monkeypatch)
    config = config_for(dataset, first_milestone_core_hours=2 / 3600, milestone_decay_fraction=0.25,
                        milestone_min_decay_steps=2)  # fmt: skip
    first = start(tmp_path / "first", config)
    run(first.dir, target=target, progress=False, stop_after_steps=6)
    export = tmp_path / "export"
    write_report(first, tmp_path / "report", export)
    exported = first.milestones()[-1]
    assert json.loads((export / "campaign_state.json").read_text())["milestones"] == first.milestones()

    # Another machine: a new campaign folder with the same settings, its trunk seeded from the export.
    moved = start(tmp_path / "moved", config)
    moved.seed_from(export, config)
    assert [m["index"] for m in moved.milestones()] == [m["index"] for m in first.milestones()]
    run(moved.dir, target=target, progress=False, stop_after_steps=1)
    assert min(e["core_hours"] for e in moved.log_history()) >= exported["core_hours"]
    # Its first step starts from the exported weights (one warm-up step away), not from a new drafter.
    fresh = start(tmp_path / "fresh", config_for(dataset))
    run(fresh.dir, target=target, progress=False, stop_after_steps=1)
    seeded, after, new = load_file(str(export / "model.safetensors")), weights(moved, 1), weights(fresh, 1)
    to_seeded = max((after[n] - seeded[n]).abs().max().item() for n in seeded)
    to_new = max((after[n] - new[n]).abs().max().item() for n in seeded)
    assert to_seeded < to_new / 5, (to_seeded, to_new)
    # An export of another shape, or a campaign that has trained already, is refused before anything is written.
    with pytest.raises(UsageError, match="differs from the campaign's settings.*block_size"):
        campaign_module._start(Campaign(tmp_path / "other"), config_for(dataset, block_size=8), False, str(export))
    assert not (tmp_path / "other").exists()
    with pytest.raises(UsageError, match="already has a trunk"):
        campaign_module._start(moved, None, False, str(export))


def test_a_campaign_goes_on_elsewhere_from_its_exported_trunk_between_milestones(target, dataset, tmp_path,
                                                                                 monkeypatch):  # fmt: skip
    tick_clock(monkeypatch)
    config = config_for(dataset, save_steps=2)
    first = start(tmp_path / "first", config)
    run(first.dir, target=target, progress=False, stop_after_steps=2)
    first.create_or_check(config_for(dataset, save_steps=2, distillation="tv"))  # a recipe change at trunk step 2
    run(first.dir, target=target, progress=False, stop_after_steps=4)
    assert not first.milestones()
    export = tmp_path / "export"
    campaign_module.main(["report", "--dir", str(first.dir), "--out", str(tmp_path / "report"), "--weights",
                          str(export), "--trunk"])  # fmt: skip
    state = json.loads((export / "campaign_state.json").read_text())
    trunk_hours = json.loads((first.dir / "trunk" / "checkpoint-4" / "campaign_state.json").read_text())["core_seconds"] / 3600
    assert (state["source"], state["trunk_step"], state["milestones"]) == ("trunk", 4, [])
    assert state["core_hours"] == pytest.approx(trunk_hours, abs=1e-5)
    exported, trunk = load_file(str(export / "model.safetensors")), weights(first, 4)
    for name, tensor in trunk.items():
        if tensor.is_floating_point():
            assert exported[name].dtype == torch.bfloat16
            torch.testing.assert_close(exported[name], tensor.to(torch.bfloat16), rtol=0, atol=0)

    moved = start(tmp_path / "moved", config)
    moved.seed_from(export, config)
    assert moved.seed()["source"] == "trunk" and moved.seed()["trunk_step"] == 4
    run(moved.dir, target=target, progress=False, stop_after_steps=1)
    assert min(e["core_hours"] for e in moved.log_history()) >= state["core_hours"]
    # Its report draws the whole curve: the first machine's points, then its own.
    before, after = campaign_module.curve(first), campaign_module.curve(moved)
    assert before["eval"] and after["eval"][: len(before["eval"])] == before["eval"]
    assert after["train"][: len(before["train"])] == before["train"] and len(after["train"]) > len(before["train"])
    hours = [p["core_hours"] for p in after["train"]]
    assert hours == sorted(hours)
    # The recipe change keeps its place on the curve (the moved trunk's steps start again from 0).
    [change] = before["recipe_changes"]
    assert change["core_hours"] == next(p["core_hours"] for p in before["train"] if p["step"] == 3)
    assert after["recipe_changes"] == before["recipe_changes"]
    with pytest.raises(UsageError, match="--trunk needs --weights"):
        campaign_module.main(["report", "--dir", str(first.dir), "--out", str(tmp_path / "r2"), "--trunk"])
    with pytest.raises(UsageError, match="no trunk checkpoint"):
        write_report(start(tmp_path / "empty", config), tmp_path / "r3", tmp_path / "w3", trunk=True)


def test_carryover_is_compared_with_its_step_matched_continued_baseline_at_each_milestone(target, dataset, prompts,
                                                                                          tmp_path, monkeypatch):  # fmt: skip
    tick_clock(monkeypatch)
    config = config_for(dataset, prompts, first_milestone_core_hours=2 / 3600, milestone_prompts_per_category=1,
                        milestone_decay_fraction=0.25, milestone_min_decay_steps=2, carry_steps=3,
                        carry_num_anchors=2, carry_learning_rate=5e-3, carry_plain_weight=1.0)  # fmt: skip
    campaign = start(tmp_path / "c", config)
    run(campaign.dir, target=target, progress=False, stop_after_steps=4)

    milestones = campaign.milestones()
    assert milestones and all("carry" in m for m in milestones)
    folder = campaign.dir / "milestones" / "m00"
    start_weights = load_file(str(folder / "model.safetensors"))
    branches = {name: load_file(str(folder / "carry" / name / "model.safetensors")) for name in ("carryover", "continued")}
    configs = {name: json.loads((folder / "carry" / name / "config.json").read_text()) for name in branches}
    assert configs["carryover"]["trained_with_carryover"] and not configs["continued"]["trained_with_carryover"]
    # Both branches start from the milestone: E_carry trains only in the carryover branch, everything else moves in both.
    carry_names = [n for n in start_weights if "carry_embedding" in n]
    assert carry_names
    for n in carry_names:
        assert not torch.equal(branches["carryover"][n], start_weights[n])
        assert torch.equal(branches["continued"][n], start_weights[n])
    for branch in branches.values():
        assert any(not torch.equal(branch[n], start_weights[n]) for n in start_weights if n not in carry_names)
    record = milestones[0]["carry"]
    assert [record["branches"][name]["steps"] for name in ("carryover", "continued")] == [3, 3]
    assert record["plain_weight"] == 1.0
    assert all(b["eval_tau"] >= 1 for b in record["branches"].values())
    pair = record["bench"]["T=0"]["comparisons"]["carryover/carry_on vs continued/carry_off"]
    assert pair["acceptance_length_relative_gain"]["estimate"] is not None and pair["speed_ratio"]["estimate"] > 0
    assert set(record["bench"]["T=0"]["methods"]) >= {"target", "carryover/carry_on", "continued/carry_off"}
    for shares in record["attention"].values():
        assert shares["proposals"] > 0 and 0 <= (shares["carry_share"] or 0) <= 1
    assert not (folder / "carry" / "carryover" / "run").exists()
    data = write_report(campaign, tmp_path / "report")
    assert "step-matched continued baseline" in (tmp_path / "report" / "curve.md").read_text()
    assert {p.name for p in (tmp_path / "report" / "carry-m00").iterdir()} == {"carry.json", "results.md"}
    assert data["milestones"][0]["carry"] == record


def test_a_carryover_comparison_cut_short_by_a_stop_is_taken_when_the_campaign_resumes(target, dataset, prompts,
                                                                                       tmp_path, monkeypatch):  # fmt: skip
    tick_clock(monkeypatch)
    config = config_for(dataset, prompts, first_milestone_core_hours=2 / 3600, milestone_prompts_per_category=1,
                        milestone_decay_fraction=0.25, milestone_min_decay_steps=2)  # fmt: skip
    campaign = start(tmp_path / "c", config)
    run(campaign.dir, target=target, progress=False, stop_after_steps=2)  # a milestone, no comparison (carry_steps 0)
    assert campaign.milestones() and "carry" not in campaign.milestones()[-1]

    # A stop during the first branch: nothing is recorded, the cut branch is not kept.
    campaign.create_or_check(config_for(dataset, prompts, first_milestone_core_hours=2 / 3600, milestone_decay_fraction=0.25,
                                        milestone_prompts_per_category=1, milestone_min_decay_steps=2, carry_steps=3,
                                        carry_num_anchors=2))  # fmt: skip
    stop = campaign_module.StopRequest()
    stop()
    stores = campaign_module.build_stores(campaign, campaign.load_config(), target, progress=False)  # built already
    trainers = campaign_module._Trainers(campaign.load_config(), target, None, FeatureStore(stores["train"]),
                                         FeatureStore(stores["eval"]), campaign.dir / "trunk")  # fmt: skip
    assert campaign_module.compare_carryover(campaign, campaign.load_config(), trainers, campaign.milestones()[-1], stop,
                                             progress=False) is None  # fmt: skip
    newest = campaign.milestones()[-1]
    assert "carry" not in newest
    assert not (Path(newest["folder"]) / "carry" / "carryover" / "branch.json").exists()
    # The next run takes the newest milestone's comparison before the trunk goes on.
    run(campaign.dir, target=target, progress=False, stop_after_steps=3)
    assert "carry" in next(m for m in campaign.milestones() if m["index"] == newest["index"])


def test_targets_are_extrapolated_along_the_newest_milestones_gain_per_doubling():
    # 0.25 a doubling from 1.0 at one core-hour; the first point lies off the line and falls outside the window.
    points = [(0.5, 0.1), (1.0, 1.0), (2.0, 1.25), (4.0, 1.5)]
    record = extrapolate(points, 2.0)
    assert record["status"] == "extrapolated" and record["points"] == 3
    assert record["gain_per_doubling"] == pytest.approx(0.25) and record["core_hours"] == pytest.approx(16.0)
    assert extrapolate(points, 1.5)["status"] == "reached"
    flat = extrapolate([(1.0, 2.0), (2.0, 1.9), (4.0, 1.95)], 2.5)
    assert flat["status"] == "not on this trend" and flat["core_hours"] is None and flat["gain_per_doubling"] < 0
    assert extrapolate([(1.0, 1.0), (2.0, 1.2)], 2.0)["status"] == "too few points"
    assert extrapolate([], 2.0)["status"] == "too few points"
