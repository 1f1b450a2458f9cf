"""The preallocated context buffer of `generate`: same proposals as a `Cache` and as a from-scratch pass, one buffer
per call that is never reallocated, and attention over one contiguous view of it."""

import pytest
import torch
from transformers.cache_utils import DynamicCache

import carryover_hf  # noqa: F401
from carryover_hf import modeling_carryover
from carryover_hf.modeling_carryover import DrafterContextBuffer
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target


ATOL = 1e-5
# (new context rows, carry rows) per proposal: a prefill, then rounds with partial, zero and full acceptance.
ROUNDS = [(6, 0), (1, 3), (2, 2), (4, 0), (1, 3), (3, 1)]


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_buffered_forward_equals_cache_and_from_scratch(attn_implementation):
    target = tiny_target("qwen3", vocab_size=16, seed=51)
    drafter = tiny_drafter(target, block_size=4, num_hidden_layers=2, seed=52, attn_implementation=attn_implementation)
    width, block = drafter.config.num_target_features, drafter.config.block_size
    generator = torch.Generator().manual_seed(53)
    features = torch.randn(1, 40, width, generator=generator)
    block_embeds = torch.randn(1, block, drafter.config.hidden_size, generator=generator)
    buffer, cache = DrafterContextBuffer(drafter, max_positions=40), DynamicCache(config=drafter.config)
    start = 0
    with torch.no_grad():
        for new, carried in ROUNDS:
            anchor = start + new
            arguments = dict(
                block_embeds=block_embeds,
                block_position_ids=torch.arange(anchor, anchor + block)[None],
                carry_features=features[:, anchor : anchor + carried] if carried else None,
                carry_position_ids=torch.arange(anchor, anchor + carried)[None] if carried else None,
            )
            incremental = dict(arguments, context_features=features[:, start:anchor],
                               context_position_ids=torch.arange(start, anchor)[None], use_cache=True)
            buffered = drafter(**incremental, past_key_values=buffer).last_hidden_state
            cached = drafter(**incremental, past_key_values=cache).last_hidden_state
            scratch = drafter(**arguments, context_features=features[:, :anchor],
                              context_position_ids=torch.arange(anchor)[None]).last_hidden_state
            torch.testing.assert_close(buffered, cached, atol=ATOL, rtol=0)
            torch.testing.assert_close(buffered, scratch, atol=ATOL, rtol=0)
            assert buffer.get_seq_length() == cache.get_seq_length() == anchor  # carry and block rows never stay
            start = anchor


def test_generate_reads_one_preallocated_buffer(monkeypatch):
    """One buffer per call, sized from max_length, never reallocated; attention reads a view of it (no concatenation)."""
    target = skew_towards_token(tiny_target("llama", vocab_size=16, seed=61), 3, 0.1)
    drafter = tiny_drafter(target, block_size=5, num_hidden_layers=2, seed=62, attn_implementation="eager")
    buffers, keys_read = [], []
    original = modeling_carryover.eager_attention_forward

    def recording(module, query, key, value, *args, **kwargs):
        keys_read.append((module.layer_idx, key.data_ptr(), key.shape[2]))
        return original(module, query, key, value, *args, **kwargs)

    monkeypatch.setattr(modeling_carryover, "eager_attention_forward", recording)
    handle = drafter.register_forward_hook(
        lambda m, a, kwargs, out: buffers.append((kwargs["past_key_values"], kwargs["past_key_values"].keys[0].data_ptr())),
        with_kwargs=True,
    )
    prompt = torch.tensor([[2, 7, 1, 8, 2, 8, 1, 8]])
    try:
        output = target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False)
    finally:
        handle.remove()
    assert torch.equal(output, target.generate(prompt, max_new_tokens=30, do_sample=False))
    buffer = buffers[0][0]
    assert isinstance(buffer, DrafterContextBuffer) and buffer.capacity >= output.shape[1]
    assert all(b is buffer and ptr == buffers[0][1] for b, ptr in buffers)  # the same storage every round
    assert keys_read and all(ptr == buffer.keys[layer].data_ptr() for layer, ptr, _ in keys_read)
    assert max(drafter.last_generation_stats.carry_rows) > 0


def test_buffer_refuses_positions_beyond_its_budget():
    target = tiny_target("llama", vocab_size=16, seed=71)
    drafter = tiny_drafter(target, block_size=4, seed=72)
    buffer = DrafterContextBuffer(drafter, max_positions=8)
    with pytest.raises(ValueError, match="beyond this buffer"):
        buffer.rotary(torch.tensor([[buffer.max_positions]]))
