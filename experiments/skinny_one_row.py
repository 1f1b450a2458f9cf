"""One-off (2026-12-06): does a 1-token decode step get cheaper with the skinny kernel than with MKL's `F.linear`?

The 180-prompt bench on the AMD EPYC (AVX-512) machine (benchmarks/results/smollm2-135m-campaign-ship-t0/) priced a
verification of 3 drafts at 0.84 of the target's own 1-token step (a least-squares fit of each run's verification time
on its rounds' draft counts), while the CPU kernels leave one row on MKL's matrix-vector path (`MIN_PACKED_ROWS = 2`,
chosen on an Intel machine where MKL won there). If MKL is slow at one row on this CPU, the target alone, and every
speedup measured against it, runs on a slow baseline. This times, in one process and alternating every round, the
target's forward over k new tokens on a 300-token context with one row on `F.linear` (as shipped) and with one row on
the skinny kernel (`MIN_PACKED_ROWS = 1`), CPU kernels otherwise on, one thread:

    OMP_NUM_THREADS=1 python experiments/skinny_one_row.py [--rounds 12]

It prints median milliseconds per forward and the greedy agreement of the two 1-row paths' logits.
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
    print(cpu_kernels.apply_cpu_kernels(target), "skinny:", cpu_kernels.skinny_linear_available())
    ids = torch.randint(0, target.config.vocab_size, (1, args.context + max(args.ks)))
    cache = target(ids[:, : args.context], use_cache=True).past_key_values
    times = {(rows, k): [] for rows in (2, 1) for k in args.ks}
    logits = {}
    for round_ in range(args.rounds):
        for rows in (2, 1) if round_ % 2 == 0 else (1, 2):
            cpu_kernels.MIN_PACKED_ROWS = rows
            for k in args.ks:
                tokens = ids[:, args.context : args.context + k]
                for _ in range(args.repeats + 1):  # the first forward after a switch is not timed
                    extra = cache.get_seq_length() - args.context
                    if extra > 0:
                        cache.crop(-extra)
                    start = time.perf_counter()
                    out = target(tokens, past_key_values=cache, use_cache=True)
                    times[(rows, k)].append(time.perf_counter() - start)
                times[(rows, k)].pop(-args.repeats - 1)
                if k == 1:
                    logits[rows] = out.logits[0, -1]
    cpu_kernels.MIN_PACKED_ROWS = 2
    step = statistics.median(times[(2, 1)])
    for (rows, k), values in times.items():
        median = statistics.median(values)
        label = "F.linear (shipped)" if rows == 2 else "skinny kernel"
        print(f"one row on {label:<19} k={k:2d}: {1000 * median:6.1f} ms ({median / step:.2f}x the shipped step)")
    difference = float((logits[1] - logits[2]).abs().max())
    print(f"1-row logits, skinny against F.linear: max |diff| {difference:.2e}, same argmax: "
          f"{bool(logits[1].argmax() == logits[2].argmax())}")


if __name__ == "__main__":
    main()
