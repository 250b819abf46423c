"""Values a kernel writes beside its output. A rows kernel's per-row statistics (a layer
norm's mean and reciprocal deviation, kept for the backward): ``rows_fusion.fuse_rows``
makes the rows kernel compute them (``attrs["stats"]``: an expression over its stages, and
the value's dtype, per statistic). A reduce kernel's sibling reductions (a norm's weight and
bias gradients): ``horizontal.merge_siblings`` makes it accumulate them
(``attrs["stats"]``: a body over its operands and the dtype, each reduced as the output
is). No rule makes either: the pass puts this step right after the kernel, named as the
value, reading the kernel's output; ``attrs["stat"]`` is the value's index. The step
launches nothing: the kernel wrote the value (the memory plan makes its buffer live from
that kernel on)."""

from __future__ import annotations

import numpy as np

from .spec import KindFacts, KindSpec


def _reference(k, stats: list[np.ndarray]) -> np.ndarray:
    """The value among those its kernel computed (``side_values`` of its kind), which the
    reference evaluator hands over in place of operands."""
    return stats[k.attrs["stat"]].reshape(k.shape)


SPEC = KindSpec(
    name="row_stat",
    order=12,
    facts=KindFacts(side=True),
    reference=_reference,
    describe="written by the kernel before it",
)
