"""Record the training runs of SmolLM2-135M drafters: loss curves (JSON + PNG) and each run's arguments.

    python examples/smollm2_135m/training_curves.py RUNS OUT/curves examples/smollm2_135m/gpu.sh   # the GPU fast path
    python examples/smollm2_135m/training_curves.py runs/smollm2-135m runs/smollm2-135m-curves     # the 0.1 runs

Reads `trainer_state.json` (its `log_history`) and `training_args.bin`-free metadata from each run folder of
`gpu.sh` or `experiments/smollm2_135m/reproduce.sh` (baseline, continued, carryover; the optional third argument
names the script that made them, default reproduce.sh) and writes `<run>.json`, `curves.png` and `README.md` to the
output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RUNS = ("baseline", "continued", "carryover")
KEYS = ("loss", "tau_teacher_forced", "acc_pos_01", "first_draft_tau", "carry_rows", "learning_rate", "grad_norm")


def _state(run: Path) -> dict:
    """The newest trainer state of a run: the final one, else that of its last checkpoint."""
    candidates = [run / "trainer_state.json"] + sorted(run.glob("checkpoint-*/trainer_state.json"),
                                                       key=lambda p: int(p.parent.name.split("-")[1]), reverse=True)  # fmt: skip
    for path in candidates:
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError(f"no trainer_state.json in {run} or its checkpoints")


def main(runs_dir: str, output_dir: str, script: str = "experiments/smollm2_135m/reproduce.sh") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    figure, (loss_axis, tau_axis) = plt.subplots(1, 2, figsize=(11, 4))
    lines = ["| run | steps | final loss | final teacher-forced τ | drafter config |", "| --- | --- | --- | --- | --- |"]
    offset = 0
    for name in RUNS:
        run = Path(runs_dir) / name
        if not run.is_dir():
            print(f"skipping {name}: no folder {run}")
            continue
        state = _state(run)
        history = [{k: entry[k] for k in ("step", "epoch", *KEYS) if k in entry} for entry in state["log_history"]]
        logged = [entry for entry in history if "loss" in entry]
        config = json.loads((run / "config.json").read_text()) if (run / "config.json").is_file() else {}
        record = {"run": name, "command": f"bash {script} {name}",
                  "global_step": state.get("global_step"), "log_history": history, "drafter_config": config}  # fmt: skip
        (output / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
        # Continuations start where the baseline ended, so their curves are drawn after it.
        start = 0 if name == "baseline" else offset
        steps = [start + entry["step"] for entry in logged]
        loss_axis.plot(steps, [entry["loss"] for entry in logged], label=name)
        tau_axis.plot(steps, [entry.get("tau_teacher_forced", float("nan")) for entry in logged], label=name)
        if name == "baseline":
            offset = state.get("global_step", 0)
        last = logged[-1] if logged else {}
        lines.append(f"| {name} | {state.get('global_step')} | {last.get('loss', float('nan')):.3f} | "
                     f"{last.get('tau_teacher_forced', float('nan')):.3f} | {config.get('num_hidden_layers')} layer(s), "
                     f"B={config.get('block_size')}, target layers {config.get('target_layer_ids')} |")  # fmt: skip
    loss_axis.set(xlabel="optimizer step (continuations after the baseline)", ylabel="training loss", yscale="log")
    tau_axis.set(xlabel="optimizer step", ylabel="teacher-forced τ (training batches)")
    for axis in (loss_axis, tau_axis):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(output / "curves.png", dpi=120)
    (output / "README.md").write_text("# Training runs of the SmolLM2-135M drafters\n\n" + "\n".join(lines) + "\n\n"
                                      f"Made by `{script}`; curves in `curves.png`, full logs in `<run>.json`.\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(*sys.argv[1:4])
