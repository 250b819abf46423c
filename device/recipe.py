"""Recipes and the executor.

A recipe holds everything decided once: the program (steps by value name), the compiled
kernels by step name, the opaque host calls, the input specs and the output spec. It holds
no pointer into an FX graph or an e-graph. The executor does only per-call work: move or
pack boundary inputs, launch kernels, run
host steps, and rebuild the outputs by the spec, checking their number and giving an
output memory of its own where eager's would not share it (saturn.eqsat.ownership).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from saturn.codegen import cpu
from saturn.eqsat import evaluate as ev
from saturn.eqsat.kinds import Kind, KindTable, is_body, spec
from saturn.eqsat.ownership import OutputOwnership
from saturn.eqsat.program import Program, Step, StepKind

from .dtypes import DTYPES, TORCH_DTYPES, HostCall
from .eager_kernels import byte_span
from .host_ops import run_host
from .input_windows import Window
from .profiling import step_range
from .steps import check_operands, const_tensor


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """A numpy array over the memory of a CPU or saturn:0 tensor (no copy)."""
    dtype = ev.np_dtype(DTYPES[t.dtype])
    if t.numel() == 0:
        return np.empty(tuple(t.shape), dtype=dtype)
    size = t.element_size()
    lo, hi = byte_span(t)
    base = np.frombuffer((ctypes.c_char * (hi - lo)).from_address(lo), dtype=dtype)
    return np.lib.stride_tricks.as_strided(
        base, tuple(t.shape), tuple(st * size for st in t.stride())
    )


def torch_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the memory of a CPU or saturn:0 tensor (no copy); bfloat16, which
    numpy lacks, through its 16-bit words."""
    if t.dtype == torch.bfloat16:
        return torch.from_numpy(numpy_view(t.view(torch.int16))).view(torch.bfloat16)
    return torch.from_numpy(numpy_view(t))


class CompiledCallError(Exception):
    """A compiled call failed (an index out of range, a library plan, a host op): the
    backend reruns the user's graph uncompiled (docs/decisions/0050)."""

    def __init__(self, error: Exception):
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


class InputMismatchError(RuntimeError):
    """A call's input is not what the recipe was compiled for (dynamo's guards keep these
    from reaching a recipe; a direct caller gets this error, never a rerun)."""


@dataclass
class InputSpec:
    dtype: torch.dtype | None  # None: a size input
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None  # eager's (outputs); None where not known
    # an input read as a window of a packed region (decision 0130), or None
    window: Window | None = None


@dataclass
class CallStats:
    crossings: int = 0
    launches: int = 0
    host_ops: int = 0
    outputs_copied: int = 0  # outputs given memory of their own (see _own_outputs)
    writes_copied: int = 0  # input writes made by an eager copy after the call (_write)
    replayed: bool = False  # a CUDA-graph replay (outputs checked when captured)


