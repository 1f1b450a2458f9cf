"""`python -m carryover_hf <command>`: the `carryover-hf` command line, for launchers that run modules
(`accelerate launch -m carryover_hf train ...`)."""

import sys

from .tools.cli import main


if __name__ == "__main__":
    sys.exit(main())  # the command's exit status (2 for bad input), as the console script gives it
