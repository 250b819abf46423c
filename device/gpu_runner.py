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

import logging
import threading
import weakref

import torch

from saturn.codegen import cuda as cg
from saturn.codegen.launchers import Launcher, emitted_kinds, launcher
from saturn.codegen.reshape import gemm_copy_order
from saturn.eqsat.kinds import Kind, KindTable, facts, spec
from saturn.eqsat.memory import plan_memory
from saturn.eqsat.program import Step, StepKind
from saturn.eqsat.ranges import indices_in_range

from .dtypes import TORCH_DTYPES
from .eager_kernels import cuda_driver as _driver
from .eager_kernels import strided_copy
from .host_ops import run_host
from .profiling import step_range
from .runner_lending import Lending
from .runner_plans import LibraryPlans, layout
from .runner_replay import Replay, WordCheck
from .runner_writes import WriteBack
from .steps import check_operands, const_tensor

log = logging.getLogger("saturn")


class GpuRunner(LibraryPlans, Lending, Replay):
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
        self.fused_takes = 0  # rows kernels that read a take's rows themselves
        # step -> the launcher of a kind codegen launches itself (codegen/launchers.py)
        self.launchers: dict[str, Launcher] = {}
        # rows step -> the values of its statistics in order (kinds/row_stat.py), whose
        # buffers it writes beside its output
        self.stats: dict[str, list[str]] = {}
        self.indexing: set[str] = set()  # kinds of those that set the error word
        # row takes and row adds raise a device word on an index out of range, read after
        # every call
        self.err_word: torch.Tensor | None = None
        self._unbounded_indices = False  # a take or add whose index the compiler cannot bound
        # the last step that may set the word: the call copies the word to pinned host
        # memory and records an event right after it, and waits for that event alone
        self._word_step: str | None = None
        self._word: WordCheck | None = None
        with torch.saturn.device(self.device):
            self.kernels: dict[str, cg.CudaKernel] = {}
            for s in prog.steps:
                if s.kind == StepKind.KERNEL:
                    BUILD[s.kernel.kind](self, s, cc)
            self._in_place_writes(prog, cc)
            # every kernel the first call will launch, built in parallel now (or found on
            # disk) rather than one after another as the call reaches it
            gens = [g for k in self.kernels.values() for g in k.expected()]
            gens += [g for k in self.launchers.values() for g in k.expected()]
            gens += self.write_back.expected()
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
            if self.fused_takes or self.indexing:  # set on an index out of range
                self.err_word = torch.zeros(1, dtype=torch.int32, device=self.device)
            if self._unbounded_indices:
                self._word = WordCheck(self.stream)
            self.consts = {
                s.output: const_tensor(s).to(self.device if s.place == "device" else "cpu")
                for s in prog.steps
                if s.kind == StepKind.CONST
            }

    def _in_place_writes(self, prog, cc) -> None:
        """The input writes (``Recipe.writes``) a call makes itself, as its last work (in
        the replayed graph): those of a kernel's value into a device input. Not where a
        take's index is checked after the call (``_check_indices``): a call that raises
        there must have written nothing, so the recipe writes after the check."""
        kernels = {s.output for s in prog.steps if s.kind == StepKind.KERNEL}
        spec = self.r.output_spec
        # program outputs only the writes read (never handed out)
        self.write_only = {spec[pos] for _, pos in self.r.writes}
        self.in_place: list[tuple[int, str]] = []
        if self.r.io_on_device and not self._unbounded_indices:
            for i, pos in self.r.writes:
                v = prog.outputs[spec[pos]]
                if v in kernels:
                    self.in_place.append((i, v))
        self.wrote = {i for i, _ in self.in_place}
        by_output = {s.output: s for s in prog.steps}
        writes = [(i, v, by_output[v].dtype, by_output[v].shape) for i, v in self.in_place]
        self.write_back = WriteBack(writes, cc)  # small ones a few to a launch

    def _not_capturable(self) -> str | None:
        inputs = set(self.r._position)
        for s in self.r.program.steps:
            if s.kind == StepKind.HOST:
                return f"host step {s.op}"
            if s.kind == StepKind.CROSSING and s.args[0] not in inputs:
                return f"a crossing ({s.op}) inside the graph"
            if s.kind == StepKind.CROSSING:
                return "inputs cross to the device on every call"
        return None

    # --- running steps -------------------------------------------------------------------

    def _steps(self, prepared: list[torch.Tensor], stats) -> dict:
        env: dict[str, object] = {}
        position = self.r._position
        # the kinds looked up once a call, not once a step (an enum attribute costs more)
        input_, const, view, kernel = StepKind.INPUT, StepKind.CONST, StepKind.VIEW, StepKind.KERNEL
        for s in self.r.program.steps:
            if s.kind == input_:
                i = position[s.output]
                env[s.output] = self.staged.get(i, prepared[i])
            elif s.kind == const:
                env[s.output] = self.consts[s.output]
            elif s.kind == view:
                env[s.output] = self._view(s, env[s.args[0]])
            elif s.kind == kernel:
                stats.launches += 1
                with step_range(s, self.r._labels):
                    self._kernel(s, env)
                env[s.output] = self.buffers[s.output]
                if s.output == self._word_step:
                    self._word.post(self.err_word.data_ptr())
            else:  # crossings and host steps (never captured: see _not_capturable)
                with step_range(s, self.r._labels):
                    env[s.output] = self.r._step(s, env, stats)
        self.write_back.run(env, prepared, self.stream)  # last: a failed call wrote nothing
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

    def _kernel(self, s: Step, env: dict) -> None:
        ops = [env[o.value] for o in s.kernel.inputs]
        check_operands(s, ops)
        LAUNCH[s.kernel.kind](self, s, self.buffers[s.output], ops)

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

    def _check_indices(self) -> None:
        """Raise if a row take met an index out of range in this call (its kernel wrote
        zeros there and read nothing). The word was copied to the host right after the
        last step that may set it (``_word_step``): the host waits for that copy alone,
        while the rest of the call's work goes on (a language model's embedding is its
        forward's first kernel). Programs whose takes all read indices the compiler bounds
        skip this, and stay asynchronous."""
        if not self._unbounded_indices:
            return
        if self._word.wait():
            self._check(
                _driver().cuMemsetD32Async(self.err_word.data_ptr(), 0, 1, self.stream),
                "cuMemsetD32Async",
            )
            kinds = self.indexing | ({Kind.GATHER} if self.fused_takes else set())
            where = [spec(k).index_error for k in Kind if k in kinds]  # in the kinds' order
            raise IndexError(f"saturn: index out of range in {' or '.join(where)}")

    def _note_indices(self, s: Step) -> None:
        """Keep the check for ``s``'s indices where the compiler cannot bound them."""
        if not indices_in_range(self.r.program, s):
            self._unbounded_indices = True
            self._word_step = s.output  # steps are built in program order: the last one

    # what a launcher of codegen's may ask of its caller (codegen.launchers.LaunchContext)

    @property
    def err_ptr(self) -> int:
        return self.err_word.data_ptr()

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        strided_copy(src, dst)

    # --- outputs: lent out of the arena, copied out only when still held -----------------

    def __del__(self) -> None:
        # held outputs must not point into memory about to be freed
        try:
            if self.arena is not None:
                self._reclaim()
        except Exception:  # interpreter shutdown: the device may be gone already
            pass


