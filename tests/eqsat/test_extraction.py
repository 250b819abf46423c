"""Extraction and lowering of GPU programs with inputs and outputs in device memory: no
crossing for a value already on the device (an input returned as an output, a view of an
input, a scalar constant), and the greedy choice followed to its fixpoint (a change can
travel up many classes, through host/device twins)."""

from __future__ import annotations

from pathlib import Path

from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

from .values import check_values

CASES = Path(__file__).parent / "cases"


def program(text: str):
    graph = parse_graph(text)
    return graph, compile_graph(graph, machine="gpu", io_on_device=True).program


def crossings(prog) -> list[str]:
    return [s.output for s in prog.steps if s.kind == "crossing"]


def host_steps(prog) -> list[str]:
    return [s.op for s in prog.steps if s.kind == "host"]


def test_an_input_returned_as_an_output_does_not_cross():
    """A training forward returns weights it saves for the backward: already on the device,
    whether a kernel reads them there (w) or nothing else reads them (u)."""
    graph, prog = program(
        "(input x f32 [4 8])\n(param w f32 [8])\n(param u f32 [2])\n(let y (Add x w))\n"
        "(output y w u)\n"
    )
    assert crossings(prog) == []
    for i, name in ((1, "w"), (2, "u")):
        (step,) = [s for s in prog.steps if s.kind == "input" and s.op == name]
        assert prog.outputs[i] == step.output and step.place == "device"
    check_values(graph, prog)


def test_a_view_of_an_input_returned_as_an_output_is_a_device_view():
    graph, prog = program(
        "(input x f32 [3 8])\n(param w f32 [4 8])\n(let t (Permute w [1 0]))\n"
        "(let y (MatMul x t))\n(output y t)\n"
    )
    assert crossings(prog) == []
    out = next(s for s in prog.steps if s.output == prog.outputs[1])
    assert out.kind == "view" and out.place == "device"
    check_values(graph, prog)


def test_a_scalar_read_as_a_tensor_is_a_device_constant():
    """full_like(x, 0) is a broadcast scalar: not copied to the device on every call (a copy
    inside the program would also stop CUDA-graph replay), and read by the kernel as the
    constant itself, not as an operand through zero strides."""
    graph, prog = program(
        "(input c bool [4 5])\n(input x f32 [4 5])\n(let sm (Softmax x 1))\n"
        "(let z (Expand (Scalar 0.0 f32) [4 5]))\n(let r (Where c z sm))\n(output r)\n"
    )
    assert crossings(prog) == [] and host_steps(prog) == []
    assert [s for s in prog.steps if s.kind == "const"] == []
    (k,) = prog.kernels  # softmax and the where as one rows kernel
    assert ("const", 0, "f32") in k.body[1:] and len(k.inputs) == 2  # c and x
    check_values(graph, prog)


def test_extraction_settles_where_a_change_travels_far():
    """The safe softmax's mask chain before a layer norm (a training forward): every class
    is re-chosen until nothing changes. Stopped after eight passes, the layer norm was
    left on the host with four crossings, its device form not yet seen as cheaper."""
    text = (CASES / "training_attention_norm.graph").read_text()
    graph, prog = program(text)
    assert host_steps(prog) == [] and crossings(prog) == []
    check_values(graph, prog)


def test_an_arange_is_a_device_constant():
    """select's backward builds a one-hot mask from arange(3) == index: the Arange is a
    constant made on the device once, so the backward has no host step and no crossing."""
    graph, prog = program(
        "(input g f32 [2 4])\n(let i (Arange 0 1 3 i64))\n(let v (View i [3 1 1]))\n"
        "(let m (Eq v (Scalar 1 i64)))\n(let z (Expand (Scalar 0 f32) [3 2 4]))\n"
        "(let y (Where m (Expand (View g [1 2 4]) [3 2 4]) z))\n(output y)\n"
    )
    assert crossings(prog) == [] and host_steps(prog) == []
    (c,) = [s for s in prog.steps if s.kind == "const" and s.op == "Arange"]
    assert c.place == "device" and c.attrs == (0, 1, 3, "i64") and c.shape == (3,)
    check_values(graph, prog)


