"""Content identity (issue 36, item 4): frozen node attributes, `Graph.digest`, `Trace.digest`, `DigestCache`.

A cache of something derived from a graph or a run is keyed by its content digest, never by the object: a rebuilt
but equal graph hits, a changed graph misses, and nothing can edit a node once a cache has seen it.
"""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import random_graphs

from rlxviz.ir import Builder, DType, FrozenAttrs, Graph, Node, Op, format_graph, from_json, parse_ir, to_json
from rlxviz.ir.identity import DigestCache
from rlxviz.passes import Pipeline
from rlxviz.passes.explain import fused_layers
from rlxviz.passes.guard import live_nodes
from rlxviz.passes.why.facts import RunFacts
from rlxviz.session.loading import layer_indices

# -- frozen attributes ------------------------------------------------------------------------------------------


def _node(**attrs: object) -> Node:
    return Node(3, Op.TRANSPOSE, (1,), (2, 4, 3), DType.f32, attrs)


@pytest.mark.parametrize("mutate", [
    lambda a: a.__setitem__("perm", (0, 1, 2)),
    lambda a: a.__delitem__("perm"),
    lambda a: a.update(perm=(0, 1, 2)),
    lambda a: a.pop("perm"),
    lambda a: a.popitem(),
    lambda a: a.clear(),
    lambda a: a.setdefault("extra", 1),
    lambda a: a.__ior__({"extra": 1}),
], ids=["assign", "del", "update", "pop", "popitem", "clear", "setdefault", "ior"])
def test_node_attrs_cannot_change(mutate):
    n = _node(perm=[0, 2, 1])
    with pytest.raises(TypeError, match="immutable"):
        mutate(n.attrs)
    assert n.attrs == {"perm": (0, 2, 1)}


def test_node_attrs_assignment_statement_raises():
    n = _node(perm=(0, 2, 1))
    with pytest.raises(TypeError):
        n.attrs["perm"] = (0, 1, 2)  # type: ignore[index]


def test_frozen_attrs_read_like_a_dict():
    n = _node(perm=[0, 2, 1], name="t", nested=[[1, 2], [3]])
    a = n.attrs
    assert type(a) is FrozenAttrs and isinstance(a, dict)
    assert a["perm"] == (0, 2, 1) and a.get("missing", 7) == 7 and "name" in a and list(a) == ["perm", "name", "nested"]
    assert a["nested"] == ((1, 2), (3,))  # lists become tuples at every depth
    assert dict(a) == {"perm": (0, 2, 1), "name": "t", "nested": ((1, 2), (3,))} and type(dict(a)) is dict
    assert {**a, "name": "u"}["name"] == "u" and a["name"] == "t"
    assert json.loads(json.dumps(a)) == {"perm": [0, 2, 1], "name": "t", "nested": [[1, 2], [3]]}
    assert a == {"perm": (0, 2, 1), "name": "t", "nested": ((1, 2), (3,))}
    assert pickle.loads(pickle.dumps(n)) == n and copy.deepcopy(a) == a
    assert type(pickle.loads(pickle.dumps(a))) is FrozenAttrs


def test_nodes_are_hashable_by_content():
    a, b, c = _node(perm=[0, 2, 1]), _node(perm=(0, 2, 1)), _node(perm=(0, 1, 2))
    assert a == b and hash(a) == hash(b) and hash(a.attrs) == hash(b.attrs)
    assert a != c and len({a, b, c}) == 2


def test_with_attrs_builds_a_new_node_and_keeps_the_old():
    n = _node(perm=(0, 2, 1))
    m = n.with_attrs(perm=[0, 1, 2], extra=1)
    assert m is not n and m.attrs == {"perm": (0, 1, 2), "extra": 1} and n.attrs == {"perm": (0, 2, 1)}
    assert n.replace(attrs={"perm": [2, 1, 0]}).attrs["perm"] == (2, 1, 0)


# -- Graph.digest ---------------------------------------------------------------------------------------------------

TWO = """graph two {
  %0 = input {name="x"} : f32[2, 4]
  %1 = param {name="w"} : f32[4, 3]
  %2 = matmul(%0, %1) : f32[2, 3] @layer.0.fc
  %3 = softmax(%2) {axis=-1} : f32[2, 3] @layer.1.sm
  %4 = relu(%2) : f32[2, 3] @layer.1.act
  return %3, %4
}
"""


def test_equal_content_equal_digest_across_every_form():
    g = parse_ir(TWO)
    assert parse_ir(TWO).digest == g.digest  # a second parse: another object, the same content
    assert from_json(to_json(g)).digest == g.digest
    assert Graph(g.nodes, g.outputs, g.name, g.next_id).digest == g.digest
    assert pickle.loads(pickle.dumps(g)).digest == g.digest
    assert len(g.digest) == 32 and int(g.digest, 16) >= 0


