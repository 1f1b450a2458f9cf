"""The tools around the core: the command line (`cli`), the benchmark (`bench`), the offline prompt and training
data (`data`), the demo, the CPU kernels, tiny random models (`tiny`) and the test fixtures (`testing`).

The core (`carryover_hf` itself, `carryover_hf.training`, `carryover_hf.hub`) never imports from here
(tests/test_layering.py checks it); the tools import the core.
"""
