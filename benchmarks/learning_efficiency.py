"""Held-out teacher-forced tau against CPU-seconds of drafter training, for the levers that matter on little compute.

Every run trains a new drafter from offline features (`carryover-hf features` stores) with the dflash objective for
the same CPU-time budget, one thread, and evaluates held-out teacher-forced tau and first-position accuracy at fixed
CPU-time marks. The runs share the data, the anchor draw and the seed; they differ in one lever each against the
`base` run (`--base first`: the first sweep's settings; `--base recipe`: the shipped 0.2 recipe). Results:
`<output>/learning_efficiency.json` (curves, settings, commands), `.md` (table), `.png` (plot); several processes
(one per core) may add their runs to one output. Cheaper data: `--read-features` (a store of `carryover-hf prompts
reading` rows, labelled by the target's stored top-k) for the `read_only` and `read_mixed` runs, `kl_only` their
control on the regenerated rows.

    python benchmarks/learning_efficiency.py --train-features runs/features-train --eval-features runs/features-eval \
        --budget 240 --runs base vocab_4096 vocab_full init_norm distill_kl markov depth_2 block_4 block_16 lr_3e-3
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "learning-efficiency"

BASE = dict(block=8, layers=1, vocab=8192, init_norm=False, init_layer=None, distillation=None, distill_weight=0.9,
            kind="dflash", lr=1e-3, anchors=64, batch=4, data="regenerated")  # fmt: skip
# The 0.2 SmolLM2 drafters' recipe as a base (`--base recipe`): block 4, the target's final norm and last layer, 0.5 CE
# + 0.5 KL to the stored top-k, lr 1.5e-3; the levers then move one thing away from what ships.
# init_layer "last": the drafter's layers start as copies of the target's last ones (the recipe's single layer is 29).
BASES = {"first": {}, "recipe": dict(block=4, init_norm=True, init_layer="last", distillation="kl",
                                     distill_weight=0.5, lr=1.5e-3)}  # fmt: skip
RUNS = {
    "base": {},
    "vocab_4096": {"vocab": 4096},
    "vocab_16384": {"vocab": 16384},
    "vocab_full": {"vocab": None},
    "init_norm": {"init_norm": True},
    "init_norm_layer29": {"init_norm": True, "init_layer": 29},
    "distill_kl": {"distillation": "kl"},
    "distill_tv": {"distillation": "tv"},
    "markov": {"kind": "markov"},
    "depth_2": {"layers": 2},
    "depth_3": {"layers": 3},
    "block_4": {"block": 4},
    "block_8": {"block": 8},
    "block_16": {"block": 16},
    "lr_3e-4": {"lr": 3e-4},
    "lr_3e-3": {"lr": 3e-3},
    "anchors_32": {"anchors": 32},
    "anchors_128": {"anchors": 128},
    # Cheaper data (`--read-features`, rows of `carryover-hf prompts reading`): the label is the target's own
    # distribution (KL to the stored top-k, no cross-entropy to text the target did not write), so `kl_only` is the
    # control on regenerated rows; `read_only` trains on reading rows alone, `read_mixed` on both stores.
    "kl_only": {"distillation": "kl", "distill_weight": 1.0},
    "read_only": {"distillation": "kl", "distill_weight": 1.0, "data": "read"},
    "read_mixed": {"distillation": "kl", "distill_weight": 1.0, "data": "mixed"},
}


class Rows:
    """Several feature stores as one sequence of rows (in order), with the stores' `token_rows` (no feature bytes)."""

    def __init__(self, *stores):
        self.stores, self.starts = stores, [0]
        for store in stores:
            self.starts.append(self.starts[-1] + len(store))

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int):
        store = max(i for i in range(len(self.stores)) if self.starts[i] <= index)
        return self.stores[store][index - self.starts[store]]

    def token_rows(self):
        for store in self.stores:
            yield from store.token_rows()


def training_rows(data: str, regenerated, read):
    """The rows a run trains on: the regenerated store, the reading store, or both."""
    if data != "regenerated" and read is None:
        raise SystemExit(f"a run on {data!r} data needs --read-features (a store of `carryover-hf prompts reading` rows)")
    return {"regenerated": regenerated, "read": read, "mixed": Rows(regenerated, read) if read else None}[data]


def cpu_seconds() -> float:
    return time.process_time()


