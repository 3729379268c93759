"""The explained fusion pipeline: patterns, named guards, rules, passes, pipelines, traces, reports."""

from .engine import Pass, PassResult, find, rule_pass
from .explain import LayerExplanation, Outcome, explain
from .guard import EPILOGUE_ACTIVATIONS, Ctx, Guard
from .pattern import Miss, P
from .pipeline import CANONICAL_ORDER, DEFAULT_PARAMS, PASSES, RLX_ORDER, Pipeline, run_pass, run_passes
from .report import MissedFusion, format_report, missed_fusions
from .rule import Rule, Shape, Soft, User
from .trace import Match, PassStep, Rejection, Trace, layer_of

__all__ = [
    "CANONICAL_ORDER", "DEFAULT_PARAMS", "EPILOGUE_ACTIVATIONS", "PASSES", "RLX_ORDER", "Ctx", "Guard",
    "LayerExplanation", "Match", "Miss", "MissedFusion", "Outcome", "P", "Pass", "PassResult", "PassStep", "Pipeline",
    "Rejection", "Rule", "Shape", "Soft", "Trace", "User", "explain", "find", "format_report", "layer_of",
    "missed_fusions", "rule_pass", "run_pass", "run_passes",
]
