"""Offline data: prompt suites by category (`carryover-hf prompts build`) and regenerated target responses
(`carryover-hf regenerate`). See docs/data.md."""

import importlib

from ...regenerated import load_regenerated
from .chat import SMOLLM2_CHAT_TEMPLATE, assemble_conversation, tiny_chat_tokenizer
from .suites import CATEGORIES, PROMPTS_DIR, load_prompts


def __getattr__(name: str):
    # The regeneration module imports generation code; load it only when asked for.
    if name == "RegenerationConfig":
        return getattr(importlib.import_module(".regenerate", __name__), name)
    raise AttributeError(f"module 'carryover_hf.tools.data' has no attribute {name!r}")


__all__ = [
    "CATEGORIES",
    "PROMPTS_DIR",
    "SMOLLM2_CHAT_TEMPLATE",
    "RegenerationConfig",
    "assemble_conversation",
    "load_prompts",
    "load_regenerated",
    "tiny_chat_tokenizer",
]
