"""Packed float32 CPU linears: same results as `nn.Linear`, row-invariant, never stale, lossless generation."""

import copy

import pytest
import torch
from torch import nn

import carryover_hf  # noqa: F401  (installs the generation hook)
from carryover_hf.tools.cpu_kernels import (
    GROUPED_ATTENTION,
    PackedLinear,
    SkinnyChoice,
    apply_cpu_kernels,
    pack_linears,
    pack_panels,
    packed_linears_available,
    panel_linear_available,
    resolve_cpu_kernels,
    skinny_linear,
    skinny_linear_available,
    tune_skinny_kernel,
    unpack_linears,
    use_grouped_attention,
    use_skinny_choice,
    use_skinny_linear,
)
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target


pytestmark = pytest.mark.skipif(not packed_linears_available(), reason="this PyTorch build has no oneDNN")


@pytest.fixture
def onednn_only():
    """Packed layers on oneDNN for every row count (the skinny kernel's routing has its own test)."""
    previous = use_skinny_linear(False)
    yield
    use_skinny_linear(previous)


def _linear(out_features=96, in_features=40, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias)


@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_matches_linear(bias):
    linear = _linear(bias=bias)
    packed = PackedLinear.wrap(linear)
    x = torch.randn(3, 7, 40)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
    assert packed.weight is linear.weight and packed.bias is linear.bias


def test_one_row_runs_the_default_kernel_and_several_rows_the_packed_one(monkeypatch, onednn_only):
    linear = _linear(out_features=1536, in_features=576)
    packed = PackedLinear.wrap(linear)
    calls = []
    original = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(a[0].shape) or original(*a))
    with torch.no_grad():
        for shape in [(1, 576), (1, 1, 576)]:  # a decode step: bit for bit what nn.Linear gives
            x = torch.randn(shape)
            assert torch.equal(packed(x), linear(x))
        assert calls == []
        x = torch.randn(1, 5, 576)
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
    assert calls == [(1, 5, 576)]


