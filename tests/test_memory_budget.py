"""One memory budget (the session's `Limits` over `rlxviz.ir.memory`'s peak), checked before anything is built
or allocated (issue 15).

Kinds: intermediates far larger than the inputs (the peak of live memory over the schedule, every node's
output counted); config values that would build a huge graph; random weights and feeds allocated at their
own dtype's size and inside the vocabulary.
"""

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from clirun import one_line, run

from rlxviz.ir import parse_ir
from rlxviz.ir.memory import MIB, node_bytes, peak_memory
from rlxviz.models import random_weights
from rlxviz.models.presets import Model, index_bounds
from rlxviz.session import LimitError, Limits, SessionError

DATA = Path(__file__).parent / "data" / "reliability"


def ir(*lines: str) -> str:
    return "graph t {\n" + "".join(f"  {ln}\n" for ln in lines) + "}\n"


# ------------------------------------------------------------------------------------- peak of the schedule

@pytest.mark.parametrize("name, peak", [("ir_outer_3gb.ir", "2.9 GiB"), ("ir_expand_huge.ir", "3.6 TiB")])
@pytest.mark.parametrize("command", ["time", "explain", "ir"])
def test_handed_huge_intermediates_are_refused_before_running(capsys, monkeypatch, name, peak, command):
    import rlxviz.session.loading as loading

    monkeypatch.setattr(loading, "random_weights", lambda *a, **k: pytest.fail("weights allocated before the check"))
    code, out, err = run(capsys, command, DATA / name)
    assert code == 2 and out == ""
    line = one_line(err, command)
    assert f"a run needs {peak} at its peak" in line and "over the limit of 2.0 GiB (default)" in line


def test_handed_outer_product_is_refused_even_under_a_tiny_limit(capsys):
    code, _, err = run(capsys, "time", DATA / "ir_outer_3gb.ir", "--max-memory-mb", 1)
    assert code == 2 and "over the limit of 1.0 MiB (--max-memory-mb)" in one_line(err, "time")


@pytest.mark.parametrize("lines", [
    # broadcasting add of [N, 1] and [1, N]: 2N floats in, N^2 out
    ['%0 = input {name="a"} : f32[30000, 1]', '%1 = input {name="b"} : f32[1, 30000]',
     "%2 = add(%0, %1) : f32[30000, 30000]", "%3 = reduce_max(%2) {axes=[0, 1]} : f32[]", "return %3"],
    # a gather with a long index list from a small table
    ['%0 = input {name="ids"} : i64[1, 4000000]', '%1 = param {name="w"} : f32[10, 256]',
     "%2 = gather(%1, %0) {axis=0} : f32[1, 4000000, 256]", "return %2"],
    # concat of one small input with itself many times, then a matmul blow-up
    ['%0 = input {name="x"} : f32[64, 1]', '%1 = input {name="y"} : f32[1, 9000000]',
     "%2 = matmul(%0, %1) : f32[64, 9000000]", "%3 = relu(%2) : f32[64, 9000000]", "return %3"],
])
def test_any_small_input_big_intermediate_graph_is_refused(tmp_path, capsys, lines):
    f = tmp_path / "g.ir"
    f.write_text(ir(*lines))
    g = parse_ir(f.read_text())
    assert sum(n.nbytes for n in g.inputs + g.params) < 64 * MIB < peak_memory(g).peak_bytes
    code, _, err = run(capsys, "time", f)
    assert code == 2 and "at its peak" in one_line(err, "time")


def test_peak_counts_live_values_and_frees_dead_ones():
    n = 1 << 20  # 4 MiB per f32 tensor
    chain = ['%0 = input {name="x"} : f32[1048576]'] + [f"%{i} = relu(%{i - 1}) : f32[1048576]" for i in range(1, 11)]
    g = parse_ir(ir(*chain, "return %10"))
    p = peak_memory(g)
    assert p.peak_bytes == 3 * 4 * n  # input + one operand + one result, never 11 tensors
    kept = parse_ir(ir(*chain, "return %10, %3"))  # %3 is an output too: it stays live to the end
    assert peak_memory(kept).peak_bytes == 4 * 4 * n
    fan = parse_ir(ir('%0 = input {name="x"} : f32[1048576]', "%1 = relu(%0) : f32[1048576]",
                      "%2 = exp(%0) : f32[1048576]", "%3 = add(%1, %2) : f32[1048576]", "return %3"))
    assert peak_memory(fan).peak_bytes == 4 * 4 * n and peak_memory(fan).at_node == 3


