"""The options subcommands share (MODEL and the pipeline, --dim/--inputs, --device, --expect, --layers) and the
argparse types that check them, each a one-line usage error."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .common import SubParsers


def _command(sub: SubParsers, name: str, func: Callable[[argparse.Namespace], int], summary: str,
             description: str) -> argparse.ArgumentParser:
    """The parser of subcommand `name`, whose arguments `func` runs on (`set_defaults(func=...)`): `summary` in
    `rlxviz --help`, `description` in `rlxviz NAME --help` (argparse folds its white space into one paragraph)."""
    p = sub.add_parser(name, help=summary, description=description)
    p.set_defaults(func=func)
    return p


def _after_arg(p: argparse.ArgumentParser, default: str | None, what: str) -> None:
    """`--after PASS` / `-a`: the graph version a command shows (`session.version_index`), described by `what`."""
    p.add_argument("--after", "-a", default=default, metavar="PASS", help=what)


def _expect_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expect", default=None, metavar="OUT.npz",
                   help="outputs the model must give on these inputs (arrays named like its outputs, or out:NAME): "
                        "version 0 is checked against them, exit 1 if it differs. Members out:NAME of the "
                        "--inputs file are checked the same way")


def _model_args(p: argparse.ArgumentParser) -> None:
    """MODEL and the options that build it and choose the pipeline (shared by explain/render/ir/time/export);
    batch and sequence length default to `session.DEFAULT_BATCH`/`DEFAULT_SEQ`, as in the app."""
    from ..session import DEFAULT_BATCH, DEFAULT_SEQ, teaching_cases
    from ..session.loading import GRAPH_JSON_SUFFIX, IR_SUFFIXES

    p.add_argument("model", metavar="MODEL", help="a preset name (bert-tiny, minilm, minilm-shaped, llama-block, ...), "
                                                   "a Hugging Face BERT checkpoint folder, an .onnx export (symbolic "
                                                   "batch/sequence dims bound to --batch/--seq), or an IR text file "
                                                   f"({'/'.join(IR_SUFFIXES)}, or {GRAPH_JSON_SUFFIX} in rlxviz's "
                                                   "to_json form; random weights from its param shapes)")
    p.add_argument("--pipeline", "-p", default="canonical", metavar="SPEC",
                   help="'canonical', 'rlx', or pass names separated by commas (default: %(default)s)")
    p.add_argument("--threshold", type=int, default=None, metavar="TOKENS",
                   help="attention-fusion gate on batch*seq, a positive integer (pipeline param fab_max_tokens)")
    p.add_argument("--variant", default=None, metavar="NAME",
                   help="teaching variant: " + ", ".join(teaching_cases()))
    p.add_argument("--variant-layer", type=int, default=None, metavar="N",
                   help="layer the variant changes (default: the one layer asked for, explain --layer N or "
                        "render --focus N; else 0)")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH,
                   help="batch size the graph is built for (default: %(default)s, as in the app; time --inputs: "
                        "the inputs')")
    p.add_argument("--seq", type=int, default=DEFAULT_SEQ,
                   help="sequence length the graph is built for (default: %(default)s, as in the app; time "
                        "--inputs: the inputs')")
    p.add_argument("--style", choices=("hf", "rlx"), default=None,
                   help="BERT graph form (default: the preset's own; hf for checkpoint folders)")
    p.add_argument("--max-memory-mb", type=int, default=None, metavar="MIB",
                   help="refuse graphs whose inputs and params would need more than MIB MiB before allocating "
                        "them (default: $RLXVIZ_MAX_MEMORY_MB or 2048)")
    p.add_argument("--dim", action="append", default=None, metavar="NAME=VALUE", type=_dim_arg,
                   help="an .onnx file: bind the symbolic dim NAME to VALUE (repeatable: --dim height=224 --dim "
                        "past_sequence_length=16); a dim written as an expression (past_sequence_length + "
                        "sequence_length) follows from its names; a NAME no input has is refused, and a dim that "
                        "sets the batch or sequence length wins over --batch/--seq, said in a note")
    p.add_argument("--inputs", "-i", default=None, metavar="IN.npz",
                   help="input arrays (.npz, one per graph input by name): an .onnx file's inputs take their shapes "
                        "(and bind the dims they name); input_ids / hidden_states set --batch and --seq; explain and "
                        "time check version 0 on them (and on out:NAME arrays in the file)")


def _dim_arg(text: str) -> tuple[str, int]:
    """argparse type of `--dim NAME=VALUE` (a bad one: argparse's usage error, exit 2)."""
    from ..ir.lint import NO_EMPTY_TENSORS
    from ..models.onnx.dims import DimError, parse_dim

    try:
        return parse_dim(text)
    except DimError as e:
        name, _, value = text.partition("=")
        if value.strip().lstrip("+-").isdigit() and int(value) == 0:  # an empty KV cache: say why it cannot be
            raise argparse.ArgumentTypeError(
                f"{name.strip()}=0: {NO_EMPTY_TENSORS}, so an empty KV cache (the first step of a with-past export) "
                "cannot be bound: give 1 or more, or run that step with the export without past inputs") from None
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--dim {text!r}: ")) from None


def _device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("cpu", "gpu"), default=None,
                   help="MLX device (default: the GPU when MLX has one here, else the CPU)")


def _layers_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", default=None, metavar="0-K",
                   help="an .onnx export: run only its layers 0..K (the graph cut after layer K, their real weights), "
                        "checked against ONNX Runtime on the same slice; for a model whose weights do not fit")


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse `type`: an integer in lo..hi, else a one-line usage error naming the bound."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{hi}, got {text[:40]!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo}..{hi}, got {text[:40]}")
        return value

    parse.__name__ = f"integer in {lo}..{hi}"
    return parse
