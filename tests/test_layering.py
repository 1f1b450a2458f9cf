"""One core, tools around it: what the core may import, and what importing the package does.

The core (the configuration, the model, the generate hook, target features, compatibility checks, training and the
Hub artifacts, with every package module they import) imports no tool: not the benchmark, the offline data, the demo,
the test fixtures or the CPU kernels. The model does not import the trainer. Imports are read with `ast` from the
source, at module level and inside functions alike, and followed through the package's own modules.
"""

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import carryover_hf


PACKAGE = "carryover_hf"
ROOT = Path(carryover_hf.__file__).parent

# The core's entry points; what they import inside the package is core too and is read the same way.
CORE = (
    "carryover_hf.configuration_carryover",
    "carryover_hf.modeling_carryover",
    "carryover_hf.generation",
    "carryover_hf.features",
    "carryover_hf.compatibility",
    "carryover_hf.training",
    "carryover_hf.hub",
)
TOOLS = ("carryover_hf.tools",)  # the benchmark, the offline data, the demo, the CLI, the test fixtures, the CPU kernels
# The inference side: it runs without the trainer.
MODEL = (
    "carryover_hf.configuration_carryover",
    "carryover_hf.modeling_carryover",
    "carryover_hf.generation",
    "carryover_hf.features",
    "carryover_hf.compatibility",
    "carryover_hf.masks",
)


def _path(module: str) -> Path:
    parts = module.split(".")[1:]
    folder = ROOT.joinpath(*parts)
    return folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")


def _is_package(module: str) -> bool:
    return _path(module).name == "__init__.py"


