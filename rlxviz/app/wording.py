"""The app's wording: what a failure means and what to do, in plain words, and model text made safe to show (no
Panel import). `AppState` calls these; the texts are the same the CLI prints where the CLI has one.
"""

from __future__ import annotations

import re
import traceback
from pathlib import PureWindowsPath

from .. import session
from ..ir import GraphError, IRSyntaxError, quote_place, syntax_error_line
from ..models import VARIANTS
from ..session import (
    OVER_THRESHOLD,
    DimsMisfitError,
    DimsWords,
    GraphTextError,
    InputDimsError,
    SessionError,
    UnboundDimsError,
)
from .sources import ONNX_UPLOAD_NAME, UPLOAD_PREFIX, SourceError, parse_dims
from .text import md_escape

SHAPE_VARIANT = OVER_THRESHOLD
VARIANT_LABELS: dict[str, str] = {name: v.label for name, v in VARIANTS.items()}
"""Teaching variants, one click each (the labels of `models.VARIANTS`). All but `over_threshold` change one
layer of the model; `over_threshold` raises the sequence length so batch*seq exceeds the attention threshold."""


def gate_box(variant: str, threshold: int | None, default: int | None) -> tuple[str, str]:
    """(label, placeholder) of the sidebar's attention-gate box: with `threshold` empty, the gate the run uses,
    `default` (the pipeline's) or the one teaching variant `variant` sets (`over_threshold`: its banner named a gate
    of 64 the empty box did not show), which the box then names as the variant's."""
    label = f"Attention gate: max batch*seq (empty: {'no gate' if default is None else default})"
    if not session.gate_note(variant, threshold):
        return label, ""
    gate = session.effective_threshold(session.variant_named(variant), threshold)
    return (f"Attention gate: max batch*seq (empty: {gate}, set by the variant '{VARIANT_LABELS[variant]}')",
            f"{gate} (set by the teaching variant)")


LAYER_OFF = (f"Layer to break does not apply to '{VARIANT_LABELS[SHAPE_VARIANT]}': it is "
             f"{session.MODEL_WIDE.split(', so')[0]}.")
"""Said under the disabled "Layer to break" box while `over_threshold` is on."""


def scrub_paths(text: str, upload_dir: str, temp_dir: str, names: dict[str, str] | None = None) -> str:
    """`text` without the server's private folders: a file of the upload's temp folder reads as the name the user
    gave it (`names`: stored name -> user's name; an error said `upload/model.onnx` for `my-net.onnx`), the folder
    itself as `upload`, any other of rlxviz's own temp folders (`rlxviz-*`) as `<temp>/rlxviz-...` (messages never
    show where the server keeps its files). A folder the operator chose (an allowed models folder, even one under
    the temp folder) is shown as is, so a user can type it back. The names stay text: the message pane escapes
    them."""
    if upload_dir:
        base = upload_dir.rstrip("/")
        for stored, given in (names or {}).items():
            text = text.replace(f"{base}/{stored}", one_line(given))
            # the session names a file by its name alone where it lists the file's dims (`session.dimroles`)
            text = text.replace(f" {stored}'s inputs", f" {one_line(given)}'s inputs")
        text = text.replace(base, "upload")
    if temp_dir:
        text = re.sub(re.escape(temp_dir.rstrip("/")) + r"/(?=rlxviz-)", "<temp>/", text)
    return text


SERVER_PATH = re.compile(r"(?<![\w.~/])(?:/[^\s/()\[\]'\",;:]+)+/([^\s/()\[\]'\",;:]+)")
"""An absolute POSIX path of two or more parts (`/srv/app/.venv/lib/.../libopenblas.so.0`); group 1 its file name."""


def hide_server_paths(text: str) -> str:
    """`text` with every absolute path cut to its file name: a timing header named the BLAS library by its full path
    on the server (`/srv/app/.venv/lib/python3.11/site-packages/.../libopenblas.so.0`), which tells a visitor
    where the server is installed and under which account; `libopenblas.so.0` says what was used."""
    return SERVER_PATH.sub(r"\1", text)


def version_name(number: int, label: str) -> str:
    """A version as every view numbers it: `N: label`, N its place in the whole trace (0 the input, N after the
    N-th pass), as `rlxviz time` and the timing table count. One numbering: the version list counted only the shown
    versions while the timing chart counted the trace's, so one version had two numbers when passes were hidden."""
    return f"{number}: {label}"


def one_line(name: str) -> str:
    """A user's file name on one line (a line break in it would split the message's first line)."""
    return " ".join(name.splitlines()) or "?"


def upload_names(files: dict[str, bytes], checked: dict[str, bytes]) -> dict[str, str]:
    """Stored name -> the user's file name, for the files `sources.check_upload` kept (matched by content)."""
    out = {}
    for stored, data in checked.items():
        given = next((k for k, v in files.items() if v is data), None)
        if given is None:
            given = next((k for k, v in files.items() if v == data), stored)
        out[stored] = given
    return out