@pytest.mark.parametrize("edit", [
    lambda t: t.replace("{axis=-1}", "{axis=0}"),  # an attribute
    lambda t: t.replace("matmul(%0, %1)", "matmul(%0, %0)").replace("param {name=\"w\"} : f32[4, 3]",
                                                                      "param {name=\"w\"} : f32[4, 4]"),  # operands
    lambda t: t.replace("return %3, %4", "return %4, %3"),  # outputs, order
    lambda t: t.replace("return %3, %4", "return %3"),  # outputs, count
    lambda t: t.replace("relu(%2)", "gelu(%2)"),  # an op
    lambda t: t.replace("f32[2, 3] @layer.1.act", "f16[2, 3] @layer.1.act"),  # a type
    lambda t: t.replace("@layer.1.act", "@layer.2.act"),  # a path (layer views read it)
    lambda t: t.replace("%4 = relu(%2)", "%5 = relu(%2)").replace("return %3, %4", "return %3, %5"),  # an id
    lambda t: t.replace("graph two", "graph three"),  # the name
], ids=["attr", "operands", "output-order", "output-count", "op", "dtype", "path", "node-id", "name"])
def test_different_content_different_digest(edit):
    changed = edit(TWO)
    assert changed != TWO
    assert parse_ir(changed, verify=False).digest != parse_ir(TWO).digest


def test_values_are_part_of_the_digest_and_shared_by_versions():
    g = parse_ir(TWO)
    w = {"w": np.arange(12, dtype=np.float32).reshape(4, 3)}
    a, b = g.with_values(w), g.with_values({"w": w["w"].copy()})
    c = g.with_values({"w": w["w"] + 1})
    assert a.digest == b.digest and a.digest != g.digest and c.digest != a.digest
    assert a.with_outputs([3]).values is a.values  # versions share the values (and their digest, made once)


def _rebuilt(g: Graph) -> Graph:
    return Graph([n.replace() for n in g], g.outputs, g.name, g.next_id, dict(g.values))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(max_ops=6), st.data())
def test_random_graphs_digest_is_their_content(case, data):
    g = case.graph
    assert _rebuilt(g).digest == g.digest and parse_ir(format_graph(g)).digest == g.digest
    nodes = g.nodes
    k = data.draw(st.integers(0, len(nodes) - 1))
    n = nodes[k]
    # an attribute: a new one on any node
    edited = [m.with_attrs(probe=1) if m.id == n.id else m for m in nodes]
    assert Graph(edited, g.outputs, g.name, g.next_id).digest != g.digest
    # an operand: a compute node reading another value than before (the graph need not be valid to be hashed)
    users = [m for m in nodes if m.inputs]
    if users:
        u = users[data.draw(st.integers(0, len(users) - 1))]
        other = next(i for i in (m.id for m in nodes) if i != u.inputs[0])
        edited = [m.replace(inputs=(other, *m.inputs[1:])) if m.id == u.id else m for m in nodes]
        assert Graph(edited, g.outputs, g.name, g.next_id).digest != g.digest
    # the outputs: one more
    assert g.with_outputs((*g.outputs, n.id)).digest != g.digest


# -- DigestCache -------------------------------------------------------------------------------------------------


class _Counted:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, g: Graph) -> int:
        self.calls += 1
        return len(g)


def test_digest_cache_hits_across_two_equal_graph_objects():
    cache: DigestCache[int] = DigestCache(limit=2)
    count = _Counted()
    a, b = parse_ir(TWO), parse_ir(TWO)
    assert a is not b
    assert cache.get_or_compute(a, lambda: count(a)) == 5
    assert cache.get_or_compute(b, lambda: count(b)) == 5 and count.calls == 1 and b in cache
    other = parse_ir(TWO.replace("relu", "gelu"))
    assert other not in cache and cache.get(other) is None


def test_digest_cache_drops_the_least_recently_used():
    cache: DigestCache[str] = DigestCache(limit=2)
    g1, g2, g3 = (parse_ir(TWO.replace("graph two", f"graph g{k}")) for k in range(3))
    cache[g1], cache[g2] = "1", "2"
    assert cache.get(g1) == "1"  # g1 is now the most recent
    cache[g3] = "3"
    assert len(cache) == 2 and g2 not in cache and cache.get(g1) == "1" and cache.get(g3) == "3"


def test_trace_digest_equal_for_equal_runs_and_cached_views_hit():
    g1 = _transformer()
    g2 = parse_ir(format_graph(g1))
    t1, t2 = Pipeline.canonical().run(g1), Pipeline.canonical().run(g2)
    assert t1 is not t2 and t1.digest == t2.digest == t1.key
    assert RunFacts.of(t1) is RunFacts.of(t2)  # one facts object for both runs
    t3 = Pipeline.canonical().run(parse_ir(format_graph(g1).replace("gelu(", "relu(")))
    assert t3.digest != t1.digest and RunFacts.of(t3) is not RunFacts.of(t1)
    assert Pipeline(["fuse_matmul_bias_act"]).run(g1).digest != t1.digest  # another pipeline, another run


