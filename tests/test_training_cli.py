"""`carryover-hf train` on a tiny target saved to disk, in one process and in two (accelerate, gloo)."""

import json
import os
import re
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, PreTrainedTokenizerFast

import carryover_hf
from carryover_hf.tools.cli import main as carryover_main
from carryover_hf.tools.testing import tiny_target
from carryover_hf.training.synthetic import regenerate_random_prompts


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny target folder (weights + word-level tokenizer) and a regenerated dataset folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("train_cli")
    target = tiny_target("llama", seed=0)
    target.save_pretrained(root / "target")
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", eos_token="t1").save_pretrained(root / "target")
    regenerate_random_prompts(target, num_rows=8, prompt_length=6, response_length=20).save_to_disk(root / "data")
    return root


def _refused(capsys, argv, pattern):
    """The command exits with status 2 and one line naming the problem (bad input, no traceback)."""
    capsys.readouterr()
    assert carryover_main(argv) == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]  # after any warnings of the work done before the check
    assert line.startswith(f"carryover-hf {argv[0]}: error: ") and re.search(pattern, line) and "Traceback" not in err


def _common(assets, output_dir):
    return [
        "--target", str(assets / "target"), "--dataset", str(assets / "data"), "--output_dir", str(output_dir),
        "--block_size", "4", "--num_anchors", "6", "--per_device_train_batch_size", "2", "--logging_steps", "1",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--dataloader_num_workers", "0",
    ]  # fmt: skip


def test_train_command_saves_and_resumes(assets, tmp_path):
    out = tmp_path / "run"
    args = _common(assets, out) + ["--objective", "dflash", "--max_steps", "2", "--save_steps", "1"]
    assert carryover_main(["train", *args]) == 0
    drafter = AutoModel.from_pretrained(out)
    assert isinstance(drafter, carryover_hf.CarryoverDrafterModel) and drafter.config.block_size == 4
    assert set(load_file(out / "model.safetensors")) == set(drafter.state_dict())
    assert os.path.isdir(out / "checkpoint-2")

    # Continue the same run to step 3 from its last checkpoint.
    resumed = _common(assets, out) + ["--objective", "dflash", "--max_steps", "3", "--resume_from_checkpoint", "last"]
    assert carryover_main(["train", *resumed]) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2, 3]

    # Continue the baseline into a carryover drafter with LoRA, saving merged weights.
    lora_out = tmp_path / "lora"
    args = _common(assets, lora_out) + [
        "--drafter", str(out), "--objective", "carryover", "--max_steps", "2", "--use_lora", "--lora_r", "4",
        "--lora_merge", "--save_strategy", "no",
    ]  # fmt: skip
    assert carryover_main(["train", *args]) == 0
    merged = AutoModel.from_pretrained(lora_out)
    assert merged.config.trained_with_carryover
    assert not torch.equal(merged.carry_embedding, drafter.carry_embedding)
    assert (lora_out / "adapter" / "adapter_model.safetensors").is_file()


def test_a_dflash_checkpoint_continues_as_a_markov_drafter(assets, tmp_path, capsys):
    base = tmp_path / "dflash"
    args = _common(assets, base) + ["--objective", "dflash", "--max_steps", "1", "--save_strategy", "no",
                                    "--draft_vocab_size", "24"]  # fmt: skip
    assert carryover_main(["train", *args]) == 0
    dflash = AutoModel.from_pretrained(base)
    markov_out = tmp_path / "markov"
    args = _common(assets, markov_out) + [
        "--drafter", str(base), "--drafter_type", "markov", "--objective", "dflash", "--max_steps", "1",
        "--save_strategy", "no", "--learning_rate", "0",
    ]  # fmt: skip
    assert carryover_main(["train", *args]) == 0
    markov = AutoModel.from_pretrained(markov_out)
    assert markov.config.drafter_type == "markov" and markov.markov_head is not None
    assert not markov.markov_head.proj.weight.any()  # W2 = 0: the first proposals are the checkpoint's own
    # W1: a row per draft-vocabulary id plus one shared row (--markov_inputs auto, a new head)
    assert markov.config.markov_input_vocab_size == 24 and markov.markov_head.token_embedding.weight.shape[0] == 25
    assert torch.equal(markov.markov_head.input_token_ids, dflash.draft_token_ids)
    weights = markov.state_dict()
    for name, value in dflash.state_dict().items():  # the backbone as trained (learning rate 0)
        torch.testing.assert_close(weights[name], value)
    # A Markov checkpoint is not silently turned back into a dflash one.
    _refused(capsys, ["train", *_common(assets, tmp_path / "back"), "--drafter", str(markov_out), "--drafter_type",
                      "dflash"], "Markov drafter; --drafter_type dflash would drop")  # fmt: skip


def test_train_command_rejects_bad_data_before_loading_models(assets, tmp_path, capsys):
    _refused(capsys, ["train", *_common(assets, tmp_path), "--dataset", str(tmp_path / "missing.txt")], "neither")
    _refused(capsys, ["train", *_common(assets, tmp_path / "empty"), "--resume_from_checkpoint", "last"],
             "no checkpoint")  # fmt: skip
    _refused(capsys, ["train", *_common(assets, tmp_path), "--max_train_samples", "9"],
             "--max_train_samples 9: .* has only 8 rows")  # fmt: skip


