"""``bench/graph_corpus.py``: a zoo model's graphs captured as the importer makes them for a
GPU, replayed through the compiler core twice, compare as the same programs; a changed
program shows as one that differs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchvision", reason="the zoo extra is not installed")

_spec = importlib.util.spec_from_file_location(
    "graph_corpus", Path(__file__).resolve().parents[2] / "bench" / "graph_corpus.py"
)
corpus = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = corpus
_spec.loader.exec_module(corpus)


def test_captured_graphs_replay_to_the_same_programs(tmp_path, capsys):
    import torch

    corpus.capture(tmp_path / "g", ["resnet18"], "tiny", ["float32"], training=True)
    torch._dynamo.reset()
    names = sorted(p.name for p in (tmp_path / "g").glob("*.graph"))
    assert names == ["resnet18_float32_train_0.graph", "resnet18_float32_train_1.graph"]
    corpus.replay(tmp_path / "g", tmp_path / "a.json")
    corpus.replay(tmp_path / "g", tmp_path / "b.json")
    rows = json.loads((tmp_path / "a.json").read_text())
    assert all(r["host"] == 0 and r["stop"] == "saturated" for r in rows.values()), rows
    capsys.readouterr()
    corpus.compare(tmp_path / "a.json", tmp_path / "b.json")
    assert capsys.readouterr().out.endswith("2 of 2 programs the same\n")
    changed = json.loads((tmp_path / "b.json").read_text())
    changed["resnet18_float32_train_1.graph"]["digest"] = "0" * 16
    (tmp_path / "b.json").write_text(json.dumps(changed))
    corpus.compare(tmp_path / "a.json", tmp_path / "b.json")
    out = capsys.readouterr().out
    assert "DIFFERS" in out and out.endswith("1 of 2 programs the same\n")