@dataclass
class Recipe:
    program: Program
    device: torch.device
    io_on_device: bool
    inputs: list[InputSpec]
    output_spec: list  # index into program.outputs, None, or ("size", value)
    output_types: list[InputSpec | None]  # what the graph returns, position by position
    host_calls: dict[str, HostCall]
    input_names: list[str] = field(default_factory=list)  # graph input per placeholder
    # how a Custom kernel's op is found: (name, host_calls) -> (op, argument builder); the
    # custom-op registry (``custom_ops.resolve``), handed in so this module sits below it
    resolve_custom: Callable | None = None
    kernels: dict[str, Callable] = field(default_factory=dict)  # step output -> compiled
    stream: int = 0  # the device's stream (GPU targets)
    replay: bool = True  # CUDA-graph replay on GPU targets (see gpu_runner)
    precision: str = "fp32"  # float32 GEMMs and convolutions: fp32, tf32 or tf32x3
    # program outputs that must not be handed out as they are (saturn.eqsat.ownership)
    ownership: OutputOwnership = field(default_factory=OutputOwnership)
    runner: object = None  # GpuRunner on GPU targets
    # a call that fails raises CompiledCallError, which the backend answers by running
    # the user's graph uncompiled (forward graphs; a backward's error propagates as it is)
    rerun: bool = False
    # (input position, return position): after a call, the value returned there is
    # written into the caller's input (an optimizer's update); those returns are not
    # handed back (decision 0127)
    writes: tuple[tuple[int, int], ...] = ()
    failed_calls: int = 0
    last: CallStats = field(default_factory=CallStats)
    # graph return positions to copy at every call, and those whose strides are checked
    _copy_at: tuple[int, ...] = field(default=(), repr=False)
    _layout_at: tuple[int, ...] = field(default=(), repr=False)
    # positions eager returns packed in memory of their own (the rest of them)
    _dense_at: tuple[int, ...] = field(default=(), repr=False)
    _position: dict[str, int] = field(default_factory=dict, repr=False)
    # per step of the host loop: the values no later step nor the outputs read
    _dead_after: tuple[tuple[str, ...], ...] = field(default=(), repr=False)
    _consts: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # --- compile time ---------------------------------------------------------------

    @property
    def on_gpu(self) -> bool:
        return self.device.index is not None and self.device.index >= 1

    def custom_op(self, name: str) -> tuple:
        """The op a Custom kernel named ``name`` runs and its argument builder."""
        if self.resolve_custom is None:
            raise NotImplementedError(f"custom kernel {name}: the recipe has no custom-op registry")
        return self.resolve_custom(name, self.host_calls)

    def prepare(self) -> None:
        """Work out once what every call needs: where each input value comes from, the
        constants, and every kernel compiled (or loaded from the cache)."""
        by_value = {v: k for k, v in self.program.inputs.items()}
        order = {name: i for i, name in enumerate(self.input_names)}
        self._position = {
            s.output: order[by_value[s.output]]
            for s in self.program.steps
            if s.kind == StepKind.INPUT
        }
        self._consts = {}  # made at the first call: compilation runs under fake tensors
        self._labels: dict[str, str] = {}  # profiler range names by step (profiling.py)
        self._returns = len(self.output_spec) - len(self.writes)
        at = {k: pos for pos, k in enumerate(self.output_spec) if isinstance(k, int)}
        own = self.ownership
        keep = lambda ks: [k for k in ks if at[k] < self._returns]  # noqa: E731
        # a GPU runner hands constants out as copies already; the host executor lends them
        copy = [*own.copy, *(() if self.on_gpu else own.constants)]
        self._copy_at = tuple(at[k] for k in keep(copy))
        self._layout_at = tuple(at[k] for k in keep(own.layout))
        checked = {*self._copy_at, *self._layout_at}
        self._dense_at = tuple(
            at[k]
            for k in keep(own.owned)
            if at[k] not in checked and _packed_spec(self.output_types[at[k]])
        )
        if self.on_gpu:
            from .gpu_runner import GpuRunner

            self.runner = GpuRunner(self, replay=self.replay, precision=self.precision)
            self.stream = self.runner.stream
            return
        for s in self.program.steps:
            if s.kind == StepKind.KERNEL and is_body(s.kernel.kind):
                self.kernels[s.output] = cpu.load(s.kernel)
        self._dead_after = dead_after(self.program)

    # --- per call -----------------------------------------------------------------------

    def __call__(self, args: list) -> list:
        if len(args) != len(self.inputs):
            raise RuntimeError(f"saturn recipe takes {len(self.inputs)} inputs, got {len(args)}")
        try:
            return self._run(args)
        except InputMismatchError:
            raise
        except Exception as e:  # an index out of range, a library plan, a host op
            if self.rerun:
                self.failed_calls += 1
                raise CompiledCallError(e) from e
            raise

    def _run(self, args: list) -> list:
        if self.runner is not None:
            outs = self.runner.replay_fast(args)
            if outs is not None:
                return self._finish(outs, args, args, CallStats(launches=1, replayed=True))
        stats = CallStats()
        env: dict[str, object] = {}
        prepared = [self._input(i, t, stats) for i, t in enumerate(args)]
        if self.runner is not None:
            outs = self.runner(prepared, stats, args)
            return self._finish(outs, args, prepared, stats)
        position = self._position  # program value of an input -> its position
        input_, const = StepKind.INPUT, StepKind.CONST  # looked up once a call, not a step
        dead = self._dead_after
        if len(dead) != len(self.program.steps):  # a recipe run without prepare()
            dead = self._dead_after = dead_after(self.program)
        for i, s in enumerate(self.program.steps):
            if s.kind == input_:
                env[s.output] = prepared[position[s.output]]
            elif s.kind == const:
                c = self._consts.get(s.output)
                if c is None:  # made once, where the program reads it
                    c = const_tensor(s)
                    c = self._consts[s.output] = c.to(self.device) if s.place == "device" else c
                env[s.output] = c
            else:
                with step_range(s, self._labels):
                    env[s.output] = self._step(s, env, stats)
            for v in dead[i]:  # memory a call holds: what is live, not all it made
                del env[v]
        outs = [env[v] for v in self.program.outputs]
        return self._finish(outs, args, prepared, stats)

    def _finish(self, outs: list, args: list, prepared: list, stats: CallStats) -> list:
        """The graph's return tuple from the program's outputs, by the output spec."""
        if stats.replayed and self.io_on_device:  # lent, laid out as the checked first call
            self.last = stats
            results = [
                outs[idx] if isinstance(idx, int) else None if idx is None else idx[1]
                for idx in self.output_spec
            ]
            return self._own_outputs(self._write(results, args, prepared, stats), stats)
        results = []
        for idx in self.output_spec:
            if idx is None or isinstance(idx, tuple):  # None, or ("size", value)
                results.append(None if idx is None else idx[1])
                continue
            t = outs[idx]
            want = self.device if self.io_on_device else torch.device("cpu")
            if t.device != want:
                t = t.to(want)
                stats.crossings += 1
            if any(t is a for a in args) or any(t is p for p in prepared):
                t = t.clone()  # never hand back an input as an output
            results.append(t)
        self._check_outputs(results)
        self.last = stats
        return self._own_outputs(self._write(results, args, prepared, stats), stats)

    def _write(self, results: list, args: list, prepared: list, stats: CallStats) -> list:
        """Write each written value into the caller's input, and the graph's own returns.
        The GPU runner wrote those it could into the input it read (``prepared``), inside
        the call's work; the rest are copied here, after it."""
        if not self.writes:
            return results
        done = self.runner.wrote if self.runner is not None else ()
        for i, pos in self.writes:
            dst, src = args[i], results[pos]
            if i in done and prepared[i] is dst:
                continue
            if src.untyped_storage()._cdata == dst.untyped_storage()._cdata:
                if src.data_ptr() == dst.data_ptr() and src.stride() == dst.stride():
                    continue  # the input itself: nothing changed
                src = src.clone()  # a view of the input: read before it is overwritten
            dst.copy_(src)
            stats.writes_copied += 1
        return results[: self._returns]

    def _own_outputs(self, results: list, stats: CallStats) -> list:
        """Outputs that would share memory with an input, a constant or another output
        where eager's do not get memory of their own, laid out as eager's; outputs that
        view memory of their own get eager's strides where theirs differ."""
        for pos in self._copy_at:
            results[pos] = self._fresh(results[pos], pos, stats)
        for pos in self._layout_at:
            t, want = results[pos], self.output_types[pos].strides
            if not _same_layout(t, want):
                results[pos] = self._fresh(t, pos, stats)
        # eager's is packed: so is ours (a caller's .view() works as in eager), whatever
        # layout the program wrote it in
        for pos in self._dense_at:
            if not results[pos].is_contiguous():
                results[pos] = self._fresh(results[pos], pos, stats)
        return results

    def _fresh(self, t: torch.Tensor, pos: int, stats: CallStats) -> torch.Tensor:
        stats.outputs_copied += 1
        strides = self.output_types[pos].strides
        if strides is None:
            return t.clone(memory_format=torch.contiguous_format)
        out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
        return out.copy_(t)

    def _check_outputs(self, results: list) -> None:
        """Each position holds what the graph returns there (a gradient, or None for an
        input that takes none): a swapped or dropped position raises."""
        if len(results) != len(self.output_types):
            raise RuntimeError(
                f"saturn recipe built {len(results)} outputs; the graph "
                f"returns {len(self.output_types)}"
            )
        for i, (t, want) in enumerate(zip(results, self.output_types, strict=True)):
            if want is not None and want.dtype is None:  # a size
                if not isinstance(t, int):
                    raise RuntimeError(f"saturn recipe output {i}: expected a size, got {t!r}")
                continue
            if want is None or t is None:
                if (want is None) != (t is None):
                    raise RuntimeError(
                        f"saturn recipe output {i}: expected "
                        f"{'None' if want is None else 'a tensor'}, got "
                        f"{'None' if t is None else 'a tensor'}"
                    )
                continue
            if t.dtype != want.dtype or tuple(t.shape) != tuple(want.shape):
                raise RuntimeError(
                    f"saturn recipe output {i}: expected {want.dtype}"
                    f"{list(want.shape)}, got {t.dtype}{list(t.shape)}"
                )

    def _input(self, i: int, t, stats: CallStats):
        spec = self.inputs[i]
        if spec.dtype is None:  # a size input (symbolic graphs): read, never a tensor
            if not isinstance(t, int | torch.SymInt):
                got = type(t).__name__
                raise InputMismatchError(f"saturn recipe input {i} is a size, got {got}")
            return t
        if not isinstance(t, torch.Tensor):
            raise InputMismatchError(f"saturn recipe input {i} is {type(t).__name__}, not a tensor")
        if t.dtype != spec.dtype or t.shape != spec.shape:
            raise InputMismatchError(
                f"saturn recipe input {i}: compiled for {spec.dtype}{list(spec.shape)}, "
                f"got {t.dtype}{list(t.shape)}"
            )
        want = self.device if self.io_on_device else torch.device("cpu")
        if spec.window is not None:  # the program reads the region around the window
            region = spec.window.read(t) if t.device == want else None
            if region is not None:
                return region
            stats.crossings += t.device != want
            return spec.window.packed(t, want)
        if t.device == want and t.is_contiguous():  # packed (size-1 axes' strides unused)
            return t
        return self._copy(t, want, stats)

    @staticmethod
    def _copy(t: torch.Tensor, want: torch.device, stats: CallStats) -> torch.Tensor:
        """A packed copy of ``t`` on ``want``, made at every call: no check can see every
        write to an input (``.data``, numpy, DLPack and C extensions bump no version
        counter), so a copy is never reused (docs/decisions/0049). Inputs already packed
        where the program reads them are read in place."""
        stats.crossings += t.device != want
        return t.to(want).contiguous()

    def _step(self, s: Step, env: dict, stats: CallStats):
        if s.kind == StepKind.CROSSING:
            stats.crossings += 1
            src = env[s.args[0]]
            return src.to(self.device) if s.op == "ToDev" else src.cpu()
        if s.kind == StepKind.VIEW:
            return run_host(s.op, [env[s.args[0]]], s.attrs, {})
        if s.kind == StepKind.HOST:
            stats.host_ops += 1
            args = [self._host_arg(env[a]) for a in s.args]
            return _traced_float(run_host(s.op, args, s.attrs, self.host_calls), s.dtype)
        stats.launches += 1
        return self._kernel(s, [env[o.value] for o in s.kernel.inputs])

    @staticmethod
    def _host_arg(v):
        return v.cpu() if isinstance(v, torch.Tensor) and v.device.type != "cpu" else v

    def _kernel(self, s: Step, operands: list[torch.Tensor]) -> torch.Tensor:
        out = torch.empty(s.shape, dtype=TORCH_DTYPES[s.dtype], device=self.device)
        check_operands(s, operands)
        HOST_KERNELS[s.kernel.kind](self, s.kernel, out, operands)
        return out


