"""What a command writes: text on stdout/stderr through one print path (`_emit`: model text escaped), warnings as
one line, and the output files it may create (never a directory, never one of its own inputs)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import CLIError

if TYPE_CHECKING:
    from ..models import Model


def _warn(command: str, message: str) -> None:
    _emit(f"rlxviz {command}: warning: {message}", sys.stderr)


def _warn_nonfinite(command: str, model: Model, outputs_finite: bool | None = None) -> bool:
    """Warn on stderr when the outputs are not finite (`outputs_finite` False) or, with no outputs
    computed (None), when the model's weights hold NaN/inf; names a bad weight. True if it warned."""
    from ..session import nonfinite_arrays

    bad = nonfinite_arrays(model.weights)
    if outputs_finite is False:
        why = f"; {len(bad)} weight(s) hold NaN/inf, e.g. {bad[0]!r}" if bad else ""
        _warn(command, f"the outputs hold NaN or infinite values{why}")
        return True
    if outputs_finite is None and bad:
        _warn(command, f"{len(bad)} weight(s) hold NaN/inf (e.g. {bad[0]!r}): the model's outputs will not "
                       "be finite, whatever the fusions")
        return True
    return False


def _not_a_directory(output: str, want: str) -> None:
    """Refuse an output path that is (or, ending in `/`, names) a directory. Raises CLIError."""
    if Path(output).is_dir():
        raise CLIError(f"output path {output} is a directory; give {want}")
    if output.endswith(("/", os.sep)):
        raise CLIError(f"output path {output} ends in '/', naming a directory; give {want}")


def _output_file(output: str, want: str, sources: Sequence[str | None] = ()) -> Path:
    """The path of an output file `run`, `render` and `export` write: not a directory, in a folder that exists,
    and none of the command's own input files (`sources`: MODEL, `--inputs`), which it would overwrite.

    Raises:
        CLIError: `output` is or names a directory (`_not_a_directory`), its folder does not exist
            (`OUT: folder DIR does not exist`), or it is one of `sources` (the same file, by any path or link).
    """
    _not_a_directory(output, want)
    out = Path(output)
    if not out.parent.is_dir():
        raise CLIError(f"{output}: folder {out.parent} does not exist")
    for src in sources:
        if src is not None and _same_file(out, Path(src)):
            raise CLIError(f"output path {output} is the input {src}; writing it would overwrite the input: "
                           f"give another file name")
    return out


def _same_file(a: Path, b: Path) -> bool:
    """True when `a` and `b` name one file (the same resolved path, or the same inode: a hard link)."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, RuntimeError):
        return False


def _out(text: str) -> None:
    """Print `text` to stdout (through `_emit`); a reader that left early (`rlxviz ir MODEL | head`) is not an error."""
    try:
        _emit(text, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


MODEL_TEXT = None
"""The model strings of this command (`session.ModelText`) that hold a line break: set by `main`, filled where
a model is loaded (`_remember`)."""


def _remember(*things: object) -> None:
    """Remember model text (graphs, models' names, file names) so `_emit` escapes its line breaks too."""
    if MODEL_TEXT is None:
        return
    for t in things:
        graph = getattr(t, "graph", None)
        if graph is not None:
            MODEL_TEXT.remember([getattr(t, "name", None)])
            MODEL_TEXT.remember_graph(graph)
        elif hasattr(t, "versions"):
            for _, g in t.versions():
                MODEL_TEXT.remember_graph(g)
        else:
            MODEL_TEXT.remember([t])


def _emit(text: str, stream: Any) -> None:
    """The CLI's one print path for human-readable text: control characters in model text (names, paths,
    file names) escaped (`ir.text`), so a name cannot retitle the terminal, clear it or forge a line.
    JSON output passes through unchanged in meaning (`json.dumps` leaves no raw control character)."""
    from ..ir.text import ModelText

    print((MODEL_TEXT or ModelText()).shown(str(text)), file=stream)


def _one_line(msg: object) -> str:
    """The first non-empty line of `msg`, at most 2000 characters."""
    text = str(msg).strip()
    if MODEL_TEXT is not None:  # a model name's line break is escaped, not taken for the message's end
        text = MODEL_TEXT.shown(text)
    line = text.splitlines()[0] if text else "(no message)"
    return line if len(line) <= 2000 else line[:1997] + "..."
