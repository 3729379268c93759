"""What a pipeline run decided, as data: `Match`, `Rejection`, `PassStep`, `Trace`.

RLX keeps none of this (docs/rlx.md §7.5): its guards are bare `continue`s. Here every near-match is
a `Rejection` naming the guard, the actual and required values, and the nodes to highlight.
Everything serializes to JSON for notebooks, the app and the CLI.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..ir import Graph, graph_to_dict
from .guard import near_miss_kind
from .merge_costs import MergeCosts

_LAYER = re.compile(r"(?:^|\.)(?:layer|layers|h|blocks?)\.(\d+)(?:\.|$)|@(\d+)(?:\.|$)")
"""A layer in a path: `encoder.layer.3`, `h.3`, `blocks.3`, or the 3rd call of a module called once per layer
(`albert_layers.0@3`, `models.module_calls`)."""


_STACK = re.compile(r"(?:^|.*\.)[^.]*(?:encoder|decoder)[^.]*(?=\.)", re.IGNORECASE)
"""The stack part of the path before a layer: up to its last component naming an encoder or a decoder
(`encoder`, `model.decoder`, `text_model.encoder`)."""


class Layer(int):
    """A layer key: its index within its stack (the int value) and the stack (`encoder`, `decoder`,
    `text_model.encoder`; "" when the path names neither an encoder nor a decoder: `model.layers.3`, `h.3`).

    An encoder-decoder model numbers its layers per stack (`encoder.layers.0` and `decoder.layers.0` are two
    layers): two `Layer`s are equal when index and stack are. A plain int N equals every stack's layer N (the
    hash is the index's), so callers of a one-stack model (`explain --layer 0`, `r.layer == 0`) are unchanged;
    `resolve_layers` turns a plain int into the graph's own keys. Ordering: by stack (encoders first, then
    decoders, by name), then by index.

    Attributes:
        stack: as above.
        qualified: the graph this key was listed from has more than one stack (`layer_keys`): its `label` names
            the stack (`decoder layer 0`), else it is `layer 0`. Not part of equality.
    """

    stack: str
    qualified: bool

    def __new__(cls, index: int, stack: str = "", qualified: bool = False) -> Layer:
        self = super().__new__(cls, index)
        self.stack, self.qualified = stack, qualified
        return self

    def __getnewargs__(self) -> tuple[int, str, bool]:  # pickling and deepcopy (dataclasses.asdict) keep the stack
        return int(self), self.stack, self.qualified

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Layer):
            return int(self) == int(other) and self.stack == other.stack
        return int(self) == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = int.__hash__

    def _key(self) -> tuple[int, str, int]:
        s = self.stack.lower()
        return (0 if not s else 1 if "encoder" in s else 2, s, int(self))

    def __lt__(self, other: object) -> bool:
        return self._key() < other._key() if isinstance(other, Layer) else int(self) < other  # type: ignore[operator]

    def __le__(self, other: object) -> bool:
        return self == other or self < other

    def __gt__(self, other: object) -> bool:
        return not self <= other

    def __ge__(self, other: object) -> bool:
        return not self < other

    def __repr__(self) -> str:
        return f"Layer({int(self)}, {self.stack!r})" if self.stack else repr(int(self))

    def __str__(self) -> str:  # the index, as for an int (`f"layer {k}"`, path components); `label` names the stack
        return str(int(self))

    @property
    def label(self) -> str:
        """`layer 3`, or with the stack named when its model has several (`decoder layer 3`, a leading `model.`
        left out)."""
        if not self.qualified or not self.stack:
            return f"layer {int(self)}"
        stack = self.stack[len("model."):] if self.stack.startswith("model.") else self.stack
        return f"{stack} layer {int(self)}"


def layer_label(layer: int | None) -> str:
    """`layer 3` / `decoder layer 3` (a `Layer`'s label), `layer 3` for a plain int, `no layer` for None."""
    if layer is None:
        return "no layer"
    return layer.label if isinstance(layer, Layer) else f"layer {layer}"


def whose_place(layer: int | None, path: str) -> str:
    """` in LAYER` (`layer_label`) when a node at model path `path` lies in another layer than a place of `layer` that
    names it (an offending reader: n4-13's layer-1 attention reads layer 0's K, whose refusal is layer 0's), so a mark
    or a role on the node says whose place it is; "" for a node of the place's own layer, or where either names no
    layer. What the drawing's node marks and the node drawer's roles add."""
    mine = layer_of(path or "")
    return f" in {layer_label(layer)}" if layer is not None and mine is not None and mine != layer else ""


NO_PATH = "-"
"""What stands for a node's path where it has none (`place_label`)."""


def place_label(anchor: int, path: str, with_node: bool = False) -> str:
    """The name of a place (a pattern's candidate, a match) at node `anchor` with model path `path`, one for every
    front end: its path, or its node `%ANCHOR` where it has no path (the app's chip tooltips said `-`); with
    `with_node` the node and the path, `%ANCHOR (PATH)` (`NO_PATH` for none), as `explain`'s lines say
    `RULE @ %17 (-)`."""
    if with_node:
        return f"%{anchor} ({path or NO_PATH})"
    return path or f"%{anchor}"


@functools.lru_cache(maxsize=1 << 16)
def layer_of(path: str) -> Layer | None:
    """The layer in a model path (`encoder.layer.3.attention` -> 3, in stack `encoder`; `decoder.block.1.layer.0`
    -> 1 in stack `decoder`), or None. Cached by path: every per-layer view asks it of every node."""
    path = path or ""
    m = _LAYER.search(path)
    if not m:
        return None
    st = _STACK.match(path[:m.start() + 1])
    stack = st.group(0) if st else ""
    stack = stack[len("model."):] if stack.startswith("model.") else stack
    return Layer(int(m.group(1) if m.group(1) is not None else m.group(2)), stack)


def layer_prefix(path: str) -> str | None:
    """The part of a model path up to and including its layer (`layer_of`'s match): `encoder.layer.3.attention` ->
    `encoder.layer.3`, ALBERT's `albert_layers.0@1.attention` -> `albert_layers.0@1` (no component of it is `1`);
    None when the path names no layer."""
    m = _LAYER.search(path or "")
    return None if m is None else path[:m.end()].rstrip(".")


def layer_keys(layers: Iterable[Layer | int]) -> tuple[Layer | int, ...]:
    """The distinct layer keys of one model, sorted, each `qualified` when the model has more than one stack (so
    its label names the stack)."""
    keys = set(layers)
    stacks = {k.stack for k in keys if isinstance(k, Layer)}
    if len(stacks) > 1:
        keys = {Layer(int(k), k.stack, True) if isinstance(k, Layer) else k for k in keys}
    return tuple(sorted(keys))


def same_stack_as(a: Layer | int, b: Layer | int) -> bool:
    """Whether layers `a` and `b` are of one stack; a plain int (a layer asked for by index alone) is of any."""
    return not isinstance(a, Layer) or not isinstance(b, Layer) or a.stack == b.stack


def own_key(have: Sequence[Layer | int], layer: Layer | int | None) -> Layer | int | None:
    """`layer` as the very key of `have` (a model's `layer_keys`) it stands for: the key of its index and stack, else
    (a plain int, as a click on a layer box sends, or another model's key) the first of its index, the one a picker
    listing `have` shows for it; `layer` itself when no key of `have` has its index (for the caller's "not in the
    model" answer) or `have` is empty.

    A plain int N equals every stack's layer N, and `qualified` is no part of equality: a key held past a click or a
    model switch compared equal to the key meant, so setting that key changed nothing (no event), and the Why tab kept
    `Layer 0` (the encoder's text) under a menu reading `decoder layer 0` (bart-full after a layer click on GPT-J)."""
    if layer is None or not have:
        return layer
    if isinstance(layer, Layer):
        mine = next((k for k in have if isinstance(k, Layer) and k == layer), None)
        if mine is not None:
            return mine
    return next((k for k in have if int(k) == int(layer)), layer)


def resolve_layers(have: Sequence[Layer | int], wanted: Iterable[Layer | int]) -> list[Layer | int]:
    """`wanted` as keys of `have` (a model's `layer_keys`): a `Layer` stays itself (qualified as in `have`); a
    plain int N becomes every stack's layer N (in an encoder-decoder model, `--layer 0` is the encoder's and the
    decoder's layer 0); one that is in no stack is kept as is (for the caller's "not in the model" error)."""
    out: list[Layer | int] = []
    for w in wanted:
        hits = [k for k in have if (k == w if isinstance(w, Layer) else int(k) == w)]
        out += hits or [w]
    return list(dict.fromkeys(out))


REFUSAL_LAYER_RULE = ("a refusal is filed in the layer of the refused candidate's core op where its rule names one "
                      "(a linear's matmul, for a matmul + bias epilogue), not of its anchor: a graph optimizer may "
                      "have named the bias add after the next layer's norm (ONNX Runtime's SkipLayerNormalization "
                      "takes the bias of layer N's fc2 under layer N+1's norm); every other refusal is filed in its "
                      "anchor's layer")
"""How a refusal gets its layer (`Rejection.layer`, `refusal_layer_path`), in words: every view that files a refusal
in a layer (`explain`'s text, `-v` and `--json`, the app's Why tab, chips and boxes) reads `Rejection.layer`."""


def refusal_layer_path(graph: Graph, bindings: dict[str, int], core: Sequence[str]) -> str:
    """The path that files a refusal in a layer (`REFUSAL_LAYER_RULE`): that of the first of the rule's `core` roles
    bound in `bindings` to a node of `graph` with a path, "" when none is (the anchor's path then files it).

    Args:
        graph: the graph the refusing pass read.
        bindings: the refused candidate's role -> node id.
        core: the rule's core roles, first first (`Rule.core`: `("mm", "w")` for a linear).
    """
    return next((graph[i].path for r in core if (i := bindings.get(r)) is not None and i in graph and graph[i].path),
                "")


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
        roles: the roles the failing guard or step reads or binds (`rule.step_roles`; `name*`: a numbered family),
            the one it is about first (a guard's first `requires`: `ln2` for `ln2_residual_scaled`, which also reads
            `ln1` as the residual it scales). (): not known (a pass that records its refusals itself).
        dead: a reader refusal's extra readers when every one reaches no graph output (dead code: `rule.Fail.dead`,
            ids in the version the pass saw); `fix` is then dead-code elimination before the pass
            (`readers.DCE_FIRST`) and its kind is worded from them (`refusal_kinds.kind_words`). (): any other refusal.
        layer_path: the path that files the refusal in a layer (`REFUSAL_LAYER_RULE`): the path of the refused
            candidate's core op (`Rule.core`: a linear's matmul) where its rule names one and it was bound; ""
            (the anchor's `path` files it) otherwise. `path` stays the anchor's: the place's label.
        costs: what the members a cost test left out would cost (`merge_costs.MergeCosts`, `merge_keeps_fusions`),
            from which `message` and every view's words are made; None for any other refusal.
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
    roles: tuple[str, ...] = ()
    dead: tuple[int, ...] = ()
    layer_path: str = ""
    costs: MergeCosts | None = None

    @property
    def layer(self) -> int | None:
        """The layer the refusal is filed in (`REFUSAL_LAYER_RULE`): `layer_path`'s, else its anchor's `path`'s."""
        return layer_of(self.layer_path or self.path)

    @property
    def place_role(self) -> str | None:
        """The role of `bindings` whose node the failing check is about (`roles`' first): its place within the
        candidate (`ln1` or `ln2`, the two residual norms of a FusedTransformerLayer candidate anchored at its
        attention). None when `roles` is not known or that role was not bound: the candidate as a whole."""
        return self.roles[0] if self.roles and self.roles[0] in self.bindings else None

    @property
    def near_miss(self) -> bool:
        """Whether the refusal is of a near-miss kind (`guard.near_miss_kind`): not one of `guard.NOT_NEAR_MISSES` (a
        fusion that kept the model's own term; nodes that only look like the rule's input, as BERT's embeddings'
        broadcast sum) and not declined by the tool's own cost test (`guard.DOES_NOT_PAY`). Only
        these are missed fusions (`report.missed_fusions`); the app's chips count the hard ones as rejections (✗)
        and its pass filter keeps the passes that have one (`app.derived`)."""
        return near_miss_kind(self.kind, self.remedy)


STAGE_SEP = "/"
"""Between a pass's name and its stage's in a step name: `fuse_sdpa/rope_heads` (`engine.Pass.stages`). A dot would
read as a rule name (`fuse_sdpa.rope_heads`); the slash is no identifier character, so a `run P first` hint never
names a stage, and `NAME#K` (the K-th run) still parses."""


RUN_SEP = "#"
"""Between a step's name and its run number in a version's name: `dead_code_elimination#2`, the second run, as
`--after NAME#K` takes it (`session.pipeline.version_index`); a first run keeps the bare name."""


def family_of(step_name: str) -> str:
    """The pass a step belongs to: `fuse_sdpa` for its stage `fuse_sdpa/rope_heads`, for itself and for a later run
    of it (`fuse_sdpa#2`)."""
    return step_name.partition(RUN_SEP)[0].partition(STAGE_SEP)[0]


def run_name(step_name: str, run: int) -> str:
    """The name of the `run`-th (1-based) run of `step_name`: the bare name for the first, `NAME#K` after it (the
    form `--after` takes)."""
    return step_name if run <= 1 else f"{step_name}{RUN_SEP}{run}"


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
    def family(self) -> str:
        """The pass this step belongs to (`family_of`): its own name, or its pass's for a stage."""
        return family_of(self.pass_name)

    @property
    def is_stage(self) -> bool:
        """A stage of a pass (`fuse_sdpa/rope_heads`), not the pass's own step."""
        return STAGE_SEP in self.pass_name

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


def reading_order(trace: Trace) -> Callable[[int | None, int], tuple[int, Any, float]]:
    """The order a reader walks the model in, as a sort key of a place (`(layer, anchor node id)`): by layer (as
    `Layer` orders them: encoders first, then by index), then by the anchor's position in the input graph's
    topological order (`anchor_position`); a place in no layer comes before the layers when its anchor is before
    every layer's first node (the embeddings), after them otherwise (the final norm, the head). Sort stably by it
    from pass order to get pass order between places of one anchor. The app's matches table and `explain`'s
    left-out lines list their rows in this one order.

    Returns:
        key(layer, anchor) -> (0 before the layers | 1 in one | 2 after them, the layer or 0, the position)."""
    position = anchor_position(trace)
    first = min((position(n.id) for n in trace.input if layer_of(n.path or "") is not None), default=math.inf)

    def key(layer: int | None, anchor: int) -> tuple[int, Any, float]:
        at = position(anchor)
        if layer is not None:
            return (1, layer, at)
        return (0 if at < first else 2, 0, at)

    return key


def anchor_position(trace: Trace) -> Callable[[int], float]:
    """Node id (of any version of `trace`) -> its position in the input graph's topological order (0 the first
    node): an input-graph node's own; a node a pass made, the last position of the nodes it absorbed (it stands where
    its result stood), followed back pass by pass; a node made from none (a packed concat of weights) just after its
    last operand (+ 0.5); `inf` for an id no version holds. Memoized per call."""
    graph = trace.input
    made: dict[int, Any] = {}
    for s in trace.steps:
        for n in s.after:
            if n.id not in graph:
                made.setdefault(n.id, n)
    memo: dict[int, float] = {}

    def position(i: int) -> float:
        if i in memo:
            return memo[i]
        if i in graph:
            memo[i] = float(graph.position(i))
            return memo[i]
        n = made.get(i)
        memo[i] = math.inf  # a cycle (none in a DAG) ends here
        if n is not None:
            src = [int(a) for a in n.absorbed]
            shift = 0.0 if src else 0.5
            found = [p for p in map(position, src or n.inputs) if p != math.inf]
            memo[i] = max(found) + shift if found else math.inf
        return memo[i]

    return position


@dataclass
class Trace:
    """A pipeline run: the input graph and one `PassStep` per pass, in order."""

    input: Graph
    steps: list[PassStep] = field(default_factory=list)
    pipeline: str = ""
    _key: tuple[int, str] = field(default=(-1, ""), repr=False, compare=False)

    @property
    def digest(self) -> str:
        """The run's content identity: sha256 (hex, 24 digits) of the pipeline name, the input graph's
        `Graph.digest`, and per step its pass name, params, error, the digest of the graph after it and what it
        decided (every field of its matches and rejections; not its seconds).

        Two traces with the same digest hold the same versions and decisions, so caches of views derived from a
        run (explanations, verdicts, drawings, timings) key on it instead of the object's identity. Made once per
        step count (recomputed when steps were added since; steps are not edited in place once added).
        """
        if self._key[0] != len(self.steps):
            h = hashlib.sha256(f"{self.pipeline}\n{self.input.digest}\n".encode())
            for s in self.steps:
                h.update(json.dumps([s.pass_name, s.params, s.error, s.after.digest], sort_keys=True,
                                    default=str).encode())
                h.update(repr((s.matches, s.rejections)).encode())  # every field: a vetted copy differs in hints
            self._key = (len(self.steps), h.hexdigest()[:24])
        return self._key[1]

    @property
    def key(self) -> str:
        """`digest` (the name the app's and the session's caches use)."""
        return self.digest

    @property
    def final(self) -> Graph:
        return self.steps[-1].after if self.steps else self.input

    def versions(self) -> list[tuple[str, Graph]]:
        """`[("input", g0), ("after fuse_sdpa", g1), ...]`: every graph version in order, a pass's later run named
        as `--after` takes it (`after dead_code_elimination#2`, `step_name`)."""
        names = self.step_names()
        return [("input", self.input)] + [(f"after {n}", s.after) for n, s in zip(names, self.steps, strict=True)]

    def step_names(self) -> list[str]:
        """The name of each step as the CLI and the app name its version: `pass_name` for a pass's first run,
        `NAME#K` for its K-th (`run_name`; `session.pipeline.version_index` reads it back). One name for both: the
        CLI said `after dead_code_elimination` for the second, no-op run, which the app's list names the same way
        as the first run that removed a node."""
        seen: dict[str, int] = {}
        out = []
        for s in self.steps:
            seen[s.pass_name] = seen.get(s.pass_name, 0) + 1
            out.append(run_name(s.pass_name, seen[s.pass_name]))
        return out

    def step_name(self, step: PassStep) -> str:
        """`step_names`' name of `step` (by identity); its bare `pass_name` when it is no step of this trace."""
        k = self.index_of(step)
        return step.pass_name if k is None else self.step_names()[k]

    @property
    def matches(self) -> list[Match]:
        return [m for s in self.steps for m in s.matches]

    @property
    def rejections(self) -> list[Rejection]:
        return [r for s in self.steps for r in s.rejections]

    def pass_number(self, k: int) -> int:
        """The 1-based number of step `k`'s pass in the run, a pass's stages counted with it (`fuse_attention_block`
        is pass 8 of the canonical run whether or not `fuse_sdpa`'s stages are steps of their own)."""
        return sum(1 for s in self.steps[:k + 1] if not s.is_stage) + (1 if self.steps[k].is_stage else 0)

    def index_of(self, step: PassStep) -> int | None:
        """The index of `step` in `steps` (by identity: two steps may compare equal), or None when it is no step of
        this trace."""
        return next((k for k, s in enumerate(self.steps) if s is step), None)

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
