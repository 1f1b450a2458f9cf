"""What a target forward over k new tokens costs with PyTorch's defaults and with `carryover_hf.tools.cpu_kernels`.

Five configurations of one model in one process: `default` (`nn.Linear` on MKL, Transformers' `sdpa`), `onednn`
(`PackedLinear` on oneDNN for every row count, same attention), `onednn_grouped` (the same with
`grouped_query_sdpa`: no key/value copies for grouped-query heads) and `cpu_kernels` (what `--cpu_kernels on` does:
the skinny kernel for 2-12 rows, oneDNN beyond, grouped attention) and `cpu_kernels_panel` (the same with the panel
kernel for 1-12 rows: `SkinnyChoice(panel_from=1)`). They are timed in one loop, the order
alternating every round, at each k on a fixed context. The cost of a speculative round's verification is the
k = drafts + 1 column over the k = 1 column of the same configuration.

It also measures row invariance: the largest logit difference between one forward over k tokens and k one-token
steps on the same context, and whether their argmaxes agree (greedy verification compares exactly these).

    python benchmarks/cpu_kernels.py --threads 1 --output benchmarks/results/smollm2-135m-cpu-kernels

`--skinny_baseline FILE` adds a fifth configuration, `cpu_kernels_baseline`: the same as `cpu_kernels` with the skinny
kernel built from FILE (an earlier revision of csrc/skinny_linear.c), so a kernel change is measured against its
predecessor in one process:

    git show a00ea24~1:src/carryover_hf/tools/csrc/skinny_linear.c > /tmp/skinny_before.c
    python benchmarks/cpu_kernels.py --threads 1 --skinny_baseline /tmp/skinny_before.c --output ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from carryover_hf.tools import cpu_kernels
from carryover_hf.tools.cpu_kernels import (
    PackedLinear,
    SkinnyChoice,
    pack_linears,
    packed_linears_available,
    panel_linear_available,
    register_grouped_attention,
    skinny_linear_available,
    skinny_linear_unavailable_reason,
    use_skinny_choice,
    use_skinny_linear,
)

KERNELS = ("default", "onednn", "onednn_grouped", "cpu_kernels", "cpu_kernels_panel")
# What `cpu_kernels_panel` changes: the panel kernel (csrc/panel_linear.c) for 1-12 rows instead of F.linear (one row)
# and the skinny kernel.
PANEL_CHOICE = SkinnyChoice(panel_from=1)


def _linear_slots(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear, PackedLinear]]:
    """(parent, attribute, plain, packed) for every packed linear: swapping the attribute swaps the kernel."""
    slots = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, PackedLinear):
                slots.append((parent, name, child.unwrap(), child))
    return slots


def _use(model, slots, kernel: str, libraries: dict) -> None:
    """Switch the model to `kernel`; `libraries` maps the skinny configurations to their compiled kernels."""
    for parent, name, plain, packed in slots:
        setattr(parent, name, plain if kernel == "default" else packed)
    model.set_attn_implementation("sdpa" if kernel in ("default", "onednn") else register_grouped_attention())
    use_skinny_linear(kernel in libraries)
    if kernel in libraries:
        cpu_kernels._Skinny.library = libraries[kernel]
    use_skinny_choice(PANEL_CHOICE if kernel == "cpu_kernels_panel" else SkinnyChoice())


def _crop(cache, context: int) -> None:
    extra = cache.get_seq_length() - context
    if extra > 0:
        cache.crop(-extra)


@torch.no_grad()
def _time_forward(model, cache, context: int, tokens: torch.Tensor, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _crop(cache, context)
        start = time.perf_counter()
        model(tokens, past_key_values=cache, use_cache=True)
        times.append(time.perf_counter() - start)
    _crop(cache, context)
    return statistics.median(times)


@torch.no_grad()
def _row_invariance(model, ids: torch.Tensor, context: int, k: int) -> dict:
    """One forward over ids[context:context+k] against k one-token steps, both on the same prefilled context."""
    prefix = model(ids[:, :context], use_cache=True).past_key_values
    block = model(ids[:, context : context + k], past_key_values=prefix, use_cache=True).logits[0]
    cache = model(ids[:, :context], use_cache=True).past_key_values
    steps = []
    for i in range(context, context + k):
        steps.append(model(ids[:, i : i + 1], past_key_values=cache, use_cache=True).logits[0, -1])
    steps = torch.stack(steps)
    return {
        "max_abs_logit_difference": float((block - steps).abs().max()),
        "bitwise_equal": bool(torch.equal(block, steps)),
        "argmax_equal": bool(torch.equal(block.argmax(-1), steps.argmax(-1))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context", type=int, default=300, help="tokens already in the cache")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8, 16])
    parser.add_argument("--rounds", type=int, default=12, help="rounds over the configurations (order alternating)")
    parser.add_argument("--repeats", type=int, default=3, help="timed forwards per kernel, k and round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, required=True, help="folder for results.json and results.md")
    parser.add_argument("--skinny_baseline", type=Path, default=None,
                        help="an earlier skinny_linear.c: adds the configuration cpu_kernels_baseline built from it")
    args = parser.parse_args()
    if args.skinny_baseline is not None and not args.skinny_baseline.is_file():
        raise SystemExit(f"--skinny_baseline {args.skinny_baseline} is not a file")
    if not packed_linears_available():
        raise SystemExit("this PyTorch build has no oneDNN packed linear")
    if not skinny_linear_available():
        raise SystemExit(f"the skinny kernel is unavailable here: {skinny_linear_unavailable_reason()}")
    torch.set_num_threads(args.threads)
    from carryover_hf.targets import load_target

    model, _ = load_target(args.target, dtype="float32")
    pack_linears(model)
    slots = _linear_slots(model)
    generator = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, args.context + max(args.ks)), generator=generator)
    kernels = KERNELS
    libraries = {"cpu_kernels": cpu_kernels._Skinny.library, "cpu_kernels_panel": cpu_kernels._Skinny.library}
    if not panel_linear_available():
        raise SystemExit(f"the panel kernel is unavailable here: {cpu_kernels._Panel.reason}")
    if args.skinny_baseline is not None:
        libraries["cpu_kernels_baseline"] = cpu_kernels._build_skinny(args.skinny_baseline)
        kernels = (*KERNELS, "cpu_kernels_baseline")
    times = {kernel: {k: [] for k in args.ks} for kernel in kernels}
    with torch.no_grad():
        cache = model(ids[:, : args.context], use_cache=True).past_key_values
        for round_ in range(args.rounds):
            for kernel in kernels if round_ % 2 == 0 else kernels[::-1]:
                _use(model, slots, kernel, libraries)
                _time_forward(model, cache, args.context, ids[:, args.context : args.context + 1], 1)  # untimed: settle
                for k in args.ks:
                    tokens = ids[:, args.context : args.context + k]
                    times[kernel][k].append(_time_forward(model, cache, args.context, tokens, args.repeats))
    invariance = {}
    for kernel in kernels:
        _use(model, slots, kernel, libraries)
        invariance[kernel] = {k: _row_invariance(model, ids, args.context, k) for k in args.ks if k > 1}
    step = {kernel: statistics.median(times[kernel][1]) for kernel in kernels}
    table = {
        kernel: {
            k: {
                "median_ms": 1e3 * statistics.median(v),
                "over_own_1_token_step": statistics.median(v) / step[kernel],
                "over_default_1_token_step": statistics.median(v) / step["default"],
            }
            for k, v in times[kernel].items()
        }
        for kernel in kernels
    }
    results = {
        "command": "python benchmarks/cpu_kernels.py "
        + " ".join(f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in vars(args).items() if v is not None),
        "target": args.target,
        "threads": args.threads,
        "context": args.context,
        "torch": torch.__version__,
        "linears": len(slots),
        "forward_cost": table,
        "row_invariance": invariance,
        "raw_seconds": times,
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        f"# Target forward over k new tokens: default kernels and the CPU kernels, part by part ({args.target})",
        "",
        f"`{results['command']}`",
        "",
        f"Context {args.context} tokens, {args.threads} thread(s), torch {torch.__version__}, {len(slots)} linears; "
        f"median of {args.rounds} alternating rounds x {args.repeats} forwards. Ratios are over the 1-token step "
        "of the same kernel (own) and of the default kernel.",
        "",
        "| k | " + " | ".join(f"{kernel} ms (/ own step, / default step)" for kernel in kernels) + " |",
        "|---:|" + "---:|" * len(kernels),
    ]
    for k in args.ks:
        cells = [
            f"{t['median_ms']:.1f} ({t['over_own_1_token_step']:.2f}, {t['over_default_1_token_step']:.2f})"
            for t in (table[kernel][k] for kernel in kernels)
        ]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Row invariance: one forward over k tokens against k one-token steps (same context).",
        "",
        "| k | " + " | ".join(f"{kernel}: max logit diff | {kernel}: bitwise / argmax equal" for kernel in kernels) + " |",
        "|---:|" + "---:|---:|" * len(kernels),
    ]
    for k in invariance["default"]:
        cells = [
            f"{invariance[kernel][k]['max_abs_logit_difference']:.2e} | "
            f"{invariance[kernel][k]['bitwise_equal']} / {invariance[kernel][k]['argmax_equal']}"
            for kernel in kernels
        ]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    (args.output / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
