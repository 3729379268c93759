"""What the dims given for an `.onnx` file (`--dim`, the app's Input dims box) do besides binding their names: a name
the file's inputs do not have is refused (`check_dims`), and a name that sets the batch or the sequence length
(`models.onnx.dims.dim_roles`: `sequence_length` of `input_ids [batch_size, sequence_length]`) overrides the
front end's own batch or sequence length, which the front end says (`override_notes`) and may bound (`check_dims`'s
`bounds`: the app's boxes take at most 64 and 512).

Both front ends say these in the same words, from here: the CLI with `--dim` and `--batch` / `--seq`, the app with
its Input dims, Batch and Sequence length boxes.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..models.onnx.dims import UnknownDimError, check_dim_names
from .errors import InputDimsError

ROLES_META = "dim_roles"
"""`Model.meta` key of an `.onnx` model's input dim names -> role (`dim_roles`: `batch`, `seq` or ''), set by
`loading.load` (the file's own: the same for every load of it, so a cached model holds the right ones)."""

SHAPE_WORDS = {"batch": "batch", "seq": "sequence length"}


def check_dims(dims: Mapping[str, int] | None, roles: Mapping[str, str], file: str,
               bounds: Mapping[str, int] | None = None) -> None:
    """Refuse `dims` for a file whose input dims are `roles` (`dim_roles`; `file`: its name as said): a name none of
    its inputs has, then a value past `bounds[role]` for a dim that sets the batch or sequence length (`role`).

    Raises:
        InputDimsError: `kind="unknown"` naming every unknown name, the file's own names and the close matches
            (`sequence_lenght names no dimension of roberta.onnx's inputs (its named dims: batch, seq)`), or
            `kind="bound"` (`sequence_length=5000 sets the sequence length, past the most it may be here (512)`).
    """
    try:
        check_dim_names(dims, roles, file)
    except UnknownDimError as e:
        raise InputDimsError(f"--dim {e.what}", "unknown", e.what, e.names, e.known) from None
    for name, value in (dims or {}).items():
        role = roles.get(name, "")
        most = (bounds or {}).get(role)
        if role and most is not None and value > most:
            what = f"{name}={value} sets the {SHAPE_WORDS[role]}, past the most it may be here ({most})"
            raise InputDimsError(f"--dim {what}", "bound", what, (name,), tuple(roles), role, most)


def dims_overrides(roles: Mapping[str, str], dims: Mapping[str, int] | None, batch: int,
                   seq: int) -> list[tuple[str, int, str, int]]:
    """The dims in `dims` that set the batch or the sequence length (`roles`) to another value than `batch` / `seq`
    (which they override): `(name, value, role, the value they override)`, in `dims`' order."""
    shape = {"batch": batch, "seq": seq}
    return [(name, value, roles[name], shape[roles[name]]) for name, value in (dims or {}).items()
            if roles.get(name) in shape and value != shape[roles[name]]]


def override_notes(meta: Mapping[str, object], dims: Mapping[str, int] | None, batch: int, seq: int,
                   option: str, labels: Mapping[str, str]) -> list[str]:
    """What a front end says of the dims that override its batch or sequence length, one note each, for a model whose
    `meta` holds its dim roles (`ROLES_META`; none: no notes): `sequence_length=40 from --dim overrides --seq 16`
    (`option="--dim"`, `labels={"batch": "--batch", "seq": "--seq"}`), or in the app's words `sequence_length=40
    from Input dims overrides Sequence length 16`."""
    roles = meta.get(ROLES_META)
    if not isinstance(roles, Mapping):
        return []
    return [f"{name}={value} from {option} overrides {labels[role]} {was}"
            for name, value, role, was in dims_overrides(roles, dims, batch, seq)]


__all__ = ["ROLES_META", "SHAPE_WORDS", "check_dims", "dims_overrides", "override_notes"]
