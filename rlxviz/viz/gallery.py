"""Make the pictures in `docs/img/` from the canonical pipeline: `python -m rlxviz.viz.gallery [OUT_DIR]`.

* `bert_layer_input.png`: one BERT-base layer as built (12 layers, seq 128; layer 3 shown).
* `bert_layer_before_ftl.png`: the same layer before `fuse_transformer_layer`, its match as a cluster with
  the bound roles (attn, ln1, fc1, fc2, ln2).
* `bert_layer_after.png`: the layer after the whole pipeline: one FusedTransformerLayer listing what it absorbed.
* `rejected_dead_h1_user.png`: the `dead_h1_user` teaching variant (layer 3: a probe of h1 that reaches no output,
  a real near-miss): the rejected match, its bound nodes, the extra user of h1 and the guard.
* `bert_base_layers.png`: the 12-layer collapsed view of the variant after the pipeline (fused / rejected).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ..models import VARIANTS, load_model
from ..passes import Pipeline
from ..passes.trace import Trace
from .overlay import Overlay
from .render import save

LAYER = 3


def _ftl_step(trace: Trace):  # noqa: ANN202
    return trace.step("fuse_transformer_layer")


def make_gallery(out: Path, engine: str = "auto", seq: int = 128) -> list[Path]:
    """Render every picture into `out` (PNG); returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    g = load_model("bert-base-shaped", 1, seq).graph
    trace = Pipeline.canonical().run(g)
    step = _ftl_step(trace)
    n_ops = sum(1 for n in g.compute_nodes() if f"layer.{LAYER}." in n.path)
    written.append(save(out / "bert_layer_input.png", g, focus=LAYER, engine=engine,
                        title=f"encoder.layer.{LAYER} as built: {n_ops} ops (params folded)"))
    before = Overlay.before(step, rejections=False, trace=trace)
    written.append(save(out / "bert_layer_before_ftl.png", step.before, before, focus=LAYER, engine=engine))
    final = Overlay.trace_summary(trace)
    written.append(save(out / "bert_layer_after.png", trace.final,
                        dataclasses.replace(final, title=f"after the canonical pipeline ({len(trace.steps)} passes)"),
                        focus=LAYER, engine=engine))
    v = dataclasses.replace(VARIANTS["dead_h1_user"], layer=LAYER)
    gv = load_model("bert-base-shaped", 1, seq, variant=v).graph
    tv = Pipeline.canonical().run(gv)
    sv = _ftl_step(tv)
    ov = Overlay.before(sv, trace=tv)
    ov = dataclasses.replace(ov, rejections=tuple(r for r in ov.rejections if r.layer == LAYER),
                             title="variant dead_h1_user: " + ov.title)
    written.append(save(out / "rejected_dead_h1_user.png", sv.before, ov, focus=LAYER, engine=engine))
    written.append(save(out / "bert_base_layers.png", tv.final, Overlay.trace_summary(tv), view="layers",
                        engine=engine, title=f"bert-base-shaped, variant dead_h1_user at layer {LAYER}: "
                                             "after the canonical pipeline"))
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", nargs="?", default="docs/img")
    ap.add_argument("--engine", default="auto")
    args = ap.parse_args()
    for p in make_gallery(Path(args.out), args.engine):
        print(p)


if __name__ == "__main__":
    main()