def test_pack_is_rebuilt_when_the_weight_changes():
    linear = _linear()
    packed = PackedLinear.wrap(linear)
    x = torch.randn(2, 40)
    with torch.no_grad():
        before = packed(x)
        linear.weight.mul_(2.0)  # in place: same storage, new version
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
        linear.weight = nn.Parameter(torch.randn(96, 40))  # replaced on the original: the wrapper keeps its own
        packed.weight = nn.Parameter(torch.randn(96, 40))  # replaced on the wrapper
        torch.testing.assert_close(packed(x), x @ packed.weight.T + packed.bias, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(before, packed(x).detach())


def test_autograd_other_dtypes_and_devices_fall_back_to_linear():
    linear = _linear()
    packed = PackedLinear.wrap(linear)
    x = torch.randn(2, 40)
    packed(x).sum().backward()  # grad enabled, weight requires grad: F.linear, so gradients flow
    assert linear.weight.grad is not None and linear.weight.grad.abs().sum() > 0
    assert packed._packed is None  # never packed for the autograd call
    half = PackedLinear.wrap(_linear().to(torch.bfloat16))
    with torch.no_grad():
        out = half(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and half._packed is None


def test_pack_linears_swaps_float32_linears_and_keeps_parameters():
    target = tiny_target("llama", vocab_size=32, seed=1)
    linears = sum(type(m) is nn.Linear for m in target.modules())
    target.lm_head.weight = target.get_input_embeddings().weight  # tied, as SmolLM2's are
    state = {k: v.data_ptr() for k, v in target.state_dict().items()}
    x = torch.randint(0, 32, (2, 9))
    with torch.no_grad():
        expected = target(x).logits
        assert pack_linears(target) == linears > 0
        assert not any(type(m) is nn.Linear for m in target.modules())
        assert pack_linears(target) == 0  # already packed
        torch.testing.assert_close(target(x).logits, expected, rtol=1e-4, atol=1e-4)
    assert {k: v.data_ptr() for k, v in target.state_dict().items()} == state
    assert target.get_output_embeddings().weight is target.get_input_embeddings().weight  # still tied
    copy.deepcopy(target)  # drafters and targets get copied by Trainer and tests
    assert unpack_linears(target) == linears
    assert sum(type(m) is nn.Linear for m in target.modules()) == linears
    assert pack_linears(tiny_target("llama", vocab_size=32, seed=1).to(torch.bfloat16)) == 0


@pytest.mark.parametrize("draft_vocabulary", [None, [0, 1, 3, 5, 8, 13]])
def test_draft_head_of_a_packed_target_runs_packed_and_gives_the_same_logits(monkeypatch, onednn_only, draft_vocabulary):
    target = tiny_target("qwen3", vocab_size=16, seed=1)
    drafter = tiny_drafter(target, block_size=4, seed=2)
    if draft_vocabulary is not None:
        drafter.set_draft_vocabulary(torch.tensor(draft_vocabulary))
    reference = drafter.draft_head(target.get_output_embeddings())
    assert reference.linear is None
    pack_linears(target)
    head = drafter.draft_head(target.get_output_embeddings())
    assert isinstance(head.linear, PackedLinear) and head.linear.weight.data_ptr() == head.weight.data_ptr()
    calls = []
    original = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(a[0].shape) or original(*a))
    states = torch.randn(1, 3, target.config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(head(states), reference(states), rtol=1e-5, atol=1e-5)
        assert torch.equal(head.argmax(states), reference.argmax(states))
        assert torch.equal(head(states[:, :1]), reference(states[:, :1]))  # one row: F.linear, bit for bit
    assert calls == [(3, target.config.hidden_size)] * 2
    assert head.size == (len(draft_vocabulary) if draft_vocabulary else 16)


@pytest.mark.parametrize("kind", ["dflash", "markov"])
@pytest.mark.parametrize("reduced_vocabulary", [False, True])
def test_greedy_generation_with_packed_models_is_identical(kind, reduced_vocabulary):
    target = skew_towards_token(tiny_target("qwen3", vocab_size=16, seed=1), 3, 0.1)
    drafter = tiny_drafter(target, block_size=4, drafter_type=kind, seed=2)
    if reduced_vocabulary:
        drafter.set_draft_vocabulary(torch.tensor([0, 1, 2, 3, 5, 7, 9, 11]))
    assert pack_linears(target) > 0 and pack_linears(drafter) > 0
    accepted = 0
    for i in range(8):
        prompt = torch.randint(0, 16, (1, 2 + i), generator=torch.Generator().manual_seed(i))
        kwargs = dict(max_new_tokens=24, do_sample=False, attention_mask=torch.ones_like(prompt))
        reference = target.generate(prompt, **kwargs)
        output = target.generate(prompt, assistant_model=drafter, **kwargs)
        assert torch.equal(output, reference), i
        accepted += sum(a - 1 for a in drafter.last_generation_stats.acceptance_lengths)
    assert accepted > 0  # some drafts were accepted, so verification forwards over several rows were compared


def test_resolve_cpu_kernels():
    assert resolve_cpu_kernels("auto", torch.float32, "cpu") is True
    assert resolve_cpu_kernels("auto", torch.bfloat16, "cpu") is False
    assert resolve_cpu_kernels("off", torch.float32, "cpu") is False
    assert resolve_cpu_kernels("on", torch.float32, "cpu") is True
    with pytest.raises(ValueError, match="needs float32 on CPU"):
        resolve_cpu_kernels("on", torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="'auto', 'on' or 'off'"):
        resolve_cpu_kernels("yes", torch.float32, "cpu")


@pytest.mark.parametrize("architecture", ["qwen3", "llama", "mistral", "gemma"])
def test_grouped_attention_gives_the_same_forward(architecture):
    """Folding grouped query heads into rows: a one-row step is unchanged bit for bit (Transformers' own path), a
    forward over a few rows on a cache agrees to float32 rounding (the attention kernel may block the longer row
    dimension differently) and gives the same argmax."""
    target = tiny_target(architecture, vocab_size=32, hidden_size=96, seed=1, num_attention_heads=6, num_key_value_heads=2, head_dim=16)
    grouped = copy.deepcopy(target)
    assert use_grouped_attention(grouped) and grouped.config._attn_implementation == GROUPED_ATTENTION
    ids = torch.randint(0, 32, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for rows in (1, 2, 3, 5, 8):
            outputs = []
            for model in (target, grouped):
                cache = model(ids[:, :12], use_cache=True).past_key_values
                outputs.append(model(ids[:, 12 : 12 + rows], past_key_values=cache, use_cache=True).logits)
            if rows == 1:
                assert torch.equal(outputs[0], outputs[1])
            torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)
            assert torch.equal(outputs[0].argmax(-1), outputs[1].argmax(-1)), rows


def test_grouped_attention_folds_only_masked_multi_row_queries(monkeypatch):
    import carryover_hf.tools.cpu_kernels as kernels

    target = tiny_target("qwen3", vocab_size=32, seed=1)
    use_grouped_attention(target)
    plain, folded = [], []
    original_sdpa, original_torch = kernels.sdpa_attention_forward, kernels.F.scaled_dot_product_attention
    monkeypatch.setattr(kernels, "sdpa_attention_forward", lambda m, q, *a, **k: plain.append(q.shape) or original_sdpa(m, q, *a, **k))
    monkeypatch.setattr(kernels.F, "scaled_dot_product_attention", lambda q, *a, **k: folded.append(q.shape) or original_torch(q, *a, **k))
    ids = torch.randint(0, 32, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = target(ids[:, :6], use_cache=True).past_key_values
        plain.clear(), folded.clear()
        target(ids[:, 6:7], past_key_values=cache, use_cache=True)  # one row: Transformers' path
        assert len(plain) == 4 and len(folded) == 4 and all(shape[2] == 1 for shape in plain)
        plain.clear(), folded.clear()
        target(ids[:, 7:9], past_key_values=cache, use_cache=True)  # two rows on a cache: folded, 2 groups x 2 rows
        assert plain == [] and folded == [(1, 2, 4, 16)] * 4


def test_use_grouped_attention_leaves_other_implementations_alone():
    assert use_grouped_attention(tiny_target("llama", vocab_size=32, attn_implementation="eager")) is False
    target = tiny_target("qwen3", vocab_size=32)
    drafter = tiny_drafter(target)
    switched = apply_cpu_kernels(target, drafter)
    assert switched["grouped_attention"] and switched["packed_linears"] > 0
    assert drafter.config._attn_implementation == "sdpa"  # a drafter's attention is its own
    target.set_attn_implementation("sdpa")  # and back
    assert target.config._attn_implementation == "sdpa"


# The Intel default, and what the AMD EPYC chose (one row on the skinny kernel, one weight row per block): each
# routes the target alone's steps and the verification rows through other kernels.
CHOICES = {
    "default": SkinnyChoice(),
    "one-row-on-kernel": SkinnyChoice(one_row=True, two_weight_rows=(False,) * 3),
    "panel-from-2": SkinnyChoice(panel_from=2),
}


@pytest.mark.parametrize("choice", sorted(CHOICES))
@pytest.mark.parametrize("kind", ["dflash", "markov"])
def test_greedy_generation_with_all_cpu_kernels_is_identical(kind, choice):
    target = skew_towards_token(tiny_target("qwen3", vocab_size=16, seed=1), 3, 0.1)
    reference_target = copy.deepcopy(target)
    drafter = tiny_drafter(target, block_size=4, drafter_type=kind, seed=2)
    apply_cpu_kernels(target, drafter)
    use_skinny_choice(CHOICES[choice])  # restored after the test (conftest)
    accepted = 0
    for i in range(6):
        prompt = torch.randint(0, 16, (1, 2 + i), generator=torch.Generator().manual_seed(i))
        kwargs = dict(max_new_tokens=24, do_sample=False, attention_mask=torch.ones_like(prompt))
        reference = reference_target.generate(prompt, **kwargs)  # default linears and attention
        output = target.generate(prompt, assistant_model=drafter, **kwargs)
        assert torch.equal(output, reference), i
        accepted += sum(a - 1 for a in drafter.last_generation_stats.acceptance_lengths)
    assert accepted > 0


skinny = pytest.mark.skipif(not skinny_linear_available(), reason="no skinny kernel here (no C compiler or AVX2)")


@skinny
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 12, 14, 15, 29])
@pytest.mark.parametrize("width", [576, 13])  # a multiple of 8 lanes, and a scalar tail only
def test_skinny_linear_matches_linear(rows, width):
    generator = torch.Generator().manual_seed(rows)
    x, weight, bias = (torch.randn(*shape, generator=generator) for shape in ((rows, width), (33, width), (33,)))
    weight /= width**0.5  # outputs of order 1: float32 rounding of a 576-term sum is then about 1e-6
    for b in (bias, None):
        torch.testing.assert_close(skinny_linear(x, weight, b), torch.nn.functional.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="contiguous"):
        skinny_linear(x, weight.t().contiguous().t())
    with pytest.raises(ValueError, match="float32"):
        skinny_linear(x.double(), weight)


@skinny
def test_packed_linear_sends_2_to_12_rows_at_one_thread_to_the_skinny_kernel(monkeypatch):
    import carryover_hf.tools.cpu_kernels as kernels

    linear = _linear(out_features=64, in_features=40)
    packed = PackedLinear.wrap(linear)
    used = []
    original_skinny, original_onednn = kernels._skinny_product, torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(kernels, "_skinny_product", lambda x, *a: used.append(("skinny", x.shape[0])) or original_skinny(x, *a))
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda x, *a: used.append(("onednn", x.shape[-2])) or original_onednn(x, *a))
    threads = torch.get_num_threads()
    try:
        with torch.no_grad():
            for rows, threads_now in [(1, 1), (2, 1), (12, 1), (13, 1), (4, 2)]:
                torch.set_num_threads(threads_now)
                x = torch.randn(1, rows, 40)
                torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
            previous = use_skinny_linear(False)
            packed(torch.randn(1, 3, 40))
            use_skinny_linear(previous)
    finally:
        torch.set_num_threads(threads)
    assert used == [("skinny", 2), ("skinny", 12), ("onednn", 13), ("onednn", 4), ("onednn", 3)]


