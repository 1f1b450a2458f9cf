"""The training-record scripts of examples/smollm2_135m: a run's segment.json and the chained curve built from it."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "examples" / "smollm2_135m"


def _script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_folder(folder: Path, steps: int, eval_tau: list[float], runtime: float | None = None) -> Path:
    """A run folder as the Trainer leaves it: trainer_state.json with training and evaluation points."""
    folder.mkdir(parents=True)
    history = []
    for i, tau in enumerate(eval_tau, start=1):
        step = i * steps // len(eval_tau)
        history.append({"step": step, "loss": 3.0 - i * 0.1, "tau_teacher_forced": tau + 0.1, "acc_pos_01": 0.4})
        history.append({"step": step, "eval_loss": 3.1 - i * 0.1, "eval_tau_teacher_forced": tau,
                        "eval_acc_pos_01": 0.3})  # fmt: skip
    if runtime is not None:
        history.append({"step": steps, "train_runtime": runtime})
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": steps, "log_history": history}))
    return folder


def test_segment_meta_is_written_once_with_command_data_and_machine(tmp_path, monkeypatch):
    meta = _script("segment_meta")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    meta.main(str(tmp_path / "run"), "first note", "rows 0-9", "carryover-hf", "train", "--note", "has space")
    written = json.loads((tmp_path / "run" / "segment.json").read_text())
    assert written["command"] == "OMP_NUM_THREADS=1 carryover-hf train --note 'has space'"
    assert written["note"] == "first note" and written["data"] == "rows 0-9"
    assert written["wall"].startswith("started ") and meta.cpu_model() in written["wall"]
    meta.main(str(tmp_path / "run"), "second note", "other rows", "carryover-hf", "train")  # a resumed run
    assert json.loads((tmp_path / "run" / "segment.json").read_text()) == written


def test_chain_continues_an_earlier_record_with_cumulative_steps(tmp_path):
    pytest.importorskip("matplotlib")
    chain = _script("chain_curves")
    first = _run_folder(tmp_path / "a", 100, [1.2, 1.4])
    second = _run_folder(tmp_path / "b", 50, [1.5], runtime=12.5)
    _script("segment_meta").main(str(second), "the continuation", "rows 0-9", "carryover-hf", "train")
    chain.main(str(tmp_path / "out"), "base", str(first))
    chain.main(str(tmp_path / "out"), "cont", str(tmp_path / "out" / "base.json"), str(second))
    record = json.loads((tmp_path / "out" / "cont.json").read_text())
    assert record["total_steps"] == 150
    assert [p["step"] for p in record["eval"]] == [50, 100, 150]
    assert [p["segment"] for p in record["eval"]] == [0, 0, 1]
    assert record["segments"][1]["first_step"] == 100 and record["segments"][1]["note"] == "the continuation"
    assert record["segments"][1]["train_runtime_s"] == 12.5 and "train_runtime_s" not in record["segments"][0]
    table = (tmp_path / "out" / "cont.md").read_text()
    assert "| 150 | 1.5 |" in table and "steps 100-150" in table and (tmp_path / "out" / "cont.png").is_file()


def test_chain_from_a_first_step_and_a_stopping_checkpoint(tmp_path):
    pytest.importorskip("matplotlib")
    chain = _script("chain_curves")
    run = _run_folder(tmp_path / "a", 100, [1.2, 1.4])
    checkpoint = run / "checkpoint-50"
    checkpoint.mkdir()
    state = json.loads((run / "trainer_state.json").read_text())
    state["log_history"] = [e for e in state["log_history"] if e["step"] <= 50]
    (checkpoint / "trainer_state.json").write_text(json.dumps({**state, "global_step": 50}))
    chain.main(str(tmp_path / "out"), "late", f"{run}@50", first_step=6100)
    record = json.loads((tmp_path / "out" / "late.json").read_text())
    assert [p["step"] for p in record["eval"]] == [6150] and record["total_steps"] == 6150
    with pytest.raises(SystemExit, match="can only open the chain"):
        chain.main(str(tmp_path / "out"), "bad", str(run), str(tmp_path / "out" / "late.json"))
    assert not (tmp_path / "out" / "bad.json").exists()


FAKE_CLI = """#!/usr/bin/env bash
# Stand-in for carryover-hf: `train` leaves a trained run folder, `push --dry-run DIR` a Hub folder; records the calls.
echo "$*" >> "$CALLS"
if [ "$1" = train ]; then
  out=$(python -c 'import sys; a = sys.argv[1:]; print(a[a.index("--output_dir") + 1])' "$@")
  mkdir -p "$out" && touch "$out/model.safetensors"
  printf '{"global_step": 540, "log_history": [
    {"step": 540, "loss": 2.0, "tau_teacher_forced": 2.1, "acc_pos_01": 0.5},
    {"step": 540, "eval_loss": 2.5, "eval_tau_teacher_forced": 1.95, "eval_acc_pos_01": 0.5},
    {"step": 540, "train_runtime": 600.0}]}' > "$out/trainer_state.json"
