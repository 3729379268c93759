"""Loading a model for any front end: a preset, a Hugging Face checkpoint folder, an IR file or IR text.

Every path goes through one limits record (`Limits`), one variant list and one cache keyed by
content (preset and shapes, folder and shapes, or a digest of IR text). Errors a user can fix are
`SessionError`s with a one-line message; IR syntax errors keep their type (`IRSyntaxError`, with
line, column and caret) for front ends that show the caret.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..ir import Graph, GraphError, IRSyntaxError, from_json, lint, parse_ir, safejson, syntax_error_line
from ..ir.identity import DigestCache
from ..ir.memory import MemoryBudgetError
from ..ir.parser import node_line
from ..ir.serialize import NotGraphJSON
from ..models import PRESETS, CheckpointError, Model, load_checkpoint, load_model, random_weights
from ..models.bert import VariantLayerError as _BuiltPastLayers
from ..models.checkpoint import read_config_file
from ..models.onnx import OnnxImportError, load_onnx
from ..models.onnx.dims import DimError, dim_roles, parse_onnx, proto_input_shapes
from ..models.onnx.size import over_budget
from ..models.onnx.weights import lazy_names
from ..passes import layer_of
from ..passes.trace import layer_keys
from .cache import LRUCache
from .defaults import DEFAULT_BATCH, DEFAULT_SEQ
from .dimroles import ROLES_META, check_dims
from .errors import DimsMisfitError, GraphTextError, LimitError, SessionError, VariantLayerError
from .inputs import unbound_dims
from .limits import Limits, human_bytes
from .variants import effective_seq, graph_variant, preset_is_bert, variant_named, variant_unavailable

MODELS = LRUCache(maxsize=4)
"""Loaded models by content key, shared by every session of the process."""

SHAPES = LRUCache(maxsize=16)
"""Bound input shapes of `.onnx` files (`onnx.dims`), so a cached model is found without parsing its file again."""

MAX_IR_FILE_BYTES = 64 << 20
"""Largest IR text / graph JSON file read (bytes; also at most the memory limit)."""

IR_SUFFIXES = (".ir", ".rlx", ".txt")
"""The suffixes of IR text files (`format_graph` form): what the CLI's help and the app's IR file box name. `load`
reads any other file that is no `.onnx` export, graph JSON or array file as IR text too."""

_LOOKS_LIKE_IR = re.compile(r"\A(?:\s*(?:#|//)[^\n]*\n|\s+)*graph\b")
"""IR text's start: blank and comment lines (`#`, `//`), then `graph`. A file of another suffix whose text does not
start so is named as no model rlxviz reads, not blamed for a syntax error at its first character."""

GRAPH_JSON_SUFFIX = ".json"
"""A graph in rlxviz's JSON form (`to_json`), read by `load_ir_file`."""

ARRAY_SUFFIXES = (".npz", ".npy")
"""NumPy array files: a model's inputs or outputs (`--inputs`, `--expect`), never a model (`load` says so)."""

PATH_SUFFIXES = (*IR_SUFFIXES, GRAPH_JSON_SUFFIX, ".onnx", *ARRAY_SUFFIXES)
"""Suffixes that make a MODEL argument look like a file path (as does a `/`)."""


def first_line(e: BaseException) -> str:
    """An exception's message, first line only (a KeyError's argument without its quotes)."""
    msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    return str(msg).strip().splitlines()[0] if str(msg).strip() else type(e).__name__


def dims_misfit(model: str, dims: Mapping[str, int], said: str) -> DimsMisfitError:
    """The error for an `.onnx` import that failed on a shape (`said`, its error) once `dims` were bound: the dims
    first, as `--dim` options (`M: --dim height=64 --dim width=64 do not fit this model: Add node ...: ShapeError:
    ...`), so a message cut to its start still names them (newcomer run 32: the app's first line did not)."""
    given = " ".join(f"--dim {k}={v}" for k, v in dims.items())
    return DimsMisfitError(f"{model}: {given} do not fit this model: {said}; change or leave out the --dim values",
                           model, dict(dims), said)


