"""A faster scheduler for the threads of one block under Numba's CUDA simulator, for the
simulator tests (``cudasim_runner.py``, the custom ops' kernels): same semantics, a
fraction of the simulator's own time. Import, then call ``install()`` before launching."""

from __future__ import annotations

import _thread
import os
import threading

import numpy as np


def _gate() -> _thread.LockType:
    """A thread's own gate: a raw lock held while the thread may not go on. Waking one
    thread is one release, where a shared condition wakes every waiter to fight for its
    lock (a convoy: most of the simulator's time was that fight)."""
    lock = _thread.allocate_lock()
    lock.acquire()
    return lock


def install() -> None:
    """The simulator's block manager polls its threads in a loop that holds the GIL, so
    every simulated thread waits for the interpreter's switch interval before it runs on;
    here a thread that reaches syncthreads or ends counts itself, and the last one wakes
    the manager, which then opens every waiting thread's gate. The semantics are the
    simulator's: when every live thread of the block waits in syncthreads, all go on; a
    thread's exception aborts the block and is raised at once. Also gives the simulator
    warp shuffles (``shfl_down_sync``, ``shfl_sync``) for whole warps.
    SATURN_CUDASIM_POLL=1 keeps the simulator's own loop."""
    _install_warp_shuffles()
    if os.environ.get("SATURN_CUDASIM_POLL") == "1":
        return
    from numba.cuda.simulator import kernel as sim

    thread_run = sim.BlockThread.run

    def _arrived(manager) -> None:
        """Count one thread in (under the manager's lock); the last wakes the manager."""
        manager.arrived += 1
        if (manager.failed or manager.arrived >= manager.live) and not manager.woken:
            manager.woken = True
            manager.wake.release()

    def syncthreads(self) -> None:
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        manager = self._manager
        with manager.lock:
            _arrived(manager)
        self.gate.acquire()
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    def run_thread(self) -> None:
        try:
            thread_run(self)  # the simulator's: keeps an exception in self.exception
        finally:
            manager = self._manager
            with manager.lock:
                self.finished = True
                if self.exception:
                    manager.failed = True
                _arrived(manager)

    def run_block(self, grid_point, *args) -> None:
        def target():
            self._f(*args)

        threads = [
            sim.BlockThread(target, self, grid_point, point, self._debug)
            for point in np.ndindex(*self._block_dim)
        ]
        self.lock, self.wake = _thread.allocate_lock(), _gate()
        self.arrived, self.live, self.failed, self.woken = 0, len(threads), False, False
        for t in threads:
            t.finished, t.gate = False, _gate()
        for t in threads:
            t.start()
        live = threads
        while live:
            self.wake.acquire()  # every live thread waits in syncthreads, or one failed
            with self.lock:
                self.woken = False
                failed = next((t for t in threads if t.exception), None)
                if failed is not None:
                    for t in threads:
                        t.abort = True
                    for t in live:
                        if not t.finished and t.gate.locked():
                            t.gate.release()
                    raise failed.exception[0].with_traceback(failed.exception[1])
                live = [t for t in live if not t.finished]
                self.arrived, self.live = 0, len(live)
            for t in live:  # every one waits in syncthreads: release them together
                t.gate.release()
        for t in threads:
            t.join()

    sim.BlockThread.syncthreads = syncthreads
    sim.BlockThread.run = run_thread
    sim.BlockManager.run = run_block
    _install_shared_arrays()


def _install_warp_shuffles() -> None:
    """The simulator has no warp shuffles; give it shfl_down_sync and shfl_sync for whole
    warps (every kernel here calls them with all 32 lanes together), the lanes exchanging
    values at a meeting whose last arrival opens the others' gates."""
    from numba.cuda.simulator import kernelapi

    lock = _thread.allocate_lock()
    warps: dict[tuple, dict] = {}

    def meet(t, w) -> None:
        if not hasattr(t, "gate"):  # the simulator's own scheduler (SATURN_CUDASIM_POLL=1)
            t.gate = _gate()
        with lock:
            w["count"] += 1
            if w["count"] < 32:
                w["waiting"].append(t.gate)
                wait = True
            else:
                for g in w["waiting"]:
                    g.release()
                w["count"], w["waiting"], wait = 0, [], False
        if wait:
            t.gate.acquire()

    def warp(t) -> dict:
        key = (id(t._manager), t.thread_id // 32)
        with lock:
            return warps.setdefault(key, {"count": 0, "waiting": [], "vals": [None] * 32})

    def shfl_down_sync(self, mask, value, delta):
        t = threading.current_thread()
        w, lane = warp(t), t.thread_id % 32
        w["vals"][lane] = value
        meet(t, w)
        src = lane + delta
        out = w["vals"][src] if src < 32 else value
        meet(t, w)
        return out

    def shfl_sync(self, mask, value, src_lane):
        t = threading.current_thread()
        w = warp(t)
        w["vals"][t.thread_id % 32] = value
        meet(t, w)
        out = w["vals"][src_lane]
        meet(t, w)
        return out

    kernelapi.FakeCUDAModule.shfl_down_sync = shfl_down_sync
    kernelapi.FakeCUDAModule.shfl_sync = shfl_sync


def _install_shared_arrays() -> None:
    """``cuda.shared.array`` under the simulator finds a block's array by the calling line
    (a traceback, slow) and creates it if missing, without a lock: two threads switched
    between the lookup and the store each get an array of their own, and a block reduction
    then reads partials another thread never wrote (seen once on a loaded machine). Here
    the lookup and the creation are one step under a lock; the key is the simulator's
    (file and line of the caller)."""
    import sys

    from numba.cuda import types
    from numba.cuda.np import numpy_support
    from numba.cuda.simulator import kernelapi

    lock = threading.Lock()
    dynamic = kernelapi.FakeCUDAShared.array

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:  # dynamic shared memory: one buffer
            return dynamic(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with lock:
            found = self._allocations.get(caller)
            if found is None:
                found = self._allocations[caller] = np.empty(shape, dtype)
        return found

    kernelapi.FakeCUDAShared.array = array
