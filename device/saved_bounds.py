"""What a training forward's saved tensors are known to hold, handed to its backward's
compile: a max pool's indices lie in their image plane (decision 0133).

AOTAutograd compiles a joint graph's forward, then its backward; a tensor the forward
saves is a backward placeholder of the forward node's name. The backward's
``max_pool2d_with_indices_backward`` adds each gradient at its index, which the compiler
cannot bound from the graph alone, so its row add checks every index and the call reads
the check's word back: a host wait at the end of every backward (ResNet's). Indices saved
by the forward are in range by construction (the forward's pool made them, and autograd
refuses a saved tensor changed in place since), so the backward clamps them into their
plane: the same values, now bounded (``eqsat/ranges``), and the backward stays
asynchronous. Indices from anywhere else keep the check.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

aten = torch.ops.aten


def saved_index_planes(gm: torch.fx.GraphModule) -> dict[str, int]:
    """The forward's outputs that are a max pool's indices: name -> the plane's size
    (H * W of the pooled input; an index is a position in it)."""
    out: dict[str, int] = {}
    for node in gm.graph.find_nodes(op="output"):
        for arg in node.all_input_nodes:
            plane = _pool_index_plane(arg)
            if plane is not None:
                out[arg.name] = plane
    return out


def _pool_index_plane(node: torch.fx.Node) -> int | None:
    if node.op != "call_function" or node.target is not operator.getitem or node.args[1] != 1:
        return None
    pool = node.args[0]
    if not isinstance(pool, torch.fx.Node):
        return None
    if pool.target is not aten.max_pool2d_with_indices.default:
        return None
    x = pool.args[0]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if val is None or val.dim() != 4:
        return None
    h, w = val.shape[-2:]
    if not isinstance(h, int) or not isinstance(w, int) or h * w == 0:
        return None  # symbolic sizes: not bounded here
    return h * w


def clamp_saved_indices(gm: torch.fx.GraphModule, planes: dict[str, int]) -> int:
    """Clamp each backward placeholder in ``planes`` into [0, plane) where a max pool's
    backward reads it as its indices (in place); the number of clamps inserted."""
    made = 0
    body = next((n for n in gm.graph.nodes if n.op != "placeholder"), None)
    for p in gm.graph.find_nodes(op="placeholder"):
        plane = planes.get(p.name)
        users = [
            u
            for u in p.users
            if u.target is aten.max_pool2d_with_indices_backward.default
            and len(u.args) > 7
            and u.args[7] is p
        ]
        if plane is None or not users or body is None:
            continue
        with gm.graph.inserting_before(body):  # after every placeholder
            c = gm.graph.call_function(aten.clamp.default, (p, 0, plane - 1))
        c.meta = dict(p.meta)  # the same dtype, shape and layout
        for u in users:
            u.update_arg(7, c)
        made += 1
    if made:
        gm.recompile()
    return made
