"""Load a Hugging Face BERT checkpoint folder (safetensors only) into a `Model`.

A folder holds `config.json` and `model.safetensors` (or a sharded `model.safetensors.index.json`),
optionally `tokenizer.json`. Tensors are read with the `safetensors` NumPy API; PyTorch is never
imported. Pickled checkpoints (`pytorch_model.bin`, `*.pt`, `*.pkl`, ...) are refused without being
opened: unpickling runs arbitrary code chosen by whoever wrote the file.

Hugging Face `Linear` weights are stored `[out, in]`; they are transposed to the graph's `[in, out]`.
Keys may carry a `bert.` prefix (e.g. `BertForMaskedLM` checkpoints) or none (`BertModel`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..ir import Graph
from .bert import BertConfig, Variant, build_bert, rlx_weights_from_hf
from .presets import Model

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
"""File suffixes of pickled (PyTorch / joblib) checkpoints, which are never opened."""

KEY_PREFIXES = ("", "bert.")
"""Key prefixes tried, in order, to find the encoder's tensors in a checkpoint."""

_LINEAR = re.compile(r"(attention\.self\.(query|key|value)|dense)\.weight$")


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message says which file or tensor and why."""


def _within(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def resolve_folder(folder: str | Path, allowed_roots: Sequence[str | Path] | None = None) -> Path:
    """The resolved checkpoint folder, checked against `allowed_roots`.

    Args:
        folder: a checkpoint directory (`~` is expanded, symlinks resolved).
        allowed_roots: when given, the resolved folder must be one of these directories or inside one.

    Raises:
        CheckpointError: outside the allowed roots (checked before anything is looked at), missing,
            a pickled checkpoint file, or not a directory.
    """
    path = Path(folder).expanduser().resolve()
    if allowed_roots is not None:
        roots = [Path(r).expanduser().resolve() for r in allowed_roots]
        if not _within(path, roots):
            raise CheckpointError(f"{folder}: outside the allowed model folders "
                                  f"({', '.join(str(r) for r in roots) or 'none configured'})")
    if path.is_file() and path.suffix.lower() in PICKLE_SUFFIXES:
        raise CheckpointError(_pickle_message([path]))
    if not path.exists():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    if not path.is_dir():
        raise CheckpointError(f"{folder}: not a folder; give the folder holding config.json and model.safetensors")
    return path


def _pickle_message(files: Sequence[Path]) -> str:
    names = ", ".join(f.name for f in files)
    return (f"refusing pickled checkpoint {names}: loading a pickle can execute arbitrary code, so it is never "
            "opened; convert it to model.safetensors (e.g. with the safetensors package) and retry")


def read_config(path: Path) -> BertConfig:
    """`BertConfig` from `path/config.json`.

    Raises:
        CheckpointError: missing or unreadable file, invalid JSON (with line/column), not a JSON object,
            a non-BERT `model_type`, relative position embeddings, missing keys or impossible sizes.
    """
    file = path / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{path}: no config.json (a Hugging Face checkpoint folder needs one)")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: cannot read: {e}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type", "bert")
    if model_type != "bert":
        raise CheckpointError(f"{file}: model_type {model_type!r} is not supported (only 'bert')")
    pos_type = raw.get("position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise CheckpointError(f"{file}: position_embedding_type {pos_type!r} is not supported (only 'absolute')")
    act = raw.get("hidden_act", "gelu")
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"):
        raise CheckpointError(f"{file}: hidden_act {act!r} is not supported")
    try:
        cfg = BertConfig.from_hf(raw)
    except ValueError as e:
        raise CheckpointError(f"{file}: {e}") from None
    except TypeError as e:
        raise CheckpointError(f"{file}: a size is not a number ({e})") from None
    sizes = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden, "num_attention_heads": cfg.heads,
             "intermediate_size": cfg.intermediate, "num_hidden_layers": cfg.layers,
             "max_position_embeddings": cfg.max_position, "type_vocab_size": cfg.type_vocab}
    for key, value in sizes.items():
        if value <= 0:
            raise CheckpointError(f"{file}: {key} must be positive, got {value}")
    if cfg.hidden % cfg.heads:
        raise CheckpointError(f"{file}: hidden_size {cfg.hidden} is not divisible by num_attention_heads {cfg.heads}")
    return cfg


def _tensor_files(path: Path) -> list[Path]:
    """The safetensors file(s) of the folder: `model.safetensors`, or the shards named by the index."""
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({type(e).__name__}: {e})") from None
        files = []
        for n in names:
            f = (path / str(n)).resolve()
            if f.parent != path or not f.name.endswith(".safetensors"):
                raise CheckpointError(f"{index}: shard {n!r} is not a .safetensors file in the folder")
            files.append(f)
        return files
    pickles = sorted(f for f in path.iterdir() if f.is_file() and f.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(_pickle_message(pickles))
    raise CheckpointError(f"{path}: no model.safetensors (nor model.safetensors.index.json)")


def read_tensors(files: Sequence[Path]) -> dict[str, np.ndarray]:
    """All tensors of the safetensors `files` as NumPy arrays (float16 widened to float32).

    Raises:
        CheckpointError: missing, truncated or corrupted file, or a dtype NumPy cannot hold (e.g. bfloat16),
            naming the file (and tensor).
    """
    from safetensors import SafetensorError, safe_open

    out: dict[str, np.ndarray] = {}
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: missing safetensors file")
        try:
            handle = safe_open(str(f), framework="np")
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{f}: truncated or corrupted safetensors file ({e})") from None
        with handle:
            for key in handle.keys():
                try:
                    arr = handle.get_tensor(key)
                except (SafetensorError, TypeError, ValueError) as e:
                    hint = "; NumPy has no bfloat16: save the checkpoint as float32 or float16" \
                        if "bfloat16" in str(e) else ""
                    raise CheckpointError(f"{f}: cannot read tensor {key!r} ({e}){hint}") from None
                if arr.dtype.name == "bfloat16":  # readable only when ml_dtypes (an onnx dependency) is installed
                    raise CheckpointError(f"{f}: cannot read tensor {key!r} (bfloat16); NumPy has no bfloat16: "
                                          "save the checkpoint as float32 or float16")
                out[key] = arr.astype(np.float32) if arr.dtype == np.float16 else arr
    return out


def _prefix(tensors: dict[str, np.ndarray]) -> str:
    probe = "embeddings.word_embeddings.weight"
    for p in KEY_PREFIXES:
        if p + probe in tensors:
            return p
    tried = " or ".join(repr(p + probe) for p in KEY_PREFIXES)
    raise CheckpointError(f"missing tensor {tried}; is this a BERT checkpoint?")


def hf_weights(tensors: dict[str, np.ndarray], graph: Graph) -> dict[str, np.ndarray]:
    """Map checkpoint tensors onto the params of a Hugging Face style BERT `graph` (`[in, out]`, float32).

    Raises:
        CheckpointError: a missing tensor (named), a mis-shaped one (named, with the expected checkpoint
            shape and the found one) or a non-float dtype.
    """
    prefix = _prefix(tensors)
    out: dict[str, np.ndarray] = {}
    for p in graph.params:
        name = p.attrs["name"]
        key = prefix + name
        linear = p.rank == 2 and bool(_LINEAR.search(name))
        want = tuple(reversed(p.shape)) if linear else p.shape
        if key not in tensors:
            raise CheckpointError(f"missing tensor {key!r} (expected shape {list(want)})")
        arr = tensors[key]
        if tuple(arr.shape) != want:
            raise CheckpointError(f"tensor {key!r} has shape {list(arr.shape)}, expected {list(want)}")
        if arr.dtype.kind != "f":
            raise CheckpointError(f"tensor {key!r} has dtype {arr.dtype}, expected a float type")
        arr = arr.astype(np.float32, copy=False)
        out[name] = np.ascontiguousarray(arr.T) if linear else arr
    return out


def load_checkpoint(folder: str | Path, batch: int = 1, seq: int = 128,
                    allowed_roots: Sequence[str | Path] | None = None, *, style: str = "hf",
                    variant: Variant | None = None, name: str | None = None,
                    description: str | None = None) -> Model:
    """A Hugging Face BERT checkpoint as a `Model` with its real weights.

    Args:
        folder: directory with `config.json`, `model.safetensors` (or an index + shards),
            optionally `tokenizer.json`.
        batch, seq: static input shape `[batch, seq]`; `seq` must not exceed `max_position_embeddings`.
        allowed_roots: when given, the resolved folder must lie inside one of these directories
            (and so must the files it holds, after resolving symlinks).
        style: `"hf"` (Hugging Face primitives, default) or `"rlx"` (fused QKV, weights concatenated).
        variant: an optional teaching variant (see `bert.VARIANTS`).
        name, description: for the `Model` record (default: the folder path, a summary of the sizes).

    Returns:
        `Model` whose graph takes `input_ids`, `attention_mask` (int64 `[batch, seq]`) and returns
        `last_hidden_state` (float32 `[batch, seq, hidden]`); `meta` holds the folder, files and unused keys.

    Raises:
        CheckpointError: every problem with the folder, its config or its tensors (see the helpers above).
    """
    path = resolve_folder(folder, allowed_roots)
    cfg = read_config(path)
    files = _tensor_files(path)
    if allowed_roots is not None:
        roots = [Path(r).expanduser().resolve() for r in allowed_roots]
        for f in files:
            if not _within(f.resolve(), roots):
                raise CheckpointError(f"{f.name}: resolves outside the allowed model folders")
    if style not in ("hf", "rlx"):
        raise CheckpointError(f"style must be 'hf' or 'rlx', got {style!r}")
    if not 0 < seq <= cfg.max_position:
        raise CheckpointError(f"seq {seq} must be in 1..{cfg.max_position} (max_position_embeddings)")
    if batch <= 0:
        raise CheckpointError(f"batch must be positive, got {batch}")
    try:
        graph = build_bert(cfg, batch, seq, style, variant, name=re.sub(r"\W", "_", path.name) or "checkpoint")
        hf_graph = graph if style == "hf" else build_bert(cfg, batch, seq, "hf")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    tensors = read_tensors(files)
    weights = hf_weights(tensors, hf_graph)
    prefix = _prefix(tensors)
    unused = sorted(k for k in tensors if not (k.startswith(prefix) and k[len(prefix):] in weights))
    if style == "rlx":
        weights = rlx_weights_from_hf(weights, cfg)
    tok = path / "tokenizer.json"
    desc = description or (f"BERT checkpoint {path.name}: {cfg.layers} layers, hidden {cfg.hidden}, "
                           f"{cfg.heads} heads")
    return Model(name or str(path), graph, weights, cfg, desc, tok if tok.is_file() else None,
                 {"folder": str(path), "files": [str(f) for f in files], "key_prefix": prefix,
                  "unused_tensors": unused})


__all__ = ["KEY_PREFIXES", "PICKLE_SUFFIXES", "CheckpointError", "hf_weights", "load_checkpoint", "read_config",
           "read_tensors", "resolve_folder"]
