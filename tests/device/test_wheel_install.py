"""saturn installed from its built wheel, not from the checkout: the wheel holds every module
of the packages and their data (rules, the C++ sources the extension is built from, the
autoload entry point), and in a new virtual environment the README's examples run from the
installed copy (the device on saturn:0, then a compiled transformer layer).

Twice: on the Python that runs the tests, the new environment taking saturn's dependencies
from the test's own environment (a path file naming its site-packages, whose editable
install of saturn is then not loaded), so that what is under test is the wheel; and on
Python 3.13 (the other version saturn supports, when the tests run on 3.12), the wheel
installed with its dependencies resolved from the package index, as a user installs it."""

from __future__ import annotations

import os
import shutil
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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """saturn's wheel, built from the checkout (once for this file's tests)."""
    dist = tmp_path_factory.mktemp("dist")
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
    (built,) = dist.glob("torch_saturn-*.whl")
    return built


def _run_example(py: Path, env_root: Path, cwd: Path) -> str:
    """The README's examples in the new environment; their stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["SATURN_CACHE_DIR"] = str(cwd / "cache")  # the extension built by this install
    run = subprocess.run(
        [py, "-c", EXAMPLE + "\nimport sys; print('PYTHON', *sys.version_info[:2])"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    where = run.stdout.split("SATURN_FROM ")[-1].split("\n")[0].strip()
    assert Path(where).is_relative_to(env_root), where  # the installed copy, not the checkout
    return run.stdout


@pytest.mark.slow
@pytest.mark.install  # with the other install check, after the suite (decision 0106)
def test_the_built_wheel_installs_and_runs_the_readme_examples(tmp_path, wheel):
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
    _run_example(py, env, tmp_path)


def _python_313() -> str | None:
    """A Python 3.13 interpreter that runs: SATURN_PYTHON313, pyenv's, or python3.13 on the
    path (where pyenv's shim may name a version it will not run)."""
    candidates = [os.environ.get("SATURN_PYTHON313")]
    for root in (Path.home() / ".pyenv/versions", Path("/root/.pyenv/versions")):
        candidates += [str(p / "bin/python3.13") for p in sorted(root.glob("3.13*"))]
    candidates.append(shutil.which("python3.13"))
    for c in candidates:
        if c and Path(c).exists():
            check = "import sys; sys.exit(sys.version_info[:2] != (3, 13))"
            if subprocess.run([c, "-c", check], capture_output=True).returncode == 0:
                return c
    return None


@pytest.mark.slow
@pytest.mark.install
def test_the_wheel_installs_from_the_index_on_python_313(tmp_path, wheel):
    """A fresh Python 3.13 environment, saturn's wheel and its dependencies from the package
    index (torch, egglog, numba, ... for 3.13), then the README's examples."""
    if sys.version_info[:2] == (3, 13):
        pytest.skip("the tests run on 3.13: the test above installed the wheel there")
    py313 = _python_313()
    if py313 is None:
        pytest.skip("no Python 3.13 interpreter here (SATURN_PYTHON313 names one)")
    env = tmp_path / "venv"
    subprocess.run([py313, "-m", "venv", str(env)], check=True, capture_output=True)
    py = env / "bin" / "python"
    install = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    assert "PYTHON 3 13" in _run_example(py, env, tmp_path)
