"""Load a Hugging Face BERT checkpoint folder (safetensors only) into a `Model`.

A folder holds `config.json` and `model.safetensors` (or a sharded `model.safetensors.index.json`),
optionally `tokenizer.json`. Tensors are read with the `safetensors` NumPy API; PyTorch is never
imported. Pickled checkpoints (`pytorch_model.bin`, `*.pt`, `*.pkl`, ...) are refused without being
opened: unpickling runs arbitrary code chosen by whoever wrote the file.

Hugging Face `Linear` weights are stored `[out, in]`; they are transposed to the graph's `[in, out]`.
Keys may carry a `bert.` prefix (e.g. `BertForMaskedLM` checkpoints) or none (`BertModel`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from ..ir import Graph, safejson
from ..ir import memory as _memory
from .bert import BertConfig, Variant, build_bert, rlx_weights_from_hf
from .presets import Model

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
"""File suffixes of pickled (PyTorch / joblib) checkpoints, which are never opened."""

KEY_PREFIXES = ("", "bert.")
"""Key prefixes tried, in order, to find the encoder's tensors in a checkpoint."""

_LINEAR = re.compile(r"(attention\.self\.(query|key|value)|dense)\.weight$")


CONFIG_BOUNDS: dict[str, int] = {
    "vocab_size": 1 << 22, "hidden_size": 1 << 16, "num_attention_heads": 1 << 10,
    "intermediate_size": 1 << 18, "num_hidden_layers": 512, "max_position_embeddings": 1 << 20,
    "type_vocab_size": 1 << 16,
}
"""Largest value accepted for each size in `config.json` (each well above any published BERT), checked
before anything is built; the memory budget (`config_bytes`, `ir.memory`) then bounds their product."""


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
        raise CheckpointError(f"{folder}: not a folder; give a checkpoint folder (it holds config.json and "
                              "model.safetensors) or an .onnx file")
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
    return read_config_file(file)