@skinny
def test_skinny_kernel_gives_each_output_the_same_sum_whatever_the_rows_and_weight_rows_per_block():
    """Bit for bit: a row's outputs do not depend on how many rows share the call or how weight rows are blocked, so a
    plain step on the kernel and a verification row on it agree exactly (the tuned choice changes speed only)."""
    import carryover_hf.tools.cpu_kernels as kernels

    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(29, 581, generator=generator), torch.randn(37, 581, generator=generator)  # odd: tails
    bias = torch.randn(37, generator=generator)
    reference = kernels._skinny_product(x, weight, bias, pairs=0)
    for rows in (1, 2, 3, 4, 14, 15):
        for pairs in (0, 0b111, 0b101):
            out = kernels._skinny_product(x[:rows].contiguous(), weight, bias, pairs=pairs)
            assert torch.equal(out, reference[:rows]), (rows, pairs)
    for i in range(5):
        assert torch.equal(kernels._skinny_product(x[i : i + 1].contiguous(), weight, bias, pairs=1), reference[i : i + 1])


@skinny
def test_one_row_goes_to_the_skinny_kernel_only_where_the_choice_says(monkeypatch):
    import carryover_hf.tools.cpu_kernels as kernels

    linear = _linear(out_features=64, in_features=40)
    packed = PackedLinear.wrap(linear)
    used = []
    original = kernels._skinny_product
    monkeypatch.setattr(kernels, "_skinny_product", lambda x, *a, **k: used.append(x.shape[0]) or original(x, *a, **k))
    threads = torch.get_num_threads()
    use_skinny_choice(SkinnyChoice(one_row=True, two_weight_rows=(False, True, False)))  # the conftest restores it
    try:
        torch.set_num_threads(1)
        x = torch.randn(1, 1, 40)
        with torch.no_grad():
            torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
            off = use_skinny_linear(False)
            torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)  # no kernel: F.linear, not oneDNN
            use_skinny_linear(off)
            use_skinny_choice(SkinnyChoice())
            packed(x)
    finally:
        torch.set_num_threads(threads)
    assert used == [1]
    assert SkinnyChoice(one_row=True, two_weight_rows=(False, True, False)).pairs == 0b010
    assert SkinnyChoice().pairs == 0b111 and packed.kernel_key == f"[{SkinnyChoice().describe()}]"