def train_run(name, options, target, train, evaluation, budget, marks, seed, base=BASE, read=None):
    import torch

    from carryover_hf import CarryoverDrafterConfig, CarryoverDrafterModel
    from carryover_hf.training.collator import CarryoverDataCollator
    from carryover_hf.training.initialization import initialize_from_target
    from carryover_hf.training.losses import default_gamma
    from carryover_hf.training.objectives import DrafterObjective
    from carryover_hf.training.vocabulary import draft_vocabulary, response_token_counts

    o = {**base, **options}
    layer_ids = train.target_layer_ids
    train = training_rows(o["data"], train, read)
    config = CarryoverDrafterConfig.from_target_config(
        target.config, num_hidden_layers=o["layers"], block_size=o["block"], drafter_type=o["kind"],
        target_layer_ids=layer_ids,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    drafter = CarryoverDrafterModel(config)
    if o["init_layer"] == "last":
        o["init_layer"] = target.config.num_hidden_layers - o["layers"]
    if o["init_norm"] or o["init_layer"] is not None:
        initialize_from_target(drafter, target, o["init_norm"], o["init_layer"])
    if o["vocab"] is not None:
        drafter.set_draft_vocabulary(draft_vocabulary(response_token_counts(train, config.vocab_size), o["vocab"]))
    drafter.carry_embedding.requires_grad_(False)
    objective = DrafterObjective(
        target, "dflash", gamma=default_gamma(o["block"]), distillation=o["distillation"],
        distillation_weight=o["distill_weight"] if o["distillation"] else 0.0,
    )  # fmt: skip
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=o["lr"])
    collator = CarryoverDataCollator(num_anchors=o["anchors"], seed=seed)
    eval_collator = CarryoverDataCollator(num_anchors=64, seed=seed + 1)
    eval_batches = [eval_collator([evaluation[j] for j in range(s, min(len(evaluation), s + 4))])
                    for s in range(0, len(evaluation), 4)]  # fmt: skip

    def evaluate():
        drafter.eval()
        sums = {"tau": 0.0, "acc1": 0.0, "anchors": 0.0, "rows1": 0.0, "loss": 0.0}
        with torch.no_grad():
            for batch in eval_batches:
                out = objective(drafter, drafter, batch)
                sums["tau"] += float(out.metrics["tau_teacher_forced"][0])
                sums["anchors"] += float(out.metrics["tau_teacher_forced"][1])
                sums["acc1"] += float(out.metrics["acc_pos_01"][0])
                sums["rows1"] += float(out.metrics["acc_pos_01"][1])
                sums["loss"] += float(out.loss_sum)
        drafter.train()
        return {"tau": sums["tau"] / sums["anchors"], "acc_pos_01": sums["acc1"] / sums["rows1"],
                "loss": sums["loss"] / sums["anchors"]}  # fmt: skip

    curve, spent, steps, epoch, anchors_seen = [], 0.0, 0, 0, 0
    curve.append({"cpu_seconds": 0.0, "steps": 0, **evaluate()})
    pending = list(marks)
    order = torch.Generator().manual_seed(seed)
    while spent < budget:
        permutation = torch.randperm(len(train), generator=order).tolist()
        for s in range(0, len(permutation) - o["batch"] + 1, o["batch"]):
            start = cpu_seconds()
            batch = collator([train[j] for j in permutation[s : s + o["batch"]]])
            out = objective(drafter, drafter, batch)
            (out.loss_sum / out.num_anchors.clamp(min=1)).backward()
            optimizer.step()
            optimizer.zero_grad()
            spent += cpu_seconds() - start
            steps += 1
            anchors_seen += int(out.num_anchors)
            while pending and spent >= pending[0]:
                curve.append({"cpu_seconds": round(spent, 1), "steps": steps, "anchors": anchors_seen, **evaluate()})
                pending.pop(0)
            if spent >= budget:
                break
        epoch += 1
        collator.set_epoch(epoch)
    print(f"{name}: {steps} steps, {epoch} epochs, held-out tau {curve[-1]['tau']:.3f}", flush=True)
    return {"options": o, "curve": curve, "steps": steps, "epochs": epoch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-features", required=True)
    parser.add_argument("--eval-features", required=True)
    parser.add_argument("--read-features", default=None,
                        help="store of reading rows (`carryover-hf prompts reading`) for the read_only/read_mixed runs")
    parser.add_argument("--budget", type=float, default=240.0, help="CPU-seconds of training per run")
    parser.add_argument("--marks", type=int, default=6, help="evaluations per run (evenly spread over the budget)")
    parser.add_argument("--runs", nargs="+", default=["base"], choices=list(RUNS))
    parser.add_argument("--base", choices=list(BASES), default="first",
                        help="what every lever changes one thing of: the first sweep's settings, or the shipped recipe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    import carryover_hf  # noqa: F401
    from carryover_hf.targets import load_target
    from carryover_hf.training.feature_store import FeatureStore

    output = Path(args.output)
    record_path = output / "learning_efficiency.json"
    base = {**BASE, **BASES[args.base]}
    _check_record(_read(record_path), base, args.budget, record_path)  # before the target loads
    train, evaluation = FeatureStore(args.train_features), FeatureStore(args.eval_features)
    read = FeatureStore(args.read_features) if args.read_features else None
    if read is not None and read.settings["top_k"] != train.settings["top_k"]:
        raise SystemExit(f"--read-features stores top-{read.settings['top_k']}, --train-features top-"
                         f"{train.settings['top_k']}: build both with the same --top_k (the reading rows' label)")
    for name in args.runs:  # before the target loads
        training_rows({**base, **RUNS[name]}["data"], train, read)
    target, _ = load_target(train.settings["target"], dtype=train.settings["target_dtype"])
    target.requires_grad_(False).eval()
    for store in (train, evaluation, read):
        if store is not None:
            store.check_compatible(train.target_layer_ids, target)
    output.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(sys.argv)
    marks = [args.budget * (i + 1) / args.marks for i in range(args.marks)]
    for name in args.runs:
        run = train_run(name, RUNS[name], target, train, evaluation, args.budget, marks, args.seed, base, read)
        # Read again before writing: processes that share an output (one per core) each add their own runs.
        record = _read(record_path)
        _check_record(record, base, args.budget, record_path)
        record.update(machine=platform.platform(), base=base, budget_cpu_seconds=args.budget,
                      train_features=train.settings, eval_features=evaluation.settings)  # fmt: skip
        if read is not None:
            record["read_features"] = {**read.settings, "rows": len(read)}
        record["commands"] = list(dict.fromkeys([*_commands(record), command]))
        record.pop("command", None)
        record["runs"][name] = run
        record_path.write_text(json.dumps(record, indent=2) + "\n")  # after every run: a partial sweep is kept
    write_report(_read(record_path), output)


def _read(record_path: Path) -> dict:
    return json.loads(record_path.read_text()) if record_path.exists() else {"runs": {}}


def _commands(record: dict) -> list[str]:
    """The commands that made a record's runs (a record of the first sweep kept one, as `command`)."""
    return [c for c in record.get("commands", [record.get("command")]) if c]


def _check_record(record: dict, base: dict, budget: float, record_path: Path) -> None:
    """An output holds the runs of one base and one budget: a new sweep of either needs another --output."""
    if record["runs"] and {**BASE, **record["base"]} != base:
        raise SystemExit(f"{record_path} holds runs of another base ({record['base']}); give another --output")
    if record["runs"] and record["budget_cpu_seconds"] != budget:
        raise SystemExit(f"{record_path} holds runs of {record['budget_cpu_seconds']:g} CPU-seconds, not {budget:g}; "
                         "give another --output")


def write_report(record: dict, output: Path) -> None:
    rows = [
        f"Held-out teacher-forced tau after {record['budget_cpu_seconds']:.0f} CPU-seconds of training (one thread), "
        "new drafter, dflash objective, offline features; `base` = " + json.dumps(record["base"]),
        "",
        "| run | change | steps | held-out tau | first-position acc. | held-out loss |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, run in record["runs"].items():
        last = run["curve"][-1]
        change = json.dumps(RUNS.get(name, {})) if RUNS.get(name) else "-"
        rows.append(f"| {name} | {change} | {run['steps']} | {last['tau']:.3f} | {last['acc_pos_01']:.3f} | {last['loss']:.3f} |")
    rows += ["", "Commands (each process adds its runs to the record):", "", *[f"    {c}" for c in _commands(record)]]
    (output / "learning_efficiency.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axis = plt.subplots(figsize=(8, 5))
    for name, run in record["runs"].items():
        axis.plot([p["cpu_seconds"] for p in run["curve"]], [p["tau"] for p in run["curve"]], marker="o", label=name)
    axis.set_xlabel("CPU-seconds of training (1 thread)")
    axis.set_ylabel("held-out teacher-forced tau")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(output / "learning_efficiency.png", dpi=120)


if __name__ == "__main__":
    main()
