"""One-off (2026-12-06): split a campaign's training feature store made before stores were kept per dataset.

Until this date `carryover-hf campaign` encoded its datasets concatenated into one training store. When the first
dataset (a regeneration run) gained chunks, the rows of the second one moved and the store refused the data. The
campaign now keeps one store per dataset (`features-train`, `features-train-1`, ...). This moves the shards of the
second dataset's rows out of an old store into their own store, so none of the encoded rows is computed again, where
the first dataset's training rows end on a shard boundary; elsewhere it says so and changes nothing (delete
`features-train-1` and the campaign encodes it):

    python experiments/campaign/split_train_store.py ../runs/campaign --first-chunks 26

The boundary is counted from the campaign's datasets as they were when the store was built: the first dataset's
first `--first-chunks` finished chunks. Both stores are checked against
their datasets' rows before the manifests are written. Shard fingerprints carry over unchanged, as each shard records
only the fingerprint of its own rows.

Run here on 2026-12-06, first by hand with the row the refusal named (3296: the first row of the first differing
shard, not the boundary). The first dataset's training rows ended at 3302, inside that shard, so the moved shards did
not line up with the second dataset; the campaign refused them (`holds other rows ... from row 0`) before training,
`features-train-1` was deleted and encoded again (767 rows). The script was then changed to find the boundary
itself and to check the moved shards; that version has not run (there is no unsplit store left here to run it on).
"""

import argparse
import json
import os
from pathlib import Path

import pyarrow.parquet as pq

from carryover_hf.regenerated import DATA_DIR
from carryover_hf.tools.campaign import Campaign, split_held_out
from carryover_hf.training.data import load_rows
from carryover_hf.training.feature_store import MANIFEST, _update_progress, _write_manifest, shard_fingerprints


def split(directory: Path, first_chunks: int) -> None:
    from datasets import concatenate_datasets

    campaign = Campaign(directory)
    config = campaign.load_config()
    old, new = campaign.dir / "features-train", campaign.dir / "features-train-1"
    if new.exists():
        raise SystemExit(f"{new} exists already: nothing to split.")
    manifest = json.loads((old / MANIFEST).read_text())
    first = load_rows(config.datasets[0], "datasets")
    # Rows per chunk vary (a chunk's last prompts may be dropped): count them from the run's chunk files.
    chunks = sorted((Path(config.datasets[0]) / DATA_DIR).glob("chunk-*.parquet"))[:first_chunks]
    first = first.select(range(sum(pq.ParquetFile(str(c)).metadata.num_rows for c in chunks)))
    rest = [load_rows(path, "datasets") for path in config.datasets[1:]]
    rows = concatenate_datasets([first, *rest])
    kept, _ = split_held_out(rows, range(*config.held_out_rows))
    boundary = sum(1 for i in kept if i < len(first))
    second_rows = rows.select([i for i in kept if i >= len(first)])
    shard_rows = manifest["settings"]["shard_rows"]
    if boundary % shard_rows or boundary + len(second_rows) != manifest["num_rows"]:
        raise SystemExit(f"the first dataset's training rows end at row {boundary}, the store holds "
                         f"{manifest['num_rows']} rows in shards of {shard_rows}: the shards cannot be moved; delete "
                         f"{new.name} (if any) and let the campaign encode it.")  # fmt: skip
    cut = boundary // shard_rows
    moved = manifest["shards"][cut:]
    if [s["data_fingerprint"] for s in moved] != shard_fingerprints(second_rows, shard_rows):
        raise SystemExit("the store's last shards do not hold the second dataset's rows: nothing moved.")
    new.mkdir()
    second = {"fingerprint": manifest["fingerprint"], "settings": manifest["settings"], "shards": []}
    for index, shard in enumerate(moved):
        name = f"shard-{index:05d}.safetensors"
        os.replace(old / shard["file"], new / name)
        second["shards"].append({**shard, "file": name})
    manifest["shards"] = manifest["shards"][:cut]
    for folder, part in ((new, second), (old, manifest)):
        _update_progress(part, len(part["shards"]))
        part["summary"] = {"rows": part["num_rows"], "tokens": sum(s["tokens"] for s in part["shards"]),
                           "bytes": sum(s["bytes"] for s in part["shards"]), "split_from": str(old)}
        _write_manifest(folder / MANIFEST, part)
    print(f"{old}: {manifest['num_rows']} rows; {new}: {second['num_rows']} rows")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("campaign", type=Path)
    parser.add_argument("--first-chunks", type=int, required=True,
                        help="finished chunks of the first dataset when the store was built (here: 26)")
    args = parser.parse_args()
    split(args.campaign, args.first_chunks)
