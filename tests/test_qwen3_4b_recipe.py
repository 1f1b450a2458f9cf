"""examples/qwen3_4b/recipe.sh: its input checks, its accelerate configs, and a CPU rehearsal of every stage.

The rehearsal (`CARRYOVER_REHEARSAL=1`) swaps the Qwen3-4B target and z-lab's drafter for tiny stand-ins built by
`carryover_hf.tools.testing.build_rehearsal_hub` into a scratch Hub cache, and runs the same commands in the same order.
It starts a dozen Python processes (about 3 minutes on the shared 2-core machine), so it is marked `slow`, as is
the FSDP2 test at the end (two processes).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import carryover_hf
from carryover_hf.hub.card import format_evaluation

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "qwen3_4b" / "recipe.sh"


def _run(tmp_path, *stages, timeout=900, **env):
    environment = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "RUNS": str(tmp_path / "runs"), **env}
    return subprocess.run(["bash", str(RECIPE), *stages], capture_output=True, text=True, timeout=timeout,
                          env=environment, check=False)  # fmt: skip


@pytest.mark.parametrize(
    "stages, env, message",
    [
        (("fetch", "nonsense"), {}, "unknown stage 'nonsense'"),
        (("bench",), {"EPOCHS": "two"}, "EPOCHS must be a whole number"),
        (("push",), {"PUSH": "1", "HF_TOKEN": ""}, "needs a write token in HF_TOKEN"),
        (("convert",), {"NUM_GPUS": "3"}, "NUM_GPUS must be 1 or 8"),
        (("regenerate",), {"DATASET": "/nonexistent/rows"}, "DATASET=/nonexistent/rows does not exist"),
    ],
)
def test_recipe_rejects_bad_settings_before_any_stage_runs(tmp_path, stages, env, message):
    result = _run(tmp_path, *stages, timeout=60, **env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "==" not in result.stdout, "no stage may start"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "hub").exists()


def test_rehearsal_needs_scratch_folders(tmp_path):
    result = subprocess.run(["bash", str(RECIPE), "fetch"], capture_output=True, text=True, timeout=60, check=False,
                            env={**os.environ, "CARRYOVER_REHEARSAL": "1", "HF_HUB_CACHE": ""})  # fmt: skip
    assert result.returncode != 0 and "HF_HUB_CACHE" in result.stderr


def test_committed_accelerate_configs():
    from accelerate.commands.config.config_args import ClusterConfig

    one = ClusterConfig.from_yaml_file(str(RECIPE.parent / "accelerate-1gpu.yaml"))
    assert one.num_processes == 1 and str(one.distributed_type) in ("NO", "DistributedType.NO")
    assert one.mixed_precision == "bf16" and not one.use_cpu
    eight = ClusterConfig.from_yaml_file(str(RECIPE.parent / "accelerate-8gpu-fsdp.yaml"))
    assert eight.num_processes == 8 and "FSDP" in str(eight.distributed_type)
    fsdp = eight.fsdp_config
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    # The class FSDP wraps layer by layer must exist under that name.
    from carryover_hf import modeling_carryover

    assert hasattr(modeling_carryover, fsdp["fsdp_transformer_layer_cls_to_wrap"])


def test_card_shows_a_value_without_interval_when_a_group_has_one_prompt():
    rows = format_evaluation([{"category": "qa", "acceptance_length": 1.5, "acceptance_length_ci": [None, None],
                               "speedup": 1.2, "speedup_ci": [1.0, 1.4]}])  # fmt: skip
    assert rows == [{"category": "qa", "acceptance_length": "1.50", "speedup": "1.20x [1.00, 1.40]"}]


@pytest.mark.parametrize("drafter_dtype, expected", [("float32", torch.float32), ("auto", torch.bfloat16)])
def test_a_bf16_drafter_is_continued_in_fp32_master_weights(tmp_path, drafter_dtype, expected):
    from carryover_hf.tools.testing import tiny_drafter, tiny_target
    from carryover_hf.training.cli import ModelArguments, _build_drafter

    tiny_drafter(tiny_target("qwen3")).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    drafter = _build_drafter(ModelArguments(drafter=str(tmp_path / "bf16"), drafter_dtype=drafter_dtype), None)
    assert {p.dtype for p in drafter.parameters()} == {expected}


def _differs(a: dict, b: dict, skip=()) -> bool:
    return any(not torch.equal(a[k].float(), b[k].float()) for k in a if k not in skip)


@pytest.mark.slow
def test_rehearsal_runs_every_stage_end_to_end(tmp_path):
    from transformers import AutoModel

    from carryover_hf.hub import detect_format
    from carryover_hf.tools.testing import REHEARSAL_LAYER_IDS, REHEARSAL_TARGET, REHEARSAL_ZLAB_DRAFTER
    from carryover_hf.training.cli import load_rows
    from carryover_hf.training.feature_store import FeatureStore

    started = time.perf_counter()
    result = _run(tmp_path, CARRYOVER_REHEARSAL="1")
    seconds = time.perf_counter() - started
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    stages = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("== ")]
    assert stages == ["fetch", "convert", "regenerate", "features", "baseline", "carryover", "bench", "push"]
    runs, hub = tmp_path / "runs", tmp_path / "hub"

    # fetch: both repositories resolve from the Hub cache; the drafter is in z-lab's own layout.
    snapshots = {repo: next((hub / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())
                 for repo in (REHEARSAL_TARGET, REHEARSAL_ZLAB_DRAFTER)}  # fmt: skip
    zlab_config = json.loads((snapshots[REHEARSAL_ZLAB_DRAFTER] / "config.json").read_text())
    assert detect_format(zlab_config) == "zlab" and zlab_config["architectures"] == ["DFlashDraftModel"]
    zlab = load_file(snapshots[REHEARSAL_ZLAB_DRAFTER] / "model.safetensors")

    # convert: the converted drafter loads with AutoModel and holds z-lab's tensors unchanged (bf16 as published).
    converted = AutoModel.from_pretrained(runs / "converted")
    assert isinstance(converted, carryover_hf.CarryoverDrafterModel)
    assert converted.config.imported_from["format"] == "zlab" and converted.generation_config.use_carryover is False
    assert converted.dtype == torch.bfloat16
    start = converted.state_dict()
    assert set(start) == set(zlab) | {"carry_embedding"}
    assert all(torch.equal(start[name], tensor) for name, tensor in zlab.items())

    # regenerate + features: a complete store of exactly the regenerated rows, for the converted drafter's layers.
    rows = load_rows(str(runs / "regenerated"))
    assert len(rows) == 8 and all(sum(mask) > 0 for mask in rows["loss_mask"])
    store = FeatureStore(runs / "features")
    manifest = store.manifest
    assert manifest["complete"] and len(manifest["shards"]) == 4 and len(store) == len(rows)
    store.check_compatible(dataset=rows)  # every shard holds exactly these rows (raises otherwise)
    assert store.target_layer_ids == REHEARSAL_LAYER_IDS == converted.config.target_layer_ids
    assert sum(s["tokens"] for s in manifest["shards"]) == sum(len(ids) for ids in rows["input_ids"])

    # baseline and carryover: both start from the converted drafter, train the same epochs, and move away from it.
    trained = {}
    for name in ("continued", "carryover"):
        drafter = AutoModel.from_pretrained(runs / name)
        state = json.loads((runs / name / "trainer_state.json").read_text())
        assert state["global_step"] == 2 and state["epoch"] == pytest.approx(1.0), name
        assert drafter.dtype == torch.float32, "trained in fp32 master weights (--drafter_dtype float32)"
        assert _differs(drafter.state_dict(), start, skip=("carry_embedding",)), name
        trained[name] = drafter
    assert trained["carryover"].config.trained_with_carryover and not trained["continued"].config.trained_with_carryover
    assert torch.count_nonzero(trained["continued"].carry_embedding) == 0, "the DFlash objective leaves E_carry alone"
    assert torch.count_nonzero(trained["carryover"].carry_embedding) > 0, "draft-verify-draft trains E_carry"
    assert _differs(trained["continued"].state_dict(), trained["carryover"].state_dict())

    # bench: one report per temperature, both drafters with carry off and on next to the target.
    for temperature in (0.0, 1.0):
        report = json.loads((runs / f"bench-t{int(temperature)}" / "results.json").read_text())
        (entry,) = report["results"]
        assert entry["temperature"] == temperature
        assert {"target", "continued/carry_off", "carryover/carry_on"} <= set(entry["summary"])
        assert entry["summary"]["carryover/carry_on"]["all"]["rounds"] > 0
        assert report["correctness"]["passed"]
        # The paper's comparison with our control: carryover (carry on) against the continued baseline, paired.
        pairs = {(c["a"], c["b"]): c for c in entry["comparisons"]}
        assert pairs[("carryover/carry_on", "continued/carry_off")]["all"]["prompts"] == 2

    # push (dry run): the upload folder with the bench table in its card, carry on, bf16 weights.
    upload = runs / "upload" / "carryover"
    files = ["README.md", "config.json", "generation_config.json", "model.safetensors"]
    assert sorted(p.name for p in upload.iterdir()) == files
    card = (upload / "README.md").read_text()
    table = card[card.index("## Evaluation"):]
    assert "| all | " in table and "| qa | " in table and "| translation | " in table
    assert "carryover-hf-rehearsal/tiny-qwen3" in card
    pushed = json.loads((upload / "config.json").read_text())
    assert json.loads((upload / "generation_config.json").read_text())["use_carryover"] is True
    assert pushed["trained_with_carryover"] is True
    assert {str(t.dtype) for t in load_file(upload / "model.safetensors").values()} == {"torch.bfloat16"}

    # Every finished stage is skipped on a rerun (no model work).
    again = _run(tmp_path, "convert", "baseline", "carryover", "bench", CARRYOVER_REHEARSAL="1", timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    for expected in ("converted exists", "continued is trained", "carryover is trained", "bench-t0 exists",
                     "bench-t1 exists"):  # fmt: skip
        assert expected in again.stdout
    print(f"rehearsal: {seconds:.0f} s for all stages")


# One optimizer step of a drafter sharded with PyTorch's FSDP2 (`fully_shard` per CarryoverDrafterLayer, then the
# root: the wrapping accelerate-8gpu-fsdp.yaml asks for) over 2 gloo processes, or unsharded in 1 process.
FSDP2_STEP = """import os, sys, json, torch, torch.distributed as dist
from carryover_hf.tools.testing import tiny_target, tiny_drafter
from carryover_hf.training.synthetic import regenerate_random_prompts
from carryover_hf.training.collator import CarryoverDataCollator
from carryover_hf.training.objectives import DrafterObjective

