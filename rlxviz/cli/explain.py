"""`rlxviz passes` (the pipeline's passes, patterns and guards) and `rlxviz explain MODEL` (per layer, fused or the
first rejecting guard).

MODEL (here and in `render`, `ir`, `export`, `time`, `overlay`) is a preset name, a checkpoint folder, an `.onnx`
export or an IR text file (random weights from its param shapes). User errors are `session.SessionError` (a
ValueError): one line."""

from __future__ import annotations

import argparse

from .args import _command, _model_args
from .common import InternalError, SubParsers, subcommand
from .loading import _crash_message, _import_checks, _run_model
from .output import _out, _warn_nonfinite

EXPLAIN_OK, EXPLAIN_NOT_FUSED = 0, 1
"""`rlxviz explain` exit codes: 0 when every expected fusion happened, 1 otherwise (2: a user error)."""


def cmd_passes(args: argparse.Namespace) -> int:
    """`rlxviz passes`: the pipeline's passes with their patterns and guard names."""
    import json

    from ..session import build_pipeline, format_passes, pass_catalog

    pipe = build_pipeline(args.pipeline)
    if args.json:
        _out(json.dumps({"pipeline": pipe.name, "params": pipe.effective_params, "passes": pass_catalog(pipe)},
                        indent=2))
    else:
        _out(format_passes(pipe))
    return 0


@subcommand
def add_passes(sub: SubParsers) -> None:
    p = _command(sub, "passes", cmd_passes, "list the pipeline's passes, patterns and guard names",
                 """Print the canonical pipeline (or another one): each pass in order, its pattern rules and the names
                 of their structure steps and guards, in the order they run.""")
    p.add_argument("--pipeline", "-p", default="canonical", metavar="SPEC",
                   help="'canonical', 'rlx', or pass names separated by commas (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_explain(args: argparse.Namespace) -> int:
    """`rlxviz explain MODEL`: per layer, fused or the first rejecting guard; exit 1 if any layer did not fuse."""
    import json

    from ..session import Limits, describe_host, imported_forms, load_inputs, variant_note
    from ..session.advice import checked_verdict
    from ..session.exactness import ExactnessCheck, check_exactness
    from ..session.fidelity import unread_weights

    model, trace = _run_model(args, allow_crashes=True)
    _warn_nonfinite("explain", model)
    user = load_inputs(args.inputs, model.graph) if args.inputs is not None else None
    feeds = user.feeds if user is not None else model.random_feeds(seed=0)
    checks = _import_checks(model, feeds, user, None, max_memory_mb=args.max_memory_mb)
    if (unread := unread_weights(model, limits=Limits.resolve(args.max_memory_mb))) is None:
        exact = check_exactness(trace, feeds, model.weights)
    else:  # weights left in their file that the limit does not let a run read
        exact = ExactnessCheck((), (), None, skipped=unread.split(": ", 1)[-1].split("; ")[0])
    check, fixes = checked_verdict(trace, model.name, feeds if unread is None else None, model.weights,
                                   None if args.layer is None else [args.layer], args.expect,
                                   verbose=args.verbose or args.json)  # advice checked, not written
    imported = imported_forms(model)  # what the file had already fused (ORT contrib ops), its quantization
    if args.json:
        _out(json.dumps({**check.to_dict(), "import_checks": [c.line() for c in checks], "imported_forms": imported,
                         "numeric_check": None if exact is None else exact.to_dict(),
                         "fix_checks": [f.to_dict() for f in fixes]}, indent=2, default=str))
    else:
        host = describe_host(model.graph)
        numbers = f"{exact.line()}\n" if exact is not None and (args.verbose or not exact.ok) else ""
        # over_threshold: model-wide, and the gate it sets (the app's banner says the same: `variant_note`)
        note = variant_note(args.variant, args.batch, args.seq, args.threshold)
        _out((f"{note}\n" if note else "") + "".join(f"{c.line()}\n" for c in checks) + numbers
             + (f"{host}\n" if host else "")
             + "".join(f"{line}\n" for line in imported) + check.render(verbose=args.verbose))
    if not all(c.ok for c in checks) or (exact is not None and not exact.ok):
        return EXPLAIN_NOT_FUSED
    if check.crashed:
        raise InternalError(_crash_message(check.crashed).replace("discarded:", "discarded, so this report is "
                                                                  "incomplete:"))
    return EXPLAIN_OK if check.ok else EXPLAIN_NOT_FUSED


@subcommand
def add_explain(sub: SubParsers) -> None:
    p = _command(sub, "explain", cmd_explain,
                 "why each layer did (not) fuse; exit 1 when the model has something to change",
                 """Run the pipeline on MODEL and report, per layer, whether every expected fusion happened, or else
                 the first rejecting guard with its actual vs required values, the fix, and how the layer differs
                 from a sibling layer that fused. What is expected depends on the layer: a post-LN BERT-style layer
                 (attention -> residual add -> LayerNorm) must become one FusedTransformerLayer (when the pipeline
                 runs fuse_transformer_layer); any other layer (e.g. LLaMA: RmsNorm, pre-norm, SwiGLU) must get the
                 fusions the pipeline's rules apply to it (FusedSwiGLU, the shared-input QKV matmul, a residual norm
                 where legal). In both, no missed fusion may be left. What is expected is what is legal for the
                 layer (what the canonical pipeline makes of it): a pipeline without a pass a layer needs is named
                 with the products it cannot make and counts as not fused, unless --expect pipeline. A layer held
                 back only by a gap in rlxviz's own ops (an op form rlxviz lacks, e.g. FusedAttentionBlock with
                 QK-norm) is counted apart in the headline ("1 held back by rlxviz's ops (rlxviz lacks ...)"): not
                 fused as expected, but nothing in the model to change (where a checked change to the model works
                 around the gap, e.g. Granite's attention scale folded into its Q projection, the headline and the
                 layer's gap line say so). Exit code 0 when there is nothing in the model to change (every
                 checked layer fused as expected, or held back only by rlxviz's ops: those are compiler fixes, a
                 workaround in the model aside), 1 otherwise, 2 for bad input.""")
    _model_args(p)
    p.add_argument("--layer", "-l", type=int, default=None, metavar="N",
                   help="check only layer N (a --variant then changes layer N unless --variant-layer says otherwise)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--verbose", "-v", action="store_true", help="also print every rule's outcome per layer")
    p.add_argument("--expect", choices=("model", "pipeline"), default="model",
                   help="judge each layer against what is legal for it (model: a product the pipeline cannot make, "
                        "because it lacks the pass, counts as not fused) or against the pipeline's own passes only "
                        "(pipeline: such products are listed, not counted). Default: %(default)s")
