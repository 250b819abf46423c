"""How saturn loads: ``import saturn`` registers the device as before; the compiler core
(``saturn.eqsat``, ``saturn.codegen``) imported alone leaves torch and the device alone,
and torch's device autoload registers the device if torch comes later; ``import torch``
alone never loads saturn. Each case in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import saturn

GOLDEN = Path(__file__).parents[1] / "eqsat" / "golden"


def python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
    return proc.stdout


def test_the_core_alone_imports_no_torch_and_compiles_a_golden_graph():
    out = python(
        f"""
        import sys
        sys.path.insert(0, "tests/eqsat")
        import saturn.codegen
        import saturn.eqsat
        from golden_runner import extracted
        from pathlib import Path
        path = Path({str(GOLDEN / "batch_norm_half.graph")!r})
        assert extracted(path) == path.with_suffix(".expected").read_text()
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        print("torch modules:", loaded, "device:", "saturn._package" in sys.modules)
        """
    )
    assert "torch modules: [] device: False" in out


def test_torch_after_the_core_registers_the_device():
    out = python(
        """
        import saturn.eqsat
        import saturn.backend  # a device module importing torch itself
        import torch
        x = torch.ones(3, device="saturn:0") * 2
        import saturn
        print(x.device, x.sum().item(), saturn.device_count() >= 1, saturn.explain.__name__)
        """
    )
    assert "saturn:0 6.0 True explain" in out


def test_a_public_name_after_the_core_registers_the_device():
    out = python(
        """
        import saturn.eqsat
        n = saturn.device_count()
        import torch
        print(n >= 1, torch.zeros(2, device="saturn:0").device)
        """
    )
    assert "True saturn:0" in out


def test_import_torch_alone_does_not_load_saturn():
    out = python("import sys, torch\nprint('saturn' in sys.modules, torch.ones(1).item())")
    assert "False 1.0" in out


def test_import_saturn_binds_every_public_name():
    for name in saturn.__all__:
        assert getattr(saturn, name) is not None, name
    assert saturn.device_count is saturn.device_module.device_count
    assert isinstance(saturn.NotCompiledError("x"), Exception)