# how saturn:0 runs each kernel kind into ``out`` (host memory). Its machine forms no rows
# kernels (the cpu-reference machine's fusion stops at loops and reductions)
HOST_KERNELS: KindTable = KindTable("saturn:0")


@HOST_KERNELS.on(Kind.LOOP, Kind.REDUCE)
def _host_body(recipe: Recipe, k, out: torch.Tensor, operands: list[torch.Tensor]) -> None:
    arrays = []
    for o, t in zip(k.inputs, operands, strict=True):
        if o.indexing != "strided" and not t.is_contiguous():
            t = t.contiguous()
        arrays.append(numpy_view(t))
    cpu.run(k, numpy_view(out), arrays)


def _through_torch(fn):
    """A kind saturn:0 runs through torch on host views of its operands, copied into out."""

    def run(recipe: Recipe, k, out: torch.Tensor, operands: list[torch.Tensor]) -> None:
        torch_view(out).copy_(fn(recipe, k, [torch_view(t) for t in operands]))

    return run


@HOST_KERNELS.on(Kind.GEMM)
@_through_torch
def _host_gemm(recipe: Recipe, k, cpu_in: list[torch.Tensor]) -> torch.Tensor:
    r = torch.matmul(cpu_in[0], cpu_in[1])
    epi = k.attrs["epilogue"]
    if epi != "none":
        r = r + cpu_in[2]
    if epi == "relu_bias":
        r = torch.relu(r)
    elif epi == "gelu_bias":
        r = torch.nn.functional.gelu(r, approximate="tanh")
    return r


