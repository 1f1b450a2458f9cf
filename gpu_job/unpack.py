"""Puts what the GPU job brought back into the checkout: checks and joins the bundle parts, extracts them.

    python gpu_job/unpack.py /work/.device/<call-2 files> [/work/.device/<call-3 files> ...] [--into .]

The bundle (gpu_job/job.py `pack`) holds repository paths: `benchmarks/results/smollm2-135m-gpu/` (state, timings,
curves, training records), `drafters/carryover-hf/smollm2-135m-gpu-*` (Hub layout) and `assets/train/smollm2-135m-gpu`
(the regenerated rows). Nothing is written unless every part is present and matches its checksum.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path


class UnpackError(RuntimeError):
    pass


def join_parts(folders: list[Path]) -> tuple[bytes, dict]:
    manifests = [f / "bundle.json" for f in folders if (f / "bundle.json").is_file()]
    if not manifests:
        raise UnpackError(f"no bundle.json in {[str(f) for f in folders]}")
    manifest = json.loads(manifests[0].read_text())
    data = bytearray()
    for part in manifest["parts"]:
        found = [f / part["name"] for f in folders if (f / part["name"]).is_file()]
        if not found:
            raise UnpackError(f"{part['name']} is missing: bring back call 3's files too (docs/gpu.md)")
        block = found[0].read_bytes()
        if hashlib.sha256(block).hexdigest() != part["sha256"]:
            raise UnpackError(f"{found[0]} does not match its checksum")
        data += block
    if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        raise UnpackError("the joined bundle does not match its checksum")
    return bytes(data), manifest


def unpack(folders: list[Path], into: Path) -> list[str]:
    data, manifest = join_parts(folders)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        for member in members:
            path = Path(member.name)
            if path.is_absolute() or ".." in path.parts or not (member.isfile() or member.isdir()):
                raise UnpackError(f"refusing bundle member {member.name!r}")
        tar.extractall(into, members=members, filter="data")
    return manifest["members"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders holding bundle.json and bundle.partNN files")
    parser.add_argument("--into", type=Path, default=Path.cwd(), help="the checkout (default: here)")
    args = parser.parse_args(argv)
    try:
        for name in unpack(args.folders, args.into):
            print(f"unpacked {name}")
    except UnpackError as error:
        print(f"unpack.py: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
