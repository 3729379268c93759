"""What every subcommand module shares: the errors and exit codes, and the registry (`@subcommand`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SubParsers = Any  # argparse._SubParsersAction (private type)
Registrar = Callable[[SubParsers], None]
SUBCOMMANDS: list[Registrar] = []


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


class InternalError(Exception):
    """A bug in rlxviz found while serving a valid request (e.g. a pass crashed): one line, exit code 3."""


EXIT_BAD_INPUT, EXIT_INTERNAL = 2, 3
"""Exit codes of every subcommand: 2 for bad input (one line on stderr), 3 for an internal error."""

EXIT_CODES_HELP = ("exit codes: 0 success; 1 a check failed (explain: a layer did not fuse; time: a version is off); "
                   "2 bad input (one line on stderr); 3 internal error (one line on stderr: a bug in rlxviz, "
                   "e.g. a pass crashed)")


def subcommand(fn: Registrar) -> Registrar:
    """Register `fn(subparsers)`, which adds one subcommand parser with `set_defaults(func=...)`."""
    SUBCOMMANDS.append(fn)
    return fn


__all__ = ["EXIT_BAD_INPUT", "EXIT_CODES_HELP", "EXIT_INTERNAL", "SUBCOMMANDS", "CLIError", "InternalError",
           "Registrar", "SubParsers", "subcommand"]
