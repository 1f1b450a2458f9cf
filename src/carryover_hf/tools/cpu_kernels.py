"""CPU kernels for inference: verifying k tokens at closer to the cost of one step.

Two parts, switched together by the CLIs' `--cpu_kernels` (`apply_cpu_kernels`): packed float32 linears (with a
small C kernel for 2-12 rows) and a grouped-query attention that does not copy the key/value cache for a few query
rows.

**Packed linears.**
A speculative round on CPU pays for one target forward over the k verified rows. With PyTorch's default float32
linear (MKL), a matmul with 2-16 rows streams the weight matrix more than once, so on SmolLM2-135M at one thread a
4-row forward costs about 1.75x a 1-row step, although both are bound by reading the same weights. oneDNN, with
each weight reordered once into its blocked layout, streams it once for a few rows; for a single row MKL's
matrix-vector kernel is the faster of the two. `PackedLinear` therefore runs one row through `F.linear` (a target's
plain decode step is unchanged, bit for bit) and two or more rows through the packed weight; 2 to 12 rows at one
intra-op thread go to the skinny kernel instead (`csrc/skinny_linear.c`: AVX2/FMA, each weight row read once, the
few rows of x against it from L1), compiled with the system's C compiler on first use into
`~/.cache/carryover_hf` (or `$CARRYOVER_HF_CACHE`) and called through ctypes; without a compiler or AVX2 it is
skipped with a warning and oneDNN takes those rows. The panel kernel (`csrc/panel_linear.c`, built the same way)
serves those rows from a second copy of the weight packed into panels of 16 output columns, at about the cost of one
row where the skinny kernel runs out of load slots (on an AMD EPYC 8 rows cost 2.2x one row on the skinny kernel,
1.1x on the panel kernel); `tune_skinny_kernel` times it against the skinny kernel on the machine at hand and sets
the rows it serves (`SkinnyChoice.panel_from`).
`benchmarks/cpu_kernels.py` measures the kernels on the machine at hand (`docs/cpu-kernels.md` has the figures).

`pack_linears(model)` swaps each float32 CPU `nn.Linear` for a `PackedLinear` that shares its parameters (tied
weights stay tied; `state_dict`, `save_pretrained` and `.weight` are unchanged). The packed copies are derived state:
it is rebuilt when the weight changes (optimizer step, `load_state_dict`, `.to()`), dropped by `copy.deepcopy` and
pickling, and skipped, falling back to `F.linear`, for other dtypes or devices and whenever autograd needs the
weight's gradient. They cost one more copy of the weights in memory each (oneDNN's, and the panels where the panel
kernel serves a layer).

**Grouped-query attention over a few rows.** Transformers' `sdpa` attention runs a one-token step of a
grouped-query model on the key/value heads directly, but for two or more query rows with a mask (a verification) it
first copies every key and value head `num_key_value_groups` times (`repeat_kv`), the whole cache, in every layer.
`grouped_query_sdpa` instead folds the query heads of each group into the row dimension, `(b, H, q, d) -> (b, H_kv,
groups * q, d)`, repeats the small `(q, kv)` mask to match, and calls the same `scaled_dot_product_attention` on the
uncopied cache: each query row meets the same keys, values and mask row, so the output is the same up to float32
rounding (bit for bit on SmolLM2-135M at 4 rows; the kernel may block a longer row dimension differently). Everything else (one row, no mask, dropout, per-head masks, position biases) goes
to Transformers' own `sdpa` unchanged. `use_grouped_attention(model)` registers it and switches an `sdpa` model to it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.utils import logging


logger = logging.get_logger(__name__)

# Row count the reorder is tuned for (measured here: 4 makes 2-8 rows cheapest; 1 makes them slower).
PACK_ROWS = 4
# Fewer rows than this go through F.linear unless `tune_skinny_kernel` found the skinny kernel faster at one row on
# this machine: MKL's matrix-vector kernel beats oneDNN's packed one on a single row, and beat the skinny kernel on the
# Intel Xeon it was first measured on (not on the AMD EPYC: docs/cpu-kernels.md).
MIN_PACKED_ROWS = 2
# Up to this many rows the skinny kernel (csrc/skinny_linear.c) runs instead of oneDNN, where it is available and
# torch runs one intra-op thread (the kernel is single-threaded); measured here: faster from 2 to 11 rows.
SKINNY_MAX_ROWS = 12
_SKINNY_SOURCE = Path(str(resources.files(__package__).joinpath("csrc", "skinny_linear.c")))  # package data
_SKINNY_FLAGS = ["-O3", "-mavx2", "-mfma", "-shared", "-fPIC"]
# The panel kernel (csrc/panel_linear.c): the same instructions with 32 vector registers where AVX-512VL gives them.
_PANEL_SOURCE = Path(str(resources.files(__package__).joinpath("csrc", "panel_linear.c")))  # package data
_PANEL_AVX512_FLAGS = ["-mavx512f", "-mavx512vl", "-DPANEL_REGISTERS=32"]
# Output columns per panel of a packed panel weight (PANEL in csrc/panel_linear.c).
PANEL_COLUMNS = 16
# Row counts at which `tune_skinny_kernel` times the panel kernel against the skinny one.
PANEL_TIMED_ROWS = (1, 2, 3, 4, 6, 8, 12)


@dataclass(frozen=True)
class SkinnyChoice:
    """How the skinny kernel runs the fewest rows, a property of the machine (`tune_skinny_kernel` times it).

    `one_row`: a single row goes to the skinny kernel rather than MKL's `F.linear`. `two_weight_rows[m - 1]`: for m =
    1, 2, 3 rows of x, the kernel takes two weight rows per block rather than one. `panel_from`: from this many rows
    up to `SKINNY_MAX_ROWS` the panel kernel (csrc/panel_linear.c) runs instead of the skinny one (None: never). The
    default is what an Intel Xeon measured best (docs/cpu-kernels.md). Whatever the choice, each output is the same
    sum in the same order for every row count a kernel serves."""

    one_row: bool = False
    two_weight_rows: tuple[bool, bool, bool] = (True, True, True)
    panel_from: int | None = None

    @property
    def pairs(self) -> int:
        """The kernel's `pairs` argument: bit m - 1 set where m rows take two weight rows per block."""
        return sum(1 << i for i, two in enumerate(self.two_weight_rows) if two)

    def describe(self) -> str:
        rows = ",".join("2" if two else "1" for two in self.two_weight_rows)
        text = f"one row on {'skinny' if self.one_row else 'F.linear'}; weight rows per block for 1-3 rows: {rows}"
        return text if self.panel_from is None else f"{text}; panel kernel from {self.panel_from} rows"


