"""The errors the session raises for input a user can fix; every front end matches them by type.

All are `ValueError`s with a one-line message: the CLI prints it (exit 2), the app shows it, a
notebook cell raises it.
"""

from __future__ import annotations

from dataclasses import dataclass


class SessionError(ValueError):
    """A user error with a one-line message (unknown model, bad IR text, unknown pass, bad layer, ...)."""


class LimitError(SessionError):
    """A graph's inputs and params would need more memory than the limits record allows.

    Attributes:
        needed: bytes the refused tensors need.
        limit: bytes allowed.
    """

    def __init__(self, message: str, needed: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.needed = needed
        self.limit = limit


class GraphTextError(SessionError):
    """IR text that parses but is not a valid graph (a lint error), with where: `line` and `col` (1-based) of the
    line that defines the node the problem names (None when it names none), and `reason`, the problem alone.
    Front ends mark that line as they mark a syntax error's."""

    def __init__(self, message: str, line: int | None = None, col: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.line, self.col, self.reason = line, col, reason or message


@dataclass(frozen=True)
class DimsWords:
    """How a front end tells its user to bind an `.onnx` file's unbound dims (`UnboundDimsError.said_as`): the CLI's
    `--dim` and `--inputs` options (`CLI_DIMS`), or the app's Input dims box (`app.wording.APP_DIMS`).

    Attributes:
        bind: the dims to type, `{pairs}` in words (`set {pairs} in the sidebar's Input dims box`).
        pair: one dim as typed, `{name}` and `{value}` (`--dim {name}={value}`); a value no file gives is `N`.
        beside: what the inputs file lies beside (`the file`, `the model`).
        inputs: the option that reads that file's arrays, `{path}` (`--inputs {path}`); '' where there is none.
        own_hint: the message goes on with the importer's whole line, its own remedy in it (`pass --dim past=N
            (Python: dims={'past': N})`), so the lead is said only for what that lacks (a value, the file); else
            with the places alone (`what`), after a lead always said.
    """

    bind: str
    pair: str
    beside: str
    inputs: str = ""
    own_hint: bool = False


CLI_DIMS = DimsWords(bind="{pairs}", pair="--dim {name}={value}", beside="the file", inputs="--inputs {path}",
                     own_hint=True)
"""The CLI's and the Python API's words: `--dim past=7 (from the shapes in qwen2.kv.npz beside the file), or --inputs
F.npz; input 'attention_mask': dimension 1 (past + 1) needs 'past'; pass --dim past=N (Python: ...)`."""


class UnboundDimsError(SessionError):
    """An `.onnx` file's symbolic dims that nothing binds (`models.onnx.dims.DimError`), every one of them, said value
    first (`said_as`): the dims to type, with the values the inputs file beside the model gives, then where they are
    needed, so a front end that cuts the line (the app's stale box) still says what to type (qwen2.kv's `past=7` came
    after 190 characters, past the cut). The message is `said_as(CLI_DIMS)`; the app says it with its Input dims box.

    Attributes:
        model: the model as asked for (a path).
        what: the message's places alone: `input 'pixel_values': cannot bind dimensions 1 (num_channels), 2 (height)`.
        names: the dim names nothing binds, in order.
        input: the first input with an unbound dim.
        beside: the file name (no folder) of the `.npz` beside the model that holds `input`'s array, or ''.
        proposed: name -> value, read from that file's array shapes (its headers), for each of `names` it gives
            (empty without such a file).
        said: the importer's whole line, its remedy in the CLI's words (`pass --dim past=N (Python: ...)`).
        path: that `.npz` file's path, as `--inputs` takes it ('' without one).

    Every argument but the message has a default: the error pickles (`session.isolated` sends it back from its
    child) by its message, and its attributes follow.
    """

    def __init__(self, message: str, model: str = "", what: str = "", names: tuple[str, ...] = (), input: str = "",
                 beside: str = "", proposed: dict[str, int] | None = None, said: str = "", path: str = "") -> None:
        super().__init__(message)
        self.model, self.what, self.names, self.input = model, what or message, tuple(names), input
        self.beside, self.proposed, self.said, self.path = beside, dict(proposed or {}), said or message, path

    def pairs(self, pair: str = "{name}={value}") -> str:
        """The dims to type, each as `pair` (`DimsWords.pair`), with the value the inputs file beside the model gives
        or `N`: `num_channels=3 height=32 width=32` (the app's Input dims box shows them as its placeholder)."""
        return " ".join(pair.format(name=n, value=self.proposed.get(n, "N")) for n in self.names)

    def said_as(self, words: DimsWords) -> str:
        """The message in a front end's `words`, the dims to type first: `M: set past=7 in the sidebar's Input dims
        box (from the shapes in qwen2.kv.npz beside the model); input 'attention_mask': dimension 1 (past + 1) needs
        'past'`; with no value known, `N` stands for it; without such a file, `--dim` is the importer's own line's."""
        given = self.pairs(words.pair)
        source = ""
        if self.beside:
            source = (f" (from the shapes in {self.beside} beside {words.beside})" if self.proposed else
                      f" ({self.beside} beside {words.beside} holds the array of {self.input!r})")
        lead = words.bind.format(pairs=given) if self.proposed or not words.own_hint else ""
        if words.inputs and self.path:
            more = words.inputs.format(path=self.path)
            lead = f"{lead}{source}, or {more}" if self.proposed else f"{more}{source}"
        elif lead:
            lead += source
        body = self.said if words.own_hint else self.what
        return f"{self.model}: {lead}; {body}" if lead else f"{self.model}: {body}"


class DimsMisfitError(SessionError):
    """An `.onnx` file that failed to import on a shape once the dims given for it were bound (`--dim`, the app's Input
    dims box): `height=64 width=64` on deit.optimum, whose position embeddings fix the patch count. The message says
    the dims first, as the CLI names them (`M: --dim height=64 --dim width=64 do not fit this model: Add node ...:
    ShapeError: ...`), so a front end that shows only a first line still names them.

    Attributes:
        model: the model as asked for (a path).
        dims: name -> value, as given.
        said: the import's error alone (`Add node '/embeddings/Add' (opset 18): ShapeError: ...`).

    Every argument but the message has a default: the error pickles by its message, and its attributes follow.
    """

    def __init__(self, message: str, model: str = "", dims: dict[str, int] | None = None, said: str = "") -> None:
        super().__init__(message)
        self.model, self.dims, self.said = model, dict(dims or {}), said or message


class InputDimsError(SessionError):
    """Dims given for an `.onnx` file (`--dim`, the app's Input dims box) refused before the import: a name no input
    of the file has (`kind="unknown"`: a typo, or a box kept from another model), or a value past the most a front end
    lets the batch or sequence length that dim sets be (`kind="bound"`: the app's `Sequence length (≤ 512)`).

    Attributes:
        kind: `unknown` or `bound`.
        what: the message without the option that gave the dims (`sequence_lenght names no dimension of
            roberta.onnx's inputs (its named dims: batch, seq)`); the message is `said_as("--dim")`.
        names: the dims refused, as given.
        known: the file's input dim names (`kind="unknown"`), in order.
        box, most: the shape the dim sets (`batch` / `seq`) and the most it may be (`kind="bound"`; '' and 0 else).

    Every argument but the message has a default: the error pickles by its message, and its attributes follow.
    """

    def __init__(self, message: str, kind: str = "unknown", what: str = "", names: tuple[str, ...] = (),
                 known: tuple[str, ...] = (), box: str = "", most: int = 0) -> None:
        super().__init__(message)
        self.kind, self.what, self.names, self.known = kind, what or message, tuple(names), tuple(known)
        self.box, self.most = box, most

    def said_as(self, option: str) -> str:
        """The message with `option` naming what gave the dims (`--dim`, `Input dims:`)."""
        return f"{option} {self.what}"


class StoppedError(SessionError):
    """A load stopped from outside: past its CPU-time limit (or its wall-clock backstop), out of memory under its
    address-space cap, or its process died (`session.isolated`)."""


class VariantLayerError(SessionError):
    """A teaching variant asked of a layer the model does not have (`variant layer 9: bert-tiny has layers 0-1`).

    Attributes:
        layer: the layer asked for.
        last: the model's last layer (its layers are 0..last).

    The CLI names the option that chose the layer (`--variant-layer 9: bert-tiny has layers 0-1`); the app moves
    its "Layer to break" to `last` and says so."""

    def __init__(self, model: str, layer: int, last: int) -> None:
        self.model, self.layer, self.last = model, layer, last
        super().__init__(self.said_as("variant layer"))

    def said_as(self, option: str) -> str:
        """The message with `option` naming what chose the layer (`--variant-layer 9: bert-tiny has layers 0-1`)."""
        return f"{option} {self.layer}: {self.model} has layers 0-{self.last}"


class PipelineError(SessionError):
    """A pipeline that cannot be built: an unknown pass, an empty list, or a pass whose required pass is missing."""


__all__ = ["CLI_DIMS", "DimsMisfitError", "DimsWords", "GraphTextError", "InputDimsError", "LimitError",
           "PipelineError", "SessionError", "StoppedError", "UnboundDimsError", "VariantLayerError"]
