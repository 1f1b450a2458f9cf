"""Benchmark harness: acceptance length and speedup of drafters against the target alone and its peers.

`run_benchmark` (Python) and `carryover-hf bench` (command line) run every method on the same prompts in one process,
check greedy outputs against the target alone, and write a JSON/markdown/PNG report with bootstrap intervals.
"""

from .overhead import measure_carry_overhead
from .prompts import Prompt, load_prompts, tiny_prompts
from .report import write_report
from .runner import BenchmarkSettings, CorrectnessError, check_greedy_output, run_benchmark

__all__ = [
    "BenchmarkSettings",
    "CorrectnessError",
    "Prompt",
    "check_greedy_output",
    "load_prompts",
    "measure_carry_overhead",
    "run_benchmark",
    "tiny_prompts",
    "write_report",
]