def read_config_file(file: Path) -> BertConfig:
    """`BertConfig` from a config file of any name; `read_config`'s checks, errors and limits."""
    try:
        if file.stat().st_size > MAX_CONFIG_BYTES:
            raise CheckpointError(f"{file}: larger than {MAX_CONFIG_BYTES // 1024} KiB; not a model config")
        raw = safejson.loads(file.read_text(encoding="utf-8"))
    except safejson.JSONTextError as e:
        raise CheckpointError(f"{file}: invalid JSON at line {e.line} column {e.col}: {e.reason}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: cannot read ({type(e).__name__})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type", "bert")
    if model_type != "bert":
        raise CheckpointError(f"{file}: model_type {_short(model_type)} is not supported (only 'bert')")
    pos_type = raw.get("position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise CheckpointError(f"{file}: position_embedding_type {_short(pos_type)} is not supported (only 'absolute')")
    act = raw.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"):
        raise CheckpointError(f"{file}: hidden_act {_short(act)} is not supported")
    for key, hi in CONFIG_BOUNDS.items():
        value = raw.get(key)
        if value is None and key in ("max_position_embeddings", "type_vocab_size"):
            continue  # defaults apply
        if key not in raw:
            raise CheckpointError(f"{file}: config.json lacks {key!r}, which a BERT config needs")
        if type(value) is not int:
            raise CheckpointError(f"{file}: {key} must be an integer, got {type(value).__name__} {_short(value)}")
        if value <= 0:
            raise CheckpointError(f"{file}: {key} must be positive, got {value}")
        if value > hi:
            raise CheckpointError(f"{file}: {key} {value} is over the limit of {hi}; refused before building")
    eps = raw.get("layer_norm_eps", 1e-12)
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 <= eps < 1:
        raise CheckpointError(f"{file}: layer_norm_eps must be a number in [0, 1), got {_short(eps)}")
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


MAX_CONFIG_BYTES = 1 << 20
"""Largest `config.json` read (bytes); real ones are under 2 KiB."""


def _short(value: object) -> str:
    """`repr(value)` cut to 40 characters, for error messages that quote a file's content."""
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."


def config_bytes(cfg: BertConfig, batch: int, seq: int) -> list[tuple[str, int]]:
    """What a BERT of `cfg` needs before it runs, by part (bytes; float32 params, int64 inputs), from the
    config alone: `[("params", ...), ("inputs", ...), ("activations", ...)]`. The activations count one
    layer's largest live set (attention scores, the FFN intermediate and a few hidden-sized tensors)."""
    h, inter, lay = cfg.hidden, cfg.intermediate, cfg.layers
    per_layer = 4 * h * h + 4 * h + 2 * h * inter + inter + h + 4 * h
    params = 4 * ((cfg.vocab_size + cfg.max_position + cfg.type_vocab) * h + 2 * h + lay * per_layer)
    tokens = batch * seq
    acts = 4 * (batch * cfg.heads * seq * seq * 2 + tokens * inter * 2 + tokens * h * 6)
    return [("params", params), ("inputs", 16 * tokens), ("activations", acts)]


def _tensor_files(path: Path) -> list[Path]:
    """The safetensors file(s) of the folder: `model.safetensors`, or the shards named by the index."""
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            if index.stat().st_size > 64 * MAX_CONFIG_BYTES:
                raise CheckpointError(f"{index}: larger than {64 * MAX_CONFIG_BYTES >> 20} MiB")
            weight_map = safejson.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(map(str, weight_map.values())))
        except (safejson.JSONTextError, KeyError, TypeError, AttributeError, OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({type(e).__name__})") from None
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


SAFETENSORS_DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL")
"""Safetensors dtypes `read_tensors` reads (float16 and bfloat16 widened to float32, exactly); any other (F8_E4M3,
F8_E5M2, U16, U32, U64, ...) is refused from the header, before any tensor data is read."""


def _header(f: Path) -> tuple[int, dict] | None:
    """(header length, header) of safetensors file `f`, or None when it cannot be read (`safe_open` then names
    what is wrong with the file)."""
    try:
        with f.open("rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if not 0 < n <= min(f.stat().st_size - 8, 100 << 20):
                return None
            header = safejson.loads(fh.read(n).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):  # safejson.JSONTextError is a ValueError
        return None
    return (n, header) if isinstance(header, dict) else None


def check_header_dtypes(f: Path) -> None:
    """Refuse a safetensors file holding a tensor of a dtype not in `SAFETENSORS_DTYPES`, from its JSON header
    alone. A header that cannot be read is left to `safe_open`, which names what is wrong with it.

    Raises:
        CheckpointError: one line naming the file, the tensor, its dtype and the supported dtypes.
    """
    _check_dtypes(f, (_header(f) or (0, {}))[1])


def _check_dtypes(f: Path, header: dict) -> None:
    """`check_header_dtypes` on the already parsed `header` of `f`."""
    for key, info in header.items():
        if key == "__metadata__" or not isinstance(info, dict):
            continue
        dtype = info.get("dtype")
        if dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"{f}: tensor {str(key)[:200]!r} has dtype {str(dtype)[:40]!r}, which rlxviz "
                                  f"cannot read (supported: {', '.join(SAFETENSORS_DTYPES)})")


def _bfloat16(f: Path, n: int, key: str, info: dict) -> np.ndarray:
    """Tensor `key` of dtype BF16 as float32, read from its bytes: bfloat16 is the upper half of a float32, so
    `u16 << 16` viewed as float32 is exact (NumPy has no bfloat16 of its own).

    Raises:
        CheckpointError: offsets or shape that do not describe the bytes the file holds.
    """
    shape, offsets = info.get("shape"), info.get("data_offsets")
    ok = (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
          and isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets))
    size = int(np.prod(shape, dtype=np.int64)) * 2 if ok else -1
    if not ok or offsets[1] - offsets[0] != size or offsets[0] < 0 or 8 + n + offsets[1] > f.stat().st_size:
        raise CheckpointError(f"{f}: tensor {key!r} (BF16): its shape and offsets do not match the file's bytes")
    with f.open("rb") as fh:
        fh.seek(8 + n + offsets[0])
        raw = np.frombuffer(fh.read(size), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)


