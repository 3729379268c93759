"""Bounded fuzzing (issue 15): a few thousand mutated IR texts and a few hundred corrupted checkpoints, each
loaded the way every front end loads them (`session.load_ir_text`, `session.load`).

Asserted for every input: it loads, or it fails with a documented error class (`IRSyntaxError` with a line
and column, or a `SessionError`, one line); nothing takes over 5 s (`walltime.within`); nothing loaded
exceeds the memory budget (`Limits`) and the process does not grow past it. Seeded, so a failure reproduces.
"""

import json
import random
import resource
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from walltime import within

from rlxviz.ir import IRSyntaxError, format_graph
from rlxviz.ir.memory import peak_memory
from rlxviz.models import BertConfig, build_bert
from rlxviz.models.bert import random_weights
from rlxviz.passes import CANONICAL_ORDER, Pipeline
from rlxviz.runtime import run_reference
from rlxviz.session import Limits, SessionError, load, load_ir_text
from rlxviz.session.loading import MODELS

DATA = Path(__file__).parent / "data" / "reliability"
LIMIT = Limits(64, "fuzz")
HANG_S = 5

TOKENS = ["[" * 40, "]", "{", "}", "(", ")", '"', "\\", "\\u12", "%", "%99999", "9" * 80, "-1", "1e400", "nan",
          "-inf", "0", ",", "=", ":", "@", "<-", "f32[", "bool", "i64", "\x00", "é", "\u2028", "\n", "return %0",
          "graph", "}", "const {value=4.0} : bool[]", "[1000000, 1000000]", "[0]", "keepdims=true", "axes=[9]",
          "%0 = input {name=\"x\"} : f32[2, 4]\n", "reduce_sum(%0)", "matmul(%0, %0)", "  ", "#", "//"]


def _seeds() -> list[str]:
    tiny = build_bert(BertConfig(vocab_size=30, hidden=8, heads=2, intermediate=16, layers=1, max_position=8),
                      1, 4, "hf", name="tiny")
    return [format_graph(tiny), (DATA / "xss_paths.ir").read_text(), (DATA / "ir_reduce_no_keepdims.ir").read_text(),
            (DATA / "ir_nesting_min.ir").read_text(), (DATA / "ir_outer_3gb.ir").read_text()]


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 4)):
        i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        kind = rng.randrange(6)
        if kind == 0:
            text = text[:i] + text[j:j + rng.randint(0, 40)] + text[j:]  # duplicate a span
        elif kind == 1:
            text = text[:i] + text[min(j, i + 30):]  # delete a span
        elif kind == 2:
            text = text[:i] + rng.choice(TOKENS) + text[i:]  # insert a token
        elif kind == 3:
            text = text[:i] + str(rng.choice([2**31, 2**63, 10**12, 7, 0, 3])) + text[i + 1:]  # a number
        elif kind == 4:
            lines = text.split("\n")
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]  # swap two lines
            text = "\n".join(lines)
        else:
            text = text[:i] + chr(rng.randrange(32, 127)) + text[i + 1:]  # flip a character
    return text


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_mutated_ir_only_documented_errors_no_hang_within_budget():
    rng = random.Random(15)
    seeds = _seeds()
    rss0 = _rss_mb()
    outcomes = {"loaded": 0, "syntax": 0, "session": 0, "ran": 0}
    for k in range(2000):
        text = _mutate(rng, rng.choice(seeds))
        try:
            with within(HANG_S, f"loading mutant #{k} ({text[:300]!r})"):
                model = load_ir_text(text, LIMIT)
        except IRSyntaxError as e:
            assert e.line >= 1 and e.col >= 1 and "\n" not in e.reason, repr(text[:200])
            outcomes["syntax"] += 1
            continue
        except SessionError as e:
            assert "\n" not in str(e).strip(), str(e)
            outcomes["session"] += 1
            continue
        outcomes["loaded"] += 1
        assert peak_memory(model.graph).peak_bytes <= LIMIT.max_bytes
        if k % 5 == 0:  # a pass may crash (recorded in the trace), never raise; the reference runs what loaded
            with within(HANG_S, f"running mutant #{k} ({text[:300]!r})"):
                trace = Pipeline(list(CANONICAL_ORDER)).run(model.graph)
                assert trace.final is not None
                with np.errstate(all="ignore"):
                    run_reference(model.graph, model.random_feeds(), model.weights)
            outcomes["ran"] += 1
    MODELS.clear()
    assert sum(outcomes.values()) - outcomes["ran"] == 2000, outcomes
    assert outcomes["loaded"] and outcomes["syntax"] and outcomes["session"], outcomes  # every path was taken
    assert _rss_mb() - rss0 < LIMIT.max_memory_mb * 4, "the process grew past the budget"


