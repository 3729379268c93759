"""The search's note names the searched node's own route into the fused node that holds it (newcomer run 39).

bert.ortopt's output dense MatMul (`/model/encoder/layer.0/attention/output/dense/MatMul`) read "absorbed into
FusedAttentionBlock %95 (layer 0) directly and via FusedMatMulBiasAct %89": %89 is the QKV projection, which the
dense matmul never passed through; gpt2.ortopt's c_attn and c_proj matmuls both read "via FusedMatMulBiasAct %120 and
attention %116 and FusedMatMulBiasAct %121". `absorbed_index` grouped a fused node's held nodes by op and joined every
route any of them took. It now keeps one row per route, so each id's note is its own chain, checked here on every
row of every distinct version: a note without `via` holds only what the fused node replaced itself, and a note
`via A %a → ... → B %b` holds only ids that B's own list names."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from rlxviz import session
from rlxviz.app.graphpane import absorbed_index
from rlxviz.passes import Pipeline
from rlxviz.passes.made import made_in_run, replaced
from rlxviz.passes.trace import Trace
from rlxviz.viz.overlay import all_versions

FIXTURES = Path(__file__).parent / "fixtures" / "onnx"
FILES = [FIXTURES / "ortopt" / "bert.ortopt.onnx", FIXTURES / "ortopt" / "gpt2.ortopt.onnx",
         FIXTURES / "zoo" / "qwen2-moe.dynamo-sdpa.onnx", FIXTURES / "zoo" / "bert.dynamo-sdpa.onnx"]
_LAST_HOP = re.compile(r"%(\d+)$")


@cache
def _run(path: Path) -> tuple[dict[int, tuple[str, str, str]], Trace]:
    m = session.load(str(path), 1, 8)
    return m.meta["onnx_nodes"], Pipeline.canonical().run(m.graph)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_rows_note_is_the_route_of_each_id_it_holds(path):
    _, t = _run(path)
    every, made = all_versions(t), made_in_run(t)
    seen, checked = set(), 0
    for s in t.steps:
        g = s.after
        if g.digest in seen:
            continue
        seen.add(g.digest)
        for key, rows in absorbed_index(g, t).items():
            n = g[int(key[1:])]
            own = set(replaced(n, g, made, every))
            for _op, ids, note in rows:
                if note.startswith("re-made as"):
                    continue
                via = note.split(" via ", 1)[1] if " via " in note else ""
                assert "directly and" not in note, note
                if not via:
                    assert set(ids) <= own, (path.stem, key, note, sorted(set(ids) - own))
                    continue
                last = int(_LAST_HOP.search(via).group(1))
                assert set(ids) <= set(every[last].absorbed), (path.stem, key, note, ids)
                checked += 1
    assert checked, path


def _note_of(path: Path, onnx_name: str) -> str:
    """The search's note, in the final version, for the imported node named `onnx_name` (the first of its ids)."""
    onnx, t = _run(path)
    ids = {i for i, (_, nm, _) in onnx.items() if nm == onnx_name}
    assert ids, onnx_name
    notes = [note for rows in absorbed_index(t.final, t).values() for _, held, note in rows if ids & set(held)]
    assert notes, onnx_name
    return notes[0]


def test_bert_ortopts_output_dense_matmul_is_absorbed_directly():
    note = _note_of(FIXTURES / "ortopt" / "bert.ortopt.onnx", "/model/encoder/layer.0/attention/output/dense/MatMul")
    assert note.startswith("absorbed into FusedAttentionBlock") and " via " not in note, note