elif [ "$1" = push ]; then
  dir=$(python -c 'import sys; a = sys.argv[1:]; print(a[a.index("--dry-run") + 1])' "$@")
  mkdir -p "$dir" && echo card > "$dir/README.md"
fi
"""


def test_release_step_trains_publishes_and_records_a_continuation(tmp_path):
    """release_0_2.sh markov_continued: segment.json before training, the export under drafters/, and the training
    record starting at the shipped baseline's step (its run folder is not needed afterwards)."""
    pytest.importorskip("matplotlib")
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[1]
    tree = tmp_path / "repo"
    for part in ("examples/smollm2_135m", "benchmarks/results/smollm2-135m-0.2-training"):
        shutil.copytree(root / part, tree / part)
    (tree / "drafters/carryover-hf").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "carryover-hf").write_text(FAKE_CLI)
    (bin_dir / "carryover-hf").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
           "RUNS": str(tmp_path / "runs")}  # fmt: skip
    result = subprocess.run(["bash", str(tree / "examples/smollm2_135m/release_0_2.sh"), "markov_continued"],
                            env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0].startswith("train ") and "--objective dflash" in calls[0] and "--seed 7" in calls[0]
    # the Markov pair's smaller store: one epoch of the first 360 training rows, 90 steps, the decay over 25
    assert "--max_train_samples 360 --max_steps 90" in calls[0] and '"num_decay_steps": 25' in calls[0]
    assert calls[1].startswith("push ") and "--carry off" in calls[1]
    assert "one epoch of the first 360 of those rows (rows 0-229 and 256-385 of the run)" in calls[1]
    segment = json.loads((tmp_path / "runs/markov-continued/segment.json").read_text())
    assert segment["command"].startswith("OMP_NUM_THREADS=1 carryover-hf train ") and "2,150 rows" in segment["data"]
    assert "first 360 of those rows" in segment["data"] and "--max_train_samples 360" in segment["command"]
    assert (tree / "drafters/carryover-hf/smollm2-135m-continued-markov/README.md").is_file()
    record = json.loads((tree / "benchmarks/results/smollm2-135m-0.2-training/markov-continued.json").read_text())
    assert record["total_steps"] == 6640 and record["eval"][0]["step"] == 6640
    assert record["segments"][0]["note"] == segment["note"] and record["segments"][0]["train_runtime_s"] == 600.0


def _journal_commands(journal: Path) -> set[tuple[str, ...]]:
    """The `carryover-hf bench` arguments each segment of a committed journal ran with, less the per-call bounds."""
    from carryover_hf.bench.journal import read_journal

    commands = set()
    for segment in read_journal(journal)[1]:
        words, kept = segment["command"].split()[2:], []  # drop "carryover-hf bench"
        while words:
            word = words.pop(0)
            if word in ("--stop_after_minutes", "--shard"):
                words.pop(0)
            else:
                kept.append(word)
        commands.add(tuple(kept))
    return commands


def test_release_bench_steps_resume_their_committed_journals(tmp_path):
    """Every bench step of release_0_2.sh passes `carryover-hf bench` exactly the arguments its committed journal ran
    with (a journal's fingerprint holds them, so any change would refuse to resume it); the Markov T = 1 step is its
    T = 0 step at the other temperature, into a journal of its own, and so are the faster kernel's and the batched
    Markov head's T = 1 steps (all eight journals have landed; the last two runs are partial)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "carryover-hf").write_text(FAKE_CLI)
    (bin_dir / "carryover-hf").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls")}
    env.pop("MINUTES", None)
    env.pop("SHARD", None)
    steps = ["bench_t0", "bench_t1", "bench_markov_t0", "bench_markov_t1", "bench_fast_t0", "bench_fast_t1",
             "bench_head_t0", "bench_head_t1"]
    result = subprocess.run(["bash", str(root / "examples/smollm2_135m/release_0_2.sh"), *steps], env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "calls").read_text().splitlines()
    assert len(lines) == len(steps) and all(line.startswith("bench ") for line in lines)
    calls = [tuple(line.split()[1:]) for line in lines]
    results = root / "benchmarks/results"
    folders = ["smollm2-135m-0.2-t0", "smollm2-135m-0.2-t1", "smollm2-135m-0.2-markov-t0", "smollm2-135m-0.2-markov-t1",
               "smollm2-135m-0.2-fast-t0", "smollm2-135m-0.2-fast-t1", "smollm2-135m-0.2-head-t0",
               "smollm2-135m-0.2-head-t1"]  # fmt: skip
    for call, folder in zip(calls, folders):
        assert _journal_commands(results / folder / "runs.jsonl") == {call}, folder
    for t0, t1 in ((2, 3), (4, 5), (6, 7)):  # each T = 0 call, at T = 1 into its own folder
        expected = list(calls[t0])
        expected[expected.index("--temperatures") + 1] = "1"
        expected[expected.index("--output_dir") + 1] = f"benchmarks/results/{folders[t1]}"
        assert calls[t1] == tuple(expected)
