"""The top-level parser (`build_parser`: every registered subcommand) and `main`, which maps every outcome to one
line and an exit code."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from . import output
from .common import EXIT_BAD_INPUT, EXIT_CODES_HELP, EXIT_INTERNAL, SUBCOMMANDS, CLIError, InternalError
from .output import _emit, _one_line, _remember, _warn


class OneLineParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose usage errors are one line on stderr and exit 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {_one_line(message)} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand (subparsers inherit `OneLineParser`)."""
    from .. import __version__

    parser = OneLineParser(prog="rlxviz", description="Make ML-compiler fusion visible.",
                                     epilog=EXIT_CODES_HELP)
    parser.add_argument("--version", action="version", version=f"rlxviz {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse `argv` (default `sys.argv[1:]`), run the subcommand, return its exit code.

    User errors print one line on stderr and return 2, as does running out of memory (`MemoryError`);
    argparse usage errors exit 2 as usual. Anything else (a bug: `InternalError`, `RecursionError`, an
    unexpected exception) prints one line naming it and returns 3; never a traceback.
    """
    from ..ir.text import ModelText

    parser = build_parser()
    args = parser.parse_args(argv)
    output.MODEL_TEXT = ModelText()  # read by the one print path (`output._emit`)
    _remember(*(v for v in vars(args).values() if isinstance(v, str)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # each warning once per place, recorded, never printed raw
        try:
            return _dispatch(args)
        finally:
            _report_warnings(args.command, caught)


def _report_warnings(command: str, caught: Sequence[warnings.WarningMessage]) -> None:
    """Python warnings raised while serving a command, as at most one line on stderr (never a file:line and
    source line): the first one's message, and how many more there were."""
    if not caught:
        return
    more = f" (and {len(caught) - 1} more warning(s))" if len(caught) > 1 else ""
    _warn(command, _one_line(str(caught[0].message)) + more)


def _dispatch(args: argparse.Namespace) -> int:
    """Run the subcommand; map its exceptions to one line on stderr and an exit code (see `main`)."""
    try:
        return int(args.func(args) or 0)
    except (CLIError, ValueError, KeyError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        _emit(f"rlxviz {args.command}: error: {_one_line(msg)}", sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else "an allocation failed"
        _emit(f"rlxviz {args.command}: error: out of memory ({detail}); try a smaller model, --batch or --seq",
              sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rlxviz {args.command}: interrupted", file=sys.stderr)
        return 130
    except InternalError as e:
        _emit(f"rlxviz {args.command}: internal error: {_one_line(str(e))}", sys.stderr)
        return EXIT_INTERNAL
    except Exception as e:  # noqa: BLE001 - a bug: one line, exit 3, never a traceback
        _emit(f"rlxviz {args.command}: internal error: {type(e).__name__}: {_one_line(str(e))} "
              "(a bug in rlxviz; please report it with the command)", sys.stderr)
        return EXIT_INTERNAL