def upload_model_name(names: dict[str, str], loaded: str) -> str:
    """The name an uploaded model is shown and downloaded under (`names`: `upload_names`' stored name -> the user's).

    An `.onnx` file: its stem as the user named it (`falcon.onnx` -> `falcon`, as `rlxviz explain falcon.onnx`
    names it; the stored copy is `model.onnx`, so every upload was called `model`), else `loaded`. A checkpoint
    upload: `loaded`, unless that is the temp folder's name (`uploaded checkpoint` then)."""
    if ONNX_UPLOAD_NAME not in names:
        return "uploaded checkpoint" if PureWindowsPath(loaded).name.startswith(UPLOAD_PREFIX) else loaded
    given = PureWindowsPath(one_line(names[ONNX_UPLOAD_NAME])).name  # the file's own name, after any / or backslash
    return (given[:-5] if given.lower().endswith(".onnx") else given) or loaded


def timing_hint(e: BaseException) -> str:
    """What to do about a timing failure, by its kind."""
    text = str(e).lower()
    if isinstance(e, MemoryError) or any(w in text for w in ("out of memory", "unable to allocate", "malloc")):
        return ("The graph's tensors do not fit in this machine's memory: lower batch or sequence length, or the "
                f"shapes in the IR text (the server refuses graphs over {session.MAX_MEMORY_ENV}).")
    if isinstance(e, NotImplementedError):
        return "A version uses an op the MLX runtime cannot lower; disable the pass that creates it and re-run."
    return "Timing a version failed; the details above say where. Change the pipeline or the model and re-run."


INTERNAL_NAME = re.compile(r"\[[A-Za-z_][\w.]*\] ")
"""The bracketed function name errors start with (`[build_bert] ...`): for a developer, left out of the page."""


IR_SYNTAX_HELP = "the IR tab of any preset shows the syntax"
"""The last line's pointer to the syntax, after an IR text's error."""


DIMS_BOX = "Input dims"
"""The sidebar box that binds an `.onnx` export's other symbolic dims (`AppState.dims`), as the CLI's `--dim`."""


APP_DIMS = DimsWords(bind=f"set {{pairs}} in the sidebar's {DIMS_BOX} box", pair="{name}={value}", beside="the model")
"""The app's words for an `.onnx` file's unbound dims (`UnboundDimsError.said_as`, the CLI's message laid out alike):
`M: set past=7 in the sidebar's Input dims box (from the shapes in qwen2.kv.npz beside the model); input ...`."""


def app_remedy(e: UnboundDimsError) -> str:
    """The session's message for an `.onnx` file's unbound dims in the app's words (`APP_DIMS`), the values to type
    in the sidebar's Input dims box first (the stale box cuts the line: qwen2.kv's `past=7` was past the cut), with
    the values the inputs file beside the model gives (`N` for one it does not), then the places."""
    return e.said_as(APP_DIMS)


def misfit_remedy(e: DimsMisfitError) -> str:
    """The session's message for dims that do not fit an `.onnx` file, said as the app's: the Input dims box's values
    on the first line, the one the banner and the stale box show (`Input dims num_channels=3 height=64 width=64 do
    not fit M: Add node ...: ShapeError: ...`; newcomer run 32 saw only the ShapeError there), then what to do."""
    given = " ".join(f"{k}={v}" for k, v in e.dims.items())
    return (f"{DIMS_BOX} {given} do not fit {e.model}: {INTERNAL_NAME.sub('', e.said)}\nA shape that follows from "
            f"them does not fit the model's own fixed shapes; change or clear them in the sidebar's {DIMS_BOX} box.")


SHAPE_BOXES = {"batch": "Batch", "seq": "Sequence length"}
"""The sidebar's boxes a dim that sets the batch or sequence length overrides (`session.override_notes`' labels)."""


def dims_refused(e: InputDimsError, dims_from: str = "") -> str:
    """The session's refusal of the Input dims box's dims in the app's words (the CLI's, `--dim` said as the box):
    `Input dims: sequence_lenght names no dimension of roberta.onnx's inputs (its named dims: batch, seq)`, then what
    to do. `dims_from`: the model the box's same dims were last loaded with ('' none): a box kept from it says so."""
    text = e.said_as(f"{DIMS_BOX}:")
    if e.kind == "bound":
        text += f"; it overrides the {SHAPE_BOXES[e.box]} box, which takes at most {e.most}"
    if dims_from:
        text += f"; the box still holds the dims given for {dims_from}"
    return f"{text}: clear or change the {DIMS_BOX} box."


