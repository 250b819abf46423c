"""The extension build: cached by key, and a failed build shows the compiler's output."""

from __future__ import annotations

import pytest

from saturn import _build


def test_cached_build_is_reused(capsys):
    assert _build.build() == _build.build()
    assert "building" not in capsys.readouterr().err  # a cached build says nothing


def test_build_failure_shows_compiler_output(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SATURN_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "broken.cpp").write_text("int main() { return undeclared_name; }\n")
    with pytest.raises(_build.ExtensionBuildError) as info:
        _build.build(src)
    assert "saturn: building its C++ extension" in capsys.readouterr().err  # said first
    text = str(info.value)
    assert "broken.cpp" in text and "undeclared_name" in text and "error" in text
    assert not list((tmp_path / "cache").rglob("*.so")), "nothing cached after a failure"