def unknown_model(model: str, what: str = f"a checkpoint folder, an .onnx file nor an IR file "
                                         f"({', '.join((*IR_SUFFIXES, GRAPH_JSON_SUFFIX))})") -> SessionError:
    """The error for a MODEL that is neither a preset nor an existing path: `FILE: no such file or folder`
    when it looks like a path (contains `/` or ends in one of `PATH_SUFFIXES`), else `unknown model ...`."""
    if "/" in model or model.lower().endswith(PATH_SUFFIXES):
        return SessionError(f"{model}: no such file or folder (MODEL is a preset name or an existing path)")
    return SessionError(f"unknown model {model!r}: not a preset ({', '.join(sorted(PRESETS))}), {what}")


def presets() -> dict[str, str]:
    """Preset name -> one-line description, the real MiniLM first."""
    names = sorted(PRESETS, key=lambda n: (n != "minilm", n))
    return {n: PRESETS[n][1] for n in names}


def default_preset() -> str:
    """`minilm` when its package is installed, else the first random-weight preset."""
    from ..models import minilm_dir

    try:
        minilm_dir()
        return "minilm"
    except CheckpointError:
        return next(n for n in presets() if n != "minilm")


_LAYERS: DigestCache[tuple[int, ...]] = DigestCache(limit=8)


def layer_indices(graph: Graph) -> tuple[int, ...]:
    """Layer indices present in the graph's node paths (`encoder.layer.3...` -> 3; per stack in an encoder-decoder
    model, `passes.trace.Layer`, qualified so their labels name the stack), sorted, as the cached tuple
    itself (graphs are immutable; the per-layer views ask it once per layer: 2,000 whole-graph scans at 1,000
    layers, and a copy per call at 10^4)."""
    return _LAYERS.get_or_compute(graph, lambda: layer_keys(i for n in graph if (i := layer_of(n.path)) is not None))


def model_layers(graph: Graph) -> list[int]:
    """`layer_indices(graph)` as a new list."""
    return list(layer_indices(graph))


IR_DESCRIPTION = "graph from"
"""How the description of a model read from IR text or an IR file begins (`_graph_model`)."""


def shape_summary(model: Model, batch: int, seq: int) -> str:
    """What the model was built for, as one phrase: `batch 1, seq 16` for presets, checkpoints and ONNX exports
    (their batch/seq dims are bound to `batch`/`seq`), and the graph's own input shapes for a graph read from IR
    text or an IR file, whose shapes are its own (`inputs hidden f32[2, 8, 64], attention_mask i64[2, 8]`).
    Raises nothing."""
    if not model.description.startswith(IR_DESCRIPTION):
        return f"batch {batch}, seq {seq}"
    return "inputs " + (", ".join(f"{n.attrs['name']} {n.type}" for n in model.graph.inputs) or "none")


def _graph_model(g: Graph, name: str, description: str, limits: Limits, source: str, meta: dict,
                 text: str | None = None) -> Model:
    """`g` linted and size-checked, as a Model with random weights. A lint error is a one-line SessionError; for
    a graph read from IR `text`, a GraphTextError with the line that defines the node it names."""
    try:
        g = lint(g, "parse")
    except GraphError as e:
        at = node_line(text, e.node_id) if text is not None and e.node_id is not None else None
        if at is None:
            raise SessionError(f"{source}: invalid graph: {first_line(e)}") from None
        reason = e.reason or first_line(e)
        raise GraphTextError(f"{source}: line {at[0]}: invalid graph: {reason}", at[0], at[1], reason) from None
    limits.check(g, source)  # before the weights are allocated
    return Model(name, g, random_weights(g, seed=0), None, description, meta=meta)