def test_rows_of_a_regeneration_run_in_progress(tmp_path):
    from carryover_hf.tools.data.regenerate import STATE_FILE, _write_chunk
    from carryover_hf.training.cli import load_rows

    (tmp_path / "data").mkdir()
    (tmp_path / STATE_FILE).write_text("{}")
    base = {"split": "train", "source": "s", "license": "l", "system": None, "turns": ["q"], "responses": ["a"],
            "text": "q a", "finished": True, "target": "t", "generation": "{}"}  # fmt: skip
    for chunk in (1, 0):  # written out of order; a half-written chunk file is not read
        rows = [dict(base, id=f"c{chunk}/{i}", category="qa", input_ids=[1, 2, 3 + i], loss_mask=[0, 1, 1],
                     num_response_tokens=2) for i in range(2)]  # fmt: skip
        _write_chunk(tmp_path, chunk, rows, {"chunk": chunk})
    (tmp_path / "data" / ".chunk-00002.parquet.tmp").write_bytes(b"partial")
    rows = load_rows(str(tmp_path))
    assert rows["id"] == ["c0/0", "c0/1", "c1/0", "c1/1"]
    assert rows["input_ids"][3] == [1, 2, 4] and rows["loss_mask"][0] == [0, 1, 1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_cpu_run_matches_one_process(assets, tmp_path):
    """Two CPU processes (gloo, DDP) train a few carryover steps and end where one process with the same global batch
    ends: the loss normalisation, anchor counts and metric reductions are correct across processes.

    accelerate 1.15 starts a single process for `--cpu` unless it goes through mpirun; `--multi_gpu` with CUDA
    hidden starts two processes through torchrun, which use gloo on the CPU.
    """
    same = [
        "--objective", "carryover", "--drafter_type", "markov", "--max_steps", "2", "--gradient_accumulation_steps", "2",
        "--save_strategy", "no", "--optim", "sgd", "--learning_rate", "0.5", "--lr_scheduler_type", "constant",
        "--warmup_steps", "0", "--train_sampling_strategy", "sequential",
    ]  # fmt: skip
    two, one = tmp_path / "two", tmp_path / "one"
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
        "-m", "carryover_hf", "train", *_common(assets, two), *same,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # One process, twice the per-device batch: the same 8 rows per optimizer step.
    assert carryover_main(["train", *_common(assets, one), *same, "--per_device_train_batch_size", "4"]) == 0

    logs = {}
    for name, out in (("two", two), ("one", one)):
        state = json.loads((out / "trainer_state.json").read_text())
        logs[name] = [entry for entry in state["log_history"] if "loss" in entry]
        assert state["global_step"] == 2 and state["epoch"] == pytest.approx(2.0)  # 8 rows per step: one epoch
    for a, b in zip(logs["two"], logs["one"]):
        for key in ("loss", "grad_norm", "carry_rows", "first_draft_tau", "tau_teacher_forced"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-4), key
    two_weights, one_weights = load_file(two / "model.safetensors"), load_file(one / "model.safetensors")
    for name in one_weights:
        torch.testing.assert_close(two_weights[name], one_weights[name], atol=1e-6, rtol=1e-5)
    assert AutoModel.from_pretrained(two).config.trained_with_carryover


def test_features_then_train_from_them_with_a_draft_vocabulary(assets, tmp_path, capsys):
    """`carryover-hf features` -> `carryover-hf train --features --draft_vocab_size` -> a drafter that records its
    vocabulary and coverage; a store for other layer ids is refused before training."""
    store = tmp_path / "features"
    common = ["--target", str(assets / "target"), "--dataset", str(assets / "data"), "--output", str(store)]
    assert carryover_main(["features", *common, "--target_layer_ids", "0", "1", "--shard_rows", "3", "--top_k", "4"]) == 0
    assert json.loads((store / "features.json").read_text())["complete"]
    out = tmp_path / "run"
    args = [a for a in _common(assets, out) if a != str(assets / "data")]
    args.remove("--dataset")
    args += ["--features", str(store), "--objective", "dflash", "--max_steps", "2", "--save_strategy", "no",
             "--draft_vocab_size", "24", "--distillation", "kl", "--init_from_target", "true"]  # fmt: skip
    assert carryover_main(["train", *args]) == 0
    drafter = AutoModel.from_pretrained(out)
    assert drafter.config.target_layer_ids == [0, 1]  # taken from the store
    assert drafter.config.draft_vocab_size == 24 and drafter.draft_token_ids.shape == (24,)
    record = json.loads((out / "draft_vocabulary.json").read_text())
    assert 0.0 < record["coverage_held_out"] <= 1.0 and record["draft_vocab_size"] == 24

    other = _common(assets, tmp_path / "other") + ["--features", str(store), "--target_layer_ids", "1", "--max_steps", "1"]
    _refused(capsys, ["train", *other], "stores target layers")
    other_rows = tmp_path / "other_rows"
    regenerate_random_prompts(tiny_target("llama", seed=0), num_rows=8, prompt_length=5, response_length=20,
                              seed=9).save_to_disk(other_rows)  # fmt: skip
    mismatched = _common(assets, tmp_path / "mismatch") + ["--features", str(store), "--max_steps", "1"]
    mismatched[mismatched.index("--dataset") + 1] = str(other_rows)
    _refused(capsys, ["train", *mismatched], "other data")
