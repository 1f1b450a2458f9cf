"""Runs `carryover-hf regenerate` or `carryover-hf features` with the target placed on a device (e.g. a GPU).

Both commands take the same options as here, but load the target on the CPU; their Python functions accept a target
that is already loaded, which is what this does (the rows are loaded and checked first, before the target). Shared by
the recipes that run these stages on a GPU: examples/qwen3_4b/recipe.sh and examples/smollm2_135m/gpu.sh.

    python examples/on_device.py cuda regenerate --target Qwen/Qwen3-4B --dtype bfloat16 --output ...
    python examples/on_device.py cuda features --target smollm2-135m --target_dtype bfloat16 --top_k 32 ...
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in ("regenerate", "features"):
        print("usage: on_device.py DEVICE {regenerate,features} [options of that carryover-hf command]",
              file=sys.stderr)
        return 2
    device, command, rest = argv[0], argv[1], argv[2:]
    from transformers import HfArgumentParser

    from carryover_hf.targets import load_target

    if command == "features":
        from carryover_hf.training.cli import load_rows
        from carryover_hf.training.feature_store import FeatureBuildConfig, build_features

        (config,) = HfArgumentParser(FeatureBuildConfig).parse_args_into_dataclasses(args=rest)
        rows = load_rows(config.dataset, "dataset")  # a bad --dataset fails before the target loads
        target, _ = load_target(config.target, dtype=config.target_dtype, device=device)
        manifest = build_features(config, target=target, rows=rows)
        summary = {"complete": manifest["complete"], **manifest["summary"], "fingerprint": manifest["fingerprint"]}
        print(json.dumps(summary))
        return 0 if manifest["complete"] else 1

    from carryover_hf.tools.data.regenerate import RegenerationConfig, regenerate

    (config,) = HfArgumentParser(RegenerationConfig).parse_args_into_dataclasses(args=rest)
    model, tokenizer = load_target(config.target, dtype=config.dtype, device=device)
    summary = regenerate(config, model=model, tokenizer=tokenizer)
    print(json.dumps({k: v for k, v in summary.items() if k != "per_category"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
