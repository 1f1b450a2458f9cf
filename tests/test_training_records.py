"""The training-record scripts of the 0.2 release log (experiments/smollm2_135m): a run's segment.json and the chained
curve built from it."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "experiments" / "smollm2_135m"


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
