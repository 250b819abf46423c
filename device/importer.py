"""FX (after AOTAutograd) to a graph in saturn's term language.

Types (dtype, shape, strides) come from the fake tensor on each node; a node without one
is refused. Non-tensor arguments become attributes or scalar constants; mixed dtypes get
explicit casts, as PyTorch promotes; ops with no row (or with an argument a kernel would
ignore, such as ``alpha`` in add) become opaque host nodes that call the original op.
Tuple results are read through getitem. The output spec keeps ``None`` positions.

This module is the entry (``import_graph``); the ``Importer`` and the handler registry are in
``import_core``, the handlers in ``import_elementwise``, ``import_reductions``,
``import_movement``, ``import_joins``, ``import_indexing``, ``import_library``,
``import_pooling`` and ``import_conv_backward``, one family each.
"""

from __future__ import annotations

import torch
import torch.fx

# each family module registers its handlers when imported
from . import (  # noqa: F401
    import_conv_backward,
    import_elementwise,
    import_indexing,
    import_joins,
    import_library,
    import_movement,
    import_pooling,
    import_reductions,
)
from .dtypes import DTYPES
from .import_core import (
    MARKERS,
    SIZE,
    Imported,
    Importer,
    UnsupportedError,
    concrete,
    fake_value,
    symbol_table,
    tensor_type,
)

__all__ = ["MARKERS", "SIZE", "Imported", "UnsupportedError", "concrete", "import_graph"]


def import_graph(
    gm: torch.fx.GraphModule, replacements: bool = False, keep_packed: frozenset = frozenset()
) -> Imported:
    """``replacements``: let custom ops that replace ATen ops take their nodes (on GPU
    targets, where their kernels run). ``keep_packed``: placeholders read only packed (the
    inputs a recipe writes); any other that is a window of a packed region is read as
    that region (``input_windows``)."""
    symbol_table.table = {}
    try:
        imported = _import(gm, replacements, keep_packed)
    finally:
        table, symbol_table.table = symbol_table.table, None
    imported.symbols = {str(sym): marker for sym, marker in table.items()}
    return imported


def _import(gm: torch.fx.GraphModule, replacements: bool, keep_packed: frozenset) -> Imported:
    imp = Importer(gm, replacements)
    imp.keep_packed = set(keep_packed)
    inputs, meta, outputs, out_meta = [], [], [], []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            imp.placeholder(node)
            val = fake_value(node)
            if imp.env[node.name] == SIZE:
                inputs.append(None)
                meta.append(("size", (), ()))
                continue
            inputs.append(imp.input_nodes[node.name])
            meta.append(
                (
                    DTYPES[val.dtype],
                    tuple(concrete(s) for s in val.shape),
                    tuple(concrete(s) for s in val.stride()),
                )
            )
        elif node.op == "call_function":
            imp.call(node)
        elif node.op == "output":
            for o in node.args[0]:
                if o is None:
                    outputs.append(None)
                    out_meta.append(None)
                elif isinstance(o, torch.fx.Node) and imp.env.get(o.name) == SIZE:
                    # a size the backward needs: returned as an int (markers substituted)
                    outputs.append(("size", concrete(fake_value(o))))
                    out_meta.append(("size", ()))
                elif isinstance(o, torch.fx.Node):
                    outputs.append(imp.env[o.name])
                    # eager's strides: an output the program views is laid out as eager's
                    strides = tuple(concrete(s) for s in fake_value(o).stride())
                    out_meta.append((*tensor_type(o), strides))
                elif isinstance(o, int):
                    outputs.append(("size", o))
                    out_meta.append(("size", ()))
                else:
                    raise UnsupportedError(f"output {o!r} is not a tensor")
        else:
            raise UnsupportedError(f"FX node kind {node.op} ({node.name})")
    imp.g.outputs = [o for o in outputs if isinstance(o, str)]
    if not imp.g.outputs:
        raise UnsupportedError("the graph returns no tensor")
    sized = list(imp.size_values)
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return Imported(
        imp.g,
        [*sized, *inputs],
        [*(("i64", (), ()) for _ in sized), *meta],
        outputs,
        out_meta,
        imp.host_calls,
        imp.fx_names,
        imp.custom_nodes,
        replaced=imp.replaced,
        size_values=list(imp.size_values.items()),
        input_windows=[
            *(None for _ in sized),
            *(imp.input_windows.get(n) for n in placeholders),
        ],
    )
