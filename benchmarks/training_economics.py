"""What a drafter training step costs on SmolLM2-135M, and which options buy the most per CPU-second.

Measurements (each writes `<output>/<name>.json` and a markdown table `<output>/<name>.md`):

* `throughput`: anchor blocks trained per second per CPU core, dflash objective, block 8, 1-layer drafter, for
  (a) the online full-vocabulary path (target forward every step), (b) offline features, (c) offline features plus
  a reduced draft vocabulary; interleaved in one run so that machine load hits all three alike. Also the one-off cost
  of `carryover-hf features` per 1k tokens and its disk size per token.
* `storage-dtype`: the loss of the same drafter on the same batches from float32, bfloat16 and float16 features.
* `init`: held-out loss and teacher-forced tau after a fixed number of offline steps, new drafter with random
  weights vs final norm from the target vs final norm plus a target layer.
* `memory`: peak resident memory of one training step at V = 152k, 512 anchors, B = 16 with a narrow random
  Qwen3-shaped model (run it once with this checkout and once with `--src` pointing at an older checkout's `src`).

    python benchmarks/training_economics.py throughput --threads 1 --rows 24
    python benchmarks/training_economics.py memory --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "training-economics"
DATASET = Path(__file__).resolve().parents[1] / "assets" / "train" / "smollm2-135m"
LAYER_IDS = [1, 8, 14, 20, 27]


def _write(output: Path, name: str, record: dict, table: list[str]) -> None:
    output.mkdir(parents=True, exist_ok=True)
    record["command"] = "python " + " ".join(sys.argv)
    record["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count()}
    (output / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    (output / f"{name}.md").write_text("\n".join(table) + f"\n\nCommand: `{record['command']}`\n")
    print("\n".join(table))


def _table(title: str, columns: list[str], rows: list[list]) -> list[str]:
    """A title line and a markdown table."""
    lines = [title, "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def _setup(threads: int):
    import torch

    torch.set_num_threads(threads)
    import carryover_hf  # noqa: F401
    from carryover_hf.targets import load_target

    target, _ = load_target("smollm2-135m", dtype="float32")
    target.requires_grad_(False)  # frozen, as CarryoverTrainer keeps it
    return target.eval()


def _drafter(target, seed=0, draft_ids=None, init_layer=None, init_norm=False, block=8):
    import torch

    from carryover_hf import CarryoverDrafterConfig, CarryoverDrafterModel
    from carryover_hf.training.initialization import initialize_from_target

    config = CarryoverDrafterConfig.from_target_config(
        target.config, num_hidden_layers=1, block_size=block, target_layer_ids=LAYER_IDS
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    drafter = CarryoverDrafterModel(config)
    if init_norm or init_layer is not None:
        initialize_from_target(drafter, target, final_norm=init_norm, layer=init_layer)
    if draft_ids is not None:
        drafter.set_draft_vocabulary(draft_ids)
    return drafter


def _rows(count: int, skip: int = 0):
    from carryover_hf.tools.data import load_regenerated

    rows = load_regenerated(DATASET)
    return rows.select(range(skip, skip + count))


def _store(target, rows, folder: Path, dtype: str, top_k: int = 0):
    from carryover_hf.training.feature_store import FeatureBuildConfig, FeatureStore, build_features

    start = time.perf_counter()
    manifest = build_features(
        FeatureBuildConfig(output=str(folder), target_layer_ids=LAYER_IDS, dtype=dtype, top_k=top_k, shard_rows=16),
        target=target, rows=rows, progress=False,
    )  # fmt: skip
    return FeatureStore(folder), manifest, time.perf_counter() - start


def throughput(args) -> None:
    import tempfile

    import torch

    from carryover_hf.training.collator import CarryoverDataCollator
    from carryover_hf.training.objectives import DrafterObjective
    from carryover_hf.training.vocabulary import build_draft_vocabulary

    target = _setup(args.threads)
    rows = _rows(args.rows)
    with tempfile.TemporaryDirectory() as folder:
        store, manifest, build_seconds = _store(target, rows, Path(folder) / "features", "bfloat16")
        held_out = _rows(16, skip=args.rows)
        ids, vocab_record = build_draft_vocabulary(rows, held_out, target.config.vocab_size, args.draft_vocab_size)
        collator = CarryoverDataCollator(num_anchors=args.anchors, seed=0)
        variants = {
            "a_online_full_vocab": (lambda i: [rows[j] for j in i], None),
            "b_offline_full_vocab": (lambda i: [store[j] for j in i], None),
            "c_offline_draft_vocab": (lambda i: [store[j] for j in i], ids),
        }
        drafters = {name: _drafter(target, draft_ids=vocab) for name, (_, vocab) in variants.items()}
        optimizers = {name: torch.optim.AdamW(d.parameters(), lr=1e-4) for name, d in drafters.items()}
        objective = DrafterObjective(target, "dflash", gamma=4.0)
        timings = {name: [] for name in variants}
        anchors = {name: 0 for name in variants}
        batches = [list(range(s, s + args.batch)) for s in range(0, args.rows - args.batch + 1, args.batch)]
        for repeat in range(args.repeats + 1):  # the first pass is a warm-up
            for k, indices in enumerate(batches):
                order = list(variants)[k % 3 :] + list(variants)[: k % 3]  # rotate who goes first
                for name in order:
                    batch = collator(variants[name][0](indices))
                    start = time.perf_counter()
                    output = objective(drafters[name], drafters[name], batch)
                    (output.loss_sum / output.num_anchors).backward()
                    optimizers[name].step()
                    optimizers[name].zero_grad()
                    elapsed = time.perf_counter() - start
                    if repeat:
                        timings[name].append(elapsed)
                        anchors[name] += int(output.num_anchors)
    results = {}
    for name in variants:
        seconds = sum(timings[name])
        results[name] = {
            "steps": len(timings[name]),
            "seconds": round(seconds, 3),
            "anchor_blocks": anchors[name],
            "anchor_blocks_per_second_per_core": round(anchors[name] / seconds / args.threads, 2),
        }
    base = results["a_online_full_vocab"]["anchor_blocks_per_second_per_core"]
    for name in variants:
        results[name]["speedup_over_a"] = round(results[name]["anchor_blocks_per_second_per_core"] / base, 2)
    tokens = manifest["summary"]["tokens"]
    record = {
        "settings": vars(args),
        "results": results,
        "features": {
            "rows": manifest["summary"]["rows"],
            "tokens": tokens,
            "seconds": round(build_seconds, 2),
            "seconds_per_1k_tokens_per_core": round(build_seconds / tokens * 1000 * args.threads, 3),
            "bytes_per_token": manifest["summary"]["bytes_per_token"],
            "dtype": "bfloat16",
        },
        "draft_vocabulary": vocab_record,
    }
    table = _table(
        f"Drafter training throughput, SmolLM2-135M fp32, dflash objective, block 8, 1 layer, {args.anchors} anchors/row, "
        f"batch {args.batch}, {args.threads} thread(s), {args.repeats} interleaved passes over {args.rows} rows",
        ["path", "anchor blocks / s / core", "vs (a)"],
        [[name, r["anchor_blocks_per_second_per_core"], f"{r['speedup_over_a']}x"] for name, r in results.items()],
    )
    f = record["features"]
    table += [
        "",
        f"`carryover-hf features` (bf16, no top-k): {f['seconds_per_1k_tokens_per_core']} s per 1k tokens per core, "
        f"{f['bytes_per_token']} bytes per token ({f['tokens']} tokens).",
        f"Draft vocabulary: {vocab_record['draft_vocab_size']} ids, held-out coverage "
        f"{vocab_record['coverage_held_out']:.1%} ({vocab_record['held_out_response_tokens']} response tokens of 16 "
        "rows after the training rows).",
    ]
    _write(Path(args.output), "throughput", record, table)


def storage_dtype(args) -> None:
    import tempfile

    import torch

    from carryover_hf.training.collator import CarryoverDataCollator
    from carryover_hf.training.objectives import DrafterObjective

    target = _setup(args.threads)
    rows = _rows(args.rows)
    drafter_path = Path(__file__).resolve().parents[1] / "drafters" / "carryover-hf" / "smollm2-135m-baseline-dflash"
    from carryover_hf import CarryoverDrafterModel

    drafter = CarryoverDrafterModel.from_pretrained(drafter_path, dtype=torch.float32)
    objective = DrafterObjective(target, "dflash", gamma=4.0)
    collator = CarryoverDataCollator(num_anchors=args.anchors, seed=0)
    losses = {}
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        for dtype in ("float32", "bfloat16", "float16"):
            store, manifest, _ = _store(target, rows, Path(folder) / dtype, dtype)
            values = []
            for start in range(0, args.rows, args.batch):
                output = objective(drafter, drafter, collator([store[j] for j in range(start, min(args.rows, start + args.batch))]))
                values.append(float(output.loss_sum / output.num_anchors))
            losses[dtype] = {"per_batch": values, "mean": sum(values) / len(values), "bytes_per_token": manifest["summary"]["bytes_per_token"]}
    reference = losses["float32"]["per_batch"]
    for dtype in losses:
        diffs = [abs(a - b) for a, b in zip(losses[dtype]["per_batch"], reference)]
        losses[dtype]["max_abs_diff_vs_float32"] = max(diffs)
        losses[dtype]["mean_abs_diff_vs_float32"] = sum(diffs) / len(diffs)
    table = _table(
        f"Loss of the shipped baseline drafter on {args.rows} rows from features stored in each dtype",
        ["storage", "mean loss", "max abs. diff vs fp32", "bytes/token"],
        [[d, f"{v['mean']:.5f}", f"{v['max_abs_diff_vs_float32']:.2e}", v["bytes_per_token"]] for d, v in losses.items()],
    )
    _write(Path(args.output), "storage-dtype", {"settings": vars(args), "losses": losses}, table)


def init(args) -> None:
    import tempfile

    import torch

    from carryover_hf.training.collator import CarryoverDataCollator
    from carryover_hf.training.objectives import DrafterObjective

    target = _setup(args.threads)
    rows, held_out = _rows(args.rows), _rows(16, skip=args.rows)
    variants = {"random": {}, "final_norm": {"init_norm": True}, "final_norm+layer_29": {"init_norm": True, "init_layer": 29},
                "final_norm+layer_15": {"init_norm": True, "init_layer": 15}}  # fmt: skip
    record = {"settings": vars(args), "results": {}}
    with tempfile.TemporaryDirectory() as folder:
        store, _, _ = _store(target, rows, Path(folder) / "train", "bfloat16")
        eval_store, _, _ = _store(target, held_out, Path(folder) / "eval", "bfloat16")
        objective = DrafterObjective(target, "dflash", gamma=4.0)
        for name, options in variants.items():
            drafter = _drafter(target, seed=0, **options)
            optimizer = torch.optim.AdamW(drafter.parameters(), lr=args.lr)
            collator = CarryoverDataCollator(num_anchors=args.anchors, seed=0)
            step, start = 0, time.perf_counter()
            while step < args.steps:
                for s in range(0, len(store) - args.batch + 1, args.batch):
                    output = objective(drafter, drafter, collator([store[j] for j in range(s, s + args.batch)]))
                    (output.loss_sum / output.num_anchors).backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    step += 1
                    if step == args.steps:
                        break
                collator.set_epoch(collator.epoch + 1)
            seconds = time.perf_counter() - start
            with torch.no_grad():
                loss = tau = count = 0.0
                eval_collator = CarryoverDataCollator(num_anchors=args.anchors, seed=1)
                for s in range(0, len(eval_store), args.batch):
                    out = objective(drafter, drafter, eval_collator([eval_store[j] for j in range(s, min(len(eval_store), s + args.batch))]))
                    loss += float(out.loss_sum)
                    tau += float(out.metrics["tau_teacher_forced"][0])
                    count += float(out.num_anchors)
            record["results"][name] = {"held_out_loss": round(loss / count, 4), "held_out_tau": round(tau / count, 4),
                                       "train_seconds": round(seconds, 1)}  # fmt: skip
    table = _table(
        f"New 1-layer drafter, {args.steps} offline dflash steps (batch {args.batch}, {args.anchors} anchors/row, lr "
        f"{args.lr}) on {args.rows} rows; held-out loss and teacher-forced tau on the 16 rows after them",
        ["initialisation", "held-out loss", "held-out tau", "train s"],
        [[n, r["held_out_loss"], r["held_out_tau"], r["train_seconds"]] for n, r in record["results"].items()],
    )
    _write(Path(args.output), "init", record, table)


def memory(args) -> None:
    """Peak RSS of one dflash training step at Qwen3's vocabulary, in a fresh process per measurement."""
    code = r"""
import resource, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
from transformers import Qwen3Config, Qwen3ForCausalLM
import carryover_hf
from carryover_hf import CarryoverDrafterConfig, CarryoverDrafterModel
from carryover_hf.training.collator import CarryoverDataCollator
from carryover_hf.training.objectives import DrafterObjective
config = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
config._attn_implementation = "sdpa"
target = Qwen3ForCausalLM(config).eval()
dconfig = CarryoverDrafterConfig.from_target_config(config, num_hidden_layers=1, block_size=16, target_layer_ids=[0, 1])
dconfig._attn_implementation = "sdpa"
drafter = CarryoverDrafterModel(dconfig)
n = 600
row = {"input_ids": torch.randint(0, 151936, (n,)).tolist(), "loss_mask": [0] * 40 + [1] * (n - 40)}
batch = CarryoverDataCollator(num_anchors=512, seed=0)([row])
objective = DrafterObjective(target, "dflash", gamma=7.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
out = objective(drafter, drafter, batch)
(out.loss_sum / out.num_anchors).backward()
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(before, peak, int(out.num_anchors), seconds)
"""
    results = {}
    for label, src in (("this checkout", None), ("--src", args.src)):
        if label == "--src" and not src:
            continue
        env = dict(os.environ)
        if src:
            env["PYTHONPATH"] = src
        out = subprocess.run([sys.executable, "-c", code, str(args.threads)], env=env, capture_output=True, text=True)
        if out.returncode:
            results[label] = {"error": out.stderr[-2000:]}
            continue
        before, peak, anchors, seconds = out.stdout.split()[-4:]
        results[label] = {"src": src or "this checkout", "rss_before_step_mb": round(int(before) / 1024),
                          "peak_rss_mb": round(int(peak) / 1024), "step_increase_mb": round((int(peak) - int(before)) / 1024),
                          "anchors": int(anchors), "seconds": round(float(seconds), 2)}  # fmt: skip
    table = _table(
        "Peak resident memory of one dflash training step (forward + backward), V = 151,936, 512 anchors, B = 16, one "
        "600-token row, narrow random Qwen3-shaped target (hidden 64) and 1-layer drafter",
        ["code", "RSS before the step (MB)", "peak RSS (MB)", "increase (MB)", "step s"],
        [[r.get("src", k), r.get("rss_before_step_mb"), r.get("peak_rss_mb"), r.get("step_increase_mb"), r.get("seconds")]
         for k, r in results.items()],
    )
    _write(Path(args.output), "memory", {"settings": vars(args), "results": results}, table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measurement", choices=["throughput", "storage-dtype", "init", "memory"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--anchors", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--src", default=None, help="memory: another checkout's src folder to compare with")
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args()
    {"throughput": throughput, "storage-dtype": storage_dtype, "init": init, "memory": memory}[args.measurement](args)


if __name__ == "__main__":
    main()
