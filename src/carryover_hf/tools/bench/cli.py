"""`carryover-hf bench`: benchmark drafters against the target alone, prompt lookup and Transformers' DFlash path."""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import HfArgumentParser

from ..cpu_kernels import apply_cpu_kernels, resolve_cpu_kernels
from .journal import JournalError, RunJournal
from .prompts import default_suite_dir, load_prompts, tiny_prompts
from .runner import BenchmarkSettings, CorrectnessError, check_shard, run_benchmark

TINY_DRAFTERS = ("tiny", "tiny-markov")
EXAMPLES = """examples:
  carryover-hf bench --target smollm2-135m --drafter base=ckpt/baseline --drafter carry=ckpt/carryover \\
      --prompts suites --num-prompts 20 --temperatures 0 1 --max-new-tokens 128
  carryover-hf bench --target tiny --drafter tiny --drafter tiny-markov    # smoke run on tiny random models

See docs/bench.md for what is measured and how."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BenchArguments:
    """What to load and where to write."""

    target: str = field(
        metadata={"help": "Target model: 'smollm2-135m', a local folder, a Hub id, or 'tiny' (tiny random model)."}
    )
    drafter: list[str] = field(
        default_factory=list,
        metadata={"help": "Drafters, each '[name=]path' (a saved Carryover drafter), 'tiny' or 'tiny-markov'.",
                  "action": "extend"},
    )
    prompts: str | None = field(
        default=None,
        metadata={"help": "JSONL prompt file (fields: prompt, turns or input_ids; category; split), or a suite folder of "
                  "<split>/<category>.jsonl (default: the shipped suites, 'suites', eval split). With --target tiny: "
                  "synthetic token prompts."},
    )
    category: list[str] = field(default_factory=list, metadata={"help": "Keep only these categories.", "action": "extend"})
    split: str | None = field(default=None, metadata={"help": "Keep only this split (suite folders: default 'eval')."})
    num_prompts: int | None = field(default=None, metadata={"help": "Prompts per category (the first N of each)."})
    dtype: str = field(default="float32", metadata={"help": f"Target and drafter dtype: {list(DTYPES)}."})
    device: str = field(default="auto", metadata={"help": "'auto' (CUDA when present), 'cpu', 'cuda', 'cuda:1', ..."})
    output_dir: str | None = field(
        default=None,
        metadata={"help": "Report folder (default benchmarks/results/<target>-<time>); every finished prompt is "
                  "journaled there (runs.jsonl) as it is measured."},
    )
    resume: bool = field(
        default=False,
        metadata={"help": "Continue the run journaled in --output_dir (the same command on the same models): prompts "
                  "measured there are kept, the rest are measured."},
    )
    overwrite: bool = field(
        default=False, metadata={"help": "Measure from scratch even if --output_dir holds a run journal."}
    )
    stop_after_minutes: float | None = field(
        default=None,
        metadata={"help": "Start no prompt after this many minutes; the report covers what was measured and says so "
                  "(continue later with --resume). Default: run to the end."},
    )
    shard: str | None = field(
        default=None,
        metadata={"help": "K/N: measure only the K-th of N shares of the prompt groups, so that N processes (each with "
                  "this option, the same command and --resume) fill one --output_dir side by side; each prompt's "
                  "methods still run back to back in one process. The report covers every group in the journal."},
    )
    chat_template: bool = field(default=True, metadata={"help": "Wrap text prompts in the tokenizer's chat template."})
    progress: bool = field(default=True, metadata={"help": "Show progress bars."})
    tiny_block_size: int = field(default=4, metadata={"help": "Block size of 'tiny' drafters."})
    threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: torch's choice)."})
    cpu_kernels: str = field(
        default="auto",
        metadata={"help": "CPU kernels (carryover_hf.tools.cpu_kernels): packed float32 linears for target and drafters, "
                  "grouped-query attention without key/value copies for the target. 'auto' (on for float32 on CPU), "
                  "'on' or 'off'. Every method runs on the same models.", "aliases": ["--packed_linears"]},
    )


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available; use --device cpu")
    return device


def _shard(spec: str | None) -> tuple[int, int] | None:
    """'K/N' -> (K, N); `run_benchmark`'s own check (`check_shard`) runs on it before anything is loaded."""
    if spec is None:
        return None
    k, slash, n = spec.partition("/")
    if not (slash and k.isdigit() and n.isdigit()):
        raise ValueError(f"--shard takes K/N with 1 <= K <= N (e.g. 1/2 and 2/2 for two processes), got {spec!r}")
    return int(k), int(n)


def _drafter_spec(spec: str) -> tuple[str, str]:
    name, _, path = spec.rpartition("=")
    path = path.strip()
    name = name.strip() or (path if path in TINY_DRAFTERS else Path(path.rstrip("/")).name)
    if not path:
        raise ValueError(f"--drafter {spec!r}: give '[name=]path'")
    return re.sub(r"[/,\s]+", "_", name), path


def _check_drafter_path(path: str) -> None:
    if path in TINY_DRAFTERS or Path(path).expanduser().exists():
        return
    if path.startswith((".", "/", "~")) or path.count("/") > 1:
        raise FileNotFoundError(f"drafter {path!r} does not exist (give a saved drafter folder or a Hub id)")


