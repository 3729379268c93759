"""A layer's line lists the fused ops the final version holds (newcomer report): GPT-2's layer 0 read
`FusedMatMulBiasAct x4 (%133 ... %136), FusedAttentionBlock ...` although the block had absorbed the q/k/v and output
projections; only the MLP's two stay. `explain`'s text, its `--json` and the app's Why tab (the same text) agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlxviz import session
from rlxviz.ir import Op
from rlxviz.passes.why.text import layer_dict

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


@pytest.mark.parametrize("stem", ["gpt2.dynamo-eager", "gpt2.ts-eager", "llama.dynamo-eager", "deit.ortopt"])
def test_the_layer_line_names_only_ops_the_final_version_holds(stem):
    m = session.load(str(ZOO / f"{stem}.onnx"), 1, 8)
    trace = session.run_pipeline(m.graph, session.build_pipeline())
    for v in session.check_fusion(trace, m.name).layers:
        ids = [int(i) for i in re.findall(r"%(\d+)", " ".join(v.done))]
        assert ids and all(i in trace.final for i in ids), (v.layer, v.done)
        assert layer_dict(v)["done"] == v.done  # --json lists the same
    if stem.startswith("gpt2"):  # the MLP's two linears stay; the attention's are inside the block
        layer0 = session.check_fusion(trace, m.name).layers[0]
        ops = [d.split(" %", 1)[0] for d in layer0.done]
        assert ops.count(Op.FUSED_MATMUL_BIAS_ACT.value) == 2 and Op.FUSED_ATTENTION_BLOCK.value in ops, ops
