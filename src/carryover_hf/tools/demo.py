"""`carryover-hf demo`: a shipped drafter against its target alone, on a few held-out prompts.

```bash
carryover-hf demo                      # SmolLM2-135M-Instruct + carryover-hf/smollm2-135m-carryover-dflash
carryover-hf demo --drafter runs/my-drafter --categories code qa --max_new_tokens 256
```

The drafters committed under `drafters/<org>/<name>` of the source checkout are placed in the local Hugging Face cache
and loaded by repo id, exactly as after a download
(`AutoModel.from_pretrained("carryover-hf/smollm2-135m-carryover-dflash")`); an installed wheel does not hold them and
finds them in that cache. Each prompt
runs with the target alone and with the drafter, back to back, after an untimed warm-up; the demo prints both times,
the speedup and the mean acceptance length, and checks that greedy outputs are identical. The drafter runs as the
library is meant to be used on CPU: with its own proposal defaults (the shipped SmolLM2 drafters: the cost-aware round
policy, which times the target's forwards once per machine during the untimed warm-up; `--round_policy rules` runs
their context lookup 10 in front of the drafter and proposal backoff 8 instead, which `--lookup_drafts N` /
`--proposal_backoff N` override) and the CPU kernels (`--cpu_kernels auto`: packed float32 linears, grouped-query
attention); `--round_policy rules --lookup_drafts 0 --proposal_backoff 0 --cpu_kernels off` shows the drafter alone.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputNotFoundError, UsageError
from ..resources import shipped_drafters_dir

SHIPPED_DRAFTERS = shipped_drafters_dir()  # None outside a source checkout
DEFAULT_DRAFTER = "carryover-hf/smollm2-135m-carryover-dflash"
SHIPPED_ORG = DEFAULT_DRAFTER.split("/")[0]
DEFAULT_CATEGORIES = ["translation", "qa", "math_reasoning", "code"]


@dataclass
class DemoArguments:
    target: str = field(default="smollm2-135m", metadata={"help": "target alias, local folder or Hub id"})
    drafter: str = field(
        default=DEFAULT_DRAFTER,
        metadata={"help": "drafter: a shipped repo id (drafters/<org>/<name>), a saved folder, or a Hub id"},
    )
    categories: list[str] = field(
        default_factory=lambda: list(DEFAULT_CATEGORIES), metadata={"help": "eval-suite categories to draw prompts from"}
    )
    prompts_per_category: int = field(default=1, metadata={"help": "held-out prompts per category"})
    max_new_tokens: int = field(default=96, metadata={"help": "new tokens per prompt (fewer if the target stops)"})
    temperature: float = field(default=0.0, metadata={"help": "0: greedy (outputs are checked to be identical)"})
    dtype: str = field(default="float32", metadata={"help": "float32 (fastest on AVX2 CPUs) or bfloat16"})
    threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: torch's choice)"})
    round_policy: str | None = field(
        default=None,
        metadata={"help": "'cost' (the cost-aware round policy) or 'rules' (the lookup and backoff below); default: the "
                  "drafter's own, generation_config.round_policy; rules when --lookup_drafts or --proposal_backoff is "
                  "given"},
    )
    lookup_drafts: int | None = field(
        default=None,
        metadata={"help": "context lookup: rounds whose last 3 or 2 tokens occurred before propose this many tokens "
                  "copied from there instead of running the drafter (0 = off; default: the drafter's own, "
                  "generation_config.lookup_drafts; docs/generate.md)"},
    )
    proposal_backoff: int | None = field(
        default=None, metadata={"help": "after a rejected first draft, skip proposing for 1, 2, 4, ... rounds (0 = "
                                "off; default: the drafter's own, generation_config.proposal_backoff)"},
    )
    cpu_kernels: str = field(
        default="auto",
        metadata={"help": "CPU kernels (carryover_hf.tools.cpu_kernels: packed float32 linears for both models, grouped-query "
                  "attention for the target): auto, on or off", "aliases": ["--packed_linears"]},
    )
    seed: int = field(default=0, metadata={"help": "seed of prompt i is seed + i (sampling)"})
    output: str | None = field(default=None, metadata={"help": "also write the results as JSON here"})


def resolve_drafter(spec: str) -> tuple[str, dict]:
    """Where to load a drafter from, and the `from_pretrained` options: a shipped drafter is first put into the local
    Hub cache (from the checkout's `drafters/`) and then loaded by its repo id, offline. Outside a checkout a shipped
    drafter must already be in that cache."""
    from huggingface_hub import constants, try_to_load_from_cache

    from ..hub.local_cache import add_to_hub_cache

    if Path(spec).expanduser().is_dir():
        return str(Path(spec).expanduser()), {}
    shipped = SHIPPED_DRAFTERS / spec if SHIPPED_DRAFTERS is not None else None
    if spec.count("/") == 1 and shipped is not None and (shipped / "config.json").is_file():
        add_to_hub_cache(shipped, spec)
        return spec, {"local_files_only": True}
    folders = SHIPPED_DRAFTERS.glob("*/*") if SHIPPED_DRAFTERS is not None else ()
    available = sorted(f"{p.parent.name}/{p.name}" for p in folders if p.is_dir())
    if spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise InputNotFoundError(
            f"--drafter {spec!r} is neither a folder nor a repo id; shipped drafters: {available}"
        )
    if spec.split("/")[0] == SHIPPED_ORG:  # a drafter of the repository, not published on the Hub
        if isinstance(try_to_load_from_cache(spec, "config.json"), str):
            return spec, {"local_files_only": True}
        if SHIPPED_DRAFTERS is not None:
            raise InputNotFoundError(f"--drafter {spec} is not a shipped drafter; shipped drafters: {available}")
        raise InputNotFoundError(
            f"--drafter {spec} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}); it ships in the "
            f"carryover-hf repository, not the wheel: pass --drafter <repository>/drafters/{spec}, or run "
            "`carryover-hf demo` once from a source checkout (an editable install), which puts it in the cache."
        )
    return spec, {}


def _check_args(args: DemoArguments) -> None:
    from .data.suites import CATEGORIES

    problems = []
    unknown = sorted(set(args.categories) - set(CATEGORIES))
    if unknown:
        problems.append(f"unknown categories {unknown}; choose from {list(CATEGORIES)}")
    if args.prompts_per_category < 1 or args.max_new_tokens < 1:
        problems.append("--prompts_per_category and --max_new_tokens must be positive")
    if args.temperature < 0:
        problems.append("--temperature must be >= 0")
    if any(value is not None and value < 0 for value in (args.lookup_drafts, args.proposal_backoff)):
        problems.append("--lookup_drafts and --proposal_backoff must be >= 0 (0 = off)")
    if args.round_policy not in (None, "rules", "cost"):
        problems.append(f"--round_policy must be 'rules' or 'cost', got {args.round_policy!r}")
    elif args.round_policy == "cost" and (args.lookup_drafts, args.proposal_backoff) != (None, None):
        problems.append("--lookup_drafts and --proposal_backoff drive --round_policy rules; the cost-aware policy "
                        "chooses lookups and proposals itself")  # fmt: skip
    if args.dtype not in ("float32", "bfloat16"):
        problems.append(f"--dtype must be float32 or bfloat16, got {args.dtype!r}")
    else:
        import torch

        from .cpu_kernels import resolve_cpu_kernels

        try:
            resolve_cpu_kernels(args.cpu_kernels, getattr(torch, args.dtype), "cpu")
        except ValueError as error:
            problems.append(str(error))
    if problems:
        raise UsageError("; ".join(problems))


def run_demo(args: DemoArguments, target=None, tokenizer=None, drafter=None, prompts=None) -> dict:
    """Runs the demo; models and prompts may be passed in (tests use tiny ones). Returns the results."""
    import torch

    from ..configuration_carryover import check_round_policy
    from .bench.prompts import default_suite_dir, encode_prompt, load_prompts
    from .bench.runner import BenchmarkSettings, Method, check_greedy_output, run_method
    from .cpu_kernels import apply_cpu_kernels, resolve_cpu_kernels

    _check_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if prompts is None:
        prompts = load_prompts(default_suite_dir(), args.categories, "eval", args.prompts_per_category)
    if drafter is None:  # where it comes from is known before the target loads: a missing drafter fails first
        source, options = resolve_drafter(args.drafter)
    if target is None:
        from ..targets import load_target

        target, tokenizer = load_target(args.target, dtype=args.dtype)
    if drafter is None:
        from ..hub.loading import load_drafter

        drafter = load_drafter(source, target, **options)
    cpu_kernels = resolve_cpu_kernels(args.cpu_kernels, target.dtype, target.device)
    if cpu_kernels:
        apply_cpu_kernels(target, drafter)
    target.eval()
    drafter.eval()
    # Not given: the drafter's own defaults, as a plain generate call would use them (a method passes every option).
    defaults = drafter.generation_config
    round_policy = args.round_policy
    if round_policy is None:
        given = (args.lookup_drafts, args.proposal_backoff) != (None, None)
        round_policy = "rules" if given else check_round_policy(getattr(defaults, "round_policy", None))
    settings = BenchmarkSettings(max_new_tokens=args.max_new_tokens, warmup=0, overhead=False)
    alone = Method("target", "target")
    if round_policy == "cost":
        lookup_drafts = proposal_backoff = None
        assisted = Method("drafter", "policy", assistant=drafter)  # carry as the drafter's default, as generate does
    else:
        lookup_drafts = defaults.lookup_drafts if args.lookup_drafts is None else args.lookup_drafts
        proposal_backoff = defaults.proposal_backoff if args.proposal_backoff is None else args.proposal_backoff
        assisted = Method("drafter", "carry_on", assistant=drafter, use_carryover=True,
                          proposal_backoff=proposal_backoff or None, lookup_drafts=lookup_drafts or None)  # fmt: skip
    encoded = [encode_prompt(p, tokenizer) for p in prompts]

    for method in (alone, assisted):  # untimed warm-up
        run_method(target, method, encoded[0], args.temperature, settings, args.seed, max_new_tokens=16)
    rows = []
    for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
        seed = args.seed + index
        # The order alternates so that drift of the machine favours neither side.
        order = (alone, assisted) if index % 2 == 0 else (assisted, alone)
        results = {m.name: run_method(target, m, ids, args.temperature, settings, seed) for m in order}
        (reference, plain), (output, spec) = results["target"], results["drafter"]
        rounds = spec["acceptance_lengths"]
        row = {
            "id": prompt.id,
            "category": prompt.category,
            "new_tokens": int(output.numel()),
            "target_seconds": plain["total_time"],
            "drafter_seconds": spec["total_time"],
            "speedup": plain["total_time"] / spec["total_time"],
            "acceptance_length": sum(rounds) / len(rounds) if rounds else None,
        }
        if args.temperature == 0:
            row["identical"] = check_greedy_output(target, ids, reference, output, tolerance=0.0)["identical"]
        rows.append(row)
        if tokenizer is not None and index == 0:
            print(f"\n[{prompt.category}] {tokenizer.decode(output, skip_special_tokens=True)[:300]}\n", flush=True)

    total_plain = sum(r["target_seconds"] for r in rows)
    total_spec = sum(r["drafter_seconds"] for r in rows)
    accepted = [r["acceptance_length"] for r in rows if r["acceptance_length"] is not None]
    summary = {
        "target": args.target,
        "drafter": args.drafter,
        "dtype": str(target.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "cpu_kernels": cpu_kernels,
        "round_policy": round_policy,
        "lookup_drafts": lookup_drafts,
        "proposal_backoff": proposal_backoff,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "speedup": total_plain / total_spec,
        "mean_acceptance_length": sum(accepted) / len(accepted) if accepted else None,
        "all_identical": all(r.get("identical", True) for r in rows),
        "prompts": rows,
    }
    return summary


def format_summary(summary: dict) -> str:
    lines = [f"{'prompt':<34} {'tokens':>6} {'target s':>9} {'drafter s':>10} {'speedup':>8} {'accept':>7}"]
    for row in summary["prompts"]:
        accept = f"{row['acceptance_length']:.2f}" if row["acceptance_length"] is not None else "-"
        mark = {True: "", False: "  OUTPUT DIFFERS"}.get(row.get("identical"), "")
        lines.append(f"{row['id']:<34} {row['new_tokens']:>6} {row['target_seconds']:>9.2f} "
                     f"{row['drafter_seconds']:>10.2f} {row['speedup']:>7.2f}x {accept:>7}{mark}")  # fmt: skip
    accept = summary["mean_acceptance_length"]
    if summary.get("round_policy") == "cost":
        proposals = "cost-aware round policy"
    else:
        proposals = f"lookup {summary.get('lookup_drafts') or 'off'}, backoff {summary.get('proposal_backoff') or 'off'}"
    lines.append(
        f"\n{summary['drafter']} on {summary['target']} ({summary['dtype']}, {summary['threads']} threads, "
        f"CPU kernels {'on' if summary.get('cpu_kernels') else 'off'}, {proposals}, T={summary['temperature']}): "
        f"speedup {summary['speedup']:.2f}x over the target alone, mean acceptance length {accept:.2f}"
        if accept is not None else "no speculative rounds ran"
    )
    if summary["temperature"] == 0:
        lines.append("greedy outputs identical to the target alone: " + ("yes" if summary["all_identical"] else "NO"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from transformers import HfArgumentParser

    parser = HfArgumentParser(DemoArguments, prog="carryover-hf demo", description=__doc__.split("\n\n")[0])
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    started = time.time()
    try:
        summary = run_demo(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"carryover-hf demo: {error}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    print(f"({time.time() - started:.0f} s in all)")
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["all_identical"] else 1


__all__ = ["DemoArguments", "format_summary", "resolve_drafter", "run_demo"]
