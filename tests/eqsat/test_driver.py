"""The text driver: every emit mode, and exit status 2 with file and line on bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from saturn.eqsat.driver import main

from .golden_runner import GOLDEN


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "saturn.eqsat", *args], capture_output=True, text=True
    )


@pytest.mark.parametrize("emit", ["extracted", "kernels", "source", "plan", "stats", "dot"])
def test_emit_modes(emit, capsys):
    assert main([str(GOLDEN / "decompose_softmax.graph"), "--emit", emit, "--io", "device"]) == 0
    out = capsys.readouterr().out
    marker = {
        "extracted": "kernel reduce",
        "kernels": "indexing=",
        "source": "@numba.njit",
        "plan": "arena: ",
        "stats": "stages: ",
        "dot": "digraph egraph",
    }[emit]
    assert marker in out
    if emit == "dot":  # the e-nodes extraction chose are marked
        assert 'style="bold,filled"' in out


def test_emit_source_for_the_gpu_is_the_cuda_kernel(capsys):
    graph = str(GOLDEN / "decompose_softmax.graph")
    assert main([graph, "--machine", "gpu", "--io", "device", "--emit", "source"]) == 0
    out = capsys.readouterr().out
    assert "# ---- kernel v1: rows" in out and "@cuda.jit" in out
    assert main([graph, "--machine", "gpu", "--io", "device", "--emit", "plan"]) == 0
    plan = capsys.readouterr().out.splitlines()
    assert plan[0].startswith("arena: ") and "live steps" in plan[1]


def test_list_rules_names_each_rule_with_its_file_and_line(tmp_path, capsys):
    mine = tmp_path / "mine.egg"
    mine.write_text(
        '(ruleset mine)\n\n(rewrite (Neg (Neg x)) x\n  :ruleset mine :name "neg-neg")\n'
    )
    assert main(["--list-rules", "--rules", str(mine)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert any(r.split()[:2] == ["gemm", "epilogue-relu"] and "gemm.egg:" in r for r in rows)
    assert rows[-1].split() == ["mine", "neg-neg", "mine.egg:3"]
    line = int(next(r for r in rows if " epilogue-relu " in r).rsplit(":", 1)[1])
    from saturn.eqsat.rules import RULES_DIR

    text = (RULES_DIR / "gemm.egg").read_text().splitlines()
    assert text[line - 1].lstrip().startswith("(rule") and "epilogue-relu" in "\n".join(
        text[line - 1 : line + 2]
    )


def test_malformed_graph_exits_2_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.graph"
    bad.write_text("(input x f32 [2 3])\n\n(let y (Add x))\n(output y)\n")
    proc = run(str(bad))
    assert proc.returncode == 2
    assert f"{bad}:3:" in proc.stderr and "Add takes 2 arguments" in proc.stderr


def test_bad_rule_file_exits_2_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.egg"
    bad.write_text("(ruleset r)\n(rewrite (Exp x) (Nope x) :ruleset r)\n")
    proc = run(str(GOLDEN / "fuse_add_relu.graph"), "--rules", str(bad))
    assert proc.returncode == 2 and f"{bad}:2:" in proc.stderr


@pytest.mark.parametrize(
    "text, message",
    [
        ("(input x f32 [2])\n(let y (Add x x)\n", "missing ')'"),
        ("(input x f32 [2])\n(let y (Frob x))\n(output y)\n", "unknown operation 'Frob'"),
        ("(input x f32 [2])\n(let y (Add x z))\n(output y)\n", "'z' is not defined"),
        (
            "(input x f32 [2])\n(input y f32 [3])\n(let r (Add x y))\n(output r)\n",
            "do not broadcast",
        ),
        ("(input x f32 [2])\n(input y i32 [2])\n(let r (Add x y))\n(output r)\n", "insert a Cast"),
        ("(input x f32 [2])\n(let r (Relu x))\n", "no (output"),
        ("(input x f32 [2])\n(output (Relu x))\n", "takes names: bind a term with let"),
        ("(input x q8 [2])\n(output x)\n", "unknown dtype"),
        ("(let i (Arange 0 1 4096 f16))\n(output i)\n", "not exact in f16"),
        ("(let i (Arange 0 1 4 i64 7))\n(output i)\n", "Arange takes 4 arguments"),
    ],
)
def test_graph_errors(tmp_path, text, message):
    f = tmp_path / "g.graph"
    f.write_text(text)
    proc = run(str(f))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert str(f) in proc.stderr


def test_a_rule_merging_ranks_is_named_with_its_file_and_line(tmp_path):
    rule = tmp_path / "bad.egg"
    rule.write_text(
        '(ruleset mine)\n(rewrite (Exp x) (Sum x (vec-of 1) 0) :ruleset mine :name "exp-to-sum")\n'
    )
    graph = tmp_path / "g.graph"
    graph.write_text("(input x f32 [4 16])\n(let r (Exp x))\n(output r)\n")
    proc = run(str(graph), "--rules", str(rule))
    assert proc.returncode == 2
    assert "Illegal merge" in proc.stderr and f"exp-to-sum x1 ({rule}:2)" in proc.stderr


def test_the_command_line_imports_neither_torch_nor_the_device():
    """``python -m saturn.eqsat`` is the torch-free core: the package's device setup is
    skipped for it (what -X importtime lists is every module the process imported)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "saturn.eqsat", "--list-rules"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "mul-one-right" in proc.stdout
    imported = {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if "|" in ln}
    assert "saturn.eqsat.driver" in imported
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}
    assert "saturn._package" not in imported


def test_dot_draws_what_graphviz_lays_out_and_marks_one_node_per_used_class():
    """Every edge into another class is clipped to that class's cluster; an e-node reading
    its own class (a cycle) is drawn without clipping, which graphviz cannot do inside the
    cluster the edge starts in. One e-node is marked in each class the program reads."""
    import re
    import shutil

    from saturn.eqsat.driver import emit_dot
    from saturn.eqsat.graph import parse_graph
    from saturn.eqsat.pipeline import compile_graph

    text = """
(input x f32 [4 16])
(param b f32 [16])
(let z (Add (Relu (Add (Mul x (Scalar 1.0 f32)) b)) (Scalar 0.0 f32)))
(let p (Softmax z 1))
(output p)
"""
    c = compile_graph(parse_graph(text, "g"), machine="gpu", io_on_device=True)
    dot = emit_dot(c)
    edges = re.findall(r"n(\d+)_\d+ -> n(\d+)_0( \[lhead=cluster_(\d+)\])?;", dot)
    assert edges
    assert any(a == b for a, b, *_ in edges), "the e-graph holds a cycle; the test needs one"
    for a, b, clip, head in edges:
        assert (a == b) == (not clip)
        assert not clip or head == b
    marked = re.findall(r"n(\d+)_\d+ \[label=[^]]*bold,filled", dot)
    assert len(marked) == len(set(marked)) > 0
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True)
        assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr
