"""One layer module called once per layer (ALBERT): the k-th call's paths are numbered `M@k`, read as layer k; paths
that already name a layer, and graphs with no repeated module, are left as they are."""

from __future__ import annotations

from rlxviz.models.module_calls import number_calls
from rlxviz.passes.trace import layer_of

LAYER = ["attention.query", "attention", "attention.key", "attention.dense", "ffn", "act", "ffn_output", "", "norm"]


def _calls(n: int, module: str = "enc.groups.0.layers_0") -> list[str]:
    return [f"{module}.{c}" if c else module for _ in range(n) for c in LAYER]


def test_the_kth_call_of_the_repeated_module_is_layer_k_in_the_dynamo_form():
    for n in (2, 3, 12):
        paths = ["emb", "emb.norm", "enc.mapping_in", *_calls(n), "pool"]
        got = number_calls(paths)
        assert [layer_of(p) for p in got] == [None] * 3 + [k for k in range(n) for _ in LAYER] + [None]
        assert got[3] == "enc.groups.0.layers_0@0.attention.query" and got[-1] == "pool"


def test_torchscripts_call_suffixes_give_the_same_numbering():
    """TorchScript names the second call's scopes `attention_1`, `ffn_1`, ..., and the layer's own nodes
    `layers_0_1`: read as call 1 of the same module, numbered as the dynamo form."""
    dyn = _calls(2)
    ts = [p if k < len(LAYER) else ".".join(s + "_1" if i >= 3 else s for i, s in enumerate(p.split(".")))
          for k, p in enumerate(dyn)]
    assert ts[len(LAYER)] == "enc.groups.0.layers_0_1.attention_1.query_1"
    assert [layer_of(p) for p in number_calls(ts)] == [layer_of(p) for p in number_calls(dyn)] == \
        [k for k in range(2) for _ in LAYER]


def test_paths_that_name_layers_or_repeat_nothing_are_kept():
    named = ["encoder.layer.0.attention", "encoder.layer.0.ffn", "encoder.layer.1.attention", "shared.ffn",
             "shared.attention", "shared.ffn"]
    assert number_calls(named) == named
    once = ["emb", "enc.block_a.attn", "enc.block_a.ffn", "head"]
    assert number_calls(once) == once
    assert number_calls([]) == [] and number_calls(["", ""]) == ["", ""]


def test_a_child_left_and_entered_again_starts_the_next_call_even_with_nodes_between_calls():
    paths = ["m.blk.a", "m.blk.b", "m", "m.blk.a", "m.blk.b", "m"]
    assert number_calls(paths) == ["m.blk@0.a", "m.blk@0.b", "m", "m.blk@1.a", "m.blk@1.b", "m"]