@HOST_KERNELS.on(Kind.CONV)
@_through_torch
def _host_conv(recipe: Recipe, k, cpu_in: list[torch.Tensor]) -> torch.Tensor:
    a = k.attrs
    b = cpu_in[2] if a["bias"] else None
    return torch.nn.functional.conv2d(
        cpu_in[0], cpu_in[1], b, a["stride"], a["padding"], a["dilation"], a["groups"]
    )


def _through_host_ops(kind: str):
    """A kind whose module says how saturn:0 runs it through the host's ops."""
    how = spec(kind).host

    def run(recipe: Recipe, k, cpu_in: list[torch.Tensor]) -> torch.Tensor:
        return how(k, cpu_in, lambda op, operands, attrs: run_host(op, operands, attrs, {}))

    return _through_torch(run)


for _kind in Kind:
    if spec(_kind).host is not None:
        HOST_KERNELS.on(_kind)(_through_host_ops(_kind))


@HOST_KERNELS.on(Kind.CUSTOM)
@_through_torch
def _host_custom(recipe: Recipe, k, cpu_in: list[torch.Tensor]) -> torch.Tensor:
    if k.attrs["name"] == "rmsnorm":  # the built-in pattern
        return run_host("RMSNorm", cpu_in, (k.attrs["eps_bits"],), {})
    op, build = recipe.custom_op(k.attrs["name"])  # a saturn custom op: its reference
    return op.run_reference(*build(cpu_in, k.attrs["eps_bits"]))