class _Skinny:
    """The skinny kernel's shared library (built on first use into a cache folder, then loaded from there) and how
    it runs the fewest rows on this machine (`SkinnyChoice`, set by `use_skinny_choice` / `tune_skinny_kernel`)."""

    library: ctypes.CDLL | None = None
    reason: str | None = None  # why it is unavailable, once tried
    tried = False
    enabled = True
    choice = SkinnyChoice()
    min_rows = MIN_PACKED_ROWS  # rows below this go to F.linear: 1 where the choice sends one row to the kernel


def _build_library(name: str, source_path: Path, flags: list[str]) -> ctypes.CDLL:
    """Compile (once per source and flags, into the cache folder) and load one of the CPU kernels (`name`: what error
    messages call it)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise RuntimeError(f"the {name} is written for x86-64 (this is {platform.machine()})")
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        raise RuntimeError(f"the {name} needs AVX2 and FMA (this CPU: {torch.backends.cpu.get_cpu_capability()})")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError(f"no C compiler (cc or gcc) to build the {name}")
    source = Path(source_path).read_bytes()
    key = hashlib.sha256(source + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("CARRYOVER_HF_CACHE", Path.home() / ".cache" / "carryover_hf"))
    path = cache / f"{Path(source_path).stem}-{key}.so"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as scratch:
            built = Path(scratch) / path.name
            result = subprocess.run([compiler, *flags, str(source_path), "-o", str(built)], capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"building the {name} failed: {result.stderr.strip()[-500:]}")
            os.replace(built, path)  # atomic: concurrent processes see a whole library or none
    return ctypes.CDLL(str(path))


def _build_skinny(source_path: Path = _SKINNY_SOURCE) -> ctypes.CDLL:
    """Compile (once per source and flags) and load a skinny kernel; `source_path` other than the shipped one is for
    benchmarks that compare kernel versions (benchmarks/cpu_kernels.py --skinny_baseline)."""
    library = _build_library("skinny kernel", source_path, _SKINNY_FLAGS)
    library.skinny_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
    library.skinny_linear.restype = None
    return library


def _build_panel(source_path: Path = _PANEL_SOURCE) -> ctypes.CDLL:
    """Compile and load the panel kernel: with 32 vector registers where the CPU has AVX-512 (the same results)."""
    wide = torch.backends.cpu.get_cpu_capability() == "AVX512"
    library = _build_library("panel kernel", source_path, _SKINNY_FLAGS + (_PANEL_AVX512_FLAGS if wide else []))
    for function, pointers, integers in (("panel_linear", 4, 3), ("panel_reference", 4, 3), ("pack_panels", 2, 2)):
        getattr(library, function).argtypes = [ctypes.c_void_p] * pointers + [ctypes.c_int64] * integers
        getattr(library, function).restype = None
    return library


def skinny_linear_available() -> bool:
    """Whether the skinny kernel can run here (built on the first call: about a second with a C compiler).

    Unavailable without x86-64 AVX2/FMA or a C compiler; `skinny_linear_unavailable_reason()` says why, and packed
    layers then use oneDNN for every row count."""
    return _load_once(_Skinny, _build_skinny, "packed linears use oneDNN for every row count.") and _Skinny.enabled


def _load_once(kernel: type, build: Callable[[], ctypes.CDLL], fallback: str) -> bool:
    """Builds `kernel`'s library (`_Skinny`, `_Panel`) on the first call, or records why it cannot be and says so once
    with what runs instead (`fallback`); whether it is loaded."""
    if not kernel.tried:
        kernel.tried = True
        try:
            kernel.library = build()
        except (OSError, RuntimeError) as error:
            kernel.reason = str(error)
            logger.warning_once(f"carryover_hf.tools.cpu_kernels: {error}; {fallback}")
    return kernel.library is not None


class _Panel:
    """The panel kernel's shared library (built on first use, like the skinny kernel's)."""

    library: ctypes.CDLL | None = None
    reason: str | None = None
    tried = False


def panel_linear_available() -> bool:
    """Whether the panel kernel can run here (built on the first call; the same needs as the skinny kernel's)."""
    return _load_once(_Panel, _build_panel, "the skinny kernel serves every row count.") and _Skinny.enabled


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """A contiguous float32 CPU weight `(N, K)` packed for the panel kernel: `(ceil(N / 16), K, 16)`, zero past N."""
    if not panel_linear_available():
        raise RuntimeError(f"the panel kernel is unavailable: {_Panel.reason or 'turned off'}")
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2 or not weight.is_contiguous():
        raise ValueError(f"pack_panels needs a contiguous 2-D float32 CPU weight, got {tuple(weight.shape)} {weight.dtype}")
    rows, width = weight.shape
    panels = torch.empty(-(-rows // PANEL_COLUMNS), width, PANEL_COLUMNS, dtype=torch.float32)  # 64-byte aligned
    _Panel.library.pack_panels(weight.data_ptr(), panels.data_ptr(), rows, width)
    return panels


def _panel_product(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, out_features: int,
                   function: str = "panel_linear") -> torch.Tensor:  # fmt: skip
    """The panel kernel's call for checked contiguous float32 CPU tensors: x `(M, K)` and `pack_panels`' result
    (`function="panel_reference"` takes the plain weight instead and computes the same sums one by one)."""
    out = torch.empty(x.shape[0], out_features, dtype=torch.float32)
    getattr(_Panel.library, function)(
        x.data_ptr(), panels.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
        x.shape[0], out_features, x.shape[1],
    )  # fmt: skip
    return out


def skinny_linear_unavailable_reason() -> str | None:
    skinny_linear_available()
    return None if _Skinny.library is not None else _Skinny.reason


def use_skinny_linear(enabled: bool) -> bool:
    """Turn the skinny kernel on or off for every packed layer (benchmarks compare both); returns the last setting."""
    previous, _Skinny.enabled = _Skinny.enabled, bool(enabled)
    return previous


def use_skinny_choice(choice: SkinnyChoice) -> SkinnyChoice:
    """Run the fewest rows as `choice` says from now on (every packed layer); returns the previous choice."""
    previous, _Skinny.choice = _Skinny.choice, choice
    _Skinny.min_rows = 1 if choice.one_row or choice.panel_from == 1 else MIN_PACKED_ROWS
    return previous


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for contiguous float32 CPU tensors, x `(M, K)`, on the skinny kernel."""
    if not skinny_linear_available():
        raise RuntimeError(f"the skinny kernel is unavailable: {_Skinny.reason or 'turned off'}")
    rows, width = x.shape
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if weight.shape[1] != width or any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
        raise ValueError(
            f"skinny_linear needs float32 CPU tensors with matching widths: x {tuple(x.shape)} {x.dtype} {x.device}, "
            f"weight {tuple(weight.shape)} {weight.dtype} {weight.device}"
        )
    if not (x.is_contiguous() and weight.is_contiguous() and (bias is None or bias.is_contiguous())):
        raise ValueError("skinny_linear: contiguous tensors only")
    return _skinny_product(x, weight, bias)


def _skinny_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pairs: int | None = None) -> torch.Tensor:
    """The kernel call itself, for callers that have checked what `skinny_linear` checks (`PackedLinear.forward`);
    `pairs` (the kernel's argument, `SkinnyChoice.pairs`) defaults to the current choice's."""
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    _Skinny.library.skinny_linear(
        x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
        x.shape[0], weight.shape[0], x.shape[1], _Skinny.choice.pairs if pairs is None else pairs,
    )  # fmt: skip
    return out


def tune_skinny_kernel(
    model: nn.Module, budget_bytes: int = 256 << 20, min_bytes: int = 64 << 20, repeats: int = 5, margin: float = 0.03
) -> SkinnyChoice | None:
    """Time how few rows run fastest on this machine, over the model's own float32 weights, and use it.

    For each row count the candidates (one row: MKL's `F.linear`, the skinny kernel with one or two weight rows per
    block; 2-3 rows: the kernel with one or two) take turns streaming the same weights (up to `budget_bytes` of the
    model's linears, so that they come from memory as in a forward, not from cache), `repeats` times each; the
    fastest median wins where it beats the default (`SkinnyChoice()`) by more than `margin`. Then the panel kernel
    takes turns with the skinny kernel so chosen at `PANEL_TIMED_ROWS`: it serves every row count from the fewest
    rows at which it wins by more than `margin` there and at every larger count timed (`panel_from`). About 2 seconds
    on SmolLM2-135M. Returns the choice now in use, or None (nothing changed) where the kernel cannot run here, torch
    runs more than one intra-op thread (the kernel is single-threaded) or the model has under `min_bytes` of
    weights to time (a weight that fits in cache says nothing about a forward)."""
    if not skinny_linear_available() or torch.get_num_threads() != 1:
        return None
    weights, seen, total = [], set(), 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, nn.Linear) or weight is None or weight.data_ptr() in seen:
            continue
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or not weight.is_contiguous():
            continue
        seen.add(weight.data_ptr())
        weights.append(weight.detach())
        total += weight.numel() * 4
        if total >= budget_bytes:
            break
    if total < min_bytes:
        return None
    generator = torch.Generator().manual_seed(0)

    panels = [pack_panels(w) for w in weights] if panel_linear_available() else None
    inputs = {w.shape[1]: torch.randn(max(PANEL_TIMED_ROWS), w.shape[1], generator=generator) for w in weights}

    def sweep(rows: int, candidate: str, pairs: int = 0) -> float:
        start = time.perf_counter()
        for i, weight in enumerate(weights):
            x = inputs[weight.shape[1]][:rows]
            if candidate == "F.linear":
                F.linear(x, weight)
            elif candidate == "panel":
                _panel_product(x, panels[i], None, weight.shape[0])
            else:
                _skinny_product(x, weight, None, pairs=(1 << (rows - 1)) if candidate == "two" else pairs)
        return time.perf_counter() - start

    def medians(rows: int, candidates: list[str], pairs: int = 0) -> dict[str, float]:
        times = {c: [] for c in candidates}
        for turn in range(repeats + 1):  # the first turn warms up
            for candidate in candidates if turn % 2 == 0 else candidates[::-1]:
                elapsed = sweep(rows, candidate, pairs)
                if turn:
                    times[candidate].append(elapsed)
        return {c: sorted(t)[len(t) // 2] for c, t in times.items()}

    default = SkinnyChoice()
    best: dict[int, str] = {}
    with torch.no_grad():
        for rows in (1, 2, 3):
            median = medians(rows, (["F.linear"] if rows == 1 else []) + ["two", "one"])
            usual = "F.linear" if rows == 1 and not default.one_row else ("two" if default.two_weight_rows[rows - 1] else "one")
            fastest = min(median, key=median.get)
            best[rows] = fastest if median[fastest] < (1 - margin) * median[usual] else usual
        choice = SkinnyChoice(
            one_row=best[1] != "F.linear",
            two_weight_rows=(best[1] == "two" if best[1] != "F.linear" else default.two_weight_rows[0], best[2] == "two", best[3] == "two"),
        )  # fmt: skip
        panel_from = None
        for rows in sorted(PANEL_TIMED_ROWS, reverse=True) if panels is not None else ():
            usual = "F.linear" if rows == 1 and not choice.one_row else "skinny"  # what serves these rows so far
            median = medians(rows, [usual, "panel"], pairs=choice.pairs)
            if median["panel"] >= (1 - margin) * median[usual]:
                break
            panel_from = rows
    choice = dataclasses.replace(choice, panel_from=panel_from)
    use_skinny_choice(choice)
    logger.info(f"carryover_hf.tools.cpu_kernels: timed on {total >> 20} MB of weights: {choice.describe()}")
    return choice


def packed_linears_available() -> bool:
    """Whether this PyTorch build has the oneDNN packed linear (CPU builds with MKL-DNN)."""
    mkldnn = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
    )


class PackedLinear(nn.Linear):
    """An `nn.Linear` whose float32 CPU inference over two or more rows runs on a weight packed once for oneDNN.

    Made with `PackedLinear.wrap(linear)`; shares `linear.weight` and `linear.bias`.
    """

    # Not packed yet (class defaults, so every way of making a layer starts from them; `packed_weight` sets both).
    _packed: torch.Tensor | None = None
    _packed_key: tuple | None = None  # (data_ptr, version) of the weight the pack was made from
    _panels: torch.Tensor | None = None  # the weight packed for the panel kernel, made on its first use
    _panels_key: tuple | None = None

    @classmethod
    def wrap(cls, linear: nn.Linear) -> "PackedLinear":
        return _holding(cls, linear.weight, linear.bias, linear.training)

    @classmethod
    def over(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "PackedLinear":
        """A packed layer computing `F.linear(x, weight, bias)` with these tensors (not copies; e.g. a drafter's
        gathered draft-vocabulary rows of the target's LM head), packed now."""
        layer = _holding(cls, weight, bias, training=False)
        if packed_linears_available():
            layer.packed_weight()
        return layer

    def unwrap(self) -> nn.Linear:
        """A plain `nn.Linear` sharing this layer's parameters."""
        return _holding(nn.Linear, self.weight, self.bias, self.training)

    def __getstate__(self) -> dict:
        # The opaque oneDNN tensor cannot be copied or pickled; copies repack on their first call.
        state = self.__dict__.copy()
        state["_packed"], state["_packed_key"] = None, None
        state["_panels"], state["_panels_key"] = None, None  # a copy of the weight: copies make their own
        return state

    def _usable(self, x: torch.Tensor) -> bool:
        weight = self.weight
        if x.dtype != torch.float32 or weight.dtype != torch.float32:
            return False
        if x.device.type != "cpu" or weight.device.type != "cpu":
            return False
        needs_grad = weight.requires_grad or x.requires_grad or (self.bias is not None and self.bias.requires_grad)
        return not (torch.is_grad_enabled() and needs_grad)

    def packed_weight(self) -> torch.Tensor:
        """The packed weight, rebuilt if the weight was replaced or changed in place since it was made."""
        key = (self.weight.data_ptr(), self.weight._version)
        if self._packed_key != key:
            with torch.no_grad():
                self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_ROWS)
            self._packed_key = key
        return self._packed

    def panel_weight(self) -> torch.Tensor:
        """The weight packed for the panel kernel (`pack_panels`), rebuilt as `packed_weight` is."""
        key = (self.weight.data_ptr(), self.weight._version)
        if self._panels_key != key:
            self._panels = pack_panels(self.weight.detach())
            self._panels_key = key
        return self._panels

    @property
    def kernel_key(self) -> str:
        """What, besides the class, decides this layer's speed by row count (the machine's `SkinnyChoice`): part of
        the key under which the round policy caches a target's verification-cost curve."""
        return f"[{_Skinny.choice.describe()}]"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The one-row test comes first and alone: a decode step pays it 200 times per forward.
        if x.numel() < _Skinny.min_rows * self.in_features or not self._usable(x):
            return F.linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.detach()
        rows = x.numel() // self.in_features
        if (
            rows <= SKINNY_MAX_ROWS
            and torch.get_num_threads() == 1
            and self.weight.is_contiguous()
            and (bias is None or bias.is_contiguous())
            and skinny_linear_available()
        ):  # `_usable` has checked float32 on CPU: what `skinny_linear` would check again
            flat = x.reshape(rows, self.in_features).contiguous()
            panel_from = _Skinny.choice.panel_from
            if panel_from is not None and rows >= panel_from and panel_linear_available():
                out = _panel_product(flat, self.panel_weight(), bias, self.out_features)
            else:
                out = _skinny_product(flat, self.weight.detach(), bias)
            return out.view(*x.shape[:-1], self.out_features)
        if rows == 1:  # chosen for the skinny kernel, which cannot run now: MKL beats oneDNN at one row
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight(), bias, "none", [], "")


def _holding(cls: type[nn.Linear], weight: torch.Tensor, bias: torch.Tensor | None, training: bool) -> nn.Linear:
    """A `cls` layer holding these weight and bias tensors themselves (not copies; parameters stay parameters)."""
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    layer.out_features, layer.in_features = weight.shape
    layer.weight, layer.bias = weight, bias
    layer.train(training)
    return layer


def _swap(model: nn.Module, wanted: Callable[[nn.Module], bool], make: Callable[[nn.Module], nn.Module]) -> int:
    count = 0
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if wanted(child):
                setattr(parent, name, make(child))
                count += 1
    return count


def pack_linears(model: nn.Module) -> int:
    """Swap every float32 CPU `nn.Linear` of `model` for a `PackedLinear` and pack it now; returns how many.

    Meant for inference on CPU (targets and drafters alike). Layers already packed, on other devices or in other
    dtypes are left as they are.
    """
    if not packed_linears_available():
        raise RuntimeError(
            "this PyTorch build has no oneDNN packed linear (torch.backends.mkldnn is unavailable); "
            "run without packed linears"
        )

    def wanted(module: nn.Module) -> bool:
        return (
            type(module) is nn.Linear and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu"
        )

    def make(linear: nn.Linear) -> PackedLinear:
        packed = PackedLinear.wrap(linear)
        packed.packed_weight()
        return packed

    return _swap(model, wanted, make)


def unpack_linears(model: nn.Module) -> int:
    """Undo `pack_linears`: plain `nn.Linear` layers sharing the same parameters; returns how many."""
    return _swap(model, lambda module: isinstance(module, PackedLinear), PackedLinear.unwrap)


# Name under which `grouped_query_sdpa` is registered with Transformers' attention and mask interfaces.
GROUPED_ATTENTION = "carryover_grouped_sdpa"


def grouped_query_sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Transformers' `sdpa` attention, with grouped-query heads folded into rows for a few masked query rows.

    query (`(b, H, q, d)`), key / value (`(b, H_kv, kv, d)`), attention_mask (`(b, 1, q, kv)`): the signature of an
    entry of `ALL_ATTENTION_FUNCTIONS`. Returns `((b, q, H, d), None)` as `sdpa_attention_forward` does.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, rows, dim = query.shape
    plain = (
        groups == 1
        or rows == 1
        or attention_mask is None
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1
        or dropout
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("cache") is not None
        or key.shape[1] * groups != heads
    )
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    # Query head h = j * groups + r reads key/value head j: its rows go to row r * q + i of head j.
    query = query.reshape(batch, heads // groups, groups * rows, dim)
    mask = attention_mask.expand(batch, 1, rows, attention_mask.shape[-1]).repeat(1, 1, groups, 1)
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return output.reshape(batch, heads, rows, dim).transpose(1, 2).contiguous(), None


def register_grouped_attention() -> str:
    """Register `grouped_query_sdpa` (with `sdpa`'s mask) with Transformers as `GROUPED_ATTENTION`; returns the name.

    Done when a model is switched to it (`use_grouped_attention`), not on import: importing carryover_hf registers
    no attention. Call it before `set_attn_implementation(GROUPED_ATTENTION)` by hand. Registering again is harmless.
    """
    AttentionInterface.register(GROUPED_ATTENTION, grouped_query_sdpa)
    AttentionMaskInterface.register(GROUPED_ATTENTION, sdpa_mask)
    return GROUPED_ATTENTION


def use_grouped_attention(model: nn.Module) -> bool:
    """Switch a model on Transformers' `sdpa` attention to `grouped_query_sdpa`; True if it was switched.

    Models on other attention implementations (or without grouped-query heads' `set_attn_implementation`) are left
    as they are. `model.set_attn_implementation("sdpa")` switches back.
    """
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(register_grouped_attention())
    return True


def apply_cpu_kernels(target: nn.Module, *drafters: nn.Module, tune: bool = True) -> dict:
    """Everything `--cpu_kernels on` does: packed linears for the target and the drafters, grouped-query attention
    for the target (a drafter's attention is its own), and with `tune` the skinny kernel's way with 1-3 rows timed
    on the target's weights (`tune_skinny_kernel`). Returns what was switched, for reports."""
    linears = pack_linears(target) + sum(pack_linears(drafter) for drafter in drafters)
    switched = {"packed_linears": linears, "grouped_attention": use_grouped_attention(target)}
    tuned = tune_skinny_kernel(target) if tune else None
    switched["skinny_choice"] = tuned.describe() if tuned is not None else None
    return switched


def resolve_cpu_kernels(choice: str, dtype: torch.dtype, device: torch.device | str) -> bool:
    """The CLIs' `--cpu_kernels auto|on|off`: `auto` applies them to float32 models on CPU when oneDNN is there."""
    if choice not in ("auto", "on", "off"):
        raise ValueError(f"--cpu_kernels must be 'auto', 'on' or 'off', got {choice!r}")
    usable = torch.device(device).type == "cpu" and dtype == torch.float32
    if choice == "on":
        if not usable:
            raise ValueError(f"--cpu_kernels on needs float32 on CPU (got {dtype} on {device}); use auto or off")
        if not packed_linears_available():
            raise ValueError("--cpu_kernels on: this PyTorch build has no oneDNN packed linear; use auto or off")
        return True
    return choice == "auto" and usable and packed_linears_available()


__all__ = [
    "GROUPED_ATTENTION",
    "MIN_PACKED_ROWS",
    "PACK_ROWS",
    "PackedLinear",
    "apply_cpu_kernels",
    "grouped_query_sdpa",
    "pack_linears",
    "packed_linears_available",
    "register_grouped_attention",
    "resolve_cpu_kernels",
    "SKINNY_MAX_ROWS",
    "SkinnyChoice",
    "skinny_linear",
    "skinny_linear_available",
    "skinny_linear_unavailable_reason",
    "tune_skinny_kernel",
    "unpack_linears",
    "use_grouped_attention",
    "use_skinny_choice",
    "use_skinny_linear",
]
