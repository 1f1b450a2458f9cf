"""Offline features of the regenerated SmolLM2-135M set for the 0.2 drafters: a training store and a held-out store.

Held out: rows 230-255 of `assets/train/smollm2-135m` (26 rows of all nine categories, never trained on; the same rows
the learning-efficiency sweep evaluated on). Training: every other row of the run, in run order, so the store grows
with the run: rerun this script after new chunks are committed and only the new rows are encoded (a short last shard
is redone). Stores are derived files (about 5.8 kB per token): they are not committed, this script rebuilds them.

    OMP_NUM_THREADS=1 python experiments/smollm2_135m/build_features.py --output runs/features [--num_rows N]

Settings: the layers of the drafters (1 8 14 20 27), bfloat16 storage, the target's top-32 log-probabilities, shards of
16 rows.
"""

import argparse

import carryover_hf  # noqa: F401  (registers the drafter classes)
from carryover_hf.tools.data import load_regenerated
from carryover_hf.targets import load_target
from carryover_hf.training.feature_store import FeatureBuildConfig, build_features

HELD_OUT = range(230, 256)
LAYERS = [1, 8, 14, 20, 27]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="assets/train/smollm2-135m", help="regeneration run folder(s), comma-separated")
    parser.add_argument("--output", default="runs/features", help="writes OUTPUT-train and OUTPUT-eval")
    parser.add_argument("--num_threads", type=int, default=1)
    parser.add_argument("--num_rows", type=int, default=None,
                        help="use the first NUM_ROWS rows of the run only (default: every finished row); the 0.2 "
                        "drafters' store is the first 2,176 (chunks 0-16)")
    args = parser.parse_args()

    rows = load_regenerated(args.dataset)
    if args.num_rows is not None:
        if not HELD_OUT.stop <= args.num_rows <= len(rows):
            raise SystemExit(f"--num_rows must be in [{HELD_OUT.stop}, {len(rows)}] ({args.dataset} has {len(rows)} "
                             f"finished rows and rows {HELD_OUT.start}-{HELD_OUT.stop - 1} are held out), "
                             f"got {args.num_rows}.")
        rows = rows.select(range(args.num_rows))
    if len(rows) < HELD_OUT.stop:
        raise SystemExit(f"{args.dataset} has {len(rows)} rows; the held-out rows {HELD_OUT.start}-{HELD_OUT.stop - 1} need more.")
    held_out = set(HELD_OUT)
    parts = {"eval": rows.select(HELD_OUT), "train": rows.select([i for i in range(len(rows)) if i not in held_out])}
    target, _ = load_target("smollm2-135m", dtype="float32")
    for name, part in parts.items():
        config = FeatureBuildConfig(output=f"{args.output}-{name}", target_layer_ids=LAYERS, dtype="bfloat16", top_k=32,
                                    shard_rows=16, batch_size=2, num_threads=args.num_threads)  # fmt: skip
        manifest = build_features(config, target=target, rows=part)
        print(name, {"rows": manifest["num_rows"], **manifest["summary"]}, flush=True)


if __name__ == "__main__":
    main()
