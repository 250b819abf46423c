"""Fixtures of the compile tests."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture
def quiet_saturn():
    """Graphs that run uncompiled say so at WARNING; tests that check results, not logs
    (the random-program fuzzers), silence it."""
    logging.getLogger("saturn").setLevel(logging.ERROR)
    yield
    logging.getLogger("saturn").setLevel(logging.NOTSET)
