"""The op table is the one source: generated rule files match it, and every row is whole."""

from __future__ import annotations

from saturn.eqsat import optable as ot
from saturn.eqsat import schema


def test_generated_files_match_the_table():
    for name, fn in schema.GENERATED.items():
        text = (schema.RULES_DIR / name).read_text()
        assert text == fn(), (
            f"rules/{name} drifted from the op table: run python -m saturn.eqsat.schema"
        )


def test_every_row_has_a_constructor_and_elementwise_rows_are_complete():
    text = (schema.RULES_DIR / "schema.egg").read_text()
    for op in ot.OPS:
        assert f"(constructor {op.name} (" in text, op.name
    for op in ot.elementwise():
        assert op.expr, f"{op.name} has no scalar expression"
        assert op.numpy is not None or op.name == "Cast", f"{op.name} has no reference semantics"
        assert f"(constructor {op.device_expr} (" in text
        assert set(op.dtypes) <= set(ot.ALL)


def test_placement_rule_per_device_op():
    text = (schema.RULES_DIR / "placement.egg").read_text()
    for op in ot.elementwise():
        assert (f':name "place-{op.name}"' in text) == bool(op.dtypes), op.name
    for name in ot.REDUCE_KINDS:
        assert f':name "place-{name}"' in text


def test_aten_spellings_are_unique():
    seen: dict[str, str] = {}
    for op in ot.OPS:
        for a in op.aten:
            assert a not in seen, f"{a} maps to {seen[a]} and {op.name}"
            seen[a] = op.name
