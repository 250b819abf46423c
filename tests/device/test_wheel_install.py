"""saturn installed from its built wheel, not from the checkout: the wheel holds every module
of the packages and their data (rules, the C++ sources the extension is built from, the
autoload entry point), and in a new virtual environment the README's examples run from the
installed copy (the device on saturn:0, then a compiled transformer layer).

The new environment takes saturn's dependencies from the test's own environment (a path
file naming its site-packages, whose editable install of saturn is then not loaded): what
is under test is the wheel, not the package index. Python 3.12 or 3.13, whichever runs the
tests."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

EXAMPLE = textwrap.dedent(
    """
    import torch
    import saturn  # registers the device, builds the extension once

    x = torch.randn(4, 4, device="saturn:0")
    y = (x @ x.t()).relu()
    assert torch.equal(y.cpu(), (x.cpu() @ x.cpu().t()).relu())
    assert torch.saturn.memory_stats("saturn:0")["allocated"] > 0  # saturn's allocator

    block = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    block = block.eval().to("saturn:0")
    x = torch.randn(2, 16, 64, device="saturn:0")
    with torch.no_grad():
        fast = torch.compile(block, backend="saturn", options={"device": "saturn:0"})
        y = fast(x)
        want = block.cpu()(x.cpu())
    torch.testing.assert_close(y.cpu(), want, rtol=1e-5, atol=1e-5)
    from saturn import backend
    assert backend.CACHE.fallbacks == [], backend.CACHE.fallbacks
    print("SATURN_FROM", saturn.__file__)
    """
)


def _expected_members() -> set[str]:
    """What the wheel must hold: every module and data file of the package folders."""
    want = set()
    for folder, package in (
        ("device", "saturn"),
        ("eqsat", "saturn/eqsat"),
        ("codegen", "saturn/codegen"),
        ("device/library", "saturn/library"),
        ("device/autoload", "saturn_autoload"),
    ):
        want |= {f"{package}/{f.name}" for f in (ROOT / folder).glob("*.py")}
    want |= {f"saturn/rules/{f.name}" for f in (ROOT / "rules").glob("*.egg")}
    want |= {f"saturn/library/{f.name}" for f in (ROOT / "device/library").glob("*.egg")}
    want |= {f"saturn/csrc/{f.name}" for f in (ROOT / "device/csrc").iterdir() if f.is_file()}
    return want


@pytest.mark.slow
def test_the_built_wheel_installs_and_runs_the_readme_examples(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("torch_saturn-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert _expected_members() - names == set()
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "saturn = saturn.backend:saturn_backend" in text  # torch.compile(backend=...)
    assert "saturn = saturn_autoload:register" in text  # torch's device autoload

    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    py = env / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # the dependencies: this environment's site-packages, after the new one's own
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    run = subprocess.run(
        [py, "-c", EXAMPLE], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    where = run.stdout.split("SATURN_FROM ")[-1].strip()
    assert Path(where).is_relative_to(env), where  # the installed copy, not the checkout