_RUNNERS: weakref.WeakSet[GpuRunner] = weakref.WeakSet()


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
        while s.kind == StepKind.VIEW:
            s = steps[s.args[0]]
        if s.kind == StepKind.INPUT:
            found[k] = s.output
    return found


def _read_only_by_gemms(prog) -> set[str]:
    """View steps whose every reader is a GEMM (which takes any operand layout it can read
    as a matrix, so the view's buffer may be laid out for the copy's sake)."""
    readers: dict[str, list[Step]] = {}
    for s in prog.steps:
        args = [o.value for o in s.kernel.inputs] if s.kind == StepKind.KERNEL else list(s.args)
        for a in args:
            readers.setdefault(a, []).append(s)
    outputs = set(prog.outputs)
    return {
        s.output
        for s in prog.steps
        if s.kind == StepKind.VIEW
        and s.output not in outputs
        and readers.get(s.output)
        and all(r.kind == StepKind.KERNEL and r.kernel.kind == Kind.GEMM for r in readers[s.output])
    }


def _on(t, device) -> bool:
    return isinstance(t, torch.Tensor) and t.device == device


# --- each kernel kind: what the runner builds before the first call, how it launches ---------

BUILD: KindTable = KindTable("the GPU runner")
LAUNCH: KindTable = KindTable("the GPU runner")


