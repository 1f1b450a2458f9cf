"""One-off (2026-12-06, extended 2026-12-07): how should the CPU kernels run a 1-token decode step and 2-3 rows?

The 180-prompt bench on the AMD EPYC (AVX-512) machine (benchmarks/results/smollm2-135m-campaign-ship-t0/) priced a
verification of 3 drafts at 0.84 of the target's own 1-token step, while the CPU kernels left one row on MKL's
matrix-vector path and ran 1-3 rows with two weight rows per block in the skinny kernel (both chosen on an Intel
machine). This times, in one process and alternating every round, the target's forward over k new tokens on a
300-token context under each `SkinnyChoice` below (CPU kernels otherwise on, one thread), and the choice
`tune_skinny_kernel` makes on this machine:

    OMP_NUM_THREADS=1 python experiments/skinny_one_row.py [--rounds 12] [--ks 1 2 3 4]

It prints median milliseconds per forward and the greedy agreement of the 1-row paths' logits with `F.linear`'s.
"""

import argparse
import statistics
import time

import torch

from carryover_hf.targets import load_target
from carryover_hf.tools import cpu_kernels


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    target, _ = load_target("smollm2-135m", dtype="float32")
    target.eval()
    print(cpu_kernels.apply_cpu_kernels(target, tune=False), "skinny:", cpu_kernels.skinny_linear_available())
    tuned = cpu_kernels.tune_skinny_kernel(target)
    print("tune_skinny_kernel:", tuned.describe() if tuned else None)
    choice = cpu_kernels.SkinnyChoice
    configurations = [
        ("before: F.linear, 2,2,2", choice()),
        ("skinny, 2,2,2", choice(one_row=True)),
        ("skinny, 1,1,1", choice(one_row=True, two_weight_rows=(False, False, False))),
    ]
    ids = torch.randint(0, target.config.vocab_size, (1, args.context + max(args.ks)))
    cache = target(ids[:, : args.context], use_cache=True).past_key_values
    times = {(c, k): [] for c in range(len(configurations)) for k in args.ks}
    logits = {}
    for round_ in range(args.rounds):
        order = list(range(len(configurations)))
        for c in order if round_ % 2 == 0 else order[::-1]:
            cpu_kernels.use_skinny_choice(configurations[c][1])
            for k in args.ks:
                tokens = ids[:, args.context : args.context + k]
                for _ in range(args.repeats + 1):  # the first forward after a switch is not timed
                    extra = cache.get_seq_length() - args.context
                    if extra > 0:
                        cache.crop(-extra)
                    start = time.perf_counter()
                    out = target(tokens, past_key_values=cache, use_cache=True)
                    times[(c, k)].append(time.perf_counter() - start)
                times[(c, k)].pop(-args.repeats - 1)
                if k == 1:
                    logits[c] = out.logits[0, -1]
    cpu_kernels.use_skinny_choice(choice())
    step = statistics.median(times[(0, 1)])
    for (c, k), values in times.items():
        median = statistics.median(values)
        print(f"{configurations[c][0]:<24} k={k:2d}: {1000 * median:6.1f} ms ({median / step:.2f}x the step before)")
    for c in range(1, len(configurations)):
        difference = float((logits[c] - logits[0]).abs().max())
        print(f"1-row logits, {configurations[c][0]} against F.linear: max |diff| {difference:.2e}, same argmax: "
              f"{bool(logits[c].argmax() == logits[0].argmax())}")


if __name__ == "__main__":
    main()
