"""The session's one limits record: the option, the variable, its deprecated alias, and the refusal."""

import warnings

import pytest

from rlxviz.ir import parse_ir
from rlxviz.session import DEFAULT_MAX_MEMORY_MB, LimitError, Limits, SessionError

BIG = parse_ir('graph big {\n  %0 = input {name="x"} : f32[200000, 200000]\n'
               '  %1 = param {name="w"} : f32[4]\n  %2 = tanh(%0) : f32[200000, 200000]\n  return %2\n}')


def test_limit_comes_from_the_option_then_the_variable_then_the_default():
    assert Limits.resolve(env={}) == Limits(DEFAULT_MAX_MEMORY_MB, "default")
    assert Limits.resolve(env={"RLXVIZ_MAX_MEMORY_MB": "1"}).max_bytes == 1 << 20
    assert Limits.resolve(8, env={"RLXVIZ_MAX_MEMORY_MB": "1"}) == Limits(8, "--max-memory-mb")
    with pytest.raises(SessionError, match="RLXVIZ_MAX_MEMORY_MB='junk': must be a positive number"):
        Limits.resolve(env={"RLXVIZ_MAX_MEMORY_MB": "junk"})
    with pytest.raises(SessionError, match="--max-memory-mb must be a positive number"):
        Limits.resolve(0)


def test_old_variable_still_works_and_warns():
    with pytest.warns(DeprecationWarning, match="RLXVIZ_MAX_TENSOR_MB is deprecated; set RLXVIZ_MAX_MEMORY_MB"):
        old = Limits.resolve(env={"RLXVIZ_MAX_TENSOR_MB": "0.5"})
    assert old == Limits(0.5, "RLXVIZ_MAX_TENSOR_MB") and old.max_bytes == 1 << 19
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name wins and nothing warns
        assert Limits.resolve(env={"RLXVIZ_MAX_TENSOR_MB": "0.5", "RLXVIZ_MAX_MEMORY_MB": "3"}).max_memory_mb == 3


def test_refusal_names_the_largest_tensor_and_the_variable():
    with pytest.raises(LimitError, match=r'needs 298\.0 GiB at its peak at %2 \(tanh\) \(the largest tensor, %0 "x" '
                                         r"f32\[200000, 200000\], 149\.0 GiB\), "
                                         r"over the limit of 2\.0 GiB \(default\).*RLXVIZ_MAX_MEMORY_MB") as e:
        Limits().check(BIG, "big.ir")
    need = 2 * 200000 * 200000 * 4 + 16  # the input and the tanh output live at once, plus the param
    assert e.value.needed == need and e.value.limit == 2048 << 20
    assert Limits(need / 2**20).check(BIG, "big.ir") == need
