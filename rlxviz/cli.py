"""The `rlxviz` command line (also `python -m rlxviz`).

Each subcommand is one function that adds its parser, registered with `@subcommand`; it sets
`func=handler` where `handler(args) -> int` returns the exit code. To add a subcommand (`passes`,
`explain`, `render`, `ir`, `time`, ...) write one such function below; `build_parser` picks it up.

Errors a user can fix (bad paths, bad inputs, unknown models) are raised as `CLIError` (or the
library's `ValueError`/`KeyError`/`OSError`) and printed by `main` as one line on stderr,
`rlxviz <command>: error: <message>`, with exit code 2 and no traceback.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SubParsers = Any  # argparse._SubParsersAction (private type)
Registrar = Callable[[SubParsers], None]
SUBCOMMANDS: list[Registrar] = []


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


def subcommand(fn: Registrar) -> Registrar:
    """Register `fn(subparsers)`, which adds one subcommand parser with `set_defaults(func=...)`."""
    SUBCOMMANDS.append(fn)
    return fn


# ----------------------------------------------------------------------------------------------- run

BACKENDS = ("reference", "mlx")
"""Backends `run` knows: `reference` is the NumPy interpreter (the oracle), `mlx` the MLX runtime."""


def executor(backend: str) -> Callable[..., list[np.ndarray]]:
    """`run(graph, feeds, weights) -> outputs` for `backend` (MLX imported only when asked for)."""
    from . import runtime

    return runtime.run_reference if backend == "reference" else runtime.run_mlx


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of an `.npz` file (pickled object arrays refused).

    Raises:
        CLIError: missing file, or not a readable `.npz`.
    """
    p = Path(path)
    if not p.is_file():
        raise CLIError(f"{path}: no such file" if not p.exists() else f"{path}: not a file")
    try:
        with p.open("rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise CLIError(f"{path}: cannot read ({e.strerror})") from None
    if magic == b"\x93NUMPY":
        raise CLIError(f"{path}: a single .npy array; expected an .npz archive of named arrays (numpy.savez)")
    if not magic.startswith(b"PK"):
        raise CLIError(f"{path}: not an .npz file (save inputs with numpy.savez)")
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise CLIError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from None


def _static_shape(arrays: dict[str, np.ndarray], path: str) -> tuple[int, int]:
    """`(batch, seq)` from `input_ids` (BERT-like models) or `hidden_states` (decoder blocks)."""
    for key, rank in (("input_ids", 2), ("hidden_states", 3)):
        if key in arrays:
            a = arrays[key]
            if a.ndim != rank or 0 in a.shape:
                raise CLIError(f"{path}: {key} must be a non-empty rank-{rank} array, got shape {list(a.shape)}")
            return int(a.shape[0]), int(a.shape[1])
    raise CLIError(f"{path}: needs 'input_ids' and 'attention_mask' (int64 [batch, seq]); "
                   f"found {sorted(arrays) or 'no arrays'}")


def resolve_model(model: str, batch: int, seq: int, style: str = "hf") -> Any:
    """A preset by name, else a Hugging Face checkpoint folder. Raises CLIError for neither."""
    from .models import PRESETS, load_checkpoint, load_model

    if model in PRESETS:
        return load_model(model, batch=batch, seq=seq, style=style)
    if Path(model).exists():
        return load_checkpoint(model, batch=batch, seq=seq, style=style)
    raise CLIError(f"unknown model {model!r}: not a preset ({', '.join(sorted(PRESETS))}) nor an existing "
                   "checkpoint folder")


def check_feeds(graph: Any, arrays: dict[str, np.ndarray], path: str, vocab: int | None) -> dict[str, np.ndarray]:
    """The graph's inputs from `arrays`, checked for presence, shape, dtype kind and value range."""
    feeds: dict[str, np.ndarray] = {}
    for node in graph.inputs:
        name = node.attrs["name"]
        if name not in arrays:
            raise CLIError(f"{path}: missing array {name!r} ({node.type}); found {sorted(arrays)}")
        a = arrays[name]
        if tuple(a.shape) != node.shape:
            raise CLIError(f"{path}: {name} has shape {list(a.shape)}, the model needs {list(node.shape)}")
        if node.dtype.is_float:
            if a.dtype.kind not in "fiu" or not np.isfinite(a).all():
                raise CLIError(f"{path}: {name} must hold finite numbers, got dtype {a.dtype}")
        else:
            if a.dtype.kind not in "iub":
                raise CLIError(f"{path}: {name} must be an integer array, got dtype {a.dtype}")
            if name == "attention_mask" and not np.isin(a, (0, 1)).all():
                raise CLIError(f"{path}: attention_mask must hold only 0 and 1")
            if name == "input_ids" and vocab is not None and (a.min() < 0 or a.max() >= vocab):
                raise CLIError(f"{path}: input_ids must lie in 0..{vocab - 1} (the vocabulary), got "
                               f"{int(a.min())}..{int(a.max())}")
        feeds[name] = a.astype(node.dtype.numpy)
    return feeds


def cmd_run(args: argparse.Namespace) -> int:
    """`rlxviz run MODEL --inputs IN.npz -o OUT.npz`: run a model and save `last_hidden_state`."""
    out = Path(args.output)
    if not out.parent.is_dir():
        raise CLIError(f"{args.output}: folder {out.parent} does not exist")
    arrays = load_npz(args.inputs)
    batch, seq = _static_shape(arrays, args.inputs)
    model = resolve_model(args.model, batch, seq, args.style)
    feeds = check_feeds(model.graph, arrays, args.inputs, getattr(model.config, "vocab_size", None))
    outputs = executor(args.backend)(model.graph, feeds, model.weights)
    named = {"last_hidden_state": np.asarray(outputs[0], dtype=np.float32)}
    named.update({f"output_{i}": np.asarray(o) for i, o in enumerate(outputs[1:], 1)})
    with out.open("wb") as f:  # an open file keeps numpy from appending `.npz` to the name
        np.savez(f, **named)
    if not args.quiet:
        shape = "x".join(map(str, named["last_hidden_state"].shape))
        print(f"{model.name}: {args.backend} -> {out} (last_hidden_state float32 {shape})", file=sys.stderr)
    return 0


@subcommand
def add_run(sub: SubParsers) -> None:
    p = sub.add_parser("run", help="run a model on inputs from an .npz file",
                       description="Run MODEL on IN.npz (input_ids, attention_mask: int64 [batch, seq]; or "
                                   "hidden_states float32 [batch, seq, hidden] for decoder blocks) and write "
                                   "last_hidden_state (float32 [batch, seq, hidden]) to OUT.npz. Batch and "
                                   "sequence length come from the inputs.")
    p.add_argument("model", metavar="MODEL", help="a preset name (e.g. minilm, bert-tiny, llama-block) or a Hugging "
                                                   "Face BERT checkpoint folder (config.json + model.safetensors)")
    p.add_argument("--inputs", "-i", required=True, metavar="IN.npz", help="input arrays")
    p.add_argument("--output", "-o", required=True, metavar="OUT.npz", help="where to write last_hidden_state")
    p.add_argument("--backend", choices=BACKENDS, default="reference", help="executor (default: %(default)s)")
    p.add_argument("--style", choices=("hf", "rlx"), default="hf",
                   help="BERT graph form: Hugging Face primitives or RLX fused QKV (default: %(default)s)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    p.set_defaults(func=cmd_run)


# ---------------------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    from . import __version__

    parser = argparse.ArgumentParser(prog="rlxviz", description="Make ML-compiler fusion visible.")
    parser.add_argument("--version", action="version", version=f"rlxviz {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse `argv` (default `sys.argv[1:]`), run the subcommand, return its exit code.

    User errors print one line on stderr and return 2; argparse usage errors exit 2 as usual.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (CLIError, ValueError, KeyError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"rlxviz {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rlxviz {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