def load_ir_text(text: str, limits: Limits | None = None, source: str = "IR text") -> Model:
    """A model from IR text (`format_graph` form): the parsed, linted graph with seeded random float32
    weights made from its param shapes, cached by a digest of the text.

    Raises:
        IRSyntaxError: malformed text (line, column, caret).
        GraphTextError: a graph that parses but is invalid (the line defining the node it names).
        SessionError: other invalid graphs. LimitError: over the memory limit.
    """
    limits = limits or Limits.resolve()
    digest = hashlib.sha256(text.encode()).hexdigest()

    def build() -> Model:
        g = parse_ir(text, verify=False)  # `_graph_model` lints: an invalid graph is a one-line SessionError
        return _graph_model(g, g.name, f"{IR_DESCRIPTION} IR text", limits, source, {}, text)

    return MODELS.get_or_compute(("ir", digest, limits.max_bytes), build)


def load_ir_file(path: str | Path, limits: Limits | None = None) -> Model:
    """A model from an IR text file (`.json`: the graph's JSON form, `to_json`), with random weights.

    Raises:
        SessionError: unreadable file, IR syntax error (one line, `FILE:LINE:COL: ...`), a JSON file that is
            not rlxviz's graph JSON (`to_json` form: e.g. an export's metadata), an invalid graph,
            or (`LimitError`) a file or a run's peak memory over the memory limit.
    """
    p = Path(path)
    limits = limits or Limits.resolve()
    if p.suffix.lower() in ARRAY_SUFFIXES:
        raise SessionError(f"{path}: a NumPy {p.suffix.lower()} of arrays (a model's inputs or outputs), not a model: "
                           "give it with --inputs (or --expect), after the model")
    try:
        size = p.stat().st_size
        if size > min(MAX_IR_FILE_BYTES, limits.max_bytes):
            raise SessionError(f"{path}: {human_bytes(size)} of IR text, over the limit of "
                               f"{human_bytes(min(MAX_IR_FILE_BYTES, limits.max_bytes))} on IR files")
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SessionError(f"{path}: cannot read IR text ({type(e).__name__}: {e})") from None
    if p.suffix.lower() == ".json":
        _refuse_model_config(p, text)
    try:
        # `_graph_model` lints (an invalid graph's error names the line that defines the node)
        g = from_json(text) if p.suffix.lower() == ".json" else parse_ir(text, verify=False)
    except IRSyntaxError as e:
        if p.suffix.lower() not in IR_SUFFIXES and not _LOOKS_LIKE_IR.match(text):  # README.md: not IR at all
            raise SessionError(f"{path}: not IR text (IR starts with `graph NAME {{`) and no other kind of model "
                               f"rlxviz reads: MODEL is a preset name, a checkpoint folder, an .onnx file or an IR "
                               f"file ({', '.join((*IR_SUFFIXES, GRAPH_JSON_SUFFIX))})") from None
        raise SessionError(syntax_error_line(str(path), e.line, e.col, e.reason)) from None
    except NotGraphJSON as e:
        raise SessionError(f"{path}: {first_line(e)}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise SessionError(f"{path}: not a valid graph: {first_line(e)}") from None
    return _graph_model(g, g.name, f"{IR_DESCRIPTION} {p.name} (random weights)", limits, str(path),
                        {"ir_file": str(p)}, None if p.suffix.lower() == ".json" else text)


def _refuse_model_config(p: Path, text: str) -> None:
    """Raise SessionError when the JSON file `p` is a Hugging Face model config, not a graph: its own limits first
    (a config over them is refused as such, before anything is built), else where it belongs."""
    try:
        raw = safejson.loads(text)
    except ValueError:  # JSONTextError: bad, too deep or too long; from_json reports it as one line
        return
    if not isinstance(raw, dict) or "model_type" not in raw:
        return
    try:
        read_config_file(p)
    except CheckpointError as e:
        raise SessionError(first_line(e)) from None
    raise SessionError(f"{p}: a Hugging Face model config, not a graph: give the folder that holds it as config.json "
                       "next to model.safetensors")


def _within_roots(p: Path, roots: Sequence[Path]) -> Path:
    """`p` resolved, if it lies inside one of `roots` and is a file. Raises SessionError otherwise."""
    path = p.expanduser().resolve()
    resolved = [Path(r).expanduser().resolve() for r in roots]
    if not any(path.is_relative_to(r) for r in resolved):
        raise SessionError(f"{p}: outside the allowed model folders ({', '.join(map(str, resolved)) or 'none'})")
    if not path.is_file():
        raise SessionError(f"{p}: no such file")
    return path


def load(model: str, batch: int = DEFAULT_BATCH, seq: int = DEFAULT_SEQ, style: str | None = None,
         variant: str | None = None, variant_layer: int = 0, limits: Limits | None = None, threshold: int | None = None,
         allowed_roots: Sequence[Path] | None = None, max_seq: int | None = None,
         dims: Mapping[str, int] | None = None, input_shapes: Mapping[str, Sequence[int]] | None = None,
         bounds: Mapping[str, int] | None = None) -> Model:
    """A model by preset name, Hugging Face checkpoint folder, or IR text file, checked against `limits`.

    Args:
        model: a preset (`bert-tiny`, `minilm`, `llama-block`, ...), a folder with config.json +
            model.safetensors (or that folder's config.json), an `.onnx` export (`models.onnx.load_onnx`:
            symbolic batch/seq dims bound to `batch`/`seq`), or a file with IR text (`.json`: the graph's JSON
            form; random weights).
        batch / seq: static input shape of the built graph (ignored for IR files).
        style: `hf` or `rlx` BERT form (None: the preset's own style; `hf` for folders).
        variant: a teaching variant name (`models.VARIANTS`) changing layer `variant_layer`; `over_threshold`
            raises `seq` over the attention gate (`effective_seq` with `threshold`, capped at `max_seq`).
        limits: the memory limits (default `Limits.resolve()`: environment or 2048 MiB).
        allowed_roots: for folders, `.onnx` files and IR text files (`IR_SUFFIXES`), directories the path must
            lie in (None: any folder).
        dims, input_shapes: for an `.onnx` file, values of symbolic dim names (`--dim`) and full shapes of some
            inputs (`--inputs`), bound before the import (`models.onnx.dims.bind_input_shapes`: a dim expression
            such as `past_sequence_length + sequence_length` is the sum of the values the other inputs use).
            Refused for any other model. A name no input of the file has is refused; a dim that sets the batch or
            sequence length overrides `batch` / `seq` (`session.dimroles`; the model's `meta["dim_roles"]` says
            which do).
        bounds: the most a dim that sets the batch (`"batch"`) or sequence length (`"seq"`) may be (the app's
            boxes' bounds; None: only the memory limit).

    Raises:
        SessionError: unknown model or variant, unreadable or malformed IR (with line and column), a variant
            where it does not apply (`variants.variant_unavailable`: an IR or ONNX file, a non-BERT preset), a
            checkpoint the loader refuses, or (`LimitError`) tensors over the limit; `InputDimsError` for
            `dims` the file's inputs do not name or past `bounds`.
    """
    limits = limits or Limits.resolve()
    v = variant_named(variant, variant_layer)
    p = Path(model)
    if model not in PRESETS and p.name == "config.json" and p.is_file():
        p = p.parent  # a checkpoint's config.json names its folder (its limits are checked before anything is built)
    if v is not None:
        kind = ("preset" if model in PRESETS else "onnx" if p.suffix.lower() == ".onnx" and not p.is_dir()
                else "ir" if p.suffix.lower() in IR_SUFFIXES and (p.is_file() or allowed_roots is not None)
                and not p.is_dir()
                else "checkpoint" if p.is_dir() or allowed_roots is not None else "ir" if p.is_file() else "")
        why = variant_unavailable(variant, kind, model, model not in PRESETS or preset_is_bert(model)) if kind else ""
        if why:
            raise SessionError(why)
    seq = effective_seq(v, batch, seq, threshold, max_seq)
    gv = graph_variant(v)
    kwargs = {"variant": gv} if style is None else {"variant": gv, "style": style}
    if (dims or input_shapes) and not (p.suffix.lower() == ".onnx" and (p.is_file() or allowed_roots is not None)):
        raise SessionError(f"{model}: --dim / input shapes bind an .onnx file's symbolic dims; this model has fixed "
                           f"shapes (use --batch / --seq)")
    try:
        if model in PRESETS:
            m = MODELS.get_or_compute(("preset", model, batch, seq, style, gv),
                                      lambda: load_model(model, batch=batch, seq=seq, **kwargs))
        elif p.suffix.lower() == ".onnx" and (p.is_file() or allowed_roots is not None):
            if allowed_roots is not None:  # a typed path (the app's folder box): inside the roots, checked first
                p = _within_roots(p, allowed_roots)
            if (why := over_budget(p, limits.max_bytes)) is not None:  # before any parse: onnx.dims reads the file
                raise OnnxImportError(f"{model}: {why}")
            st = p.stat()
            key = ("onnx-shapes", str(p.resolve()), st.st_mtime_ns, st.st_size, batch, seq,
                   tuple(sorted((dims or {}).items())),
                   tuple(sorted((k, tuple(v)) for k, v in (input_shapes or {}).items())))
            parsed: list[Any] = []  # the file parsed for its input shapes, handed to the import: parsed once

            def proto() -> Any:
                if not parsed:
                    parsed.append(parse_onnx(p))
                return parsed[0]

            def roles_of() -> dict[str, str]:
                g = proto().graph
                return dim_roles(g.input, {t.name for t in g.initializer})

            roles = SHAPES.get_or_compute(("onnx-roles", str(p.resolve()), st.st_mtime_ns, st.st_size), roles_of)
            check_dims(dims, roles, p.name, bounds)  # a typo or another model's dims: refused, not ignored
            shapes = SHAPES.get_or_compute(key, lambda: proto_input_shapes(proto(), batch, seq, dims, input_shapes))
            m = MODELS.get_or_compute(("onnx", str(p.resolve()), p.stat().st_mtime_ns, batch, seq, limits.max_bytes,
                                       tuple(sorted(shapes.items()))),
                                      lambda: load_onnx(p, batch, seq, input_shapes=shapes, max_bytes=limits.max_bytes,
                                                        proto=parsed.pop() if parsed else None))
            parsed.clear()
            m.meta[ROLES_META] = dict(roles)  # the file's own: which dims override batch and seq (`dimroles`)
        elif p.suffix.lower() in IR_SUFFIXES and allowed_roots is not None and not p.is_dir():
            return load_ir_file(_within_roots(p, allowed_roots), limits)  # a typed path: inside the roots first
        elif p.is_dir() or allowed_roots is not None:  # with roots, the loader checks the folder before anything
            roots = None if allowed_roots is None else tuple(allowed_roots)
            m = MODELS.get_or_compute(("folder", str(p), roots, batch, seq, style, gv, limits.max_bytes),
                                      lambda: load_checkpoint(p, batch, seq, roots, max_bytes=limits.max_bytes,
                                                              **kwargs))
        elif p.is_file():
            return load_ir_file(p, limits)
        else:
            raise unknown_model(model)
    except SessionError:
        raise
    except _BuiltPastLayers as e:  # the builder's refusal, named after the model asked for
        raise VariantLayerError(model, e.layer, e.last) from None
    except DimError as e:  # dims batch and seq do not bind: all of them, and the inputs file beside the model
        raise unbound_dims(model, p, e) from None
    except MemoryBudgetError as e:  # a checkpoint's config or graph over the limit, before it was built or read
        raise LimitError(f"{first_line(e)} (the limit from {limits.source})", limit=limits.max_bytes) from None
    except (ValueError, KeyError, OSError) as e:
        msg = first_line(e)
        if dims and isinstance(e, OnnxImportError) and "ShapeError" in msg:  # the dims given are the likely cause
            raise dims_misfit(model, dims, msg.removeprefix(f"{model}: ")) from None
        raise SessionError(msg if msg.startswith(model) else f"{model}: {msg}") from None
    limits.check(m.graph, model, unloaded=lazy_names(m.weights))  # weights left in their file are read by run/time
    return m


__all__ = ["ARRAY_SUFFIXES", "GRAPH_JSON_SUFFIX", "IR_SUFFIXES", "MODELS", "PATH_SUFFIXES", "default_preset",
           "dims_misfit", "first_line", "layer_indices", "load", "load_ir_file", "load_ir_text", "model_layers",
           "presets", "unknown_model"]