def tensor_keys(files: Sequence[Path]) -> list[str]:
    """Every tensor name of the safetensors `files`, from their headers alone (no tensor data is read).
    Raises CheckpointError for a missing or unreadable file."""
    keys: list[str] = []
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: missing safetensors file")
        _, header = _header(f) or (0, {})
        keys += [k for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    return keys


def read_tensors(files: Sequence[Path], keep: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
    """The tensors of the safetensors `files` that `keep` accepts (default: all) as NumPy arrays (float16 and
    bfloat16 widened to float32, exactly). A tensor `keep` refuses is never read: a checkpoint's unused 1 GiB
    tensor costs nothing.

    Raises:
        CheckpointError: missing, truncated or corrupted file, or a dtype rlxviz cannot read (e.g. float8), naming
            the file (and tensor).
    """
    from safetensors import SafetensorError, safe_open

    out: dict[str, np.ndarray] = {}
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: missing safetensors file")
        n, header = _header(f) or (0, {})  # the header once: its dtypes checked before any data, BF16 offsets
        _check_dtypes(f, header)
        bf16 = {k for k, v in header.items() if isinstance(v, dict) and v.get("dtype") == "BF16"}
        try:
            handle = safe_open(str(f), framework="np")
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{f}: truncated or corrupted safetensors file ({e})") from None
        with handle:
            for key in handle.keys():
                if keep is not None and not keep(key):
                    continue
                if key in bf16:
                    out[key] = _bfloat16(f, n, key, header[key])
                    continue
                try:
                    arr = handle.get_tensor(key)
                except (SafetensorError, TypeError, ValueError, AttributeError) as e:
                    raise CheckpointError(f"{f}: cannot read tensor {key!r} ({e})") from None
                except BaseException as e:  # safetensors' Rust panic (out of memory) derives from BaseException
                    if type(e).__name__ != "PanicException":
                        raise
                    raise CheckpointError(f"{f}: cannot read tensor {key!r} (the reader failed: "
                                          f"{str(e).splitlines()[0][:200]})") from None
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


def check_within(files: Iterable[Path], allowed_roots: Sequence[str | Path] | None) -> None:
    """Refuse any of `files` whose real path (symlinks resolved) lies outside `allowed_roots` (None: no
    restriction). Called before a file is opened; the message names the file, never its content.

    Raises:
        CheckpointError: a file that resolves outside the allowed folders.
    """
    if allowed_roots is None:
        return
    roots = [Path(r).expanduser().resolve() for r in allowed_roots]
    for f in files:
        if f.exists() and not _within(f.resolve(), roots):
            raise CheckpointError(f"{f.name}: resolves outside the allowed model folders; not opened")


def load_checkpoint(folder: str | Path, batch: int = 1, seq: int = 128,
                    allowed_roots: Sequence[str | Path] | None = None, *, style: str = "hf",
                    variant: Variant | None = None, name: str | None = None,
                    description: str | None = None, max_bytes: int | None = None) -> Model:
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
        max_bytes: the memory limit (the session's `Limits.max_bytes`; None: not checked), checked on the
            config's sizes before the graph is built and on the graph's peak before any tensor is read.

    Returns:
        `Model` whose graph takes `input_ids`, `attention_mask` (int64 `[batch, seq]`) and returns
        `last_hidden_state` (float32 `[batch, seq, hidden]`); `meta` holds the folder, files and unused keys.

    Raises:
        CheckpointError: every problem with the folder, its config or its tensors (see the helpers above).
        MemoryBudgetError: the model needs more memory than `max_bytes`.
    """
    path = resolve_folder(folder, allowed_roots)
    check_within([path / "config.json", path / "model.safetensors.index.json", path / "tokenizer.json"],
                 allowed_roots)
    cfg = read_config(path)
    if max_bytes is not None:
        _memory.check_bytes(config_bytes(cfg, max(batch, 1), max(seq, 1)), max_bytes, f"{path / 'config.json'}")
    files = _tensor_files(path)
    check_within(files, allowed_roots)
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
    if max_bytes is not None:
        peak = _memory.peak_memory(graph).peak_bytes
        _memory.check_bytes([("a run at its peak", peak)], max_bytes, str(path))
    wanted = {p + n.attrs["name"] for n in hf_graph.params for p in KEY_PREFIXES}
    tensors = read_tensors(files, keep=wanted.__contains__)  # unused tensors are never read
    weights = hf_weights(tensors, hf_graph)
    prefix = _prefix(tensors)
    unused = sorted(k for k in tensor_keys(files) if not (k.startswith(prefix) and k[len(prefix):] in weights))
    if style == "rlx":
        weights = rlx_weights_from_hf(weights, cfg)
    tok = path / "tokenizer.json"
    desc = description or (f"BERT checkpoint {path.name}: {cfg.layers} layers, hidden {cfg.hidden}, "
                           f"{cfg.heads} heads")
    return Model(name or str(path), graph, weights, cfg, desc, tok if tok.is_file() else None,
                 {"folder": str(path), "files": [str(f) for f in files], "key_prefix": prefix,
                  "unused_tensors": unused})


__all__ = ["CONFIG_BOUNDS", "KEY_PREFIXES", "PICKLE_SUFFIXES", "CheckpointError", "check_within", "config_bytes",
           "hf_weights", "load_checkpoint", "read_config", "read_tensors", "resolve_folder", "tensor_keys"]