def test_bf16_is_counted_at_the_width_it_is_computed_in():
    g = parse_ir(ir('%0 = input {name="x"} : bf16[1024]', "return %0"))
    assert node_bytes(g[0]) == 4096


def test_the_limits_record_checks_the_peak(monkeypatch):
    g = parse_ir(ir('%0 = input {name="x"} : f32[1048576]', "%1 = relu(%0) : f32[1048576]", "return %1"))
    assert Limits(8).check(g, "g") == 8 * MIB
    with pytest.raises(LimitError, match="needs 8.0 MiB at its peak at %1"):
        Limits(7).check(g, "g")


def test_app_and_notebooks_use_the_same_budget(monkeypatch):
    from rlxviz.session import load, load_ir_text
    from rlxviz.teach import TeachError

    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "1")
    text = ir('%0 = input {name="x"} : f32[200000]', "%1 = relu(%0) : f32[200000]", "%2 = exp(%1) : f32[200000]",
              "return %2")
    g = parse_ir(text)
    assert sum(n.nbytes for n in g.inputs) < MIB  # inputs alone fit: the intermediates do not
    with pytest.raises(LimitError, match="at its peak"):  # the app loads IR text through this
        load_ir_text(text, Limits.resolve())
    with pytest.raises(TeachError, match=r"over the limit of 1\.0 MiB \(RLXVIZ_MAX_MEMORY_MB\)"):
        load("minilm-shaped", seq=8)  # presets too: 88 MiB of random weights
    assert issubclass(LimitError, SessionError)


# ------------------------------------------------------------------------------------------ config values

def _folder(tmp_path: Path, config: dict) -> Path:
    folder = tmp_path / "ck"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")  # never reached
    return folder


def test_handed_config_with_a_million_layers_is_refused_before_building(tmp_path, capsys, monkeypatch):
    import rlxviz.models.checkpoint as ck

    monkeypatch.setattr(ck, "build_bert", lambda *a, **k: pytest.fail("graph built before the check"))
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_bytes((DATA / "config_1e6_layers.json").read_bytes())
    code, _, err = run(capsys, "explain", folder)
    assert code == 2
    assert "num_hidden_layers 1000000 is over the limit of 512; refused before building" in one_line(err, "explain")


def test_a_model_config_given_as_the_model_is_refused_as_a_config(tmp_path, capsys, monkeypatch):
    """A Hugging Face config of any file name given where a graph file goes is checked as a config (its limits,
    before anything is built), not parsed as graph JSON; a config.json file names its checkpoint folder."""
    import rlxviz.models.checkpoint as ck

    monkeypatch.setattr(ck, "build_bert", lambda *a, **k: pytest.fail("graph built before the check"))
    code, _, err = run(capsys, "explain", DATA / "config_1e6_layers.json")
    assert code == 2
    assert "config_1e6_layers.json: num_hidden_layers 1000000 is over the limit of 512; refused before building" \
        in one_line(err, "explain")
    small = tmp_path / "small.json"
    small.write_text(json.dumps(BASE))
    code, _, err = run(capsys, "explain", small)
    assert code == 2 and "a Hugging Face model config, not a graph: give the folder" in one_line(err, "explain")
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_bytes((DATA / "config_1e6_layers.json").read_bytes())
    code, _, err = run(capsys, "explain", folder / "config.json")
    assert code == 2 and "num_hidden_layers 1000000 is over the limit" in one_line(err, "explain")

