"""CarryoverTrainer on tiny random targets: gradients, loss, acceptance, accumulation, resume, checkpoints, LoRA."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, GenerationConfig

import carryover_hf
from carryover_hf import CarryoverDrafterConfig, CarryoverDrafterModel, DrafterTargetMismatchError
from carryover_hf.tools.testing import tiny_target
from carryover_hf.training import (
    CarryoverTrainer,
    CarryoverTrainingArguments,
    apply_lora,
    load_lora_drafter,
    merge_lora,
)
from carryover_hf.training.synthetic import regenerate_random_prompts

BLOCK = 4
PROMPT, RESPONSE = 8, 32


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", seed=0)


@pytest.fixture(scope="module")
def dataset(target):
    return regenerate_random_prompts(target, num_rows=16, prompt_length=PROMPT, response_length=RESPONSE, seed=0)


def fresh_drafter(target, drafter_type="dflash", seed=0):
    """An untrained drafter as training starts from it (E_carry and the Markov head's W2 at zero)."""
    config = CarryoverDrafterConfig.from_target_config(target.config, block_size=BLOCK, drafter_type=drafter_type)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return CarryoverDrafterModel(config)


def make_args(output_dir, **overrides):
    values = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": 4,
        "num_anchors": 8,
        "learning_rate": 3e-3,
        "warmup_steps": 0,
        "logging_steps": 5,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
    }
    values.update(overrides)
    return CarryoverTrainingArguments(**values)


def acceptance_in_generate(target, drafter, dataset, rows=3, **options):
    """Mean acceptance length of `target.generate(..., assistant_model=drafter, **options)` on the training prompts."""
    drafter.eval()
    lengths = []
    for row in dataset.select(range(rows)):
        prompt = torch.tensor([row["input_ids"][:PROMPT]])
        target.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            assistant_model=drafter,
            max_new_tokens=RESPONSE,
            do_sample=False,
            pad_token_id=0,
            **options,
        )
        lengths += drafter.last_generation_stats.acceptance_lengths
    return sum(lengths) / len(lengths)


@pytest.mark.parametrize("objective", ["dflash", "carryover"])
def test_gradients_reach_only_the_drafter(target, dataset, tmp_path, objective):
    drafter = fresh_drafter(target)
    trainer = CarryoverTrainer(
        model=drafter, target_model=target, args=make_args(tmp_path), train_dataset=dataset, objective=objective
    )
    grads_enabled = []
    handle = drafter.register_forward_hook(lambda m, a, out: grads_enabled.append(out.last_hidden_state.requires_grad))
    batch = next(iter(trainer.get_train_dataloader()))
    drafter.train()
    loss = trainer.compute_loss(drafter, batch)
    loss.backward()
    handle.remove()

    assert not target.training
    assert all(p.grad is None and not p.requires_grad for p in target.parameters())
    # carryover: the first draft runs without gradient, only the second draft is trained.
    assert grads_enabled == ([True] if objective == "dflash" else [False, True])
    trained = {n: p for n, p in drafter.named_parameters() if n != "carry_embedding"}
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trained.values())
    if objective == "dflash":
        assert not drafter.carry_embedding.requires_grad and drafter.carry_embedding.grad is None
    else:
        assert drafter.carry_embedding.grad is not None and drafter.carry_embedding.grad.abs().sum() > 0
    optimizer = trainer.create_optimizer()
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in drafter.parameters() if p.requires_grad}
    assert not optimized & {id(p) for p in target.parameters()}


