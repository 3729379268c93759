"""The float64 oracle holds only the params it is using, widens a table it only gathers from row by row (the rows it
gathers), and `time`'s memory estimate (`ir.memory.oracle_peak`) counts what it holds, not every param at 8 bytes."""

import numpy as np
import pytest

import rlxviz.runtime.reference as reference
from rlxviz.ir import Builder
from rlxviz.ir.memory import node_bytes, oracle_peak, peak_memory
from rlxviz.runtime import run_oracle

rng = np.random.default_rng(5)


def embed_graph(tied: bool = False, vocab: int = 50, hidden: int = 8):
    """ids [2, 3] -> table[ids] [2, 3, hidden] @ w [hidden, 4]; `tied`: the table also read as a head (x @ table^T)."""
    b = Builder("embed")
    ids = b.input("ids", (2, 3), "i64")
    table = b.param("table", (vocab, hidden))
    x = b.gather(table, ids)
    y = b.matmul(x, b.param("w", (hidden, 4)))
    b.output(b.matmul(x, b.transpose(table, (1, 0))) if tied else y)
    return b.build()


@pytest.fixture
def bound_dtypes(monkeypatch):
    """Param name -> the NumPy dtype the reference bound it in."""
    seen: dict[str, np.dtype] = {}
    real = reference.bind_leaf

    def spy(node, feeds, weights, dtype=None):
        arr = real(node, feeds, weights, dtype)
        if "name" in node.attrs and node.attrs["name"] in weights:
            seen[node.attrs["name"]] = arr.dtype
        return arr

    monkeypatch.setattr(reference, "bind_leaf", spy)
    return seen


def test_a_table_only_gathered_from_is_not_widened_and_the_numbers_are_the_float64_ones(bound_dtypes):
    g = embed_graph()
    ids = rng.integers(0, 50, (2, 3))
    w = {"table": rng.standard_normal((50, 8)).astype(np.float32), "w": rng.standard_normal((8, 4)).astype(np.float32)}
    got = run_oracle(g, {"ids": ids}, w)[0]
    want = np.take(w["table"].astype(np.float64), ids, axis=0) @ w["w"].astype(np.float64)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float64
    assert bound_dtypes == {"table": np.float32, "w": np.float64}


def test_a_table_also_read_otherwise_is_widened_with_the_same_numbers(bound_dtypes):
    g = embed_graph(tied=True)
    ids = rng.integers(0, 50, (2, 3))
    w = {"table": rng.standard_normal((50, 8)).astype(np.float32), "w": rng.standard_normal((8, 4)).astype(np.float32)}
    got = run_oracle(g, {"ids": ids}, w)[0]
    t64 = w["table"].astype(np.float64)
    np.testing.assert_array_equal(got, np.take(t64, ids, axis=0) @ t64.T)
    assert bound_dtypes["table"] == np.float64


def test_a_missing_or_misshaped_param_is_still_named():
    g = embed_graph()
    ids = rng.integers(0, 50, (2, 3))
    with pytest.raises(KeyError, match="'w'"):
        run_oracle(g, {"ids": ids}, {"table": np.zeros((50, 8), np.float32)})
    with pytest.raises(ValueError, match="expected shape"):
        run_oracle(g, {"ids": ids}, {"table": np.zeros((50, 8), np.float32), "w": np.zeros((8, 5), np.float32)})


@pytest.mark.parametrize("tied", [False, True])
def test_the_time_estimate_counts_the_widened_params_not_all_at_8_bytes(tied):
    g = embed_graph(tied=tied, vocab=100_000, hidden=64)
    table = next(n for n in g if n.attrs.get("name") == "table")
    old = peak_memory(g, itemsize=8).peak_bytes  # every param at 8 bytes for the whole run
    new = oracle_peak(g)
    assert new <= old
    if tied:  # the table is widened: its float64 copy is counted
        assert new >= node_bytes(table, 8)
    else:  # only gathered from: no float64 copy of it
        assert new < node_bytes(table, 8) and old - new >= node_bytes(table, 8)


def _shared_input_graph(n_heads: int):
    """x [2, 3, 8] @ w_i [8, 16] for `n_heads` params on the same x, and one matmul on another operand."""
    b = Builder("shared")
    x = b.input("x", (2, 3, 8))
    outs = [b.matmul(x, b.param(f"w{i}", (8, 16))) for i in range(n_heads)]
    outs.append(b.matmul(b.relu(x), b.param("lone", (8, 16))))
    b.output(*outs)
    return b.build()


@pytest.mark.parametrize("n_heads, want", [(1, 0), (2, 2 * 8 * 16 * 4), (3, 3 * 8 * 16 * 4)])
def test_concat_bytes_counts_the_params_of_matmuls_that_share_an_operand(n_heads, want):
    from rlxviz.ir.memory import concat_bytes

    assert concat_bytes(_shared_input_graph(n_heads)) == want