@BUILD.on(Kind.LOOP, Kind.REDUCE, Kind.ROWS)
def _build_body(r: GpuRunner, s: Step, cc) -> None:
    r.kernels[s.output] = cg.CudaKernel(s.kernel, cc)
    if "take" in s.kernel.attrs:  # a row take read inside (fuse_row_takes)
        r.fused_takes += 1
        r._note_indices(s)


@LAUNCH.on(Kind.LOOP, Kind.REDUCE, Kind.ROWS)
def _launch_body(r: GpuRunner, s: Step, out: torch.Tensor, ops: list[torch.Tensor]) -> None:
    k = s.kernel
    ops = [
        t if o.indexing == "strided" or t.is_contiguous() else t.contiguous()
        for o, t in zip(k.inputs, ops, strict=True)
    ]
    r.kernels[s.output].launch(
        r.stream,
        out.data_ptr(),
        [t.data_ptr() for t in ops],
        [tuple(t.shape) for t in ops],
        [tuple(t.stride()) for t in ops],
        workspace=lambda n: r._kernel_workspace(s.output, n),
        err_ptr=r.err_word.data_ptr() if "take" in k.attrs else None,
        stat_ptrs=tuple(r.buffers[v].data_ptr() for v in r.stats.get(s.output, ())),
    )


@BUILD.on(Kind.ROW_STAT)
def _build_row_stat(r: GpuRunner, s: Step, cc) -> None:
    written = r.stats.setdefault(s.kernel.inputs[0].value, [])
    if s.kernel.attrs["stat"] != len(written):  # fuse_rows puts them after it in order
        raise ValueError(f"row statistic {s.output} is out of its rows kernel's order")
    written.append(s.output)


@LAUNCH.on(Kind.ROW_STAT)
def _launch_row_stat(r: GpuRunner, s: Step, out: torch.Tensor, ops: list[torch.Tensor]) -> None:
    pass  # its rows kernel, the step before, wrote it (passed ``r.stats``)


@BUILD.on(Kind.CUSTOM)
def _build_custom(r: GpuRunner, s: Step, cc) -> None:
    try:
        r.custom[s.output] = r.r.custom_op(s.kernel.attrs["name"])
    except RuntimeError as e:  # e.g. the built-in "rmsnorm" pattern's kernel
        raise NotImplementedError(str(e)) from None


@LAUNCH.on(Kind.CUSTOM)
def _launch_custom(r: GpuRunner, s: Step, out: torch.Tensor, ops: list[torch.Tensor]) -> None:
    op, build = r.custom[s.output]
    op.run_into(out, build(r._custom_operands(s.output, op, ops), s.kernel.attrs["eps_bits"]))


@BUILD.on(*emitted_kinds())
def _build_emitted(r: GpuRunner, s: Step, cc) -> None:
    r.launchers[s.output] = launcher(s.kernel, cc)
    if facts(s.kernel.kind).indices:
        r.indexing.add(s.kernel.kind)
        r._note_indices(s)


@LAUNCH.on(*emitted_kinds())
def _launch_emitted(r: GpuRunner, s: Step, out: torch.Tensor, ops: list[torch.Tensor]) -> None:
    r.launchers[s.output].launch(r.stream, out, ops, r)


@BUILD.on(Kind.GEMM, Kind.CONV, Kind.CONV_GRAD)
def _build_library(r: GpuRunner, s: Step, cc) -> None:
    """Nothing before the first call: a plan depends on its operands' layouts."""


@LAUNCH.on(Kind.GEMM, Kind.CONV, Kind.CONV_GRAD)
def _launch_library(r: GpuRunner, s: Step, out: torch.Tensor, ops: list[torch.Tensor]) -> None:
    k = s.kernel
    key = tuple(layout(t) for t in ops)
    have = r.plans.get(s.output)
    if have is None or have[0] != key:
        have = r.plans[s.output] = (key, r._library_plan(k, key, out, ops))
    packs = r.packs.get(s.output)
    if packs:  # operands the plan reads as packed copies
        for i, buf in packs.items():
            strided_copy(ops[i], buf)
        ops = [packs.get(i, t) for i, t in enumerate(ops)]
    ptrs = tuple(t.data_ptr() for t in ops)
    if k.kind == Kind.GEMM:  # cuBLASLt's operands: a, b, out, then the epilogue's
        have[1].run((*ptrs[:2], out.data_ptr(), *ptrs[2:]))
    else:  # cuDNN's: its operands, out, and the shared workspace
        have[1].run((*ptrs, out.data_ptr()), r.workspaces[s.output].data_ptr())