def _within(module: str, prefixes) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def _imports(module: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a package module in `module`'s source."""
    path = _path(module)
    base = module if _is_package(module) else module.rpartition(".")[0]
    return [(line, name) for line, name in _imported_names(path.read_text(), base)
            if name == PACKAGE or (_within(name, (PACKAGE,)) and _path(name).exists())]  # fmt: skip


def _absolute(name: str, level: int, base: str) -> str:
    """`name` imported `level` dots up from the package `base` (level 0: absolute)."""
    if not level:
        return name
    parent = base.rsplit(".", level - 1)[0]
    return f"{parent}.{name}" if name else parent


def _imported_names(source: str, base: str) -> list[tuple[int, str]]:
    """(line, name) of every import in `source`, read anywhere in the file (module level, functions, branches):
    `import x`, `from x import y` (y as `x.y` too: it may be a submodule), relative to the package `base`, and
    `importlib.import_module` with a literal name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node.module or "", node.level, base)
            names = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module":
            literal = node.args[0] if node.args else None
            if isinstance(literal, ast.Constant) and isinstance(literal.value, str):
                name = literal.value.lstrip(".")
                names = [_absolute(name, len(literal.value) - len(name), base)]
        found += [(node.lineno, name) for name in names]
    return found


def _reach(entry_points) -> dict[str, list[str]]:
    """Every package module the entry points reach through imports (not through the package root, which only
    registers the Auto classes and the hook), with the chain that reaches it."""
    chains = {module: [module] for module in entry_points}
    todo = list(entry_points)
    for module in entry_points:  # a package's modules are part of it
        if _is_package(module):
            for path in sorted(_path(module).parent.rglob("*.py")):
                name = ".".join((PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
                chains.setdefault(name, [module, name])
                todo.append(name)
    while todo:
        module = todo.pop()
        for line, imported in _imports(module):
            if imported == PACKAGE or imported in chains:
                continue
            chains[imported] = chains[module] + [f"{imported} (line {line} of {module})"]
            if not _within(imported, TOOLS):
                todo.append(imported)
    return chains


def test_the_core_imports_no_tool():
    reached = _reach(CORE)
    offending = {module: chain for module, chain in reached.items() if _within(module, TOOLS)}
    assert not offending, "the core imports tools:\n" + "\n".join(" -> ".join(chain) for chain in offending.values())


def test_the_model_does_not_import_the_trainer():
    reached = _reach(MODEL)
    offending = {module: chain for module, chain in reached.items() if _within(module, (f"{PACKAGE}.training",))}
    assert not offending, "the model imports training:\n" + "\n".join(" -> ".join(c) for c in offending.values())


def test_the_import_reader_sees_every_kind_of_import():
    """What the tests above stand on: an import inside a function or a branch counts, relative imports resolve."""
    source = (
        "import carryover_hf.tools.bench\n"
        "from ..tools import testing\n"
        "def run():\n"
        "    if True:\n"
        "        from ..tools.cpu_kernels import apply_cpu_kernels\n"
        "    from .cli import main\n"
        "    importlib.import_module('..tools.data', __name__)\n"
        "    importlib.import_module('carryover_hf.tools.demo')\n"
    )
    names = {name for _, name in _imported_names(source, "carryover_hf.training")}
    assert {"carryover_hf.tools.bench", "carryover_hf.tools.testing", "carryover_hf.tools.cpu_kernels", "carryover_hf.training.cli",
            "carryover_hf.tools.data", "carryover_hf.tools.demo"} <= names  # fmt: skip
    assert all(_path(module).is_file() for module in CORE + MODEL + TOOLS)  # no entry point renamed away


# The package's top level, as the folder layout should show it: the core's modules, training, the Hub artifacts, the
# tools around them, the real targets and the package data.
TOP_LEVEL = {
    "__init__.py", "__main__.py", "py.typed", "compatibility.py", "configuration_carryover.py", "errors.py",
    "features.py", "generation.py", "masks.py", "modeling_carryover.py", "regenerated.py", "resources.py",
    "round_policy.py", "suffix_cache.py", "targets.py", "utils.py", "assets", "hub", "integrations", "tools", "training",
}  # fmt: skip


def test_the_top_level_holds_the_core_and_one_folder_per_concern():
    present = {p.name for p in ROOT.iterdir() if p.name != "__pycache__"}
    assert present == TOP_LEVEL, f"unexpected: {sorted(present - TOP_LEVEL)}, missing: {sorted(TOP_LEVEL - present)}"
    assert not set(CORE) & {f"{PACKAGE}.{p.removesuffix('.py')}" for p in ("tools",)}
    reached = _reach(["carryover_hf.tools"])  # the tools reach the core, never the other way round (test above)
    assert "carryover_hf.generation" in reached


def _in_a_fresh_python(script: str) -> str:
    """What `script` prints, run by a new interpreter (one that has imported nothing of the package yet)."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


REGISTRIES = """
    import json
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def registered():
        return sorted(ALL_ATTENTION_FUNCTIONS.valid_keys()), sorted(ALL_MASK_ATTENTION_FUNCTIONS.valid_keys())
"""


def test_importing_the_package_registers_no_attention():
    """`import carryover_hf` registers the Auto classes and the generate hook, and no attention function or mask:
    the CPU kernels' grouped-query attention is registered when it is applied (`apply_cpu_kernels`)."""
    printed = _in_a_fresh_python(REGISTRIES + """
    import sys
    before = registered()
    import carryover_hf
    print(json.dumps([before, registered(), "carryover_hf.tools.cpu_kernels" in sys.modules]))
    """)  # fmt: skip
    before, after, kernels_loaded = json.loads(printed.strip().splitlines()[-1])
    assert after == before
    assert not kernels_loaded


def test_applying_the_cpu_kernels_registers_their_attention():
    from carryover_hf.tools.cpu_kernels import packed_linears_available

    if not packed_linears_available():
        pytest.skip("this PyTorch build has no oneDNN")
    _in_a_fresh_python(REGISTRIES + """
    from carryover_hf.tools.cpu_kernels import GROUPED_ATTENTION, apply_cpu_kernels
    from carryover_hf.tools.tiny import tiny_drafter, tiny_target

    assert all(GROUPED_ATTENTION not in names for names in registered())
    target = tiny_target("qwen3", vocab_size=32)
    assert apply_cpu_kernels(target, tiny_drafter(target))["grouped_attention"]
    assert all(GROUPED_ATTENTION in names for names in registered())
    assert target.config._attn_implementation == GROUPED_ATTENTION
    """)  # fmt: skip
