"""Curves of a drafter trained in segments (each segment continues the previous one's checkpoint, e.g. on a grown
feature store): held-out and training teacher-forced tau, first-position accuracy and loss against the cumulative
optimizer step, as JSON + PNG + a markdown table.

    python experiments/smollm2_135m/chain_curves.py OUT NAME [--first_step N] SEGMENT [SEGMENT ...]
    SEGMENT = FOLDER[@STEP]: a run folder (its trainer_state.json, or its last checkpoint's) and, optionally, the
              checkpoint step the next segment started from (later points of that segment are left out)
            | RECORD.json: an earlier record of this script (the drafter a continuation starts from): its segments
              and points, as they are
    --first_step N: the cumulative step the first segment starts at, for a chain whose earlier part has no record

Each segment's `command` and data are taken from the run folder's `segment.json` when present (written by whoever
ran the segment; `release_0_2.sh` writes one before it trains), so the record says how every part was made.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "smollm2_135m"))
from training_curves import _state  # noqa: E402  (the same reading of a run's newest trainer state)

TRAIN_KEYS = ("loss", "tau_teacher_forced", "acc_pos_01", "learning_rate")
EVAL_KEYS = ("eval_loss", "eval_tau_teacher_forced", "eval_acc_pos_01", "eval_acc_pos_02", "eval_acc_pos_03",
             "eval_first_draft_tau")  # the last: segments trained with the carryover objective


def _checkpoint_state(folder: Path, step: int | None) -> dict:
    if step is None:
        return _state(folder)
    return json.loads((folder / f"checkpoint-{step}" / "trainer_state.json").read_text())


def main(output: str, name: str, *segments: str, first_step: int = 0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    offset, train, evaluation, parts = first_step, [], [], []
    for spec in segments:
        if spec.endswith(".json"):  # an earlier record: taken whole, its steps already cumulative
            if parts or offset:
                raise SystemExit(f"{spec}: an earlier record can only open the chain (it starts at step 0)")
            earlier = json.loads(Path(spec).read_text())
            parts, train, evaluation = earlier["segments"], earlier["train"], earlier["eval"]
            offset = earlier["total_steps"]
            continue
        folder, _, until = spec.partition("@")
        folder, until = Path(folder), int(until) if until else None
        state = _checkpoint_state(folder, until)
        meta = json.loads((folder / "segment.json").read_text()) if (folder / "segment.json").is_file() else {}
        for entry in state["log_history"]:
            if until is not None and entry["step"] > until:
                continue
            point = {"step": offset + entry["step"], "segment": len(parts)}
            if "loss" in entry:
                train.append({**point, **{k: entry[k] for k in TRAIN_KEYS if k in entry}})
            if "eval_loss" in entry:
                evaluation.append({**point, **{k: entry[k] for k in EVAL_KEYS if k in entry}})
        steps = until if until is not None else state["global_step"]
        runtime = [entry["train_runtime"] for entry in state["log_history"] if "train_runtime" in entry]
        parts.append({"folder": str(folder), "first_step": offset, "steps": steps, **meta,
                      **({"train_runtime_s": runtime[-1]} if runtime and until is None else {})})  # fmt: skip
        offset += steps
    record = {"drafter": name, "segments": parts, "total_steps": offset, "train": train, "eval": evaluation}
    (out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")

    figure, (tau_axis, acc_axis) = plt.subplots(1, 2, figsize=(11, 4))
    tau_axis.plot([p["step"] for p in train], [p["tau_teacher_forced"] for p in train], alpha=0.5, label="training batches")
    tau_axis.plot([p["step"] for p in evaluation], [p["eval_tau_teacher_forced"] for p in evaluation], "o-", label="held-out rows")
    acc_axis.plot([p["step"] for p in train], [p["acc_pos_01"] for p in train], alpha=0.5, label="training batches")
    acc_axis.plot([p["step"] for p in evaluation], [p["eval_acc_pos_01"] for p in evaluation], "o-", label="held-out rows")
    for part in parts[1:]:
        for axis in (tau_axis, acc_axis):
            axis.axvline(part["first_step"], color="grey", lw=0.8, ls=":")
    tau_axis.set(xlabel="optimizer step (dotted: a new segment)", ylabel="teacher-forced τ")
    acc_axis.set(xlabel="optimizer step", ylabel="first-position accuracy")
    for axis in (tau_axis, acc_axis):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(name)
    figure.tight_layout()
    figure.savefig(out / f"{name}.png", dpi=120)
    lines = [f"# {name}", "", "| step | held-out τ | held-out first-position acc. | held-out loss | first-draft τ |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {p['step']} | {p['eval_tau_teacher_forced']} | {p['eval_acc_pos_01']} | {p['eval_loss']} | "
              f"{p.get('eval_first_draft_tau', '–')} |" for p in evaluation]  # fmt: skip
    if any("eval_first_draft_tau" in p for p in evaluation):
        lines += ["", "Points of carryover-objective segments: τ, accuracy and loss are the second draft's (at the first "
                  "rejected position, with the rejected rows as carry); first-draft τ is the plain block's at the "
                  "anchors (the quantity the other segments report as τ)."]
    lines += ["", "Segments:", ""] + [f"- steps {p['first_step']}-{p['first_step'] + p['steps']}: `{p['folder']}`"
                                      + (f" ({p['note']})" if p.get("note") else "") for p in parts]  # fmt: skip
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("output")
    parser.add_argument("name")
    parser.add_argument("segments", nargs="+")
    parser.add_argument("--first_step", type=int, default=0)
    args = parser.parse_args()
    main(args.output, args.name, *args.segments, first_step=args.first_step)
