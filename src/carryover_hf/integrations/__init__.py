"""Integrations with serving engines, loaded by those engines (not imported by the package itself).

* `vllm_plugin`: vLLM's `vllm.general_plugins` entry point; serves carry exports with carry (docs/vllm.md).
"""
