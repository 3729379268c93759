"""The ONNX importer as a package (`rlxviz.models.onnx`): its public names, the former module path, and the byte
counts its folding bound prints without importing the session (a floor above it)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from rlxviz.models import onnx as package
from rlxviz.models import onnx_import
from rlxviz.models.onnx.fold import FoldError, check_fold, human_bytes
from rlxviz.session.limits import human_bytes as session_bytes


@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 1536, 5 << 20, (3 << 30) + 7, 2.6, 1 << 41])
def test_the_fold_bound_says_bytes_as_the_session_does(n: float):
    assert human_bytes(n) == session_bytes(n)


@pytest.mark.parametrize("dims, held, limit", [([1024, 1024], 0, 1 << 20), ([300, 300], 1 << 19, 1 << 19),
                                               ([64], 100, 120)])
def test_a_fold_over_the_memory_limit_names_its_bytes(dims: list[int], held: int, limit: int):
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"],
                            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]))
    need = int(np.prod(dims)) * 4
    with pytest.raises(FoldError) as e:
        check_fold(node, [np.asarray(dims, dtype=np.int64)], 17, held, limit)
    said = str(e.value)
    assert f"of {session_bytes(need)}" in said and f"over the limit of {session_bytes(limit)}" in said, said
    assert (f"with {session_bytes(held)} of constants already held" in said) == (need <= limit), said


def test_the_former_module_path_gives_the_packages_public_names():
    for name in onnx_import.__all__:
        want = package.validate.validate if name == "validate" else getattr(package, name)  # a module there
        assert getattr(onnx_import, name) is want, name
    assert not hasattr(onnx_import, "MAX_IMPORT_SECONDS")  # a limit is patched where it lives: onnx.driver
    assert package.driver.MAX_IMPORT_SECONDS > 0 and package.validate.VALIDATE_SECONDS > 0