BASE = {"model_type": "bert", "vocab_size": 50, "hidden_size": 16, "num_attention_heads": 2,
        "intermediate_size": 32, "num_hidden_layers": 2, "max_position_embeddings": 32}


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": 1 << 20, "num_attention_heads": 1}, "hidden_size 1048576 is over the limit"),
    ({"vocab_size": 10**12}, "vocab_size 1000000000000 is over the limit"),
    ({"num_attention_heads": 1 << 30}, "num_attention_heads 1073741824 is over the limit"),
    ({"intermediate_size": 1 << 40}, "intermediate_size 1099511627776 is over the limit"),
    ({"num_hidden_layers": 2.5}, "num_hidden_layers must be an integer, got float 2.5"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be an integer, got bool True"),
    ({"hidden_size": "16"}, "hidden_size must be an integer, got str '16'"),
    ({"layer_norm_eps": 1e300}, "layer_norm_eps must be a number in [0, 1)"),
    # every value within its bound, their product far over the budget: refused from the config alone
    ({"vocab_size": 1 << 22, "hidden_size": 1 << 14, "num_attention_heads": 16}, "needs 264.0 GiB (params alone"),
    ({"num_hidden_layers": 512, "hidden_size": 4096, "num_attention_heads": 32, "intermediate_size": 16384},
     "params alone"),
])
def test_any_oversized_config_is_refused_before_building(tmp_path, capsys, monkeypatch, change, message):
    import rlxviz.models.checkpoint as ck

    monkeypatch.setattr(ck, "build_bert", lambda *a, **k: pytest.fail("graph built before the check"))
    code, _, err = run(capsys, "explain", _folder(tmp_path, {**BASE, **change}), "--seq", "8")
    assert code == 2 and message in one_line(err, "explain")


# ----------------------------------------------------------------------------- random weights and feeds

@pytest.mark.parametrize("dtype, itemsize", [("bool", 1), ("i32", 4), ("f16", 2), ("f32", 4)])
def test_random_weights_allocate_about_their_declared_size(dtype, itemsize):
    g = parse_ir(ir(f'%0 = param {{name="w"}} : {dtype}[4096, 2048]', "return %0"))
    tracemalloc.start()
    try:
        w = random_weights(g)["w"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    declared = 4096 * 2048 * itemsize
    assert w.nbytes == declared and w.dtype == g[0].dtype.numpy
    assert peak <= declared + 9 * MIB  # one float64 chunk of 8 MiB on top, not 8x the size
    if dtype == "bool":
        assert 0.4 < w.mean() < 0.6  # both values, not all True


def test_random_feeds_stay_inside_every_table_they_index():
    g = parse_ir(ir('%0 = input {name="input_ids"} : i64[2, 64]', '%1 = input {name="attention_mask"} : i64[2, 64]',
                    '%2 = input {name="pos"} : i32[64]', '%3 = param {name="emb"} : f32[50, 8]',
                    '%4 = param {name="pe"} : f32[7, 8]', "%5 = gather(%3, %0) {axis=0} : f32[2, 64, 8]",
                    '%6 = cast(%2) {dtype="i64"} : i64[64]', "%7 = gather(%4, %6) {axis=0} : f32[64, 8]",
                    "%8 = add(%5, %7) : f32[2, 64, 8]", "return %8, %1"))
    assert index_bounds(g) == {0: 50, 2: 7}
    m = Model("t", g, random_weights(g))
    for seed in range(5):
        f = m.random_feeds(seed)
        assert f["input_ids"].max() < 50 and f["pos"].max() < 7 and f["pos"].dtype == np.int32
        assert set(np.unique(f["attention_mask"])) <= {0, 1}


def test_cli_time_runs_a_graph_with_a_small_vocabulary(tmp_path, capsys):
    f = tmp_path / "v.ir"
    f.write_text(ir('%0 = input {name="input_ids"} : i64[1, 256]', '%1 = param {name="emb"} : f32[3, 4]',
                    "%2 = gather(%1, %0) {axis=0} : f32[1, 256, 4]", "%3 = relu(%2) : f32[1, 256, 4]", "return %3"))
    code, out, err = run(capsys, "time", f, "--repeat", 1)
    assert code == 0, err
    assert "NO" not in out