def _load_drafter(path: str, target, dtype: torch.dtype, block_size: int, index: int):
    from ...modeling_carryover import CarryoverDrafterModel
    from ..tiny import tiny_drafter

    if path in TINY_DRAFTERS:
        kind = "markov" if path == "tiny-markov" else "dflash"
        return tiny_drafter(target, block_size=block_size, drafter_type=kind, seed=index).to(target.device)
    try:
        drafter = CarryoverDrafterModel.from_pretrained(path, dtype=dtype, use_safetensors=True)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"could not load drafter {path!r} as a Carryover drafter ({error}). z-lab, Transformers or speculators "
            "DFlash checkpoints must first be imported with `carryover-hf convert`."
        ) from error
    return drafter.to(target.device).eval()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser(
        (BenchArguments, BenchmarkSettings),
        prog="carryover-hf bench",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=_HelpFormatter,
    )
    args, settings = parser.parse_args_into_dataclasses(argv)
    if args.dtype not in DTYPES:
        parser.error(f"--dtype must be one of {list(DTYPES)}, got {args.dtype!r}")
    try:
        settings.validate()
        if args.resume and args.overwrite:
            raise ValueError("--resume and --overwrite exclude each other")
        if args.resume and args.output_dir is None:
            raise ValueError("--resume needs the --output_dir of the run to continue")
        if args.stop_after_minutes is not None and args.stop_after_minutes <= 0:
            raise ValueError(f"--stop_after_minutes must be positive, got {args.stop_after_minutes}")
        shard = _shard(args.shard)
        check_shard(shard, args.output_dir, args.resume)
        if args.output_dir is not None:
            RunJournal.check_can_open(args.output_dir, args.resume, args.overwrite)  # before minutes of loading
        device = _device(args.device)
        if args.threads:
            torch.set_num_threads(args.threads)
        dtype = DTYPES[args.dtype]
        use_cpu_kernels = resolve_cpu_kernels(args.cpu_kernels, dtype, device)
        tiny = args.target == "tiny"

        # Prompts first: a bad file should fail before minutes of model loading.
        if args.prompts is not None:
            prompts = load_prompts(args.prompts, args.category or None, args.split, args.num_prompts)
        elif tiny:
            prompts = tiny_prompts(2 * (args.num_prompts or 4))
        else:  # the shipped suites
            args.prompts = str(default_suite_dir())
            prompts = load_prompts(args.prompts, args.category or None, args.split, args.num_prompts)
        names = [_drafter_spec(s) for s in args.drafter]
        duplicates = sorted({n for n, _ in names if [m for m, _ in names].count(n) > 1})
        if duplicates:
            raise ValueError(f"drafter names {duplicates} are repeated; name them with --drafter name=path")
        for _, path in names:
            _check_drafter_path(path)

        if tiny:
            from ..tiny import tiny_target

            # Enough positions for the default overhead context lengths.
            target, tokenizer = tiny_target("qwen3", dtype=dtype, max_position_embeddings=4096).to(device), None
        else:
            from ...targets import load_target

            target, tokenizer = load_target(args.target, dtype=args.dtype, device=device)
        drafters = {name: _load_drafter(path, target, dtype, args.tiny_block_size, i) for i, (name, path) in enumerate(names)}
        # What was switched (for the report), or False.
        cpu_kernels = apply_cpu_kernels(target, *drafters.values()) if use_cpu_kernels else False
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        print(f"carryover-hf bench: {error}", file=sys.stderr)
        return 2

    output_dir = args.output_dir or str(
        Path("benchmarks") / "results" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', args.target)}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    )
    run_info = {
        "command": "carryover-hf bench " + " ".join(argv),
        "target": args.target,
        "drafters": dict(names),
        "prompts": args.prompts or "synthetic tiny prompts",
        "categories": args.category or None,
        "split": args.split,
        "num_prompts_per_category": args.num_prompts,
        "cpu_kernels": cpu_kernels,
    }
    try:
        report = run_benchmark(
            target,
            drafters,
            prompts,
            tokenizer=tokenizer,
            settings=settings,
            output_dir=output_dir,
            progress=args.progress,
            chat_template=args.chat_template,
            run_info=run_info,
            resume=args.resume,
            overwrite=args.overwrite,
            time_limit=None if args.stop_after_minutes is None else 60 * args.stop_after_minutes,
            shard=shard,
        )
    except CorrectnessError as error:
        print(f"carryover-hf bench: {error}", file=sys.stderr)
        return 1
    except JournalError as error:
        print(f"carryover-hf bench: {error}", file=sys.stderr)
        return 2
    progress = report["progress"]
    if not progress["complete"] and args.shard is not None:
        print(f"Shard {args.shard}: {progress['prompt_groups']} of {progress['prompt_groups_total']} prompt groups in "
              "the journal. Rerun the same command to continue its share; the report is complete when every shard's "
              "share is measured.")
    elif not progress["complete"]:
        print(
            f"Stopped after {args.stop_after_minutes:g} minutes: {progress['prompt_groups']} of "
            f"{progress['prompt_groups_total']} prompt groups measured. "
            + ("Rerun the same command to continue." if args.resume
               else f"Continue with the same command plus --resume (and --output_dir {output_dir}).")
        )
    print(f"Report written to {output_dir}/results.md (all numbers in results.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
