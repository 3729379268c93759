"""What a pipeline run decided, as data: `Match`, `Rejection`, `PassStep`, `Trace`.

RLX keeps none of this (rlx-notes §7.5): its guards are bare `continue`s. Here every near-match is
a `Rejection` naming the guard, the actual and required values, and the nodes to highlight.
Everything serializes to JSON for notebooks, the app and the CLI.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ..ir import Graph, format_graph, graph_to_dict

_LAYER = re.compile(r"(?:^|\.)(?:layer|layers|h|blocks?)\.(\d+)(?:\.|$)|@(\d+)(?:\.|$)")
"""A layer in a path: `encoder.layer.3`, `h.3`, `blocks.3`, or the 3rd call of a module called once per layer
(`albert_layers.0@3`, `models.module_calls`)."""


@functools.lru_cache(maxsize=1 << 16)
def layer_of(path: str) -> int | None:
    """The layer index in a model path (`encoder.layer.3.attention` -> 3), or None. Cached by path: every per-layer
    view asks it of every node."""
    m = _LAYER.search(path or "")
    return int(m.group(1) if m.group(1) is not None else m.group(2)) if m else None


@dataclass(frozen=True)
class Match:
    """A pattern that matched and was rewritten.

    Attributes:
        pass_name: the pass, e.g. `fuse_transformer_layer`.
        rule: the rule within the pass, e.g. `fuse_transformer_layer.bert_post_ln`.
        anchor: id of the node the match was anchored on.
        bindings: role -> node id, e.g. `{"attn": 41, "ln1": 44, "fc1": 45, "fc2": 46, "ln2": 47}`.
        fused: id of the node that replaced the match (None for a rewrite that makes several).
        path: provenance of the match (common model path, e.g. `encoder.layer.3`).
    """

    pass_name: str
    rule: str
    anchor: int
    bindings: dict[str, int]
    fused: int | None
    path: str = ""

    @property
    def layer(self) -> int | None:
        return layer_of(self.path)


@dataclass(frozen=True)
class Rejection:
    """A near-match: the pattern started to match at `anchor` and stopped.

    Attributes:
        stage: `"structure"` (the graph does not have the pattern's shape at a bound role) or
            `"guard"` (the shape is there but a named guard failed).
        guard: the guard's name, e.g. `h1_user_count`.
        message: actual vs required, e.g. "h1 (%41, encoder.layer.3) has 3 users; needs exactly 2: ...".
        bindings: role -> node id bound before matching stopped.
        offending: node ids to emphasize (e.g. the extra user of h1).
        offending_edges: `(producer, consumer)` edges to emphasize.
        hint: how to fix the model or the pipeline.
        subject: the node the failed check is about (h1 for `h1_user_count`), when known; the
            renderer marks it with the guard. None: the anchor is the subject.
        kind: what kind of "no": `illegal` (fusing would change meaning), `not recognized` (a pattern
            limit; `fix` says what the compiler would need) or `not profitable` (a gate or cost test).
        fix: the compiler-side fix, if any (e.g. "add gelu_tanh to the epilogue allow-list").
        needed / found: for a structure failure, what the pattern needed at the failing operand edge
            (deduplicated alternatives) and the op found there; `found` is never among `needed`.
        headline: the first failing guard of its candidate (False: a further failing guard of the same
            rule at the same anchor, reported after the headline).
        soft: the rule still fused; this records what it left out (e.g. an additive mask kept).
        remedy: `compiler only` or `read by the model` when no change to the model that keeps its numbers makes the
            fusion legal (the hint then says why, `none in the model: ...`); "" or `in the model`: the hint keeps
            the numbers (`guard.REMEDIES`).
    """

    pass_name: str
    rule: str
    anchor: int
    stage: str
    guard: str
    message: str
    bindings: dict[str, int] = field(default_factory=dict)
    offending: tuple[int, ...] = ()
    offending_edges: tuple[tuple[int, int], ...] = ()
    path: str = ""
    hint: str = ""
    subject: int | None = None
    kind: str = ""
    fix: str = ""
    needed: tuple[str, ...] = ()
    found: str = ""
    headline: bool = True
    soft: bool = False
    remedy: str = ""

    @property
    def layer(self) -> int | None:
        return layer_of(self.path)


@dataclass
class PassStep:
    """One pass of a pipeline run: the graph before and after, and what it decided.

    `seconds` is wall time of the pass (s). `error` holds the verifier's or the pass's error text
    when the pass broke the graph; then `after` is `before` (the broken result is discarded).
    """

    pass_name: str
    before: Graph
    after: Graph
    matches: list[Match] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def added(self) -> list[int]:
        """Ids present after the pass but not before."""
        return [n.id for n in self.after if n.id not in self.before]

    @property
    def removed(self) -> list[int]:
        """Ids present before the pass but not after."""
        return [n.id for n in self.before if n.id not in self.after]

    @property
    def changed(self) -> bool:
        return self.after is not self.before and (bool(self.added) or bool(self.removed)
                                                  or self.after.outputs != self.before.outputs)


@dataclass
class Trace:
    """A pipeline run: the input graph and one `PassStep` per pass, in order."""

    input: Graph
    steps: list[PassStep] = field(default_factory=list)
    pipeline: str = ""
    _key: tuple[int, str] = field(default=(-1, ""), repr=False, compare=False)

    @property
    def key(self) -> str:
        """A content key: a digest of the input graph's IR text and each step's pass name, params and error.

        Passes are deterministic, so two traces with the same key hold the same versions; caches (drawings,
        timings) key on it instead of the object's identity. Recomputed when steps were added since.
        """
        if self._key[0] != len(self.steps):
            h = hashlib.sha256(format_graph(self.input).encode())
            for s in self.steps:
                h.update(json.dumps([s.pass_name, s.params, s.error], sort_keys=True, default=str).encode())
            self._key = (len(self.steps), h.hexdigest()[:24])
        return self._key[1]

    @property
    def final(self) -> Graph:
        return self.steps[-1].after if self.steps else self.input

    def versions(self) -> list[tuple[str, Graph]]:
        """`[("input", g0), ("after fuse_sdpa", g1), ...]`: every graph version in order."""
        return [("input", self.input)] + [(f"after {s.pass_name}", s.after) for s in self.steps]

    @property
    def matches(self) -> list[Match]:
        return [m for s in self.steps for m in s.matches]

    @property
    def rejections(self) -> list[Rejection]:
        return [r for s in self.steps for r in s.rejections]

    def step(self, pass_name: str) -> PassStep:
        """The (last) step of `pass_name`. Raises KeyError if the pass did not run."""
        for s in reversed(self.steps):
            if s.pass_name == pass_name:
                return s
        raise KeyError(f"pass {pass_name!r} is not in this trace: {[s.pass_name for s in self.steps]}")

    def to_dict(self, graphs: bool = True) -> dict[str, Any]:
        """JSON-ready dict; with `graphs`, every version's graph is included (see `ir.graph_to_dict`)."""
        return {
            "pipeline": self.pipeline,
            "input": graph_to_dict(self.input) if graphs else None,
            "steps": [{
                "pass": s.pass_name, "seconds": s.seconds, "error": s.error, "params": s.params,
                "added": s.added, "removed": s.removed,
                "matches": [asdict(m) for m in s.matches],
                "rejections": [asdict(r) for r in s.rejections],
                "after": graph_to_dict(s.after) if graphs else None,
            } for s in self.steps],
        }

    def to_json(self, graphs: bool = True, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(graphs), indent=indent)
