"""Every notebook under notebooks/ runs top to bottom without an error, and its committed
outputs (what readers see where the notebook is rendered) are what a fresh run prints, up
to timings and object addresses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat (a dev extra) is not installed")
NotebookClient = pytest.importorskip("nbclient", reason="nbclient is not installed").NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))

# what differs from run to run: wall times, object addresses
_VARIABLE = [
    (re.compile(r"\d+(\.\d+)?\s*(ms|us|s)\b"), "<time>"),
    (re.compile(r"0x[0-9a-f]+"), "<address>"),
]


def normalized(nb) -> list[list[tuple[str, str]]]:
    """Per code cell: (kind, text) of its outputs, stderr left out (warnings belong to the
    environment: a Python or library version), each stream's chunks joined and the streams
    put first (how a stream is chunked depends on timing), variable parts replaced."""
    cells = []
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        outs: list[tuple[str, str]] = []
        for o in c.get("outputs", []):
            if o["output_type"] == "stream" and o["name"] == "stderr":
                continue
            if o["output_type"] == "stream":
                kind, text = f"stream:{o['name']}", str(o["text"])
            else:
                data = o.get("data", {})
                kind = o["output_type"] + ":" + ",".join(sorted(data))
                text = (
                    ""
                    if "image/svg+xml" in data or "image/png" in data
                    else data.get("text/plain", "")
                )
            for pat, rep in _VARIABLE:
                text = pat.sub(rep, str(text))
            outs.append((kind, text))
        streams = {}
        for kind, text in outs:
            if kind.startswith("stream"):
                streams[kind] = streams.get(kind, "") + text
        others = [o for o in outs if not o[0].startswith("stream")]
        cells.append(sorted(streams.items()) + others)
    return cells


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_shows_what_it_prints(path):
    committed = nbformat.read(path, as_version=4)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    assert any(c.get("outputs") for c in committed.cells if c.cell_type == "code"), (
        f"{path.name} is committed without outputs: run it and save it"
    )
    assert normalized(nb) == normalized(committed), (
        f"{path.name}: its committed outputs differ from a fresh run; re-run and save it"
    )


def test_there_are_notebooks():
    assert NOTEBOOKS
