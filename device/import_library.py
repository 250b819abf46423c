"""Importer handlers for the ops that become library calls: matrix products (``mm``,
``bmm``, ``addmm``) and convolution. Pooling is ``import_pooling``'s.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import Node

from .import_core import Importer, handles, tensor_type


def _h_matmul(row_name: str):
    def h(imp: Importer, node: torch.fx.Node):
        dtype, shape = tensor_type(node)
        args = [imp.env[a.name] for a in node.args[:2]]
        if any(imp.g.nodes[a].dtype != dtype for a in args):
            return None
        return imp.add(Node(node.name, row_name, args, (), dtype, shape), node.name)

    return h


def _h_addmm(imp: Importer, node: torch.fx.Node):
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return None  # the epilogue would ignore alpha and beta
    dtype, shape = tensor_type(node)
    args = [imp.env[a.name] for a in node.args[:3]]
    return imp.add(Node(node.name, "Addmm", tuple(args), (), dtype, shape), node.name)


def only_first_result_used(node: torch.fx.Node) -> bool:
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


def _h_convolution(imp: Importer, node: torch.fx.Node):
    """A 2-D convolution. A half one with a bias on a GPU target is the product rounded to
    the half type, plus the bias, rounded again: how eager CUDA computes it (cuDNN's
    convolution, then an add), so the add is an elementwise op that fuses."""
    x, w, b, stride, padding, dilation, transposed, _out_pad, groups = node.args
    if transposed or len(stride) != 2:
        return None
    dtype, shape = tensor_type(node)
    attrs = (tuple(stride), tuple(padding), tuple(dilation), int(groups))
    if b is None or (imp.gpu and dtype in ot.HALVES):
        name = node.name if b is None else imp.fresh("conv")
        conv = imp.add(
            Node(name, "Conv2dNoBias", (imp.env[x.name], imp.env[w.name]), attrs, dtype, shape),
            name if b is None else None,
        )
        if b is None:
            return conv
        bn = imp.g.nodes[imp.env[b.name]]
        tail = (shape[1],) + (1,) * (len(shape) - 2)
        bias = imp.add(Node(imp.fresh("conv_bias"), "View", (bn.name,), (tail,), bn.dtype, tail))
        return imp.add(Node(node.name, "Add", (conv, bias), (), dtype, shape), node.name)
    return imp.add(
        Node(
            node.name,
            "Conv2d",
            (imp.env[x.name], imp.env[w.name], imp.env[b.name]),
            attrs,
            dtype,
            shape,
        ),
        node.name,
    )


handles(
    {
        "aten.mm.default": _h_matmul("MatMul"),
        "aten.bmm.default": _h_matmul("BatchMatMul"),
        "aten.addmm.default": _h_addmm,
        "aten.convolution.default": _h_convolution,
    }
)
