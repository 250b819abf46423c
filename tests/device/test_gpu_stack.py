"""The first GPU compile of a process warns, once, when a library saturn plans GPU calls with
is not installed (cupy, nvmath, the cuDNN frontend), naming it, what it is for and the
extra that installs it; with all of them present it says nothing."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

from saturn import gpu_stack


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(gpu_stack, "_checked", False)


def _without(monkeypatch, absent: set[str]):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in absent else real(name, *a)
    )


def test_a_missing_library_is_named_once(fresh, monkeypatch):
    monkeypatch.setattr(gpu_stack, "LIBRARIES", {"cupy": "device arrays", "numpy": "arrays"})
    _without(monkeypatch, {"cupy"})
    with pytest.warns(UserWarning, match=r"without cupy \(cupy: device arrays\).*\[cu13\]"):
        gpu_stack.check_once()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gpu_stack.check_once()  # once per process


def test_nothing_is_said_when_every_library_is_there(fresh, monkeypatch):
    _without(monkeypatch, set())
    monkeypatch.setattr(gpu_stack, "LIBRARIES", {"numpy": "arrays"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gpu_stack.check_once()
    assert gpu_stack.missing() == []