def _transformer() -> Graph:
    b = Builder("tiny")
    x = b.input("x", (1, 4, 8))
    for k in range(2):
        w, bias = b.param(f"layer.{k}.fc.weight", (8, 8)), b.param(f"layer.{k}.fc.bias", (8,))
        with b.scope(f"layer.{k}.fc"):
            x = b.gelu(b.add(b.matmul(x, w), bias))
    b.output(x)
    return b.build()


# -- the bug class: a cache keyed by object identity answering for a rebuilt graph ------------------------------


def _layered(layers: int, dead: bool) -> str:
    lines = ["graph g {", '  %0 = input {name="x"} : f32[2, 4]']
    for i in range(1, layers + 1):
        lines.append(f"  %{i} = relu(%{i - 1}) : f32[2, 4] @layer.{i - 1}.act")
    if dead:
        lines.append(f"  %{layers + 1} = neg(%0) : f32[2, 4] @layer.0.dead")
    lines += [f"  return %{layers}", "}"]
    return "\n".join(lines)


def test_rebuilt_graphs_never_get_a_stale_cached_answer():
    """Each graph is freed before the next is built, so CPython hands the next one a freed address: a cache keyed
    by `id(graph)` (what every one of these caches was before `IdentityMap`, and what `IdentityMap` guarded
    against by holding its keys) would answer for the old graph. Keyed by content, every answer is the graph's own,
    and the equal graphs of the loop hit the entries of the first."""
    for k in range(60):
        layers, dead = 1 + k % 5, k % 2 == 1
        g = parse_ir(_layered(layers, dead))
        want_live = frozenset(range(layers + 1))
        assert live_nodes(g) == want_live
        assert tuple(int(i) for i in layer_indices(g)) == tuple(range(layers))
        t = Pipeline(["fuse_matmul_bias_act"]).run(g)
        assert RunFacts.of(t).trace.digest == t.digest and fused_layers(t) == {}
        del g, t  # freed now (reference counting): the next graph may take its address


def test_an_edited_copy_of_a_cached_graph_is_not_answered_from_the_cache():
    """The edit that once went unseen, an attribute changed on a node a cache had seen, cannot happen (attrs are
    frozen); the edit that remains, a new node in a new graph, is a new digest and a new entry."""
    g = parse_ir(_layered(3, dead=False))
    assert live_nodes(g) == frozenset({0, 1, 2, 3})
    with pytest.raises(TypeError):
        g[2].attrs["probe"] = 1  # type: ignore[index]
    rewired = Graph([n.replace(inputs=(0,)) if n.id == 2 else n for n in g], g.outputs, g.name, g.next_id)
    assert rewired.digest != g.digest and live_nodes(rewired) == frozenset({0, 2, 3})
    assert live_nodes(g) == frozenset({0, 1, 2, 3})


def test_a_run_copied_with_other_hints_is_another_run():
    """`session.advice.vetted` copies a run with the hints of the fixes that failed their check: same graphs, other
    decisions. Its digest differs, so its verdict is made from its own rejections, not served from the original's."""
    from dataclasses import replace

    from rlxviz.passes import Trace

    g = parse_ir(TWO)
    t = Pipeline(["fuse_matmul_bias_act"]).run(g)
    step = t.steps[0]
    probe = replace(step, rejections=[*step.rejections, _rejection("hint a")])
    a, b = Trace(t.input, [probe], t.pipeline), Trace(t.input, [replace(probe, rejections=[
        *step.rejections, _rejection("hint b")])], t.pipeline)
    assert a.digest != b.digest and RunFacts.of(a) is not RunFacts.of(b) and RunFacts.of(b).trace is b
    assert Trace(t.input, [replace(probe, seconds=9.0)], t.pipeline).digest == a.digest  # the time is no decision


def _rejection(hint: str):
    from rlxviz.passes.trace import Rejection

    return Rejection("fuse_matmul_bias_act", "fuse_matmul_bias_act.bias_act", 2, "guard", "g", "m", hint=hint)


def test_a_changed_pass_registry_empties_the_caches(monkeypatch):
    """A view of a run reads the pass definitions too (a guard's declared excuse): replacing a pass in `PASSES` (a
    notebook's new rule, a test's patched policy) must not leave a view made under the old definition in a cache
    keyed by the unchanged content."""
    from rlxviz.passes import PASSES

    cache: DigestCache[int] = DigestCache()
    g = parse_ir(TWO)
    cache[g] = 1
    assert cache.get(g) == 1
    monkeypatch.setitem(PASSES, "unfuse", PASSES["unfuse"])
    assert cache.get(g) is None and len(cache) == 0
    t = Pipeline(["fuse_matmul_bias_act"]).run(g)
    facts = RunFacts.of(t)
    assert RunFacts.of(t) is facts
    monkeypatch.delitem(PASSES, "unfuse")
    assert RunFacts.of(t) is not facts
