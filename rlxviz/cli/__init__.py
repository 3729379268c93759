"""The `rlxviz` command line (also `python -m rlxviz`).

Each subcommand is one function that adds its parser, registered with `@subcommand`; it sets
`func=handler` where `handler(args) -> int` returns the exit code. To add a subcommand (`passes`,
`explain`, `render`, `ir`, `time`, ...) write one such function in a command module below (imported here, in
the order `--help` lists); `build_parser` picks it up.

Errors a user can fix (bad paths, bad inputs, unknown models) are raised as `CLIError` (or the
library's `ValueError`/`KeyError`/`OSError`) and printed by `main` as one line on stderr,
`rlxviz <command>: error: <message>`, with exit code 2 and no traceback.

The package, one job per module: `common` (errors, exit codes, the registry), `args` (shared options and their
types), `loading` (the model, the pipeline, the executor), `output` (the one print path, output files), one module
per group of subcommands (`run`, `explain`: passes and explain, `render`: render, ir and export, `timing`: time and
overlay), and `entry` (`build_parser`, `main`).
"""

from __future__ import annotations

# isort: off
from . import run  # noqa: F401 - registers `run`; the order of these imports is the order `--help` lists
from . import explain  # noqa: F401 - `passes`, `explain`
from . import render  # noqa: F401 - `render`, `ir`, `export`
from . import timing  # noqa: F401 - `time`, `overlay`
# isort: on
from .common import EXIT_BAD_INPUT, EXIT_INTERNAL, SUBCOMMANDS, CLIError, InternalError, subcommand
from .entry import build_parser, main

__all__ = ["EXIT_BAD_INPUT", "EXIT_INTERNAL", "SUBCOMMANDS", "CLIError", "InternalError", "build_parser", "main",
           "subcommand"]