@pytest.mark.parametrize("drafter_type", ["dflash", "markov"])
@pytest.mark.parametrize("objective", ["dflash", "carryover"])
def test_loss_falls_and_acceptance_rises(target, dataset, tmp_path, objective, drafter_type):
    drafter = fresh_drafter(target, drafter_type)
    untrained = acceptance_in_generate(target, drafter, dataset)
    trainer = CarryoverTrainer(
        model=drafter,
        target_model=target,
        args=make_args(tmp_path, max_steps=30, learning_rate=4e-3, per_device_eval_batch_size=8),
        train_dataset=dataset,
        eval_dataset=dataset,
        objective=objective,
    )
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_loss"] < 0.9 * before, (before, after)
    trained = acceptance_in_generate(target, drafter, dataset)
    assert trained > untrained + 0.2, (untrained, trained)
    # The eval rows are the target's greedy answers: the replayed decoding is full-block greedy decoding, carry off.
    full_blocks = dict(use_carryover=False, round_policy="rules", lookup_drafts=0, proposal_backoff=0)
    replayed = acceptance_in_generate(target, drafter, dataset, rows=len(dataset),
                                      generation_config=GenerationConfig(**full_blocks))  # fmt: skip
    assert after["eval_tau_decoding"] == pytest.approx(replayed, abs=1e-4)

    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    expected = {"loss", "acc_pos_01", f"acc_pos_{BLOCK - 1:02d}", "tau_teacher_forced"}
    if objective == "carryover":
        expected |= {"first_draft_tau", "carry_rows"}
        assert 0 <= logged[-1]["carry_rows"] <= BLOCK - 1
        assert 1 <= logged[-1]["first_draft_tau"] <= BLOCK
        assert "eval_first_draft_tau" in after
    assert expected <= set(logged[-1])
    assert 1 <= logged[-1]["tau_teacher_forced"] <= BLOCK
    assert drafter.config.trained_with_carryover == (objective == "carryover")


@pytest.mark.parametrize("objective", ["dflash", "carryover"])
def test_gradient_accumulation_matches_one_large_batch(target, dataset, tmp_path, objective):
    results = []
    for batch_size, steps in ((4, 1), (2, 2)):
        drafter = fresh_drafter(target)
        args = make_args(
            tmp_path / f"ga{steps}",
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=steps,
            max_steps=1,
            optim="sgd",
            learning_rate=0.5,
            lr_scheduler_type="constant",
            train_sampling_strategy="sequential",
            logging_steps=1,
        )
        trainer = CarryoverTrainer(
            model=drafter, target_model=target, args=args, train_dataset=dataset, objective=objective
        )
        trainer.train()
        results.append(
            (trainer.state.log_history[0]["loss"], {n: p.detach().clone() for n, p in drafter.named_parameters()})
        )
    (loss_a, params_a), (loss_b, params_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    start = fresh_drafter(target).state_dict()
    assert any(not torch.allclose(params_a[n], start[n]) for n in params_a)
    for name in params_a:
        torch.testing.assert_close(params_a[name], params_b[name], atol=1e-6, rtol=1e-5)


def test_resume_continues_the_same_run_and_checkpoints_hold_the_drafter(target, dataset, tmp_path):
    target_before = {n: p.detach().clone() for n, p in target.named_parameters()}
    # 16 rows / batch 4 = 4 steps per epoch: the resumed part crosses into a new epoch (new anchors).
    common = {"max_steps": 6, "save_strategy": "steps", "save_steps": 3, "logging_steps": 1}
    full = fresh_drafter(target, "markov")
    CarryoverTrainer(
        model=full,
        target_model=target,
        args=make_args(tmp_path / "full", **common),
        train_dataset=dataset,
        objective="carryover",
    ).train()
    resumed = fresh_drafter(target, "markov")
    trainer = CarryoverTrainer(
        model=resumed,
        target_model=target,
        args=make_args(tmp_path / "resumed", **common),
        train_dataset=dataset,
        objective="carryover",
    )
    trainer.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    for (name, a), b in zip(full.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=name)

    # The target is untouched: bit-identical weights.
    for name, p in target.named_parameters():
        assert torch.equal(p, target_before[name]), name

    # Checkpoints: drafter tensors only, in safetensors, loadable with AutoModel.
    checkpoint = tmp_path / "full" / "checkpoint-6"
    files = set(os.listdir(checkpoint))
    assert "model.safetensors" in files and not any(f.endswith(".bin") and "model" in f for f in files)
    tensors = load_file(checkpoint / "model.safetensors")
    assert set(tensors) == set(full.state_dict())
    target_shapes = {tuple(p.shape) for p in target.parameters()}
    assert not any(name.startswith(("model.", "lm_head")) for name in tensors)
    assert "carry_embedding" in tensors and "markov_head.proj.weight" in tensors
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == "carryover_drafter" and config["trained_with_carryover"] is True
    loaded = AutoModel.from_pretrained(checkpoint)
    assert isinstance(loaded, CarryoverDrafterModel)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, full.state_dict()[name]), name
    optimizer_state = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    assert len(optimizer_state["state"]) == sum(p.requires_grad for p in full.parameters())
    del target_shapes


