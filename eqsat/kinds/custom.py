"""Custom kernels: a registered custom op's kernel (``Custom``: its name, its operands as a
list, a float attribute's bits), run by the op's own implementation (``device/custom_ops.py``)
or, for the built-in ``rmsnorm`` pattern, by saturn's rows kernel."""

from __future__ import annotations

import numpy as np

from ..numpy_ops import apply_op
from .spec import KindSpec, streamed


def _lower(en, library, lw):
    return library("custom", lw.tlist(en.kids[0]), {"name": en.attrs[0], "eps_bits": en.attrs[1]})


def _reference(k, operands: list[np.ndarray]) -> np.ndarray:
    """The built-in pattern a custom kernel stands for (a user's op has no numpy form)."""
    if k.attrs["name"] != "rmsnorm":
        raise NotImplementedError(f"the reference evaluator cannot run custom op {k.attrs['name']}")
    return apply_op("RMSNorm", operands, (k.attrs["eps_bits"],), k.dtype)


SPEC = KindSpec(
    name="custom",
    order=9,
    term="Custom",
    declare=(
        ";; a custom op's kernel: name, operands, float attribute bits",
        "(constructor Custom (String TList i64) Tensor)",
    ),
    # a TList is typed by its head, so a custom op by its first operand: saturn's custom
    # kernels keep their first operand's type
    type_of=lambda attrs, kids: kids[0],
    cost=streamed,
    lower=_lower,
    reference=_reference,
    describe="a custom op",
)
