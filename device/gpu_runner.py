"""The executor of a recipe on a GPU: an arena laid out by the memory plan, library plans,
and CUDA-graph replay.

Every kernel output lives at a fixed offset in one arena (``saturn.eqsat.memory``), so the
addresses a call uses are the same from call to call. The first call runs step by step (it
loads kernels and builds the nvmath and cuDNN plans for the layouts it sees). When replay is
on and the program is capturable (device steps only, no crossing other than the boundary
inputs), the second call captures the whole call's device work on saturn's stream as a CUDA
graph and later calls replay it: one launch. Inputs are read where they lie; an input that
arrives at a new address is staged: it gets a buffer of its own, the graph is captured once
more reading from there, and each later call copies the input into it before the replay.
An input whose shape or strides differ from the recipe's never reaches this point (the
recipe checks and packs inputs first).

Outputs are *lent*: the tensors a call returns view the runner's memory (the arena, a
reshape's kept copy) through storages of their own, with no copy. Before the next call
rewrites that memory, every lent storage still held anywhere (the caller's tensor, a view
of it, autograd's saved tensors) is copied to fresh memory and its data pointer swapped to
the copy, so what the caller holds keeps its values; storages nobody holds cost nothing. A
training step (whose saved activations and gradients are dropped before the next step) and
an inference loop that drops its outputs never copy. An output that views an input is a
view of the caller's tensor, as in eager (a forward's saved inputs and transposed weights).

Rule for replay (documented in docs/decisions/0013): on for recipes whose shapes are all
static, off when the option ``replay`` is False, when the program has host steps or
crossings, or when a capture saw the allocator hand out memory (the graph would then
write memory it does not own); each refusal is logged once with its reason.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import weakref

import numpy as np
import torch

from saturn.codegen import cuda as cg
from saturn.codegen.conv import ConvError, ConvParams, ConvPlan, SplitConvPlan
from saturn.codegen.cublaslt import WORKSPACE_BYTES, LtPlan
from saturn.codegen.gemm import GemmError, GemmPlan, Layout, time_on_stream
from saturn.codegen.reshape import gemm_copy_order
from saturn.eqsat.graph import bits_float
from saturn.eqsat.memory import plan_memory
from saturn.eqsat.optable import HALVES
from saturn.eqsat.program import Step
from saturn.eqsat.ranges import indices_in_range

from .dtypes import DTYPES, TORCH_DTYPES
from .eager_kernels import byte_span, strided_copy
from .eager_kernels import cuda_driver as _driver
from .host_ops import run_host
from .profiling import recording, step_range
from .steps import check_operands, const_tensor

log = logging.getLogger("saturn")


def fill_word(value_bits: int, dtype: str) -> int:
    """A pad's constant as its element's bits (signed for 8-byte elements, which the
    kernel takes as int64), converted to the dtype once, as PyTorch converts it."""
    t = torch.tensor(bits_float(value_bits), dtype=torch.float64).to(TORCH_DTYPES[dtype])
    size = t.element_size()
    word = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])
    return int(word.item()) if size == 8 else int(word.item()) & ((1 << (8 * size)) - 1)


def layout(t: torch.Tensor) -> Layout:
    return Layout(DTYPES[t.dtype], tuple(t.shape), tuple(t.stride()))


class GpuRunner:
    # tf32x3 GEMMs are kept only where faster than float32 (tests turn the choice off)
    choose_precision = True
    gelu_epilogue = "timed"  # codegen.gemm.GELU_CHOICES; tests force one way

    def __init__(self, recipe, replay: bool = True, precision: str = "fp32"):
        self.r = recipe
        self.device = recipe.device
        self.precision = precision
        prog = recipe.program
        self.memory = plan_memory(prog)
        cc = torch.saturn.get_device_capability(self.device)
        self.stream = torch.saturn.stream_handle(self.device)
        self.custom: dict[str, tuple] = {}  # step -> (custom op, argument builder)
        self.takes: dict[str, cg.TakeKernel] = {}
        self.fused_takes = 0  # rows kernels that read a take's rows themselves
        self.scatters: dict[str, cg.ScatterAddKernel] = {}
        self.concats: dict[str, cg.ConcatKernel] = {}
        self.pads: dict[str, tuple[cg.PadKernel, int]] = {}  # step -> (kernel, fill word)
        # row takes and row adds raise a device word on an index out of range, read after
        # every call
        self.err_word: torch.Tensor | None = None
        self._err_host = np.zeros(1, dtype=np.int32)
        self._unbounded_indices = False  # a take or add whose index the compiler cannot bound
        with torch.saturn.device(self.device):
            self.kernels: dict[str, cg.CudaKernel] = {}
            for s in prog.steps:
                if s.kind == "kernel" and s.kernel.kind in ("loop", "reduce", "rows"):
                    self.kernels[s.output] = cg.CudaKernel(s.kernel, cc)
                    if "take" in s.kernel.attrs:  # a row take read inside (fuse_row_takes)
                        self.fused_takes += 1
                        self._unbounded_indices |= not indices_in_range(prog, s)
                elif s.kind == "kernel" and s.kernel.kind == "custom":
                    try:
                        self.custom[s.output] = recipe.custom_op(s.kernel.attrs["name"])
                    except RuntimeError as e:  # e.g. the built-in "rmsnorm" pattern's kernel
                        raise NotImplementedError(str(e)) from None
                elif s.kind == "kernel" and s.kernel.kind == "gather":
                    table, index = s.kernel.inputs
                    self.takes[s.output] = cg.TakeKernel(
                        cg.MEMORY_SIZE[table.dtype], index.dtype, len(index.shape), cc
                    )
                    self._unbounded_indices |= not indices_in_range(prog, s)
                elif s.kind == "kernel" and s.kernel.kind == "scatter":
                    base, index, _ = s.kernel.inputs
                    self.scatters[s.output] = cg.ScatterAddKernel(base.dtype, index.dtype, cc)
                    self._unbounded_indices |= not indices_in_range(prog, s)
                elif s.kind == "kernel" and s.kernel.kind == "concat":
                    a = s.kernel.inputs[0]
                    self.concats[s.output] = cg.ConcatKernel(
                        cg.MEMORY_SIZE[a.dtype],
                        len(a.shape),
                        s.kernel.attrs["dim"],
                        cc,
                        len(s.kernel.inputs),
                    )
                elif s.kind == "kernel" and s.kernel.kind == "pad":
                    x = s.kernel.inputs[0]
                    self.pads[s.output] = (
                        cg.PadKernel(cg.MEMORY_SIZE[x.dtype], len(x.shape), cc),
                        fill_word(s.kernel.attrs["value_bits"], x.dtype),
                    )
                elif s.kind == "kernel" and s.kernel.kind not in ("gemm", "conv"):
                    raise NotImplementedError(f"{s.kernel.kind} kernels have no GPU runner yet")
            # every kernel the first call will launch, built in parallel now (or found on
            # disk) rather than one after another as the call reaches it
            gens = [g for k in self.kernels.values() for g in k.expected()]
            gens += [g for c in self.concats.values() for g in c.expected()]
            gens += [p.g for p, _ in self.pads.values()]
            cg.precompile(gens, cc)
        # device memory is made at the first call: compilation runs under fake tensors
        self.arena: torch.Tensor | None = None
        # storages every call rewrites (their StorageImpl address -> [start, end) address)
        self._owned: dict[int, tuple[int, int]] = {}
        self.buffers: dict[str, torch.Tensor] = {}
        self.consts: dict[str, torch.Tensor] = {}
        self.plans: dict[str, tuple[tuple, object]] = {}  # step -> (layout key, plan)
        self.workspaces: dict[str, torch.Tensor] = {}
        self.conv_steps: set[str] = set()  # steps whose workspace is a convolution plan's
        self._conv_ws: torch.Tensor | None = None  # the largest of them (the shared one)
        # step -> {operand index: packed copy} for library plans made on packed operands
        self.packs: dict[str, dict[int, torch.Tensor]] = {}
        # custom step -> {operand index: packed copy} (CustomOp.packed_positions)
        self.custom_packs: dict[str, dict[int, torch.Tensor]] = {}
        # reshapes that copy -> (their buffer, the source's axis order it was copied in)
        self.view_copies: dict[str, tuple[torch.Tensor, tuple[int, ...] | None]] = {}
        self.gemm_read = _read_only_by_gemms(prog)
        self._scratch: torch.Tensor | None = None
        self._lt_workspace: torch.Tensor | None = None  # the half products' (see _gemm_plan)
        why = self._not_capturable()
        self.replay = replay and why is None
        if replay and why:
            log.info("saturn: CUDA-graph replay off for this graph: %s", why)
        self.calls = 0
        self.exec_ = None  # the instantiated graph
        self.captured_outs: list[torch.Tensor] = []
        self.captured_ptrs: tuple[int, ...] = ()  # input addresses the graph was captured with
        # what replay_fast compares each input with (None: every call goes the checked way)
        self._fast: list[tuple] | None = None
        self._exec_handle = 0  # exec_'s raw CUgraphExec, for the ctypes launch
        self.staged: dict[int, torch.Tensor] = {}  # inputs read from a buffer of their own
        self.captures = 0
        self.replays = 0
        self.fast_replays = 0  # replays that took replay_fast's one-pass check
        self._ok = _driver().CUresult.CUDA_SUCCESS
        # weak references to the storages of outputs handed out (see _lend, _reclaim)
        self.lent: list[int] = []
        # device copies outputs took: lent storages still held when a later call ran, and
        # outputs in memory a later call reuses (constants, staged inputs, kept copies)
        self.copied_out = 0
        self._captured_plan: tuple | None = None  # _out_plan of the captured outputs
        self.out_inputs = _outputs_viewing_inputs(prog)
        # re-entrant: a custom op's kernel may export an arena buffer (take_back_lent)
        self.lock = threading.RLock()
        _RUNNERS.add(self)

    def _materialize(self) -> None:
        """The arena with every kernel output's view at its planned offset, and constants."""
        prog = self.r.program
        with torch.saturn.device(self.device):
            self.arena = torch.empty(
                max(self.memory.size, 1), dtype=torch.uint8, device=self.device
            )
            self._own(self.arena)
            for v, slot in self.memory.slots.items():
                s = next(st for st in prog.steps if st.output == v)
                raw = self.arena[slot.offset : slot.offset + slot.nbytes]
                self.buffers[v] = raw.view(TORCH_DTYPES[s.dtype]).view(s.shape)
            if self.takes or self.fused_takes or self.scatters:  # set on an index out of range
                self.err_word = torch.zeros(1, dtype=torch.int32, device=self.device)
            self.consts = {
                s.output: const_tensor(s).to(self.device if s.place == "device" else "cpu")
                for s in prog.steps
                if s.kind == "const"
            }

    def _not_capturable(self) -> str | None:
        inputs = set(self.r._position)
        for s in self.r.program.steps:
            if s.kind == "host":
                return f"host step {s.op}"
            if s.kind == "crossing" and s.args[0] not in inputs:
                return f"a crossing ({s.op}) inside the graph"
            if s.kind == "crossing":
                return "inputs cross to the device on every call"
        return None

    # --- running steps -------------------------------------------------------------------

    def _steps(self, prepared: list[torch.Tensor], stats) -> dict:
        env: dict[str, object] = {}
        position = self.r._position
        for s in self.r.program.steps:
            if s.kind == "input":
                i = position[s.output]
                env[s.output] = self.staged.get(i, prepared[i])
            elif s.kind == "const":
                env[s.output] = self.consts[s.output]
            elif s.kind == "view":
                env[s.output] = self._view(s, env[s.args[0]])
            elif s.kind == "kernel":
                stats.launches += 1
                with step_range(s, self.r._labels):
                    self._kernel(s, env)
                env[s.output] = self.buffers[s.output]
            else:  # crossings and host steps (never captured: see _not_capturable)
                with step_range(s, self.r._labels):
                    env[s.output] = self.r._step(s, env, stats)
        return env

    def _view(self, s: Step, src: torch.Tensor) -> torch.Tensor:
        """A view step. A reshape that cannot view its source copies it: the first call
        keeps the buffer that copy made, and later calls copy into it again (a captured
        call must not allocate). A reshape only GEMMs read is copied in the order that
        keeps the source's fastest axis fastest where that makes the GEMM read a transposed
        matrix (``gemm_copy_order``): a row copy instead of a tiled transpose."""
        have = self.view_copies.get(s.output)
        if have is not None:
            (buf, out), order = have
            strided_copy(src if order is None else src.permute(order), buf)
            return out
        order = None
        if s.op == "View" and s.output in self.gemm_read and _on(src, self.device):
            order = gemm_copy_order(tuple(src.shape), src.stride(), tuple(s.attrs[0]))
        if order is not None:
            moved = src.permute(order)
            buf = torch.empty(moved.shape, dtype=src.dtype, device=self.device)
            strided_copy(moved, buf)
            inverse = sorted(range(len(order)), key=order.__getitem__)
            out = buf.permute(inverse).view(tuple(s.attrs[0]))
            self.view_copies[s.output] = ((buf, out), order)
            self._own(buf)
            return out
        out = run_host(s.op, [src], s.attrs, {})
        if (
            isinstance(src, torch.Tensor)
            and src.device == self.device
            and out.numel()
            and out.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()
        ):
            self.view_copies[s.output] = ((out.view(src.shape), out), None)
            self._own(out)
        return out

    def _workspace(self, nbytes: int, keep: bool = True):
        """Scratch device memory for tuning (one buffer, grown as needed; its address) or,
        with ``keep=False``, a buffer of a plan's own (the tensor)."""
        if not keep:
            return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=self.device)
        if self._scratch is None or self._scratch.numel() < nbytes:
            self._scratch = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=self.device)
        return self._scratch.data_ptr()

    def _kernel_workspace(self, step: str, nbytes: int) -> int:
        """A kernel's own scratch memory (a split reduction's partials): made at the first
        call, at the same address in every later one (replay captures it)."""
        ws = self.workspaces.get(step)
        if ws is None or ws.numel() < nbytes:
            ws = self.workspaces[step] = self._workspace(nbytes, keep=False)
        return ws.data_ptr()

    def _kernel(self, s: Step, env: dict) -> None:
        k = s.kernel
        ops = [env[o.value] for o in k.inputs]
        out = self.buffers[s.output]
        check_operands(s, ops)
        if k.kind in ("loop", "reduce", "rows"):
            ops = [
                t if o.indexing == "strided" or t.is_contiguous() else t.contiguous()
                for o, t in zip(k.inputs, ops, strict=True)
            ]
            self.kernels[s.output].launch(
                self.stream,
                out.data_ptr(),
                [t.data_ptr() for t in ops],
                [tuple(t.shape) for t in ops],
                [tuple(t.stride()) for t in ops],
                workspace=lambda n: self._kernel_workspace(s.output, n),
                err_ptr=self.err_word.data_ptr() if "take" in k.attrs else None,
            )
            return
        if k.kind == "gather":
            table, index = ops
            self.takes[s.output].launch(
                self.stream,
                (out.data_ptr(), table.data_ptr(), index.data_ptr(), self.err_word.data_ptr()),
                (tuple(table.shape), tuple(table.stride())),
                (tuple(index.shape), tuple(index.stride())),
            )
            return
        if k.kind == "scatter":
            base, index, values = ops
            strided_copy(base, out)  # the table first (on the stream): the adds land on it
            self.scatters[s.output].launch(
                self.stream,
                (out.data_ptr(), values.data_ptr(), index.data_ptr(), self.err_word.data_ptr()),
                base.shape[0],
                (tuple(values.shape), tuple(values.stride())),
                (tuple(index.shape), tuple(index.stride())),
            )
            return
        if k.kind == "concat":
            self.concats[s.output].launch(
                self.stream,
                (out.data_ptr(), *(p.data_ptr() for p in ops)),
                *((tuple(p.shape), tuple(p.stride())) for p in ops),
            )
            return
        if k.kind == "pad":
            (x,) = ops
            kernel, fill = self.pads[s.output]
            shape_strides = (tuple(x.shape), tuple(x.stride()))
            kernel.launch(
                self.stream, (out.data_ptr(), x.data_ptr()), shape_strides, k.attrs["pads"], fill
            )
            return
        if k.kind == "custom":
            op, build = self.custom[s.output]
            op.run_into(out, build(self._custom_operands(s.output, op, ops), k.attrs["eps_bits"]))
            return
        key = tuple(layout(t) for t in ops)
        have = self.plans.get(s.output)
        if have is None or have[0] != key:
            have = self.plans[s.output] = (key, self._library_plan(k, key, out, ops))
        packs = self.packs.get(s.output)
        if packs:  # operands the plan reads as packed copies
            for i, buf in packs.items():
                strided_copy(ops[i], buf)
            ops = [packs.get(i, t) for i, t in enumerate(ops)]
        ptrs = tuple(t.data_ptr() for t in ops)
        if k.kind == "gemm":
            have[1].run((*ptrs[:2], out.data_ptr(), *ptrs[2:]))
        else:
            have[1].run((*ptrs, out.data_ptr()), self.workspaces[s.output].data_ptr())

    def _custom_operands(self, step: str, op, ops: list[torch.Tensor]) -> list[torch.Tensor]:
        """A custom step's operands with those the op reads packed copied, where they are
        strided views, into buffers of the step's own: made at the first call (never
        captured), so a captured call copies without allocating."""
        want = op.packed_positions
        if not want:
            return ops
        bufs = self.custom_packs.setdefault(step, {})
        ops = list(ops)
        for i in want:
            t = ops[i]
            if t.is_contiguous():
                continue
            buf = bufs.get(i)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = bufs[i] = torch.empty(t.shape, dtype=t.dtype, device=t.device)
            strided_copy(t, buf)
            ops[i] = buf
        return ops

    def _library_plan(self, k, key: tuple, out: torch.Tensor, ops: list[torch.Tensor]):
        """The product's or convolution's plan for the operands' layouts; where the library
        takes no plan for them (a layout cuBLASLt or cuDNN declines: a row stride it does
        not take, a misaligned slice), the plan for packed copies of the operands that are
        not packed, made at every call before the plan runs (the copies' buffers are the
        step's own, at fixed addresses, so replay captures them). A library that declines
        packed operands too raises: the call then runs uncompiled (decision 0050)."""
        self.packs.pop(k.output, None)

        def plan(operands):
            ptrs = tuple(t.data_ptr() for t in operands)
            lays = tuple(layout(t) for t in operands)
            if k.kind == "gemm":
                return self._gemm_plan(k, lays, out, ptrs)
            return self._conv_plan(k, lays, (*ptrs, out.data_ptr()))

        try:
            return plan(ops)
        except (GemmError, ConvError) as e:
            packs = {
                i: torch.empty(t.shape, dtype=t.dtype, device=t.device)
                for i, t in enumerate(ops)
                if not t.is_contiguous()
            }
            if not packs:
                raise
            log.info(
                "saturn: %s %s: %s; planned on packed copies of operands %s",
                k.kind,
                k.output,
                str(e).splitlines()[0][:200],
                sorted(packs),
            )
        for i, buf in packs.items():
            strided_copy(ops[i], buf)
        made = plan([packs.get(i, t) for i, t in enumerate(ops)])
        self.packs[k.output] = packs
        return made

    def _gemm_plan(self, k, key: tuple, out: torch.Tensor, ptrs: tuple[int, ...]):
        """The product's plan, tuned on this call's operands. float16/bfloat16 products are
        cuBLASLt plans of their own (float32 accumulation, one rounding) sharing one
        workspace: they run one after another on the stream, and the workspace's fixed
        address is what replay captures."""
        bias = key[2] if len(key) == 3 else None
        args = (key[0], key[1], layout(out), k.attrs["epilogue"], bias)
        ptrs = (*ptrs[:2], out.data_ptr(), *ptrs[2:])
        if key[0].dtype in HALVES:
            if self._lt_workspace is None:
                self._lt_workspace = self._workspace(WORKSPACE_BYTES, keep=False)
            ws = (self._lt_workspace.data_ptr(), WORKSPACE_BYTES)
            return LtPlan(*args, ptrs, self.stream, ws)
        return GemmPlan(
            *args,
            ptrs,
            self.stream,
            self.precision,
            alloc=lambda n: self._workspace(n, keep=False),
            choose=self.choose_precision,
            gelu=self.gelu_epilogue,
        )

    def _conv_plan(self, k, key: tuple, ptrs: tuple[int, ...]):
        """The convolution's plan, tuned on this call's operands. With ``tf32x3`` the split
        plan is timed against the float32 one and kept only where faster (as for GEMMs)."""
        a = k.attrs
        x, w, bias = key[0], key[1], key[2] if a["bias"] else None
        out_lay = layout(self.buffers[k.output])
        params = ConvParams(
            tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]), a["groups"]
        )
        plan = ConvPlan(x, w, bias, out_lay, params, self.stream, self.precision == "tf32")
        plan.autotune(ptrs, self._workspace)
        self._scratch = None
        ws = self._conv_workspace(plan.workspace_size)
        if self.precision == "tf32x3" and x.dtype == "f32":
            try:
                split = SplitConvPlan(
                    x, w, bias, out_lay, params, self.stream, lambda n: self._workspace(n, False)
                )
            except ConvError as e:
                log.info("saturn: convolution %s stays float32: %s", k.output, e)
                split = None
            if split is not None:
                split.autotune(ptrs, self._workspace)
                self._scratch = None
                sws = self._conv_workspace(split.workspace_size)
                split.timings = {
                    "tf32x3": time_on_stream(lambda: split.run(ptrs, sws.data_ptr()), self.stream)
                }
                if self.choose_precision:
                    split.timings["fp32"] = time_on_stream(
                        lambda: plan.run(ptrs, ws.data_ptr()), self.stream
                    )
                if not self.choose_precision or split.timings["tf32x3"] < split.timings["fp32"]:
                    plan, ws = split, sws
                else:
                    plan.timings = split.timings
        # one buffer for every convolution, grown as plans need more (_share_conv_workspaces)
        if self._conv_ws is None or self._conv_ws.numel() < ws.numel():
            self._conv_ws = ws
        self.workspaces[k.output] = self._conv_ws
        self.conv_steps.add(k.output)
        return plan

    def _conv_workspace(self, nbytes: int) -> torch.Tensor:
        """The shared convolution workspace where it is large enough, else a new buffer."""
        if self._conv_ws is not None and self._conv_ws.numel() >= max(nbytes, 1):
            return self._conv_ws
        return self._workspace(nbytes, keep=False)

    def _share_conv_workspaces(self) -> None:
        """After the first call, which made every plan: every convolution step's workspace
        is the largest one. The steps run one after another on saturn's stream, so none
        reads scratch another wrote (the half products share one already); a buffer per
        step added up (ResNet-152 in float32 peaked at 8.5 GB on the H200, eager at 0.6 GB).
        During the first call the shared buffer grows as plans need more (steps planned
        before a growth keep the smaller one until now). This runs before replay captures,
        so the captured graph reads the shared buffer; a plan made later either fits it or
        takes the larger buffer it needs (the steps captured before keep theirs)."""
        for n in self.conv_steps:
            self.workspaces[n] = self._conv_ws
        self.conv_steps.clear()

    # --- a call ------------------------------------------------------------------------------

    def __call__(self, prepared: list[torch.Tensor], stats, given: list | None = None) -> list:
        """One call. ``given``: the caller's inputs (``prepared`` holds packed copies of
        those that were not packed): an output that is a view of an input is a view of
        the caller's tensor, as in eager, only where that input is the caller's own."""
        with self.lock:
            if self.arena is None:
                self._materialize()
            # outputs of earlier calls still held must keep their values: this call writes
            # the arena (an input that is such an output moves before its address is read)
            self._reclaim()
            self.calls += 1
            if not self.replay or self.calls == 1:
                env = self._steps(prepared, stats)
                outs = [env[v] for v in self.r.program.outputs]
                plan = self._out_plan(outs, env)
                if self.calls == 1:
                    self._share_conv_workspaces()
            else:
                outs, env = self._replayed(prepared, stats)
                stats.replayed = env is None
                plan = self._captured_plan if env is None else self._out_plan(outs, env)
            results = self._hand_out(outs, plan, prepared, given)
            # after the hand-out, which then overlaps the device's work; results of a call
            # that raises are dropped (lent storages nobody holds cost nothing)
            self._check_indices()
            return results

    def replay_fast(self, args: list) -> list | None:
        """A replayed call's outputs when every input is the packed device tensor the graph
        was captured with: its dtype, shape and address (what ``Recipe._input`` and
        ``_replayed`` check, in one pass, and the launch through ctypes). None: the call
        goes the checked way, which raises on a wrong input or captures again."""
        if self._fast is None:
            return None
        with self.lock:
            want = self._fast  # read again under the lock: another thread may recapture
            if want is None or len(args) != len(want):
                return None
            # outputs of earlier calls still held move first (an input may be one)
            self._reclaim()
            dev = self.device
            for t, (ptr, dtype, shape) in zip(args, want, strict=True):
                if not (
                    isinstance(t, torch.Tensor)
                    and t.data_ptr() == ptr
                    and t.dtype is dtype
                    and t.shape == shape
                    and t.device == dev
                    and t.is_contiguous()
                ):
                    return None
            self.calls += 1
            err = self._launch_graph(_graph_launch(), self._exec_handle)
            if err != 0:
                self._check((err,), "cuGraphLaunch")
            self.replays += 1
            self.fast_replays += 1
            results = self._hand_out(self.captured_outs, self._captured_plan, args, args)
            self._check_indices()
            return results

    def _check_indices(self) -> None:
        """Raise if a row take met an index out of range in this call (its kernel wrote
        zeros there and read nothing): the error word is copied to the host after the
        call's work, which waits for it (4 bytes; programs whose takes all read constant
        indices in range skip this, and so stay asynchronous)."""
        if not self._unbounded_indices:
            return
        drv = _driver()
        word = self.err_word.data_ptr()
        self._check(
            drv.cuMemcpyDtoHAsync(self._err_host.ctypes.data, word, 4, self.stream),
            "cuMemcpyDtoHAsync",
        )
        self._check(drv.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        if self._err_host[0]:
            self._err_host[0] = 0
            self._check(drv.cuMemsetD32Async(word, 0, 1, self.stream), "cuMemsetD32Async")
            where = []
            if self.takes or self.fused_takes:
                where.append(
                    "a row take (embedding, index_select or indexing along the first "
                    "axis: every index in [0, rows); gather: in [0, size) along its dim)"
                )
            if self.scatters:
                where.append(
                    "a row add (index_put with accumulate: every index in [-rows, rows); "
                    "scatter and scatter_add: in [0, size) along their dim)"
                )
            raise IndexError(f"saturn: index out of range in {' or '.join(where)}")

    # --- outputs: lent out of the arena, copied out only when still held -----------------

    def _groups(self, outs: list) -> list[tuple[int, int, list[tuple]]]:
        """Outputs in the runner's memory as (address, bytes, members): one storage per
        group of outputs whose bytes overlap (views of one value share it, as in eager), each
        member (position, dtype, element offset, shape, strides). Other outputs are in no
        group."""
        spans = []
        for i, t in enumerate(outs):
            if isinstance(t, torch.Tensor) and t.numel() and self._in_owned(t):
                spans.append((*byte_span(t), i, t))
        spans.sort(key=lambda sp: sp[0])
        groups: list[list] = []
        for start, end, i, t in spans:
            if groups and start < groups[-1][1]:
                groups[-1][1] = max(groups[-1][1], end)
                groups[-1][2].append((start, i, t))
            else:
                groups.append([start, end, [(start, i, t)]])
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
        return self._groups(outs), views

    def _hand_out(self, outs: list, plan: tuple, prepared: list, given: list | None) -> list:
        """The call's results: outputs in the runner's memory as tensors over storages of
        their own that point into it (weakly tracked, see _reclaim); views of the caller's
        inputs as views of them; anything else on the device (a constant, a staged input, a
        packed copy of an input: memory a later call reuses) as a copy."""
        groups, views = plan
        results = list(outs)
        lent = set()
        for k, (i, shape, stride, rel) in views.items():
            if given is not None and prepared[i] is given[i]:
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
            if i not in lent and isinstance(t, torch.Tensor) and t.device == self.device:
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

    def __del__(self) -> None:
        # held outputs must not point into memory about to be freed
        try:
            if self.arena is not None:
                self._reclaim()
        except Exception:  # interpreter shutdown: the device may be gone already
            pass

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

    def _replayed(self, prepared: list[torch.Tensor], stats) -> tuple[list, dict | None]:
        """The replayed call's outputs (the captured ones) and None, or, where the call
        could not be captured, the outputs of a step-by-step run and its values."""
        drv = _driver()
        # size inputs (symbolic graphs) are fixed for this recipe: only tensors can move
        ptrs = tuple(t.data_ptr() if isinstance(t, torch.Tensor) else None for t in prepared)
        if self.exec_ is not None and self.captured_ptrs != ptrs:
            moved = [
                i
                for i, (a, b) in enumerate(zip(self.captured_ptrs, ptrs, strict=True))
                if a != b and i not in self.staged
            ]
            if moved:
                for i in moved:
                    self.staged[i] = torch.empty_like(prepared[i])
                self._release()  # capture again, reading the staged copies
        for i, buf in self.staged.items():
            buf.copy_(prepared[i])
        if self.exec_ is None:
            if not self._capture(prepared, stats):
                self.replay = False
                env = self._steps(prepared, stats)
                return [env[v] for v in self.r.program.outputs], env
            self.captured_ptrs = ptrs
            self._fast = self._fast_check(ptrs)
        (err,) = self._launch_graph(drv.cuGraphLaunch, self.exec_)
        if err != self._ok:
            self._check((err,), "cuGraphLaunch")
        self.replays += 1
        stats.launches += 1
        return self.captured_outs, None

    def _launch_graph(self, launch, graph):
        """``launch(graph, stream)``, inside one profiler range while a profiler records."""
        if not recording():
            return launch(graph, self.stream)
        with torch.profiler.record_function(
            f"saturn replay of {len(self.r.program.kernels)} kernels"
        ):
            return launch(graph, self.stream)

    def _fast_check(self, ptrs: tuple) -> list[tuple] | None:
        """(address, dtype, shape) of each input for ``replay_fast``: only where every input
        is a tensor read in place on the device (no size inputs, none staged, outputs
        handed out on the device)."""
        if not self.r.io_on_device or self.staged or any(p is None for p in ptrs):
            return None
        if any(spec.dtype is None for spec in self.r.inputs):
            return None
        self._exec_handle = _handle_of(self.exec_)
        return [
            (p, spec.dtype, torch.Size(spec.shape))
            for p, spec in zip(ptrs, self.r.inputs, strict=True)
        ]

    def _release(self) -> None:
        drv = _driver()
        if self.exec_ is not None:
            drv.cuGraphExecDestroy(self.exec_)
        self.exec_, self.captured_outs, self.captured_ptrs = None, [], ()
        self._captured_plan = None
        self._fast = None

    def _capture(self, prepared, stats) -> bool:
        """Capture one call's device work as a graph; False when it is not safe to replay."""
        drv = _driver()

        before = torch.saturn.memory_stats(self.device)
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._check(drv.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture")
        try:
            env = self._steps(prepared, stats)
        except Exception as e:
            # a step that waits for the device while capturing (a host function's fallback
            # reading a value back) invalidates the capture; the call runs step by step
            err, graph = drv.cuStreamEndCapture(self.stream)
            if graph is not None and err == self._ok:
                drv.cuGraphDestroy(graph)
            log.warning(
                "saturn: CUDA-graph replay off for this graph: a step failed captured: %s", e
            )
            return False
        err, graph = drv.cuStreamEndCapture(self.stream)
        self._check((err,), "cuStreamEndCapture")
        after = torch.saturn.memory_stats(self.device)
        allocated = (after["hits"] + after["misses"]) - (before["hits"] + before["misses"])
        if allocated:
            log.warning(
                "saturn: CUDA-graph replay off for this graph: %d allocation(s) during capture",
                allocated,
            )
            drv.cuGraphDestroy(graph)
            return False
        err, exec_ = drv.cuGraphInstantiate(graph, 0)
        self._check((err,), "cuGraphInstantiate")
        drv.cuGraphDestroy(graph)
        self.captures += 1
        self.exec_ = exec_
        self.captured_outs = [env[v] for v in self.r.program.outputs]
        self._captured_plan = self._out_plan(self.captured_outs, env)
        return True

    @staticmethod
    def _check(res, what: str) -> None:
        drv = _driver()
        err = res[0] if isinstance(res, tuple) else res
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"saturn: {what} failed: {err}")


_RUNNERS: weakref.WeakSet[GpuRunner] = weakref.WeakSet()


@functools.cache
def _graph_launch():
    """libcuda's cuGraphLaunch through ctypes: a replayed call's one launch, at a fraction
    of the binding's per-call cost (measured on the H200: ~2.8 us through cuda-python)."""
    fn = ctypes.CDLL("libcuda.so.1").cuGraphLaunch
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def _handle_of(obj) -> int:
    """The raw handle a cuda-python driver object wraps."""
    from cuda.bindings.utils import get_cuda_native_handle

    return int(get_cuda_native_handle(obj))


def take_back_lent(t: torch.Tensor) -> None:
    """Give ``t``'s storage memory of its own now if a compiled call lent it out of its
    arena: a raw address handed to another library must stay valid after later calls."""
    storage = t.untyped_storage()
    for runner in list(_RUNNERS):
        if runner.lends(storage):
            with runner.lock:
                runner._take_back(storage)
            return


def _outputs_viewing_inputs(prog) -> dict[int, str]:
    """Output position -> the input value it is (or views through view steps)."""
    steps = {s.output: s for s in prog.steps}
    found = {}
    for k, v in enumerate(prog.outputs):
        s = steps[v]
        while s.kind == "view":
            s = steps[s.args[0]]
        if s.kind == "input":
            found[k] = s.output
    return found


def _read_only_by_gemms(prog) -> set[str]:
    """View steps whose every reader is a GEMM (which takes any operand layout it can read
    as a matrix, so the view's buffer may be laid out for the copy's sake)."""
    readers: dict[str, list[Step]] = {}
    for s in prog.steps:
        args = [o.value for o in s.kernel.inputs] if s.kind == "kernel" else list(s.args)
        for a in args:
            readers.setdefault(a, []).append(s)
    outputs = set(prog.outputs)
    return {
        s.output
        for s in prog.steps
        if s.kind == "view"
        and s.output not in outputs
        and readers.get(s.output)
        and all(r.kind == "kernel" and r.kernel.kind == "gemm" for r in readers[s.output])
    }


def _on(t, device) -> bool:
    return isinstance(t, torch.Tensor) and t.device == device
