"""Values a graph computes from no input, computed once when it compiles (decision 0096).

A model that builds a tensor from shapes alone (Swin's shifted-window attention mask: a
zero tensor, slice assignments of counts, a pad, comparisons) hands saturn a subgraph
reading no input, which every call would run again as tiny kernels. Here such a subgraph
is run once at compile time, by PyTorch on the CPU, and its results enter the graph as
tensor constants on the compile target (lifted to inputs like any constant,
``constants.lift_constants``).

Only ops whose result is the same bits on every device are folded: creation, movement,
copies and scatters of slices, padding, selection, comparisons and logic, and the IEEE
operations PyTorch computes exactly rounded on every device (add, subtract, multiply,
divide, negate, min, max); never transcendental functions, reductions (their order is the
device's) or random numbers. A result larger than FOLD_MAX_ELEMENTS stays computed per call
(a constant costs memory for the model's lifetime), as does anything reading an input or a
symbolic size. Two more stay as they are because the compiler does better with them:
anything built from ``arange`` (the importer reads an index that is a slice, a broadcast or
a strided view there; folded, it would be an opaque index gathered on the host), and a
value whose elements are all equal (a fill is read as a scalar, not from memory).
"""

from __future__ import annotations

import copy
import operator

import torch
from torch.fx.node import map_arg

FOLD_MAX_ELEMENTS = 1 << 18

aten = torch.ops.aten
_CREATE = {
    aten.full.default,
    aten.zeros.default,
    aten.ones.default,
    aten.scalar_tensor.default,
}
_EXACT = _CREATE | {
    aten.lift_fresh_copy.default,
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.expand.default,
    aten.permute.default,
    aten.t.default,
    aten.transpose.int,
    aten.slice.Tensor,
    aten.select.int,
    aten.alias.default,
    aten.clone.default,
    aten.copy.default,
    aten.slice_scatter.default,
    aten.select_scatter.default,
    aten.cat.default,
    aten.stack.default,
    aten.constant_pad_nd.default,
    aten.where.self,
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.fill.Scalar,
    aten.triu.default,
    aten.tril.default,
    aten.eq.Tensor,
    aten.eq.Scalar,
    aten.ne.Tensor,
    aten.ne.Scalar,
    aten.lt.Tensor,
    aten.lt.Scalar,
    aten.le.Tensor,
    aten.le.Scalar,
    aten.gt.Tensor,
    aten.gt.Scalar,
    aten.ge.Tensor,
    aten.ge.Scalar,
    aten.logical_and.default,
    aten.logical_or.default,
    aten.logical_not.default,
    aten.logical_xor.default,
    aten.bitwise_and.Tensor,
    aten.bitwise_or.Tensor,
    aten.bitwise_not.default,
    aten.add.Tensor,
    aten.add.Scalar,
    aten.sub.Tensor,
    aten.sub.Scalar,
    aten.mul.Tensor,
    aten.mul.Scalar,
    aten.div.Tensor,
    aten.neg.default,
    aten.abs.default,
    aten.maximum.default,
    aten.minimum.default,
}


def _to_copy_exact(args, kwargs) -> bool:
    """A dtype conversion is the same everywhere except a float to an integer (NaN and
    out-of-range values convert as the device's instruction does)."""
    src, dst = args[0].dtype, kwargs.get("dtype", args[0].dtype)
    return not (src.is_floating_point and not dst.is_floating_point)


def fold_constants(gm: torch.fx.GraphModule, device: torch.device) -> torch.fx.GraphModule:
    """``gm`` itself when nothing folds; else a copy whose input-free values are tensor
    attributes on ``device`` read by ``get_attr`` nodes (the original is left as it is: it
    is what runs uncompiled if the compile fails). Runs outside the fake-tensor mode
    AOTAutograd compiles under: the values are real."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.no_grad():
        return _fold(gm, device)


def _fold(gm: torch.fx.GraphModule, device: torch.device) -> torch.fx.GraphModule:
    values: dict[torch.fx.Node, torch.Tensor] = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            v = operator.attrgetter(n.target)(gm)  # as lift_constants reads it
            if isinstance(v, torch.Tensor) and v.numel() <= FOLD_MAX_ELEMENTS:
                values[n] = v.detach().cpu()
            continue
        if n.op != "call_function":
            continue
        ok = n.target in _EXACT or n.target is aten._to_copy.default
        reads = n.all_input_nodes
        if not ok or any(r not in values for r in reads):
            continue
        if not reads and n.target not in _CREATE:
            continue
        args = map_arg(n.args, values.__getitem__)
        kwargs = dict(map_arg(n.kwargs, values.__getitem__))
        if n.target is aten._to_copy.default and not _to_copy_exact(args, kwargs):
            continue
        if "device" in kwargs:
            kwargs["device"] = torch.device("cpu")
        kwargs.pop("pin_memory", None)
        try:
            v = n.target(*args, **kwargs)
        except Exception:  # not foldable as written (an argument form PyTorch refuses)
            continue
        want = n.meta.get("val")
        if (
            not isinstance(v, torch.Tensor)
            or not isinstance(want, torch.Tensor)
            or tuple(v.shape) != tuple(want.shape)
            or v.dtype != want.dtype
            or v.numel() > FOLD_MAX_ELEMENTS
        ):
            continue
        values[n] = v
    # the folded values something unfolded reads become constants,
    # except uniform ones (a fill, an expanded scalar): the compiler reads those as a
    # scalar, not from memory
    edge = [
        n
        for n in values
        if n.op == "call_function"
        and any(u not in values for u in n.users)
        and not _uniform(values[n])
    ]
    if not edge:
        return gm
    graph = copy.deepcopy(gm.graph)
    out = torch.fx.GraphModule(gm, graph)
    by_name = {n.name: n for n in graph.nodes}
    for i, n in enumerate(edge):
        name = f"_saturn_folded_{i}"
        out.register_buffer(name, values[n].contiguous().to(device))
        old = by_name[n.name]
        with graph.inserting_before(old):
            new = graph.get_attr(name)
        old.replace_all_uses_with(new)
    graph.eliminate_dead_code()
    out.recompile()
    return out


def _uniform(v: torch.Tensor) -> bool:
    flat = v.reshape(-1)
    return flat.numel() <= 1 or bool((flat == flat[0]).all())
