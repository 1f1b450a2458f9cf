"""The wheel: built from the sources, installed into a fresh virtualenv, and run from a folder outside the checkout.

The fresh environment gets the wheel alone (`--no-deps`); a `.pth` line lists the project environment's
site-packages, so torch and Transformers come from there. A plain path line does not run that folder's own `.pth`
files, so the editable install of the checkout stays out: `carryover_hf` is the wheel's copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from carryover_hf.tools.data import tiny_chat_tokenizer
from carryover_hf.hub.local_cache import add_to_hub_cache
from carryover_hf.tools.testing import tiny_hub_config, tiny_target

REPO = Path(__file__).resolve().parents[1]
SHIPPED_HUB_CONFIGS = sorted(p.stem for p in (REPO / "src/carryover_hf/assets/hub_configs").glob("*.json"))


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder of the fresh environment, environment variables, a working folder outside the checkout)."""
    root = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the sources: a build in place writes build/ into the checkout others work in.
    source = root / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(source), "-w", root],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = root.glob("carryover_hf-*.whl")

    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel]
    installed = subprocess.run(pip, capture_output=True, text=True, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root, {}).stdout
    (Path(purelib.strip()) / "project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(root / "hub-cache"), CARRYOVER_HF_CACHE=str(root / "cache"),
               OMP_NUM_THREADS="1", PATH=f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}")  # fmt: skip
    return env_dir / "bin", env, elsewhere, wheel


def test_wheel_ships_its_data_and_every_command_finds_it_from_any_folder(installed, tmp_path):
    bin_dir, env, cwd, wheel = installed
    carryover = str(bin_dir / "carryover-hf")
    assert wheel.stat().st_size < 6_000_000  # both prompt splits compress to about 2.5 MB

    where = _run([str(bin_dir / "python"), "-c", "import carryover_hf.resources as r; print(r.__file__); "
                  "print(r.checkout_root()); print(r.PROMPT_SUITES_DIR)"], cwd, env)  # fmt: skip
    assert where.returncode == 0, where.stderr[-3000:]
    module, root, suites = where.stdout.split()
    assert Path(module).is_relative_to(bin_dir.parent) and root == "None"
    assert sorted(p.name for p in Path(suites).iterdir()) == ["eval", "manifest.json", "train"]

    listed = _run([carryover, "init", "--list"], cwd, env)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert [line.split()[0] for line in listed.stdout.splitlines()] == SHIPPED_HUB_CONFIGS

    # init for a tiny target in the Hub cache (a hub config file of the format of the shipped ones), then the demo
    # with that drafter on the shipped eval prompts.
    tokenizer = tiny_chat_tokenizer()
    target = tiny_target("llama", vocab_size=len(tokenizer), max_position_embeddings=4096)
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    add_to_hub_cache(tmp_path / "target", "org/tiny-target", cache_dir=env["HF_HUB_CACHE"])
    config_file = tiny_hub_config(tmp_path, target, kind="dflash")
    init = _run([carryover, "init", str(config_file), "drafter", "--target", "org/tiny-target"], cwd, env)
    assert init.returncode == 0, init.stderr[-3000:]
    assert "org/tiny-carryover-dflash" in init.stdout
    files = {p.name for p in (cwd / "drafter").iterdir()}
    assert files == {"config.json", "generation_config.json", "model.safetensors", "README.md"}
    assert "# tiny-carryover-dflash" in (cwd / "drafter" / "README.md").read_text()  # the shipped card template

    demo = _run([carryover, "demo", "--target", "org/tiny-target", "--drafter", "drafter", "--categories", "qa",
                 "code", "--max_new_tokens", "6", "--threads", "1", "--output", "demo.json"], cwd, env)  # fmt: skip
    assert demo.returncode == 0, demo.stderr[-3000:]
    summary = json.loads((cwd / "demo.json").read_text())
    assert [row["category"] for row in summary["prompts"]] == ["qa", "code"] and summary["all_identical"]

    # The shipped SmolLM2 drafters live in the repository, not the wheel: one line says how to get one.
    missing = _run([carryover, "demo", "--target", "org/tiny-target"], cwd, env)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    (line,) = missing.stderr.strip().splitlines()
    assert "carryover-hf/smollm2-135m-carryover-dflash is not in the Hugging Face cache" in line
    assert "drafters/carryover-hf/smollm2-135m-carryover-dflash" in line
