"""`carryover-hf` command line: one subcommand per job, each implemented in its own module."""

from __future__ import annotations

import importlib
import sys

from ..errors import USAGE_EXIT_CODE, UsageError

# subcommand -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("carryover_hf.tools.demo", "the shipped SmolLM2-135M drafter against the target alone: speedup and acceptance"),
    "features": ("carryover_hf.training.feature_store", "run the target once per training row and store its features"),
    "train": ("carryover_hf.training.cli", "train or fine-tune a drafter (DFlash or draft-verify-draft objective)"),
    "prompts": ("carryover_hf.tools.data.cli", "build the offline prompt suites (`prompts build`) or reading rows (`prompts reading`)"),
    "regenerate": ("carryover_hf.tools.data.regenerate", "record target responses to prompts as a training dataset"),
    "campaign": ("carryover_hf.tools.campaign", "start, resume, stop or report a drafter training campaign that outlives sessions"),
    "bench": ("carryover_hf.tools.bench.cli", "benchmark drafters against the target alone and its peers"),
    "convert": ("carryover_hf.hub.convert", "import z-lab / Transformers / speculators DFlash checkpoints, or export"),
    "push": ("carryover_hf.hub.push", "save a drafter with its model card and upload it to the Hub"),
    "vllm": ("carryover_hf.tools.vllm_check", "build vLLM's CPU environment, or serve the target and an exported drafter with vLLM and compare"),
    "init": ("carryover_hf.hub.configs", "initialise a drafter from a shipped hub config for its target"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: carryover-hf <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `carryover-hf <command> --help` for the options of a command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"carryover-hf: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except UsageError as error:  # bad input: one line naming the option and the fix; any other error is a bug
        print(f"carryover-hf {name}: error: {error}", file=sys.stderr)
        return USAGE_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
