"""Parallel verification (one target forward over the cached prefix) equals sequential verification.

Tolerance: float32, |parallel - sequential| <= 1e-4 + 1e-4 * |sequential| for every fused feature and final-norm
state; acceptance counts (leading drafts equal to the target's greedy choice) must be identical.
"""

import pytest
import torch

import carryover_hf  # noqa: F401
from carryover_hf.features import gather_target_features, hidden_state_indices
from carryover_hf.tools.testing import tiny_target
from carryover_hf.training.losses import leading_matches
from carryover_hf.training.verification import parallel_verify, target_forward, target_logits

BLOCK = 5
LAYER_IDS = [0, 2, 3]


def _sequential(target, prefix, drafts):
    """Plain forward over `prefix + drafts`: states at the anchor and draft rows."""
    sequence = torch.cat([prefix, drafts])[None]
    last_layer = target.config.num_hidden_layers - 1  # its entry is the final-norm output
    out = target(sequence, output_hidden_states=sorted(set(hidden_state_indices([*LAYER_IDS, last_layer]))))
    start = prefix.shape[0] - 1
    features = gather_target_features(out.hidden_states, LAYER_IDS)[0, start:]
    return features, out.hidden_states[-1][0, start:], out.logits[0, start:]


def _greedy_continuation(target, prefix, length):
    out = target.generate(prefix[None], max_new_tokens=length, do_sample=False, pad_token_id=0)
    return out[0, prefix.shape[0] :]


@pytest.mark.parametrize(
    "architecture,overrides,attn",
    [
        ("llama", {}, "sdpa"),
        ("llama", {}, "eager"),
        ("qwen3", {}, "sdpa"),
        ("mistral", {"sliding_window": 6}, "sdpa"),
        ("qwen3", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 2}, "sdpa"),
        ("gemma", {}, "sdpa"),
    ],
)
def test_parallel_verification_equals_sequential(architecture, overrides, attn):
    torch.manual_seed(0)
    target = tiny_target(architecture, attn_implementation=attn, **overrides)
    lengths = [24, 17]
    input_ids = torch.zeros(2, max(lengths), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, n in enumerate(lengths):
        input_ids[i, :n] = torch.randint(0, 64, (n,))
        attention_mask[i, :n] = 1
    anchors = torch.tensor([[3, 9, 15, 22], [0, 5, 11, 16]])

    # Drafts: the target's own continuation, corrupted at a different row per anchor, so that acceptance counts
    # range from 0 to B-1.
    drafts = torch.zeros(2, 4, BLOCK - 1, dtype=torch.long)
    for b in range(2):
        for k in range(4):
            a = int(anchors[b, k])
            drafts[b, k] = _greedy_continuation(target, input_ids[b, : a + 1], BLOCK - 1)
            cut = (b * 4 + k) % BLOCK  # == B-1: no corruption (all accepted)
            if cut < BLOCK - 1:
                drafts[b, k, cut] = (drafts[b, k, cut] + 1) % 64

    states = target_forward(target, input_ids, attention_mask, LAYER_IDS, use_cache=True)
    rows = torch.cat([torch.gather(input_ids, 1, anchors)[..., None], drafts], dim=-1)
    verified = parallel_verify(target, states.past_key_values, rows, anchors, LAYER_IDS, with_last_hidden_state=True)
    parallel_greedy = target_logits(target, verified.last_hidden_state).argmax(-1)  # (b, A, B)
    valid = torch.ones_like(drafts, dtype=torch.bool)
    parallel_accepted = leading_matches(drafts, parallel_greedy[..., :-1], valid)

    sequential_accepted = torch.zeros_like(parallel_accepted)
    for b in range(2):
        for k in range(4):
            a = int(anchors[b, k])
            features, last, logits = _sequential(target, input_ids[b, : a + 1], drafts[b, k])
            torch.testing.assert_close(verified.features[b, k], features, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(verified.last_hidden_state[b, k], last, atol=1e-4, rtol=1e-4)
            sequential_accepted[b, k] = leading_matches(drafts[b, k], logits.argmax(-1)[:-1], valid[b, k])
    assert torch.equal(parallel_accepted, sequential_accepted)
    # The corruption pattern reaches zero, partial and full acceptance.
    assert {0, BLOCK - 1} <= set(sequential_accepted.flatten().tolist())


def test_target_forward_features_match_generation_convention():
    """Context features of the training pass are the per-layer states `hidden_states[i + 1]` of a plain forward."""
    target = tiny_target("llama")
    ids = torch.randint(0, 64, (1, 10))
    states = target_forward(target, ids, None, LAYER_IDS, with_last_hidden_state=True)
    out = target(ids, output_hidden_states=True)
    expected = torch.cat([out.hidden_states[i + 1] for i in LAYER_IDS], dim=-1)
    torch.testing.assert_close(states.features, expected)
    torch.testing.assert_close(target_logits(target, states.last_hidden_state), out.logits, atol=1e-5, rtol=1e-5)


def test_unsupported_target_attention_is_rejected():
    target = tiny_target("llama")
    ids = torch.randint(0, 64, (1, 8))
    states = target_forward(target, ids, None, LAYER_IDS, use_cache=True)
    target.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation"):
        parallel_verify(target, states.past_key_values, ids[:, None, :BLOCK], torch.tensor([[2]]), LAYER_IDS)
