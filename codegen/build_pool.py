"""Worker processes that build kernels, kept for the whole process.

A worker's first build pays about 1.3 s before its kernel (Numba's import, 0.6 s, and
its compiler's first run; two cores, tiny ResNet-18's kernels): a training step compiles
three graphs, and each paid it again when every graph started workers of its own. The
pool is started when a GPU compile begins, so that cost runs beside Dynamo's tracing and
the e-graph, and later graphs find the workers ready. Kernels are handed out one at a
time to whichever worker is free (a long kernel no longer holds back the ones dealt to
its worker after it). A worker imports only the codegen folder, under an empty
``saturn`` package (not saturn's device package with torch and the extension, and never
the caller's ``__main__``, which a user's script without a main guard would run again),
and exits after ``IDLE_S`` without work or when the parent's end of its pipe closes.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import selectors
import subprocess
import sys
import threading
from pathlib import Path

log = logging.getLogger("saturn")

IDLE_S = 120.0  # a worker with nothing to build for this long exits (the pool starts anew)

_WORKER = """
import json, os, select, sys, types
# replies on a descriptor of their own: anything else printed (a library's notice, at the C
# level too) goes where stderr goes
reply = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
for name, path in (("saturn", []), ("saturn.codegen", [sys.argv[1]])):
    m = types.ModuleType(name); m.__path__ = path; sys.modules[name] = m
from saturn.codegen import cubins
cubins.warm(tuple(json.loads(sys.argv[2])))
idle = float(sys.argv[3])
while select.select([sys.stdin], [], [], idle)[0]:
    line = sys.stdin.readline()
    if not line:
        break
    j = json.loads(line)
    try:
        cubins.build(cubins.Job(*j["job"]), tuple(j["cc"]), j["version"])
        msg = ""
    except Exception as e:
        msg = f"{j['job'][0]}: {type(e).__name__}: {e}"[:300]
    reply.write(json.dumps(msg) + "\\n")
    reply.flush()
"""


class Pool:
    """``size`` build workers for compute capability ``cc``; ``run`` builds jobs on them."""

    def __init__(self, size: int, cc: tuple[int, int]) -> None:
        self.size = size
        self.cc = cc
        self.pid = os.getpid()  # a forked child has pipes to its parent's workers: not its own
        self.procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()  # one build at a time hands out this pool's workers
        self._fill()

    def _fill(self) -> None:
        """Start workers until ``size`` are alive (those gone idle are replaced)."""
        self.procs = [p for p in self.procs if p.poll() is None]
        folder = str(Path(__file__).parent)
        while len(self.procs) < self.size:
            cmd = [sys.executable, "-c", _WORKER, folder, json.dumps(self.cc), str(IDLE_S)]
            self.procs.append(
                subprocess.Popen(
                    cmd,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            )

    def run(self, jobs: list, version: str) -> list[str]:
        """Build ``jobs`` (``cubins.Job``), each on the next free worker; the failures'
        messages (a kernel that fails here is left to its first launch, which raises)."""
        failed: list[str] = []
        with self._lock, selectors.DefaultSelector() as sel:
            self._fill()
            todo = list(reversed(jobs))

            def give(p: subprocess.Popen) -> None:
                j = todo.pop()
                msg = {"job": [j.name, j.source, list(j.pointer_types), list(j.ints)]}
                msg.update(cc=list(self.cc), version=version)
                try:
                    p.stdin.write(json.dumps(msg) + "\n")
                    p.stdin.flush()
                    sel.register(p.stdout, selectors.EVENT_READ, (p, j))
                except OSError:  # the worker is gone (idle just now): another one builds it
                    todo.append(j)

            for p in self.procs:
                if todo:
                    give(p)
            while sel.get_map():
                for key, _ in sel.select():
                    p, j = key.data
                    sel.unregister(key.fileobj)
                    line = p.stdout.readline()
                    if not line:  # the worker died building it
                        failed.append(f"{j.name}: its build worker exited")
                        continue
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        msg = f"{j.name}: its build worker answered {line[:100]!r}"
                    if msg:
                        failed.append(str(msg))
                    if todo:
                        give(p)
            failed += [f"{j.name}: no build worker was left" for j in todo]
        return failed

    def close(self) -> None:
        for p in self.procs:
            try:
                p.stdin.close()  # the worker's loop ends at its pipe's end
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []


_POOL: Pool | None = None
_POOL_LOCK = threading.Lock()


def pool(size: int, cc: tuple[int, int]) -> Pool:
    """The process's pool for ``cc`` with ``size`` workers, started if there is none."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or (_POOL.size, _POOL.cc, _POOL.pid) != (size, cc, os.getpid()):
            if _POOL is not None and _POOL.pid == os.getpid():
                _POOL.close()
            else:
                atexit.register(_close)
            _POOL = Pool(size, cc)
        return _POOL


def started(cc: tuple[int, int]) -> bool:
    """Whether the process has a pool for ``cc`` (its workers may have gone idle since:
    ``run`` starts them again)."""
    return _POOL is not None and _POOL.cc == cc and _POOL.pid == os.getpid()


def shutdown() -> None:
    """Stop the workers and forget the pool (the next build starts one)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None and _POOL.pid == os.getpid():
            _POOL.close()
        _POOL = None


def _close() -> None:
    if _POOL is not None and _POOL.pid == os.getpid():
        _POOL.close()
