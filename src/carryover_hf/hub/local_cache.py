"""Put a saved model folder into the Hugging Face Hub cache, so that `from_pretrained("org/name")` finds it offline.

The shipped drafters (`drafters/`) and the tests use this to load by repo id on machines that cannot reach the Hub.
The layout is the one `huggingface_hub` writes itself: `models--org--name/snapshots/<revision>/<files>` and
`refs/main` holding the revision.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from huggingface_hub import constants


def folder_revision(folder: str | Path) -> str:
    """A 40-hex revision that changes whenever a file of `folder` changes (names and contents)."""
    digest = hashlib.sha1()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def add_to_hub_cache(
    folder: str | Path, repo_id: str, cache_dir: str | Path | None = None, revision: str | None = None
) -> Path:
    """Copies `folder` into the Hub cache as `repo_id` at `revision` (default: `folder_revision(folder)`) and points
    `refs/main` at it. Returns the snapshot folder. An existing snapshot of the same revision is kept as it is."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder; pass a saved model folder (config.json, *.safetensors).")
    if repo_id.count("/") != 1:
        raise ValueError(f"repo_id must look like 'org/name', got {repo_id!r}.")
    cache = Path(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE)
    revision = revision or folder_revision(folder)
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    if not snapshot.is_dir():
        staging = repo / "snapshots" / f".{revision}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(folder, staging)
        staging.rename(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


__all__ = ["add_to_hub_cache", "folder_revision"]