@skinny
def test_tune_skinny_kernel_times_the_models_weights_and_uses_the_choice():
    import carryover_hf.tools.cpu_kernels as kernels

    model = nn.Sequential(*(nn.Linear(512, 1024, bias=False) for _ in range(4)))  # 8 MB of float32 weights
    threads = torch.get_num_threads()
    try:  # every test starts from the default choice and gets it back (conftest)
        torch.set_num_threads(1)
        assert tune_skinny_kernel(model) is None  # under 64 MB: cache-resident, says nothing; nothing changes
        assert kernels._Skinny.choice == SkinnyChoice()
        choice = tune_skinny_kernel(model, min_bytes=1 << 20, repeats=1)
        assert isinstance(choice, SkinnyChoice) and kernels._Skinny.choice == choice
        assert kernels._Skinny.min_rows == (1 if choice.one_row or choice.panel_from == 1 else 2)
        assert choice.panel_from in (None, *kernels.PANEL_TIMED_ROWS)
        torch.set_num_threads(2)
        assert tune_skinny_kernel(model, min_bytes=1 << 20, repeats=1) is None  # the kernel runs at one thread only
    finally:
        torch.set_num_threads(threads)


def test_skinny_kernel_build_failure_says_why(monkeypatch, tmp_path):
    import carryover_hf.tools.cpu_kernels as kernels

    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("CARRYOVER_HF_CACHE", str(tmp_path))
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("the build is not attempted without AVX2")
    with pytest.raises(RuntimeError, match="building the skinny kernel failed"):
        kernels._build_skinny()
    assert list(tmp_path.iterdir()) == []  # nothing half-written is left behind