objective, out = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
target = tiny_target("qwen3", seed=0)
drafter = tiny_drafter(target, block_size=4, seed=1).train()
drafter.carry_embedding.requires_grad_(objective == "carryover")
rows = regenerate_random_prompts(target, num_rows=8, prompt_length=6, response_length=20)
mine = [rows[i] for i in range(rank * 8 // world, (rank + 1) * 8 // world)]
if world > 1:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    for layer in drafter.layers:  # what accelerate's TRANSFORMER_BASED_WRAP of CarryoverDrafterLayer does
        fully_shard(layer, mesh=mesh)
    fully_shard(drafter, mesh=mesh)
    assert isinstance(drafter, FSDPModule)
optimizer = torch.optim.SGD([p for p in drafter.parameters() if p.requires_grad], lr=0.5)
output = DrafterObjective(target, objective, 4.0)(drafter, drafter, CarryoverDataCollator(num_anchors=6, seed=0)(mine))
totals = torch.stack([output.loss_sum.detach(), output.num_anchors.float()])
if world > 1:
    dist.all_reduce(totals)
# FSDP averages gradients over processes: scale so the step equals one process over all rows.
(output.loss_sum * world / totals[1]).backward()
optimizer.step()
if world > 1:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(drafter, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
else:
    state = drafter.state_dict()
if rank == 0:
    drafter.save_pretrained(out, state_dict=state)
    with open(os.path.join(out, "step1.json"), "w") as handle:
        json.dump({"loss": float(totals[0] / totals[1]), "world": world,
                   "sharded": sorted({type(p).__name__ for p in drafter.parameters()})}, handle)
if world > 1:
    dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["dflash", "carryover"])
def test_fsdp2_sharded_drafter_matches_one_process(tmp_path, objective):
    """accelerate 1.15 does not enable FSDP on CPU (docs/qwen3-4b.md), so this drives PyTorch's FSDP2 directly on two
    gloo processes: the objectives run on sharded (DTensor) drafter weights, the loss at step 1 equals one process over
    the same 8 rows, and the gathered full checkpoint loads with AutoModel and equals the one-process step."""
    from transformers import AutoModel

    from carryover_hf.tools.testing import tiny_drafter, tiny_target

    script = tmp_path / "fsdp2_step.py"
    script.write_text(FSDP2_STEP)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    import socket
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runs = {
        "one": [sys.executable, str(script), objective, str(tmp_path / "one")],
        "two": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
                str(script), objective, str(tmp_path / "two")],
    }  # fmt: skip
    for name, command in runs.items():
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, check=False)
        assert result.returncode == 0, name + result.stdout[-2000:] + result.stderr[-3000:]
    one, two = (json.loads((tmp_path / n / "step1.json").read_text()) for n in ("one", "two"))
    assert two["world"] == 2 and two["sharded"] == ["DTensor"] and one["sharded"] == ["Parameter"]
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    loaded = {n: AutoModel.from_pretrained(tmp_path / n).state_dict() for n in ("one", "two")}
    start = tiny_drafter(tiny_target("qwen3", seed=0), block_size=4, seed=1).state_dict()
    assert _differs(loaded["one"], start, skip=("carry_embedding",)), "the step must change the weights"
    assert (objective == "carryover") == (not torch.equal(loaded["one"]["carry_embedding"], start["carry_embedding"]))
    for name, tensor in loaded["one"].items():
        torch.testing.assert_close(loaded["two"][name], tensor, atol=1e-6, rtol=1e-5)
