"""Errors in what a user passed to a `carryover-hf` command.

Validation raises `UsageError` (a bad option value) or `InputNotFoundError` (a file, folder or cached model that is not
there), with a message that names the option and says how to fix it. The command line (`carryover_hf.tools.cli`) prints
such an error on one line, `carryover-hf <command>: error: <message>`, and exits with status 2; every other exception
keeps its traceback, since it is a bug. They subclass `ValueError` / `FileNotFoundError`, so Python callers that
catch those keep working.
"""

from __future__ import annotations


class UsageError(ValueError):
    """Bad input to a command: the message names the option and the fix."""


class InputNotFoundError(UsageError, FileNotFoundError):
    """A file, folder or model named on the command line does not exist: the message says where to get it."""


class ProposalOptionError(UsageError, AttributeError):
    """A proposal option (`use_carryover`, `lookup_drafts`, ...) read or set on a drafter's `config`, which does not
    hold them: the message names where it lives (`drafter.generation_config.<option>`, or the generate call). An
    `AttributeError` too, so `hasattr(config, option)` stays False and `getattr(config, option, default)` works."""


USAGE_EXIT_CODE = 2

__all__ = ["USAGE_EXIT_CODE", "InputNotFoundError", "ProposalOptionError", "UsageError"]
