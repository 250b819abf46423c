"""The GPU runner's lent outputs (a mixin of ``GpuRunner``): a call's outputs view the
runner's memory through storages of their own; before the next call rewrites that memory,
every lent storage still held is copied out and its data pointer swapped to the copy.
"""

from __future__ import annotations

import functools

import torch

from saturn.eqsat.program import StepKind

from .eager_kernels import byte_span
from .eager_kernels import cuda_driver as _driver


class Lending:
    # program outputs only the recipe's input writes read: never handed out (gpu_runner)
    write_only: frozenset[int] | set[int] = frozenset()

    def _groups(self, outs: list, bases: list | None = None) -> list[tuple[int, int, list[tuple]]]:
        """Outputs in the runner's memory as (address, bytes, members): one storage per
        group of outputs whose bytes overlap (views of one value share it, as in eager), each
        member (position, dtype, element offset, shape, strides). Other outputs are in no
        group."""
        spans = []
        for i, t in enumerate(outs):
            if i in self.write_only:  # read by the recipe's writes, never handed out
                continue
            if isinstance(t, torch.Tensor) and t.numel() and self._in_owned(t):
                spans.append((*_lent_span(t, bases[i] if bases else None), i, t))
        spans.sort(key=lambda sp: sp[0])
        groups: list[list] = []
        for start, end, i, t in spans:
            if groups and start < groups[-1][1]:
                groups[-1][1] = max(groups[-1][1], end)
                groups[-1][2].append((t.data_ptr(), i, t))
            else:
                groups.append([start, end, [(t.data_ptr(), i, t)]])
        out = []
        for start, end, members in groups:
            if any((ptr - start) % t.element_size() for ptr, _, t in members):
                continue  # mixed element sizes at odd offsets: copied out instead
            out.append(
                (
                    start,
                    end - start,
                    [
                        (i, t.dtype, (ptr - start) // t.element_size(), t.shape, t.stride())
                        for ptr, i, t in members
                    ],
                )
            )
        return out

    def _out_plan(self, outs: list, env: dict) -> tuple[list, dict]:
        """How a call's outputs are handed out: the arena groups (``_groups``) and the
        outputs that view an input without a copy: position -> (input position, shape,
        strides, element offset from the input's)."""
        views = {}
        for k, value in self.out_inputs.items():
            t, base = outs[k], env[value]
            if (
                isinstance(t, torch.Tensor)
                and isinstance(base, torch.Tensor)
                and t.device == base.device == self.device
                and t.untyped_storage()._cdata == base.untyped_storage()._cdata
            ):
                rel = t.storage_offset() - base.storage_offset()
                views[k] = (self.r._position[value], t.shape, t.stride(), rel)
        return self._groups(outs, self._bases(outs)), views

    @functools.cached_property
    def _view_roots(self) -> dict[str, str]:
        """Each view step's value -> the value it views in the end (the program's steps
        come in order, so a view's source is resolved before the view)."""
        roots: dict[str, str] = {}
        for s in self.r.program.steps:
            if s.kind == StepKind.VIEW:
                roots[s.output] = roots.get(s.args[0], s.args[0])
        return roots

    def _bases(self, outs: list) -> list:
        """Per output that is a view not packed, the buffer of the kernel output it views
        (following the program's view steps), else None."""
        roots = self._view_roots
        return [
            self.buffers.get(roots.get(v, v))
            if isinstance(t, torch.Tensor) and not t.is_contiguous()
            else None
            for v, t in zip(self.r.program.outputs, outs, strict=True)
        ]

    def _hand_out(self, outs: list, plan: tuple, prepared: list, given: list | None) -> list:
        """The call's results: outputs in the runner's memory as tensors over storages of
        their own that point into it (weakly tracked, see _reclaim); views of the caller's
        inputs as views of them; anything else on the device (a constant, a staged input, a
        packed copy of an input: memory a later call reuses) as a copy."""
        groups, views = plan
        results = list(outs)
        lent = set()
        for k, (i, shape, stride, rel) in views.items():
            # the caller's own tensor, or its region (InputSpec.window): not a copy
            if given is not None and (
                prepared[i] is given[i]
                or prepared[i].untyped_storage()._cdata == given[i].untyped_storage()._cdata
            ):
                base = prepared[i]
                results[k] = base.as_strided(shape, stride, base.storage_offset() + rel)
                lent.add(k)
        for start, nbytes, members in groups:
            storage = torch._C._construct_storage_from_data_pointer(start, self.device, nbytes)
            for i, dtype, offset, shape, stride in members:
                empty = torch.empty(0, dtype=dtype, device=self.device)
                results[i] = empty.set_(storage, offset, shape, stride)
                lent.add(i)
            self.lent.append(storage._weak_ref())
        for i, t in enumerate(outs):
            if i in lent or i in self.write_only:
                continue
            if isinstance(t, torch.Tensor) and t.device == self.device:
                results[i] = self._copy_out(t)
        return results

    def _reclaim(self) -> None:
        """Copy every lent storage still held out of the runner's memory (and forget the
        rest)."""
        if not self.lent:
            return
        lent, self.lent = self.lent, []
        for ref in lent:
            try:
                held = torch.UntypedStorage._new_with_weak_ptr(ref)
                if held is not None:
                    self._take_back(held)
            finally:
                torch.UntypedStorage._free_weak_ref(ref)

    def _take_back(self, held: torch.UntypedStorage) -> None:
        """Give a lent storage memory of its own: a device copy of its bytes, then the
        swap of data pointers (every tensor and view over it follows). A storage already
        taken back (its address outside the runner's memory) is left alone."""
        ptr, nbytes = held.data_ptr(), held.nbytes()
        if not self._points_into_owned(ptr):
            return
        fresh = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        (err,) = _driver().cuMemcpyDtoDAsync(fresh.data_ptr(), ptr, nbytes, self.stream)
        if err != self._ok:
            self._check((err,), "cuMemcpyDtoDAsync")
        whole = torch.empty(0, dtype=torch.uint8, device=self.device).set_(held)
        torch.ops.saturn_rt.swap_storage_data(whole, fresh)  # fresh now views the arena
        self.copied_out += 1

    def lends(self, storage: torch.UntypedStorage) -> bool:
        """Whether ``storage`` is one this runner lent that still points into its memory."""
        if storage.device != self.device or storage._cdata in self._owned:
            return False
        return self._points_into_owned(storage.data_ptr())

    def _points_into_owned(self, ptr: int) -> bool:
        return any(base <= ptr < end for base, end in self._owned.values())

    def _own(self, t: torch.Tensor) -> None:
        """Note memory every call rewrites (the arena, a reshape's kept copy): outputs in
        it are lent."""
        storage = t.untyped_storage()
        self._owned[storage._cdata] = (storage.data_ptr(), storage.data_ptr() + storage.nbytes())

    def _packed(self, t: torch.Tensor) -> tuple | None:
        """(shape, dtype, address, bytes) of a packed device tensor; None for anything else."""
        if t.device != self.device or not t.is_contiguous():
            return None
        return (t.shape, t.dtype, t.data_ptr(), t.numel() * t.element_size())

    def _copy_out(self, t: torch.Tensor) -> torch.Tensor:
        """A fresh tensor with ``t``'s values: one asynchronous device copy when packed."""
        self.copied_out += 1
        packed = self._packed(t)
        if packed is None:
            return t.clone()
        shape, dtype, src, nbytes = packed
        out = torch.empty(shape, dtype=dtype, device=self.device)
        if nbytes:
            (err,) = _driver().cuMemcpyDtoDAsync(out.data_ptr(), src, nbytes, self.stream)
            if err != self._ok:
                self._check((err,), "cuMemcpyDtoDAsync")
        return out

    def _in_owned(self, t: torch.Tensor) -> bool:
        return t.device == self.device and t.untyped_storage()._cdata in self._owned


def _lent_span(t: torch.Tensor, base: torch.Tensor | None) -> tuple[int, int]:
    """The bytes an output's lent storage covers: its own, or, for a view that is not
    packed (a slice, heads out of a fused projection), those of the buffer it views, as
    eager's view keeps its base's storage. A graph that takes the output (a backward its
    saved tensor) then finds the window's region inside the storage and reads it in place
    (decision 0130) instead of copying it at every call."""
    lo, hi = byte_span(t)
    if base is None or t.is_contiguous() or not base.numel():
        return lo, hi
    b_lo, b_hi = byte_span(base)
    if base.untyped_storage()._cdata != t.untyped_storage()._cdata or not b_lo <= lo < hi <= b_hi:
        return lo, hi
    return b_lo, b_hi