def test_lora_adapter_and_merged_weights(target, dataset, tmp_path):
    base = fresh_drafter(target)
    start = {n: p.detach().clone() for n, p in base.state_dict().items()}
    model = apply_lora(base, r=4, lora_alpha=8)
    trainer = CarryoverTrainer(
        model=model,
        target_model=target,
        args=make_args(tmp_path, max_steps=3),
        train_dataset=dataset,
        objective="carryover",
    )
    trainer.train()
    base_state = model.get_base_model().state_dict()
    changed = {
        n
        for n, t in base_state.items()
        if "lora_" not in n and not torch.equal(t, start[n.replace(".base_layer", "")])
    }
    assert changed == {"carry_embedding"}  # LoRA adapters and E_carry train; every base weight stays
    assert any("lora_" in n and p.requires_grad for n, p in model.named_parameters())

    trainer.save_model(str(tmp_path / "adapter"))
    assert {"adapter_model.safetensors", "carryover_extra.safetensors"} <= set(os.listdir(tmp_path / "adapter"))
    fresh = fresh_drafter(target)
    reloaded = load_lora_drafter(fresh, str(tmp_path / "adapter"))

    inputs = {
        "block_embeds": torch.randn(1, BLOCK, 64),
        "block_position_ids": torch.arange(10, 10 + BLOCK)[None],
        "context_features": torch.randn(1, 10, base.config.num_target_features),
        "context_position_ids": torch.arange(10)[None],
        "carry_features": torch.randn(1, 2, base.config.num_target_features),
        "carry_position_ids": torch.arange(10, 12)[None],
    }
    model.eval()
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        torch.testing.assert_close(reloaded(**inputs).last_hidden_state, expected)
        merged = merge_lora(model)
        assert isinstance(merged, CarryoverDrafterModel)
        merged.save_pretrained(tmp_path / "merged")
        loaded = AutoModel.from_pretrained(tmp_path / "merged")
        torch.testing.assert_close(loaded(**inputs).last_hidden_state, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("distillation", ["kl", "tv"])
def test_distillation_runs(target, dataset, tmp_path, distillation):
    drafter = fresh_drafter(target)
    trainer = CarryoverTrainer(
        model=drafter,
        target_model=target,
        args=make_args(tmp_path, max_steps=2, distillation=distillation, distillation_weight=0.5, logging_steps=1),
        train_dataset=dataset,
        objective="carryover",
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


def test_bad_inputs_fail_early(target, dataset, tmp_path):
    drafter = fresh_drafter(target)
    args = make_args(tmp_path)
    with pytest.raises(ValueError, match="target_model"):
        CarryoverTrainer(model=drafter, args=args, train_dataset=dataset)
    with pytest.raises(ValueError, match="objective"):
        CarryoverTrainer(model=drafter, target_model=target, args=args, train_dataset=dataset, objective="eagle")
    with pytest.raises(ValueError, match="loss_mask"):
        CarryoverTrainer(
            model=drafter, target_model=target, args=args, train_dataset=dataset.remove_columns("loss_mask")
        )
    other = tiny_target("llama", hidden_size=32)
    with pytest.raises(DrafterTargetMismatchError):
        CarryoverTrainer(model=drafter, target_model=other, args=args, train_dataset=dataset)
    with pytest.raises(ValueError, match="objective"):
        CarryoverTrainingArguments(output_dir=str(tmp_path), objective="nope")


def test_trainer_is_exported_lazily():
    assert carryover_hf.CarryoverTrainer is CarryoverTrainer
    assert carryover_hf.CarryoverTrainingArguments is CarryoverTrainingArguments


def test_plain_training_arguments(target, dataset, tmp_path):
    """`TrainingArguments` without the objective fields: defaults apply, the collator still gets its columns."""
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, report_to="none", use_cpu=True,
        logging_steps=1, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    trainer = CarryoverTrainer(model=fresh_drafter(target), target_model=target, args=args, train_dataset=dataset)
    assert trainer.objective == "dflash" and args.ddp_find_unused_parameters is False
    trainer.train()
    assert [entry["step"] for entry in trainer.state.log_history if "loss" in entry] == [1, 2]


def test_max_train_seconds_ends_training_early_and_saves(target, dataset, tmp_path):
    """A time-boxed run stops after the step that passes the limit, however many epochs were asked for."""
    drafter = fresh_drafter(target)
    args = make_args(tmp_path / "boxed", num_train_epochs=1000, max_train_seconds=1e-6)
    trainer = CarryoverTrainer(model=drafter, target_model=target, args=args, train_dataset=dataset)
    result = trainer.train()
    assert trainer.state.global_step == 1 and result.global_step == 1
    trainer.save_model(tmp_path / "boxed")
    assert (tmp_path / "boxed" / "model.safetensors").is_file()
    with pytest.raises(ValueError, match="max_train_seconds must be positive"):
        make_args(tmp_path / "bad", max_train_seconds=0)


@pytest.mark.parametrize("objective", ["dflash", "carryover"])
def test_the_saved_drafter_carries_by_default_only_where_its_carry_segment_was_trained(target, dataset, tmp_path,
                                                                                        objective):  # fmt: skip
    drafter = fresh_drafter(target)
    assert drafter.generation_config.use_carryover is True  # a new drafter's default
    trainer = CarryoverTrainer(model=drafter, target_model=target, train_dataset=dataset,
                               args=make_args(tmp_path, objective=objective, max_steps=1))  # fmt: skip
    trainer.train()
    trainer.save_model(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "generation_config.json").read_text())
    assert saved["use_carryover"] is (objective == "carryover")


def test_skipping_repeated_text_shapes_the_training_anchors_only(target, dataset, tmp_path):
    """`anchor_skip_repeated`: no training anchor where the last N tokens occurred before in the row; evaluation
    still draws from every position."""
    from carryover_hf.training.collator import repeated_positions

    args = make_args(tmp_path, num_anchors=64, anchor_skip_repeated=2, per_device_eval_batch_size=16)
    trainer = CarryoverTrainer(model=fresh_drafter(target), target_model=target, args=args, train_dataset=dataset,
                               eval_dataset=dataset)  # fmt: skip

    def anchors_on_repeats(loader):
        on, total = 0, 0
        for batch in loader:
            for ids, anchors, valid in zip(batch["input_ids"], batch["anchors"], batch["anchor_mask"]):
                flags = repeated_positions(ids.tolist(), 2)
                on += int(flags[anchors[valid].numpy()].sum())
                total += int(valid.sum())
        return on, total

    train_on, train_total = anchors_on_repeats(trainer.get_train_dataloader())
    eval_on, eval_total = anchors_on_repeats(trainer.get_eval_dataloader())
    assert train_on == 0 and train_total > 0
    assert eval_on > 0  # the tiny target's answers repeat bigrams: evaluation keeps those anchors
    assert trainer.data_collator.skip_repeated == 2


def test_cpu_autocast_runs_training_steps_in_bfloat16_and_evaluation_in_float32(target, dataset, tmp_path, monkeypatch):
    drafter = fresh_drafter(target, "markov")
    trainer = CarryoverTrainer(model=drafter, target_model=target, args=make_args(tmp_path, cpu_autocast="bfloat16"),
                               train_dataset=dataset, eval_dataset=dataset)  # fmt: skip
    seen = []  # the output dtype of the drafter's first linear layer, at each forward
    linear = next(m for m in drafter.modules() if isinstance(m, torch.nn.Linear))
    handle = linear.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    batch = next(iter(trainer.get_train_dataloader()))
    drafter.train()
    loss = trainer.compute_loss(drafter, batch)
    loss.backward()
    assert seen and set(seen) == {torch.bfloat16} and loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 and (p.grad is None or p.grad.dtype == torch.float32) for p in drafter.parameters())
    drafter.eval()
    with torch.no_grad():
        trainer.compute_loss(drafter, batch)
    assert seen[-1] == torch.float32
    handle.remove()
    # "auto" follows the CPU; a bad value fails at once.
    for native in (True, False):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda native=native: native)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
        auto = CarryoverTrainer(model=fresh_drafter(target, "markov"), target_model=target,
                                args=make_args(tmp_path, cpu_autocast="auto"), train_dataset=dataset)  # fmt: skip
        assert auto.train_autocast == (torch.bfloat16 if native else None)
    with pytest.raises(ValueError, match="cpu_autocast must be"):
        make_args(tmp_path, cpu_autocast="float16")
