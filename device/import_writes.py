"""Input writes kept in a graph: AOTAutograd's ``keep_inference_input_mutations`` leaves an
inference graph's writes to its inputs (an optimizer's parameter updates, a cache filled in
place), and a training forward's writes to inputs that need no gradient (batch norm's
running statistics), as ``aten.copy_(input, value)`` at its end. saturn compiles the graph
without them, each value an extra return, and the recipe writes each value into the
caller's tensor after the call's work (``Recipe.writes``; on a GPU, inside the replayed
graph). Nothing is written before every step of the call has succeeded, so a call that
fails and reruns uncompiled (decision 0050) applies the writes once. See
docs/decisions/0127.
"""

from __future__ import annotations

import torch


def split_input_writes(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, tuple]:
    """``gm`` without its trailing input writes, each written value appended to its
    returns, and the writes as (placeholder name, return position). A graph with none is
    returned as it is. A ``copy_`` whose result is read, or into a value that is not an
    input, stays in the graph (the importer refuses it, and the graph runs uncompiled with
    that reason)."""
    nodes = list(gm.graph.nodes)
    placeholders = {n for n in nodes if n.op == "placeholder"}
    writes = [
        n
        for n in nodes
        if n.op == "call_function"
        and n.target is torch.ops.aten.copy_.default
        and len(n.args) == 2
        and not n.kwargs
        and n.args[0] in placeholders
        and isinstance(n.args[1], torch.fx.Node)
        and not n.users
    ]
    if not writes or len({n.args[0] for n in writes}) != len(writes):
        return gm, ()
    skip = set(writes)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    out = []
    for n in nodes:
        if n in skip:
            continue
        if n.op == "output":
            (returns,) = n.args
            returns = tuple(returns) if isinstance(returns, list | tuple) else (returns,)
            first = len(returns)
            mapped = torch.fx.node.map_arg(returns, lambda a: env[a])
            extra = tuple(env[w.args[1]] for w in writes)
            graph.output((*mapped, *extra))
            out = [(w.args[0].name, first + j) for j, w in enumerate(writes)]
            continue
        env[n] = graph.node_copy(n, lambda a: env[a])
    return torch.fx.GraphModule(gm, graph), tuple(out)
