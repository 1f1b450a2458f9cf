"""The generation, sampling and training tests again, on the other end of the supported Transformers range.

The project environment holds one Transformers release (a fresh install takes the newest the range admits); this test
builds a second environment holding the release at the other end (`compatibility.SUPPORTED_TRANSFORMERS`) and runs the
generate hook's and the trainer's tests in it. The second environment is a virtualenv whose `.pth` line lists the
project environment's site-packages, so it shares torch and the rest; pip installs into it only what the other
release needs in another version (Transformers itself, the huggingface-hub it pins). It is kept in `.cache/` (ignored)
and reused while its release is the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import transformers
from packaging.version import Version

from carryover_hf.compatibility import SUPPORTED_TRANSFORMERS

ROOT = Path(__file__).resolve().parents[1]
# The hook's and the trainer's tests: every greedy-equivalence and sampling test, training end to end, and the
# per-round comparison with Transformers' own DFlash path (test_hub_convert.py).
TESTS = ["tests/test_generation_greedy.py", "tests/test_generation_sampling.py", "tests/test_generation_hook.py",
         "tests/test_generation_buffered.py", "tests/test_generation_draft_vocabulary.py",
         "tests/test_generation_round_policy.py", "tests/test_round_policy.py",
         "tests/test_carry_segment.py", "tests/test_training_trainer.py", "tests/test_training_verification.py",
         "tests/test_training_objectives.py", "tests/test_training_offline.py", "tests/test_hub_convert.py"]  # fmt: skip


def _other_end() -> str:
    """A pip requirement for the release at the end of the range the project environment does not hold."""
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_TRANSFORMERS
    installed = Version(transformers.__version__)
    if (installed.major, installed.minor) != (low_major, low_minor):
        return f"transformers=={low_major}.{low_minor}.*"
    return f"transformers>={high_major}.{high_minor - 1},<{high_major}.{high_minor}"


def _environment(requirement: str) -> Path:
    folder = ROOT / ".cache" / ("transformers-env-" + "".join(c if c.isalnum() else "_" for c in requirement))
    python = folder / "bin" / "python"
    # made for this project environment (its `.pth` names that environment's site-packages), else made again
    stamp = requirement + "\n" + sysconfig.get_paths()["purelib"] + "\n"
    if (folder / "ready").is_file() and (folder / "ready").read_text() == stamp:
        return python
    venv.EnvBuilder(with_pip=False, clear=True).create(folder)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    # After the environment's own site-packages: what pip installs there wins over the project's copies.
    (Path(purelib) / "project_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    result = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", requirement],
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    if result.returncode != 0:
        pytest.fail(f"pip could not install {requirement} into {folder}: {result.stderr[-2000:]}")
    (folder / "ready").write_text(stamp)
    return python


def test_hook_and_trainer_tests_pass_on_the_other_end_of_the_range():
    requirement = _other_end()
    python = _environment(requirement)
    version = subprocess.run([str(python), "-c", "import transformers; print(transformers.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert Version(version) != Version(transformers.__version__), (version, requirement)
    env = {key: value for key, value in os.environ.items() if not key.startswith("VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(ROOT / "src")  # the checkout's package (the editable install's hook is not read there)
    result = subprocess.run([str(python), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TESTS],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)  # fmt: skip
    assert result.returncode == 0, f"Transformers {version}:\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-500:]