def dims_notes(meta: dict, dims: str, batch: int, seq: int) -> list[str]:
    """What the Input dims box's text `dims` overrode of the Batch and Sequence length boxes (`batch`, `seq`) for a
    model with `meta`, one note each, as the CLI says it with `--dim` (`session.override_notes`): `sequence_length=40
    from Input dims overrides Sequence length 16`. [] for a box that does not parse."""
    try:
        given = dict(parse_dims(dims))
    except SourceError:
        return []
    return session.override_notes(meta, given, batch, seq, DIMS_BOX, SHAPE_BOXES)


def explain_error(e: Exception, source: str, preset: str, onnx: bool = False, text: str | None = None,
                  dims_from: str = "") -> str:
    """An exception as a message with what to do, matched by its type. `onnx`: the path or upload is an ONNX file,
    named so ("the uploaded ONNX file"; a newcomer's bart-full.onnx was "the uploaded checkpoint").

    An error in IR text says where, as the CLI does (`ir.syntax_error_line`: `IR text:3:16: IR syntax error: ...`;
    a lint error `IR text: line 3: invalid graph: ...`), then the line it points at with a caret under the column
    (`ir.quote_place`, the one formatter of the place; for a lint error the line of `text` that defines the node),
    then what to do. The quoted line is data: the message pane shows it escaped (`statusbar._md_text`). `dims_from`:
    the model the Input dims box's dims were last loaded with (`dims_refused`)."""
    kind = "ONNX file" if onnx else "checkpoint"
    what = {"preset": f"building preset {preset!r}", "checkpoint": f"loading the {kind} at the server path"
            if onnx else "loading the checkpoint folder",
            "upload": f"loading the uploaded {kind}", "ir": "reading the IR text"}[source]
    if isinstance(e, GraphTextError) and e.line and text is not None and e.line <= len(lines := text.splitlines()):
        return (f"{INTERNAL_NAME.sub('', str(e))}\n{quote_place(lines[e.line - 1], e.col or 1)}\nThe IR text parses "
                f"but is not a valid graph: fix line {e.line} at the caret ({IR_SYNTAX_HELP}).")
    if isinstance(e, UnboundDimsError):  # the CLI's --dim and --inputs said as the app's Input dims box
        return app_remedy(e)
    if isinstance(e, DimsMisfitError):
        return misfit_remedy(e)
    if isinstance(e, InputDimsError):
        return dims_refused(e, dims_from)
    if isinstance(e, SourceError | SessionError):
        # `bert-tiny: variant layer 5 ...`, not `[build_bert] variant ...`
        return INTERNAL_NAME.sub("", str(e))
    if isinstance(e, IRSyntaxError):
        return (f"{syntax_error_line('IR text', e.line, e.col, e.reason)}\n{e.quoted}\nThe IR text does not parse: "
                f"fix line {e.line} at the caret ({IR_SYNTAX_HELP}).")
    if isinstance(e, GraphError):
        return f"The graph is invalid: {e}\nFix the node shown and load again."
    return (f"Error while {what}: {type(e).__name__}: {e}\nChange the settings and try again; details:\n"
            + "".join(traceback.format_exception_only(e)).strip())


def md_lines(text: str) -> str:
    """Plain text as Markdown lines: each line escaped, its line break and indentation kept."""
    return "  \n".join(md_escape(line).replace("  ", "&nbsp;&nbsp;") for line in text.splitlines())


STALE_WHY_CHARS = 200
"""At most this many characters of a failure's first line in the stale banner (`stale_why`)."""


def stale_why(message: str) -> str:
    """A failure's reason as the stale banner (`stale.StaleMark`, `AppState.stale`) says it: the first line of its
    message (`IR text:9:12: IR syntax error: undefined value %9999`), at most `STALE_WHY_CHARS` characters, ending
    in a full stop. The banner says it itself: it pointed at "the message above", which a dismissed message was
    no longer."""
    line = next((ln.strip() for ln in message.splitlines() if ln.strip()), "no reason was given")
    if len(line) > STALE_WHY_CHARS:
        line = line[:STALE_WHY_CHARS - 1].rstrip() + "…"
    return line if line.endswith((".", "!", "?", "…")) else line + "."


def stale_more(message: str) -> str:
    """A failure's whole message where `stale_why` cuts any of it (a line past `STALE_WHY_CHARS`, lines after the
    first), for the stale box to unfold (`stale.StaleMark`): the banner may be dismissed, the stale box stays; ''
    where the stale box says it whole."""
    whole = message.strip()
    return whole if stale_why(whole) not in (whole, whole + ".") else ""


__all__ = ["APP_DIMS", "SHAPE_BOXES", "STALE_WHY_CHARS", "dims_notes", "dims_refused", "explain_error",
           "hide_server_paths", "md_lines", "scrub_paths", "stale_more", "stale_why", "timing_hint"]
