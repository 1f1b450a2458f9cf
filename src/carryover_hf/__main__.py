"""`python -m carryover_hf <command>`: the `carryover-hf` command line, for launchers that run modules
(`accelerate launch -m carryover_hf train ...`)."""

from .tools.cli import main


if __name__ == "__main__":
    main()
