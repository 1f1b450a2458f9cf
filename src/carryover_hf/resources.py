"""Where the data carryover-hf ships lives: the one place that resolves each kind.

Package data, under `carryover_hf/assets/` and read through `importlib.resources`, so that a wheel installed anywhere
finds it as a source checkout does:

* `HUB_CONFIGS_DIR`: ready drafter configs for real targets (`carryover-hf init`), `hub_configs/*.json`;
* `MODEL_CARD_TEMPLATE`: the drafters' model card template, `model_cards/carryover_drafter.md`;
* `PROMPT_SUITES_DIR`: the built prompt suites, `prompts/{train,eval}/<category>.jsonl` and `prompts/manifest.json`;
  `resolve_prompt_suite` turns the names commands accept (`suites`, `eval/code`, ...) into paths.

The rest of the repository (the committed SmolLM2 drafters in `drafters/`, training data under `assets/`, benchmark
results) is not in the wheel; `checkout_root()` finds it when the package runs from its source checkout.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .errors import InputNotFoundError


def package_data(*parts: str) -> Path:
    """A file or folder of the package's data, `carryover_hf/assets/<parts>`.

    pip installs wheels unpacked, so the package's files are plain files on disk; a zipped import (which would need
    `importlib.resources.as_file`) is refused with a message rather than returning a path that does not exist."""
    location = resources.files(__package__).joinpath("assets")
    for part in parts:
        location = location.joinpath(part)
    if not isinstance(location, Path):
        raise RuntimeError(f"carryover-hf reads its data files from disk; it is imported from {location}, an archive.")
    return location


HUB_CONFIGS_DIR = package_data("hub_configs")
MODEL_CARD_TEMPLATE = package_data("model_cards", "carryover_drafter.md")
PROMPT_SUITES_DIR = package_data("prompts")
# Where the repository kept the suites before they moved into the package: commands written with it (docs, recorded
# bench reports) still name the shipped suites, from any working directory.
FORMER_PROMPT_SUITES_DIR = "assets/prompts"


def resolve_prompt_suite(name_or_path: str | Path) -> Path:
    """A JSONL file or suite folder as given, else a name in the shipped suites: `"suites"` (or `"assets/prompts"`,
    their former place in the repository) for the whole folder, `eval/code` or `eval/code.jsonl` for one file."""
    path = Path(name_or_path).expanduser()
    if path.is_file() or path.is_dir():
        return path
    name = str(name_or_path).rstrip("/")
    if name == FORMER_PROMPT_SUITES_DIR or name.startswith(FORMER_PROMPT_SUITES_DIR + "/"):
        name = name[len(FORMER_PROMPT_SUITES_DIR) :].strip("/")
    if name in ("", "suites"):
        return PROMPT_SUITES_DIR
    if not name.startswith(("/", ".", "~")):  # a path that is not there names no shipped file
        for candidate in (PROMPT_SUITES_DIR / name, PROMPT_SUITES_DIR / f"{name}.jsonl"):
            if candidate.is_file() or candidate.is_dir():
                return candidate
    known = sorted(str(p.relative_to(PROMPT_SUITES_DIR).with_suffix("")) for p in PROMPT_SUITES_DIR.glob("*/*.jsonl"))
    raise InputNotFoundError(
        f"No prompt file or suite folder {str(name_or_path)!r}: give a JSONL path, a folder of "
        f"<split>/<category>.jsonl, 'suites' (the shipped suites) or one of their files "
        f"({', '.join(known[:12])}, ...)."
    )


def checkout_root() -> Path | None:
    """The source checkout the package runs from (an editable install of the repository), or None for an installed
    wheel: the folder holding `pyproject.toml` and `src/carryover_hf/`."""
    package = Path(__file__).resolve().parent
    root = package.parents[1]
    if package.parent.name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


def shipped_drafters_dir() -> Path | None:
    """The committed SmolLM2 drafters, `drafters/<org>/<name>` of the source checkout; None outside a checkout."""
    root = checkout_root()
    return root / "drafters" if root is not None and (root / "drafters").is_dir() else None


__all__ = [
    "HUB_CONFIGS_DIR",
    "MODEL_CARD_TEMPLATE",
    "PROMPT_SUITES_DIR",
    "checkout_root",
    "package_data",
    "resolve_prompt_suite",
    "shipped_drafters_dir",
]