def _packed_spec(spec: InputSpec | None) -> bool:
    """A tensor output whose eager strides are known and packed."""
    if spec is None or spec.dtype is None or spec.strides is None:
        return False
    packed, step = [], 1
    for n in reversed(spec.shape):
        packed.append(step)
        step *= n
    strides = zip(spec.shape, spec.strides, reversed(packed), strict=True)
    return step == 0 or all(n < 2 or a == b for n, a, b in strides)


def _same_layout(t: torch.Tensor, strides: tuple[int, ...] | None) -> bool:
    """``t`` has these strides on every axis longer than 1 (packed when they are None)."""
    if strides is None:
        return t.is_contiguous()
    return all(n < 2 or a == b for n, a, b in zip(t.shape, t.stride(), strides, strict=True))


def _traced_float(r, dtype: str):
    """A host step's tensor in the floating dtype the graph was traced with. The CPU kernel
    may keep a reduced-precision input's dtype where the device's typing (which the trace
    used) widens: ``native_layer_norm`` of bfloat16 returns bfloat16 statistics on the CPU
    and float32 ones on a GPU. Other dtype differences are left for the output check."""
    if not (isinstance(r, torch.Tensor) and dtype and r.dtype.is_floating_point):
        return r
    want = TORCH_DTYPES.get(dtype)
    return r.to(want) if want is not None and want.is_floating_point and want != r.dtype else r


def dead_after(program: Program) -> tuple[tuple[str, ...], ...]:
    """For each step, the values whose last reader it is (a value no step reads: the step
    that makes it), outputs excepted: the host loop drops them there, so a call holds the
    values still to be read, not every intermediate it made (a training backward on
    saturn:0 held tens of gigabytes: ConvMixer's written-out depthwise gradients)."""
    last: dict[str, int] = {}
    for i, s in enumerate(program.steps):
        last[s.output] = i
        reads = s.args if s.kernel is None else (*s.args, *(o.value for o in s.kernel.inputs))
        for v in reads:
            last[v] = i
    for v in program.outputs:
        last.pop(v, None)
    dead: list[list[str]] = [[] for _ in program.steps]
    for v, i in last.items():
        dead[i].append(v)
    return tuple(tuple(d) for d in dead)
