"""Small regenerated datasets from a (tiny) target, for tests, examples and smoke runs."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


@torch.no_grad()
def regenerate_random_prompts(
    target: PreTrainedModel,
    num_rows: int = 16,
    prompt_length: int = 8,
    response_length: int = 32,
    seed: int = 0,
    batch_size: int = 16,
):
    """A `datasets.Dataset` of random prompts answered greedily by `target` itself.

    Rows hold `input_ids` (prompt + response) and `loss_mask` (0 on the prompt, 1 on the response): the training-data
    contract of `CarryoverTrainer`, with responses a drafter can learn because the target produced them.
    """
    import datasets

    vocab_size = target.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab_size, (num_rows, prompt_length), generator=generator)
    device = next(target.parameters()).device
    rows = []
    for start in range(0, num_rows, batch_size):
        batch = prompts[start : start + batch_size].to(device)
        output = target.generate(
            batch,
            attention_mask=torch.ones_like(batch),
            do_sample=False,
            max_new_tokens=response_length,
            min_new_tokens=response_length,
            pad_token_id=0,
        )
        for sequence in output.cpu().tolist():
            rows.append(
                {"input_ids": sequence, "loss_mask": [0] * prompt_length + [1] * (len(sequence) - prompt_length)}
            )
    return datasets.Dataset.from_list(rows)


__all__ = ["regenerate_random_prompts"]