def test_an_arange_returned_as_an_output_is_a_device_constant():
    """A training forward returns the position embedding's arange for the backward: with
    outputs on the device it is made there once (a crossing per call would keep the graph
    from being replayed)."""
    graph, prog = program(
        "(input x f32 [3])\n(let i (Arange 0 1 3 i64))\n(let y (Add x x))\n(output y i)\n"
    )
    assert crossings(prog) == [] and host_steps(prog) == [], prog.to_text()
    consts = [s for s in prog.steps if s.kind == "const" and s.op == "Arange"]
    assert [(c.place, c.output in prog.outputs) for c in consts] == [("device", True)]
    check_values(graph, prog)


def test_an_arange_on_the_host_stays_a_host_constant():
    """Read only by a host op (an op the device has no kernel for), the Arange is made on the
    host: no crossing in either direction."""
    _, prog = program(
        "(input x f32 [5])\n(let i (Arange -4 2 5 f32))\n"
        '(let o (Opaque "aten.cumsum" i [0]) f32 [5])\n(let y (Add x o))\n(output y)\n'
    )
    (c,) = [s for s in prog.steps if s.kind == "const" and s.op == "Arange"]
    assert c.place == "host"
    assert len(crossings(prog)) == 1  # the host op's result, to the device's Add


def _residual_chain(n: int, left_deep: bool) -> str:
    """``r_k = relu(exp(a_k) + r_(k-1))``, every r_k an output (written to memory)."""
    lines = ["(input x f32 [64])", *(f"(input a{i} f32 [64])" for i in range(n))]
    prev = "x"
    for i in range(n):
        terms = (prev, f"(Exp a{i})") if left_deep else (f"(Exp a{i})", prev)
        lines.append(f"(let r{i} (Relu (Add {terms[0]} {terms[1]})))")
        prev = f"r{i}"
    lines += [f"(output r{i})" for i in range(n)]
    return "\n".join(lines) + "\n"


def test_a_residual_chain_reads_what_is_written_anyway():
    """Extraction inlines every earlier r into each later one (a shared producer is paid
    once); every r is written to memory anyway (an output), so each body reads the
    previous r instead of recomputing it: two reads a kernel however long the chain, the
    earlier value on either side of the add."""
    for left_deep in (False, True):
        graph = parse_graph(_residual_chain(40, left_deep))
        c = compile_graph(graph, machine="gpu", io_on_device=True)
        reads = [len(k.inputs) for k in c.program.kernels]
        assert max(reads) == 2, reads
        assert len(c.program.kernels) == 40
        check_values(graph, c.program, scale=0.5)  # reading gives the same values


def test_a_cheap_recomputation_of_what_a_body_reads_is_kept():
    """A loop written to memory (y, an output) whose recomputation reads nothing the body
    does not read already (x) is recomputed: one read fewer than reading y."""
    text = "(input x f32 [64])\n(let y (Relu x))\n(let z (Add (Exp y) x))\n(output y)\n(output z)\n"
    graph = parse_graph(text)
    c = compile_graph(graph, machine="gpu", io_on_device=True)
    assert sorted(len(k.inputs) for k in c.program.kernels) == [1, 1], c.program.to_text()
    check_values(graph, c.program)


def test_the_read_bound_cuts_a_chain_held_in_one_body():
    """Nothing in the chain is written to memory but its end: the body would read every
    a_k; past MAX_FUSED_READS it reads a loop instead (written to memory for it)."""
    from saturn.eqsat.kernel_bodies import MAX_FUSED_READS

    text = _residual_chain(40, False).replace(
        "\n".join(f"(output r{i})" for i in range(40)), "(output r39)"
    )
    graph = parse_graph(text)
    c = compile_graph(graph, machine="gpu", io_on_device=True)
    reads = [len(k.inputs) for k in c.program.kernels]
    assert max(reads) == MAX_FUSED_READS + 1 and len(reads) > 1, reads
    check_values(graph, c.program, scale=0.5)


