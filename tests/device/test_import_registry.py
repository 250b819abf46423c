"""The importer's handler registry (device/import_core.py): every family module registers
its ops once, each key names an ATen overload that exists, and a second handler for an op
is refused rather than silently replacing the first."""

from __future__ import annotations

import pytest
import torch

from saturn import import_core, importer  # noqa: F401  (importer registers the families)


def _overload(target: str):
    ns, op, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def test_every_handled_op_is_an_aten_overload():
    assert len(import_core.HANDLERS) > 80
    for target in import_core.HANDLERS:
        assert str(_overload(target)) == target


def test_a_second_handler_for_an_op_is_refused():
    before = dict(import_core.HANDLERS)
    with pytest.raises(ValueError, match=r"aten\.flip\.default has two importer handlers"):
        import_core.handles({"aten.flip.default": lambda imp, node: None})
    assert import_core.HANDLERS == before


def test_each_family_registers_its_own_ops():
    families = {h.__module__ for h in import_core.HANDLERS.values() if hasattr(h, "__module__")}
    assert families == {
        "saturn.import_elementwise",
        "saturn.import_reductions",
        "saturn.import_movement",
        "saturn.import_joins",
        "saturn.import_indexing",
        "saturn.import_library",
        "saturn.import_pooling",
        "saturn.import_conv_backward",
    }
