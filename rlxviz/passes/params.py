"""Pipeline parameters: one frozen dataclass, so a misspelt parameter fails where it is given.

`Pipeline.params` stays a plain mapping of overrides (front ends build it from user input), but every place that
takes one (`Pipeline(...)`, `Pipeline.canonical(**params)`, `Pipeline.run(graph, params)`, `run_passes`,
`session.build_pipeline`) checks its keys against `PipelineParams`' fields and the parameters its passes declare.
Before this, an open `dict[str, Any]` took `{"fab_max_tokns": 1}` without a word, and because `guard.size_le` reads a
missing parameter as "no gate", the attention gate silently switched off.

A rule author may add a gate of their own (`size_le("epilogue_max_rows", ...)`, as notebook 04 asks): the guard
declares the parameter (`Guard.params`), its pass collects it (`Pass.params`), and a pipeline holding that pass
accepts it. A new name close to a field (`fab_max_tokns`) is taken for a misspelling when the guard is built
(`check_new_param`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any


class ParamError(KeyError):
    """An unknown pipeline parameter. `str()` is the one-line message (not `KeyError`'s quoted repr).

    Attributes:
        name: the unknown parameter.
        close: the known parameters it is close to (difflib), best first; empty when none is close.
    """

    def __init__(self, name: str, close: tuple[str, ...], where: str = "", known: Iterable[str] = ()) -> None:
        self.name, self.close = name, close
        guess = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        at = f" (in {where})" if where else ""
        self.message = f"unknown pipeline parameter {name!r}{at}{guess} (known: {', '.join(known or PARAM_NAMES)})"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineParams:
    """Every parameter a pass reads from its pipeline.

    Attributes:
        fab_max_tokens: batch*seq gate of `fuse_attention_block` (tokens); None = no gate (the `rlx` profile: 64).
        max_region_steps: most elementwise steps `mark_elementwise_regions` packs into one region (count).
        max_region_inputs: most distinct inputs of one region (count).
        merge_cost_test: True: `fuse_shared_input_matmul` never merges a matmul whose merge would cost a fusion.
        unfuse_ops: op names `unfuse` expands (None: every fused op).
    """

    fab_max_tokens: int | None = None
    max_region_steps: int = 32
    max_region_inputs: int = 16
    merge_cost_test: bool = True
    unfuse_ops: tuple[str, ...] | list[str] | None = None

    @classmethod
    def of(cls, params: Mapping[str, Any] | None, where: str = "") -> PipelineParams:
        """The parameters with `params` over the defaults.

        Raises:
            ParamError: a key that is no field, naming the close matches.
        """
        check_params(params or {}, where)
        return cls(**dict(params or {}))


PARAM_NAMES: tuple[str, ...] = tuple(f.name for f in fields(PipelineParams))
"""The known parameter names, in declaration order."""


def check_param(name: str, where: str = "", known: Iterable[str] = PARAM_NAMES) -> str:
    """`name`, if it is one of `known` (default: the `PipelineParams` fields).

    Raises:
        ParamError: naming `where` and the close matches (`difflib.get_close_matches`).
    """
    known = tuple(known)
    if name not in known:
        raise ParamError(name, tuple(difflib.get_close_matches(str(name), known, n=2)), where, known)
    return name


def check_params(params: Mapping[str, Any], where: str = "", known: Iterable[str] = PARAM_NAMES
                 ) -> Mapping[str, Any]:
    """`params`, after checking every key with `check_param` (raises `ParamError` on the first unknown one)."""
    known = tuple(known)
    for k in params:
        check_param(k, where, known)
    return params


def check_new_param(name: str, where: str = "") -> str:
    """`name` for a guard that reads a pipeline parameter: a `PipelineParams` field, or a new parameter of the
    guard's own (a gate a rule author adds, e.g. `epilogue_max_rows`; the guard's pass then declares it, and a
    pipeline that holds the pass accepts it). A name that is no field but close to one is taken for a misspelling.

    Raises:
        ParamError: `name` is within difflib's 0.75 ratio of a field it is not (`fab_max_tokns`).
    """
    close = tuple(difflib.get_close_matches(str(name), PARAM_NAMES, n=2, cutoff=0.75))
    if name not in PARAM_NAMES and close:
        raise ParamError(name, close, where)
    return name


__all__ = ["PARAM_NAMES", "ParamError", "PipelineParams", "check_new_param", "check_param", "check_params"]