panel = pytest.mark.skipif(not panel_linear_available(), reason="no panel kernel here (no C compiler or AVX2)")


@panel
def test_panel_kernel_computes_one_sequential_sum_per_output_whatever_the_rows():
    """Bit for bit: every output is `fma(x[k], w[k], s)` over k in order (the scalar `panel_reference`), whatever the
    rows sharing the call (1-14 in one pass, more in several), the half-panel passes of 7+ rows on 16 registers, the
    columns past the last full panel, and the bias."""
    import carryover_hf.tools.cpu_kernels as kernels

    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(31, 581, generator=generator), torch.randn(37, 581, generator=generator)  # 37: 2 panels + 5
    bias = torch.randn(37, generator=generator)
    panels = pack_panels(weight)
    assert panels.shape == (3, 581, 16) and torch.equal(panels[2, :, 5:], torch.zeros(581, 11))
    for b in (bias, None):
        reference = kernels._panel_product(x, weight, b, 37, function="panel_reference")
        torch.testing.assert_close(reference, torch.nn.functional.linear(x, weight, b), rtol=1e-4, atol=1e-4)
        for rows in (1, 2, 3, 6, 7, 8, 13, 14, 15, 29, 31):
            assert torch.equal(kernels._panel_product(x[:rows].contiguous(), panels, b, 37), reference[:rows]), rows
        for i in range(4):
            assert torch.equal(kernels._panel_product(x[i : i + 1].contiguous(), panels, b, 37), reference[i : i + 1])


@panel
def test_packed_linear_sends_rows_from_the_choices_panel_from_to_the_panel_kernel(monkeypatch):
    import carryover_hf.tools.cpu_kernels as kernels

    linear = _linear(out_features=70, in_features=40)
    packed = PackedLinear.wrap(linear)
    used = []
    original_skinny, original_panel = kernels._skinny_product, kernels._panel_product
    monkeypatch.setattr(kernels, "_skinny_product", lambda x, *a: used.append(("skinny", x.shape[0])) or original_skinny(x, *a))
    monkeypatch.setattr(kernels, "_panel_product", lambda x, *a: used.append(("panel", x.shape[0])) or original_panel(x, *a))
    threads = torch.get_num_threads()
    use_skinny_choice(SkinnyChoice(panel_from=4))  # the conftest restores the default
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            for rows in (1, 3, 4, 12, 13):
                x = torch.randn(1, rows, 40)
                torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
            linear.weight.mul_(2.0)  # the panels are rebuilt for a changed weight
            x = torch.randn(5, 40)
            torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(threads)
    # one row: F.linear; 13 rows: oneDNN (past SKINNY_MAX_ROWS); neither is recorded here
    assert used == [("skinny", 3), ("panel", 4), ("panel", 12), ("panel", 5)]
    assert "panel kernel from 4 rows" in packed.kernel_key
