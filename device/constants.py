"""Tensor constants of a graph as its leading inputs.

A tensor made inside a compiled function (``torch.tensor([...])``, a buffer Dynamo did not
lift) reaches the backend as a ``get_attr`` node reading an attribute of the graph module.
The importer takes placeholders, not attributes, so each tensor constant becomes a new
placeholder ahead of the others and the compiled call receives the constants before the
caller's arguments. The recipe (and its cache key) then covers the constants' types and
not their values, as for any input, and the values are read where they live.
"""

from __future__ import annotations

import copy
import operator

import torch


def lift_constants(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """``gm`` itself and [] when it reads no tensor attribute; else a copy whose tensor
    ``get_attr`` nodes are leading placeholders, and the tensors in that order. Other
    attributes (submodules of higher-order ops) are left for the importer to refuse."""
    reads = [
        n
        for n in gm.graph.nodes
        if n.op == "get_attr" and isinstance(operator.attrgetter(n.target)(gm), torch.Tensor)
    ]
    if not reads:
        return gm, []
    graph = copy.deepcopy(gm.graph)
    by_name = {n.name: n for n in graph.nodes}
    first = next(iter(graph.nodes))
    consts = []
    for i, read in enumerate(reads):
        value = operator.attrgetter(read.target)(gm)
        old = by_name[read.name]
        with graph.inserting_before(first):
            ph = graph.placeholder(f"saturn_const_{i}")
        ph.meta = dict(old.meta)
        if "val" not in ph.meta:  # the importer types every placeholder from its fake value
            ph.meta["val"] = value
        old.replace_all_uses_with(ph)
        graph.erase_node(old)
        consts.append(value)
    return torch.fx.GraphModule(gm, graph), consts
