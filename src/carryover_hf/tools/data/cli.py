"""`carryover-hf prompts build|show|reading`: build the offline prompt suites, summarise built ones, or write rows of
train prompts the target only reads (`carryover_hf.tools.data.reading`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ...errors import UsageError
from ...resources import checkout_root, resolve_prompt_suite
from . import reading
from .sources import SourceUnavailableError
from .suites import CATEGORIES, DEFAULT_SEED, DEFAULT_TRAIN_SIZE, MANIFEST, PROMPTS_DIR, build_suites, write_suites


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="carryover-hf prompts", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    build = sub.add_parser("build", help="build train/eval prompt suites from the offline sources")
    build.add_argument("--output", type=Path, default=None,
                       help=f"output folder (default in a source checkout: the shipped suites, {PROMPTS_DIR})")
    build.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of every random choice (default %(default)s)")
    build.add_argument("--train-size", type=int, default=DEFAULT_TRAIN_SIZE, help="train prompts per category (at most)")
    build.add_argument("--categories", nargs="+", default=list(CATEGORIES), choices=CATEGORIES, metavar="CATEGORY",
                       help=f"categories to build (default all: {' '.join(CATEGORIES)})")  # fmt: skip
    show = sub.add_parser("show", help="print the sizes, sources and licences of built suites")
    show.add_argument("--prompts-dir", type=Path, default=PROMPTS_DIR)
    reading.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.action == "reading":
        try:
            output = reading.build_reading(args)
        except (ValueError, FileNotFoundError) as error:
            print(f"carryover-hf prompts reading: {error}", file=sys.stderr)
            return 2
        summary = json.loads(output.with_name(output.name + reading.SIDECAR_SUFFIX).read_text())["summary"]
        print(f"wrote {output}: {summary['rows']} rows, {summary['read_tokens']} read tokens "
              f"({summary['rows_with_reference']} rows with a reference)")
        return 0
    if args.action == "show":
        path = resolve_prompt_suite(args.prompts_dir) / MANIFEST
        if not path.is_file():
            print(f"no {MANIFEST} in {args.prompts_dir}; build the suites with `carryover-hf prompts build`", file=sys.stderr)
            return 1
        manifest = json.loads(path.read_text())
        for category, entry in manifest["categories"].items():
            print(f"{category:<15} eval {entry['eval']['size']:>4}  train {entry['train']['size']:>5}")
            for source, info in entry["train"]["sources"].items():
                print(f"    {info['prompts']:>5}  {source}  [{'; '.join(info['licenses'])}]")
        return 0
    if args.train_size < 1:
        print("--train-size must be positive", file=sys.stderr)
        return 2
    if args.output is None:
        if checkout_root() is None:  # the shipped suites are part of the installed package: not rewritten in place
            raise UsageError("--output is required outside a source checkout: give the folder to build the suites in.")
        args.output = PROMPTS_DIR
    start = time.time()
    try:
        suites = build_suites(seed=args.seed, categories=args.categories, train_size=args.train_size,
                              progress=lambda message: print(f"[{time.time() - start:6.0f}s] {message}", flush=True))  # fmt: skip
    except SourceUnavailableError as error:
        print(f"carryover-hf prompts build: a source is missing.\n{error}", file=sys.stderr)
        return 1
    write_suites(suites, args.output, seed=args.seed, train_size=args.train_size)
    print(f"wrote {args.output} ({sum(len(s['train']) + len(s['eval']) for s in suites.values())} prompts)")
    return 0