def _cat_tree(n: int, shared: bool = False) -> str:
    """A balanced tree of two-operand concatenations of n pieces of unequal lengths (the
    form a many-piece ``cat`` imports as), each piece an elementwise result; ``shared``:
    the left half is also an output."""
    lines = [f"(input x{i} f32 [2 {i + 1} 3])" for i in range(n)]
    lines += [f"(let p{i} (Exp x{i}))" for i in range(n)]
    level = [f"p{i}" for i in range(n)]
    k = 0
    while len(level) > 1:
        nxt = []
        for j in range(0, len(level) - 1, 2):
            lines.append(f"(let c{k} (Cat {level[j]} {level[j + 1]} 1))")
            nxt.append(f"c{k}")
            k += 1
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    lines.append(f"(output {level[0]})")
    if shared:
        lines.append("(output c0)")
    return "\n".join(lines) + "\n"


def test_a_tree_of_concatenations_is_one_kernel():
    """Five pieces in a tree of four two-operand concatenations: one kernel copying each
    element once (merge_concats); the values are numpy's concatenation."""
    graph = parse_graph(_cat_tree(5))
    c = compile_graph(graph, machine="gpu", io_on_device=True)
    cats = [k for k in c.program.kernels if k.kind == "concat"]
    assert len(cats) == 1 and len(cats[0].inputs) == 5, c.program.to_text()
    assert cats[0].shape == (2, 15, 3)
    check_values(graph, c.program)


def test_a_concatenation_read_elsewhere_is_still_written():
    """c0 is an output: it is written, and the concatenation reading it copies its pieces
    (the same bytes as reading it)."""
    graph = parse_graph(_cat_tree(5, shared=True))
    c = compile_graph(graph, machine="gpu", io_on_device=True)
    cats = sorted(len(k.inputs) for k in c.program.kernels if k.kind == "concat")
    assert cats == [2, 5], c.program.to_text()
    check_values(graph, c.program)


def test_concatenations_along_different_axes_stay_apart():
    """A concatenation along dim 1 of one along dim 2: not one copy of pieces (their
    coordinates pick pieces along different axes), two kernels."""
    text = (
        "(input a f32 [2 3 4])\n(input b f32 [2 3 5])\n(input c f32 [2 2 9])\n"
        "(let ab (Cat (Exp a) (Exp b) 2))\n(let r (Cat ab (Exp c) 1))\n(output r)\n"
    )
    graph = parse_graph(text)
    c = compile_graph(graph, machine="gpu", io_on_device=True)
    cats = sorted(len(k.inputs) for k in c.program.kernels if k.kind == "concat")
    assert cats == [2, 2], c.program.to_text()
    check_values(graph, c.program)


def _norm_stream(n: int) -> str:
    """A transformer's residual stream: each layer's norm reads the stream twice (its mean
    square and its scaling), a product reads the norm, the next stream adds it back."""
    lines = ["(input x f32 [2048 256])", *(f"(input w{i} f32 [256 256])" for i in range(n))]
    h = "x"
    for i in range(n):
        lines += [
            f"(let m{i} (Mean (Mul {h} {h}) [1] 1))",
            f"(let n{i} (Mul {h} (Rsqrt (Add m{i} (Scalar 0.000001 f32)))))",
            f"(let g{i} (MatMul n{i} w{i}))",
            f"(let h{i} (Add {h} (Tanh g{i})))",
        ]
        h = f"h{i}"
    return "\n".join([*lines, f"(output {h})"]) + "\n"


def test_extraction_work_grows_linearly_with_depth(monkeypatch):
    """Each layer's stream is a body read by several kernels, and each later layer's
    written-out body nests it: trying each materialised must not re-extract everything
    above it (quadratic in depth). Counted in class choices made, four times the depth
    may take at most six times the work (it took eleven before trials were local)."""
    from saturn.eqsat import extract as ex

    calls = [0]
    best_of = ex._Extractor.best_of

    def counted(self, *a):
        calls[0] += 1
        return best_of(self, *a)

    monkeypatch.setattr(ex._Extractor, "best_of", counted)
    work = {}
    for n in (12, 48):
        calls[0] = 0
        c = compile_graph(parse_graph(_norm_stream(n)), machine="gpu", io_on_device=True)
        work[n] = calls[0]
        # every layer's stream written once (a launch saved beats recomputing it 3 times)
        assert len(c.program.kernels) >= 2 * n, c.program.to_text()
    assert work[48] <= 6 * work[12], work
