"""The carry probe: the block queries' attention split into context, carry and block rows, proposal by proposal."""

import pytest
import torch

import carryover_hf  # noqa: F401
from carryover_hf.tools.carry_probe import _Recorder, attention_shares, recording, split_shares, summarize
from carryover_hf.tools.testing import tiny_drafter, tiny_target


def test_the_split_puts_each_key_row_in_its_kind():
    recorder = _Recorder()
    # Two proposals of one layer: keys [context x 5 ; carry x 2 ; block x 3], then [context x 7 ; block x 3].
    recorder.calls = [(0, torch.tensor([0.1] * 5 + [0.2, 0.1] + [0.0, 0.1, 0.1]), 3),
                      (0, torch.tensor([0.1] * 7 + [0.1, 0.1, 0.1]), 3)]  # fmt: skip
    first, second = split_shares(recorder, carry_rows=[2, 0], num_layers=1)
    assert (first["context_rows"], first["carry_rows"], first["block_rows"]) == (5, 2, 3)
    assert first["context"] == pytest.approx(0.5) and first["carry"] == pytest.approx(0.3)
    assert first["block"] == pytest.approx(0.2)
    assert second["carry"] == 0 and second["context"] == pytest.approx(0.7)
    summary = summarize([first, second], 1)
    assert summary["proposals_with_carry"] == 1 and summary["carry_share"] == pytest.approx(0.3)
    # per carry row 0.15 against 0.1 per context row; 0.3 against the latest two context rows' 0.2
    assert summary["carry_per_row"] == pytest.approx(1.5)
    assert summary["carry_over_recent_context"] == pytest.approx(1.5)
    assert first["recent_context"] == pytest.approx(0.2)
    with pytest.raises(RuntimeError, match="do not line up"):
        split_shares(recorder, carry_rows=[2], num_layers=1)


def test_shares_of_a_generation_add_up_and_follow_the_carry_rows():
    target = tiny_target("llama", seed=0)
    drafter = tiny_drafter(target, block_size=4, num_hidden_layers=2)
    torch.manual_seed(0)
    prompts = [torch.randint(0, 64, (1, 10)) for _ in range(2)]
    shares = attention_shares(target, drafter, prompts, max_new_tokens=20)
    assert shares["proposals"] > 0 and shares["proposals_with_carry"] > 0
    assert len(shares["layers"]) == 2 and 1 <= shares["mean_carry_rows"] <= 3
    for layer in shares["layers"]:
        assert layer["context_share"] + layer["block_share"] <= 1 + 1e-6
    # The drafter's attention is restored afterwards, and under the probe a greedy output is the target's own.
    assert drafter.config._attn_implementation != "carryover_carry_probe"
    options = dict(attention_mask=torch.ones_like(prompts[0]), max_new_tokens=20, do_sample=False, pad_token_id=0)
    alone = target.generate(prompts[0], **options)
    with recording(drafter) as recorder:
        probed = target.generate(prompts[0], **options, assistant_model=drafter)
    assert recorder.calls and torch.equal(alone, probed)
