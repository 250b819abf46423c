"""Row statistics: a per-row value a ``rows`` kernel writes beside its output (a layer
norm's mean and reciprocal deviation, kept for the backward). No rule makes one:
``kernel_fusion.fuse_rows`` makes the rows kernel compute it (``attrs["stats"]``: an
expression over its stages, and the value's dtype, per statistic) and puts this step right
after it, named as the value, reading the rows kernel's output; ``attrs["stat"]`` is the
statistic's index. The step launches nothing: the rows kernel wrote the value (the memory
plan makes its buffer live from that kernel on)."""

from __future__ import annotations

import numpy as np

from .spec import KindFacts, KindSpec


def _reference(k, stats: list[np.ndarray]) -> np.ndarray:
    """The statistic among those its rows kernel computed (``rows.stats``), which the
    reference evaluator hands over in place of operands."""
    return stats[k.attrs["stat"]].reshape(k.shape)


SPEC = KindSpec(
    name="row_stat",
    order=12,
    facts=KindFacts(side=True),
    reference=_reference,
    describe="written by the rows kernel before it",
)