CFG = {"model_type": "bert", "vocab_size": 30, "hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 16,
       "num_hidden_layers": 1, "max_position_embeddings": 8, "type_vocab_size": 2}


def _checkpoint(folder: Path) -> None:
    cfg = BertConfig(vocab_size=30, hidden=8, heads=2, intermediate=16, layers=1, max_position=8)
    g = build_bert(cfg, 1, 4, "hf")
    w = random_weights(g)
    tensors = {k: np.ascontiguousarray(v.T) if v.ndim == 2 and k.endswith(("query.weight", "key.weight",
                                                                             "value.weight", "dense.weight"))
               else v for k, v in w.items()}
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CFG))
    save_file(tensors, str(folder / "model.safetensors"))


def _corrupt(rng: random.Random, good_cfg: str, good_st: bytes) -> tuple[str, bytes]:
    cfg, st = good_cfg, bytearray(good_st)
    kind = rng.randrange(5)
    if kind == 0:  # flip bytes of the safetensors header or data
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(min(len(st), 400) if rng.random() < 0.7 else len(st))
            st[i] = rng.randrange(256)
    elif kind == 1:  # truncate
        st = st[:rng.randrange(len(st))]
    elif kind == 2:  # an out-of-range, mistyped or missing config value
        d = json.loads(cfg)
        key = rng.choice(list(d))
        value = rng.choice([10**9, -1, 0, 2.5, "7", None, [1], True, "HUGE", {"a": 1}])
        d[key] = value
        if rng.random() < 0.2:
            del d[key]
        cfg = json.dumps(d).replace('"HUGE"', "9" * 500)
    elif kind == 3:  # broken config text
        i = rng.randrange(len(cfg))
        cfg = cfg[:i] + rng.choice(["[" * 5000, "NaN", "\\x", "}", '"', "Infinity", "1e999"]) + cfg[i:]
    else:  # a header length that claims more than the file
        st[:8] = (len(st) * rng.randint(2, 10**6)).to_bytes(8, "little")
    return cfg, bytes(st)


def test_corrupted_checkpoints_only_documented_errors_no_hang(tmp_path):
    rng = random.Random(150)
    _checkpoint(tmp_path / "good")
    good_cfg = (tmp_path / "good" / "config.json").read_text()
    good_st = (tmp_path / "good" / "model.safetensors").read_bytes()
    outcomes = {"loaded": 0, "refused": 0}
    for k in range(250):
        folder = tmp_path / f"c{k}"
        folder.mkdir()
        cfg, st = _corrupt(rng, good_cfg, good_st)
        (folder / "config.json").write_text(cfg)
        (folder / "model.safetensors").write_bytes(st)
        try:
            with within(HANG_S, f"checkpoint #{k} to load or refuse"):
                model = load(str(folder), 1, 4, limits=LIMIT)
            assert peak_memory(model.graph).peak_bytes <= LIMIT.max_bytes
            outcomes["loaded"] += 1
        except SessionError as e:
            assert "\n" not in str(e).strip() and str(e).strip(), str(e)
            outcomes["refused"] += 1
    MODELS.clear()
    assert outcomes["refused"] >= 100 and outcomes["loaded"] >= 1, outcomes


def test_the_watchdog_fails_a_block_past_its_time_and_restores_the_handler():
    import signal
    import time

    before = signal.getsignal(signal.SIGALRM)
    with pytest.raises(pytest.fail.Exception, match=r"^sleeping took over 0\.2 s$"):
        with within(0.2, "sleeping"):
            time.sleep(5)
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with within(5, "a quick block"):
        pass
