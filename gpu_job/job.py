"""The GPU job: one time-boxed run per device-tool call, each stage writing its result as soon as it is done.

    call 1  keep_part1, environment, cuda_checks, round_profile          (needs no target)
    call 2  target, convert, regenerate, train_dflash, train_markov, bf16_divergence, curves, pack
    call 3  hand back the bundle parts call 2 could not return (the 64 MiB / 8-file limit of one call); repeatable

Every stage gets at most what is left of the call's budget minus what the later must-run stages need (`RESERVE`), so
there is always time to pack. The state lives in `--work` (on the device machine: kept while it stays warm), so an
interrupted call run again skips what is done, and the SmolLM2 recipe (`examples/smollm2_135m/gpu.sh`) resumes its
own stages (regeneration chunk by chunk, training from its last checkpoint). `--rehearsal` runs the same stages on the
CPU with tiny stand-ins (tests/test_gpu_job.py). docs/gpu.md gives the procedure around it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from travel import sha256  # noqa: E402  (the one checksum of parts and wholes)

MIB = 1 << 20
# What comes back from one call ($OUT): the device tool's limits.
RETURN_FILES, RETURN_FILE_BYTES, RETURN_TOTAL_BYTES, RETURN_DEPTH = 8, 16 * MIB, 64 * MIB, 2
RETURN_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
PART_BYTES = 15 * MIB  # a bundle part, under the 16 MiB a file
# Exit codes a caller can act on (docs/gpu.md).
EXIT_MISSING_PART, EXIT_BAD_CHECKSUM = 3, 4
KINDS = ("dflash", "markov")
# Seconds a stage keeps back for the stages after it that must run (packing above all).
RESERVE = {"pack": 25, "bf16_divergence": 40, "curves": 10}
# How the training time of one drafter kind is shared by its stages (fractions of the kind's share).
TRAIN_SHARES = {"features": 0.2, "baseline": 0.45, "carryover": 0.2, "continued": 0.15}
LEASE = "smollm2-135m-gpu"  # names of what the job brings back (results folder, drafters' repo prefix, data)


class StageError(RuntimeError):
    """A stage could not do its work; the message says why (recorded, and the job goes on where it can)."""


def return_problems(out: Path) -> list[str]:
    """What in `out` would not come back from a call (count, size, depth, names); empty when all of it would."""
    problems, files, total = [], [], 0
    for path in sorted(out.rglob("*")):
        relative = path.relative_to(out)
        if any(not RETURN_NAME.match(part) for part in relative.parts):
            problems.append(f"{relative}: a name outside letters, digits, '.', '_', '-'")
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            problems.append(f"{relative}: not a plain file or folder")
        elif path.is_file():
            files.append(relative)
            total += path.stat().st_size
            if len(relative.parts) - 1 > RETURN_DEPTH:
                problems.append(f"{relative}: more than {RETURN_DEPTH} folders down")
            if path.stat().st_size > RETURN_FILE_BYTES:
                problems.append(f"{relative}: {path.stat().st_size / MIB:.1f} MiB, over {RETURN_FILE_BYTES // MIB} MiB")
    if len(files) > RETURN_FILES:
        problems.append(f"{len(files)} files, over {RETURN_FILES}")
    if total > RETURN_TOTAL_BYTES:
        problems.append(f"{total / MIB:.1f} MiB in all, over {RETURN_TOTAL_BYTES // MIB} MiB")
    return problems


class Job:
    def __init__(self, call: int, budget: float, out: Path, work: Path, staging: Path, rehearsal: bool):
        self.call, self.out, self.work, self.staging, self.rehearsal = call, out, work, staging, rehearsal
        self.deadline = time.monotonic() + budget
        self.device = "cpu" if rehearsal else "cuda"
        work.mkdir(parents=True, exist_ok=True)
        out.mkdir(parents=True, exist_ok=True)
        if rehearsal:  # the tiny stand-in target lives in this Hub cache (read when huggingface_hub is imported)
            os.environ["HF_HUB_CACHE"] = str(work / "hub")
        if (work / "site-target").is_dir():  # the target's package, installed by an earlier call 2
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(work / "site-target"), os.environ.get("PYTHONPATH")]))
            sys.path.insert(0, str(work / "site-target"))
        self.state_path = work / "state.json"
        self.state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {"stages": {}}
        self.runs = work / "runs"
        self.exports = work / "export"

    # -- bookkeeping -------------------------------------------------------------------------------------------------
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        text = json.dumps(self.state, indent=2, default=str) + "\n"
        self.state_path.write_text(text)
        (self.out / f"summary-call{self.call}.json").write_text(text)

    def stage(self, name: str, function, reserve: float = 0.0, cap: float | None = None, minimum: float = 5.0):
        """Runs `function(seconds)` unless it is done; records its result, seconds and outcome at once."""
        record = self.state["stages"].get(name, {})
        if record.get("status") == "done":
            print(f"== {name}: done in an earlier run, skipped")
            return record.get("result")
        seconds = self.left() - reserve
        if cap is not None:
            seconds = min(seconds, cap)
        if seconds < minimum:
            self.state["stages"][name] = {**record, "status": "skipped", "why": f"{seconds:.0f} s left for it"}
            self.save()
            print(f"== {name}: skipped, {seconds:.0f} s left for it")
            return None
        print(f"== {name} ({seconds:.0f} s at most, {time.strftime('%H:%M:%S')})", flush=True)
        started = time.monotonic()
        try:
            result = function(seconds)
            status = "incomplete" if isinstance(result, dict) and result.get("incomplete") else "done"
            why = None
        except StageError as error:
            result, status, why = None, "failed", str(error)
            print(f"== {name} failed: {error}", flush=True)
        self.state["stages"][name] = {"status": status, "seconds": round(time.monotonic() - started, 1),
                                      "result": result, **({"why": why} if why else {})}
        self.save()
        return result

    def write(self, name: str, data) -> None:
        """A result file into $OUT (small: JSON or markdown)."""
        path = self.out / name
        path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2, default=str) + "\n")

    def recipe(self, kind: str, stages: list[str], seconds: float, **env) -> None:
        """Stages of examples/smollm2_135m/gpu.sh for one drafter kind, stopped (and resumable) at `seconds`."""
        data = self.runs / "regenerated"
        environment = {**os.environ, "KIND": kind, "RUNS": str(self.runs / kind), "OUT_DIR": str(self.exports),
                       "DATASET": str(data) if data.exists() else "", "TARGET_DTYPE": "float32",
                       "REPO_PREFIX": f"carryover-hf/{LEASE}", "PY": os.environ.get("PY", sys.executable),
                       **{k: str(v) for k, v in env.items()}}  # fmt: skip
        if self.rehearsal:
            environment.update(CARRYOVER_REHEARSAL="1", HF_HUB_CACHE=str(self.work / "hub"))
        run(["bash", str(ROOT / "examples/smollm2_135m/gpu.sh"), *stages], seconds, environment)

    # -- call 1 --------------------------------------------------------------------------------------------------------
    def keep_part1(self, seconds: float) -> dict:
        """The target's first part, checked and kept outside the checkout for call 2."""
        source = self.staging / "target"
        manifest = json.loads((source / "manifest.json").read_text())
        kept = self.work / "target"
        kept.mkdir(exist_ok=True)
        part = manifest["parts"][0]
        if sha256(source / part["name"]) != part["sha256"]:
            raise StageError(f"{part['name']} does not match its checksum: prepare the calls again")
        shutil.copy2(source / part["name"], kept / part["name"])
        shutil.copy2(source / "manifest.json", kept / "manifest.json")
        return {"kept": part["name"], "bytes": part["size"]}

    def environment(self, seconds: float) -> dict:
        import torch
        import transformers

        info = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
                "cuda": torch.cuda.is_available()}
        from importlib import metadata

        for package in ("huggingface_hub", "safetensors", "accelerate", "peft", "pyarrow", "fsspec", "datasets", "gguf"):
            try:
                info[package] = metadata.version(package)
                __import__(package)
            except Exception as error:  # noqa: BLE001 (a missing or broken package is what this stage reports)
                info[package] = f"unusable: {type(error).__name__}: {error}"
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
            info["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        self.write("environment.json", info)
        return info

    def cuda_checks(self, seconds: float) -> dict:
        from checks import greedy_identity

        result = greedy_identity(self.device, deadline=time.monotonic() + seconds)
        self.write("cuda_checks.json", result)
        return result

    def round_profile(self, seconds: float) -> dict:
        import torch

        from round_profile import round_profile

        shape = "tiny" if self.rehearsal else "qwen3-4b"
        dtype = torch.float32 if self.rehearsal else torch.bfloat16
        result = round_profile(self.device, dtype, shape, time.monotonic() + seconds)
        self.write("round_profile.json", {k: v for k, v in result.items() if k != "markdown"})
        self.write("round_profile.md", result.get("markdown", ""))
        return {k: v for k, v in result.items() if k != "markdown"}

    # -- call 2 --------------------------------------------------------------------------------------------------------
    def target(self, seconds: float) -> dict:
        """Reassembles the target's wheel from call 1's part and this call's, checks it, and installs it."""
        manifest = json.loads((self.staging / "target/manifest.json").read_text())
        paths = []
        for part in manifest["parts"]:
            found = [p for p in (self.work / "target" / part["name"], self.staging / "target" / part["name"]) if p.is_file()]
            if not found:
                raise SystemExit(EXIT_MISSING_PART)
            if sha256(found[0]) != part["sha256"]:
                raise StageError(f"{part['name']} does not match its checksum")
            paths.append(found[0])
        wheel = self.work / "target" / manifest["name"]
        with open(wheel, "wb") as out:
            for path in paths:
                with open(path, "rb") as handle:
                    shutil.copyfileobj(handle, out, 1 << 22)
        if sha256(wheel) != manifest["sha256"]:
            raise SystemExit(EXIT_BAD_CHECKSUM)
        site = self.work / "site-target"
        run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade",
             "--target", str(site), str(wheel)], seconds, dict(os.environ))  # fmt: skip
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
        sys.path.insert(0, str(site))
        return {"wheel": manifest["name"], "bytes": manifest["size"], "site": str(site)}

    def regenerate(self, seconds: float) -> dict:
        """The target's own greedy answers (float32) to the whole train split; resumable chunk by chunk."""
        settings = {"PROMPTS_PER_CATEGORY": 4 if self.rehearsal else 100000, "REGEN_BATCH": 4 if self.rehearsal else 512}
        if not self.rehearsal:
            settings["MAX_NEW_TOKENS"] = 512
        environment = {**settings, "DATASET": ""}
        earlier = ROOT / "assets/train" / LEASE  # an earlier lease's rows, carried (docs/gpu.md): resumed after them
        if earlier.is_dir() and not (self.runs / "regenerated").exists():
            shutil.copytree(earlier, self.runs / "regenerated")
        try:
            self.recipe("dflash", ["regenerate"], seconds, RUNS=self.runs, **environment)
        except StageError as error:
            if "time" not in str(error):
                raise
        from carryover_hf.tools.data.regenerate import STATE_FILE

        state = self.runs / "regenerated" / STATE_FILE
        summary = json.loads(state.read_text()).get("summary", {}) if state.exists() else {}
        chunks = sum(1 for _ in (self.runs / "regenerated" / "data").glob("chunk-*.parquet"))
        return {"chunks_done": chunks, "summary": summary, "incomplete": not summary.get("complete", False)}

    def train(self, kind: str, seconds: float) -> dict:
        """Features, baseline, carryover continuation, continued baseline (same steps), export: one kind."""
        if not any((self.runs / "regenerated" / "data").glob("chunk-*.parquet")):
            raise StageError("no regenerated rows to train on")
        started, done, failed = time.monotonic(), {}, {}
        for stage, share in TRAIN_SHARES.items():
            budget = share * seconds
            try:
                if stage == "features":
                    self.recipe(kind, ["features"], budget)
                elif stage == "continued":  # as many steps as the carryover run took (gpu.sh, EXTRA_SECONDS)
                    self.recipe(kind, ["continued"], max(budget, seconds - (time.monotonic() - started) - 15),
                                EXTRA_SECONDS=max(1, int(budget)))
                else:
                    setting = "BASELINE_SECONDS" if stage == "baseline" else "EXTRA_SECONDS"
                    self.recipe(kind, [stage], budget + 20, **{setting: max(1, int(budget - 15))})
                done[stage] = round(time.monotonic() - started, 1)
            except StageError as error:
                failed[stage] = str(error)
                if stage in ("features", "baseline"):
                    break  # the later runs start from these
        self.recipe(kind, ["export"], max(15.0, seconds - (time.monotonic() - started)), PARTIAL_EXPORT=1)
        steps = {}
        for run_name in ("baseline", "carryover", "continued"):
            state = self.runs / kind / run_name / "trainer_state.json"
            if state.exists():
                steps[run_name] = json.loads(state.read_text())["global_step"]
        return {"elapsed_after": done, "steps": steps, "failed": failed, "incomplete": bool(failed)}

    def bf16_divergence(self, seconds: float) -> dict:
        """How often assisted output differs from plain generate with SmolLM2 in bf16 (50 held-out prompts)."""
        import torch

        import carryover_hf  # noqa: F401  (the generate hook)
        from carryover_hf.tools.bench.prompts import load_prompts
        from carryover_hf.targets import load_target
        from checks import bf16_divergence
        from transformers import AutoModel

        drafters = sorted(self.exports.glob("drafters/*-carryover-dflash")) + sorted(self.exports.glob("drafters/*"))
        if not drafters:
            raise StageError("no drafter was exported")
        if self.rehearsal:
            target_name, dtype, count = "carryover-hf-rehearsal/tiny-smollm2", torch.float32, 4
        else:
            target_name, dtype, count = "smollm2-135m", torch.bfloat16, 50
        target, tokenizer = load_target(target_name, dtype=dtype, device=self.device)
        drafter = AutoModel.from_pretrained(drafters[0], dtype=dtype).to(self.device)
        prompts = load_prompts("suites", split="eval")
        chosen = [prompts[i * len(prompts) // count] for i in range(count)]
        texts = [p.text for p in chosen]
        result = bf16_divergence(target, tokenizer, drafter, texts, 128 if not self.rehearsal else 8,
                                 time.monotonic() + seconds)
        result["drafter"] = drafters[0].name
        self.write("bf16_divergence.json", result)
        return result

    def curves(self, seconds: float) -> dict:
        made = {}
        for kind in KINDS:
            if all((self.runs / kind / name).is_dir() for name in ("baseline", "continued", "carryover")):
                self.recipe(kind, ["curves"], seconds / 2, OUT_DIR=self.exports / f"curves-{kind}")
                made[kind] = True
        return made

    def pack(self, seconds: float) -> dict:
        """One uncompressed tar (results first, then drafters, then data) in parts of 15 MiB; the parts that fit
        this call's return limits go to $OUT, the rest wait for call 3."""
        bundle = self.work / "bundle"
        shutil.rmtree(bundle, ignore_errors=True)
        bundle.mkdir()
        results = f"benchmarks/results/{LEASE}"
        members: list[tuple[Path, str]] = [(self.state_path, f"{results}/state.json")]
        for name in ("timings.tsv",):
            if (self.exports / name).exists():
                members.append((self.exports / name, f"{results}/{name}"))
        for kind in KINDS:
            if (self.exports / f"curves-{kind}" / "curves").is_dir():
                members.append((self.exports / f"curves-{kind}" / "curves", f"{results}/curves-{kind}"))
        for kind in KINDS:  # the training records (logs, trainer state) without checkpoints
            for run_name in ("baseline", "continued", "carryover"):
                folder = self.runs / kind / run_name
                for name in ("trainer_state.json", "train_results.json", "all_results.json", "eval_results.json"):
                    if (folder / name).exists():
                        members.append((folder / name, f"{results}/records/{kind}-{run_name}-{name}"))
        # What the release needs first: the continuations (the carryover question), then the rows (the next lease
        # resumes from them), then the baselines. A Markov drafter of the GPU recipe is ~40 MB in bf16.
        drafters = {run: sorted(self.exports.glob(f"drafters/*-{run}-*")) for run in ("carryover", "continued", "baseline")}
        members += [(path, f"drafters/carryover-hf/{path.name}") for run in ("carryover", "continued") for path in drafters[run]]
        data = self.runs / "regenerated"
        if data.is_dir():
            members.append((data, f"assets/train/{LEASE}"))
        members += [(path, f"drafters/carryover-hf/{path.name}") for path in drafters["baseline"]]
        archive = self.work / "bundle.tar"
        with tarfile.open(archive, "w") as tar:
            for path, name in members:
                tar.add(path, arcname=name)
        parts, whole = [], hashlib.sha256()  # the archive is read once: parts and the whole's checksum together
        with open(archive, "rb") as handle:
            index = 0
            while block := handle.read(PART_BYTES):
                path = bundle / f"bundle.part{index:02d}"
                path.write_bytes(block)
                whole.update(block)
                parts.append({"name": path.name, "size": len(block), "sha256": hashlib.sha256(block).hexdigest()})
                index += 1
        manifest = {"parts": parts, "sha256": whole.hexdigest(), "members": [name for _, name in members]}
        (bundle / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n")
        archive.unlink()
        shutil.copy2(bundle / "bundle.json", self.out / "bundle.json")
        returned = hand_back(bundle, self.out, self.call)
        return {"parts": len(parts), "returned": returned, "pending": len(parts) - len(returned),
                "bytes": sum(p["size"] for p in parts), "members": manifest["members"]}

    def return_pending(self, seconds: float) -> dict:
        bundle = self.work / "bundle"
        if not (bundle / "bundle.json").exists():
            raise StageError("call 2 packed nothing: no bundle to hand back")
        shutil.copy2(bundle / "bundle.json", self.out / "bundle.json")
        returned = hand_back(bundle, self.out, self.call)
        pending = sorted(p.name for p in bundle.glob("bundle.part*"))
        return {"returned": returned, "pending": pending, "incomplete": bool(pending)}  # incomplete: call 3 again


def hand_back(bundle: Path, out: Path, call: int) -> list[str]:
    """Moves bundle parts into `out` while its return limits allow (leaving room for the summary and the log)."""
    moved = []
    later = (f"summary-call{call}.json", f"log-call{call}.txt")  # written after this, if not there yet
    reserve_files, reserve_bytes = sum(not (out / name).exists() for name in later), 2 * MIB
    for part in sorted(bundle.glob("bundle.part*")):
        files = [p for p in out.rglob("*") if p.is_file()]
        used = sum(p.stat().st_size for p in files)
        if len(files) + 1 + reserve_files > RETURN_FILES or used + part.stat().st_size + reserve_bytes > RETURN_TOTAL_BYTES:
            break
        shutil.move(str(part), out / part.name)
        moved.append(part.name)
    return moved


def run(command: list[str], seconds: float, environment: dict) -> None:
    """A child process in its own group, stopped (TERM, then KILL) when `seconds` pass."""
    process = subprocess.Popen(command, env=environment, start_new_session=True)
    try:
        code = process.wait(timeout=max(1.0, seconds))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        raise StageError(f"stopped at its time limit ({seconds:.0f} s): {' '.join(command[:4])} ...") from None
    if code != 0:
        raise StageError(f"exit code {code}: {' '.join(command[:4])} ...")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--call", type=int, choices=(1, 2, 3), required=True)
    parser.add_argument("--budget", type=float, required=True, help="seconds this call may take in all")
    parser.add_argument("--out", type=Path, required=True, help="the folder whose files come back")
    parser.add_argument("--work", type=Path, required=True, help="state kept between calls (outside the checkout)")
    parser.add_argument("--staging", type=Path, default=ROOT / ".gpu", help="what gpu_job/travel.py prepared")
    parser.add_argument("--rehearsal", action="store_true", help="CPU, tiny stand-ins (the CI rehearsal)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing outside the device machine can be reached
    job = Job(args.call, args.budget, args.out, args.work, args.staging, args.rehearsal)
    if args.call == 1:
        job.stage("keep_part1", job.keep_part1, minimum=1)
        job.stage("environment", job.environment, minimum=1)
        job.stage("cuda_checks", job.cuda_checks, reserve=30, cap=60)
        job.stage("round_profile", job.round_profile, reserve=3)
    elif args.call == 2:
        try:
            job.stage("target", job.target, minimum=1)
        except SystemExit as code:
            print("the target's first part is missing (a fresh machine: call 1 ran elsewhere or long ago): run call 1 "
                  "and then call 2 again" if code.code == EXIT_MISSING_PART else
                  "the reassembled target does not match its checksum: prepare the calls again", file=sys.stderr)
            return int(code.code)
        if job.state["stages"]["target"]["status"] != "done":
            return 1
        late = sum(RESERVE.values())
        job.stage("convert", lambda s: job.recipe("dflash", ["target"], s) or {}, reserve=late)
        training = max(0.0, job.left() - late)
        job.stage("regenerate", job.regenerate, reserve=late, cap=0.35 * training)
        share = (job.left() - late) / 2
        for kind in KINDS:
            job.stage(f"train_{kind}", lambda s, k=kind: job.train(k, s), reserve=late, cap=share, minimum=30)
        job.stage("bf16_divergence", job.bf16_divergence, reserve=RESERVE["pack"] + RESERVE["curves"],
                  cap=RESERVE["bf16_divergence"])
        job.stage("curves", job.curves, reserve=RESERVE["pack"], cap=RESERVE["curves"])
        job.stage("pack", job.pack, minimum=1)
    else:
        job.stage("return_pending", job.return_pending, minimum=1)
    problems = return_problems(args.out)
    for problem in problems:
        print(f"return limit: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
