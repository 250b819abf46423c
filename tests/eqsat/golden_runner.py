"""Run a golden graph with the options its header asks for (``;; rewrites: patterns``,
``;; machine: gpu``, ``;; io: device``) and return the extracted program's text."""

from __future__ import annotations

from pathlib import Path

from saturn.eqsat.driver import run

GOLDEN = Path(__file__).parent / "golden"


def options(path: Path) -> list[str]:
    args: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith(";;"):
            continue
        key, _, value = line[2:].strip().partition(":")
        value = value.strip()
        if key == "rewrites":
            args += ["--rewrites", value]
        elif key == "machine":
            args += ["--machine", value]
        elif key == "io":
            args += ["--io", value]
    return args


def extracted(path: Path) -> str:
    return run([str(path), *options(path)])
