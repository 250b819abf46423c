"""``torch.compile(model, backend="saturn")``.

Registered only through the ``torch_dynamo_backends`` entry point (this module must not
also call ``register_backend``). Dynamo's graph goes through AOTAutograd with saturn's
decomposition table; each forward (and backward) graph is imported, compiled by
``saturn.eqsat`` into a recipe, and run by the executor with the boxed calling convention.
A graph saturn cannot represent runs uncompiled, and the reason is logged.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from saturn.eqsat.compile_cache import compile_cached
from saturn.eqsat.errors import EqsatError, RuleError
from saturn.eqsat.kinds import Kind
from saturn.eqsat.pipeline import Compiled, Stages

from . import decompositions, gpu_stack
from .constant_folding import fold_constants
from .constants import lift_constants
from .import_writes import split_input_writes
from .importer import Imported, UnsupportedError, import_graph
from .options import Options, options_for_mode, parse
from .recipe import CompiledCallError, InputSpec, Recipe
from .saved_bounds import clamp_saved_indices, saved_index_planes

log = logging.getLogger("saturn")


@dataclass
class CompiledGraph:
    """What one graph compiled to, kept for ``saturn.explain``."""

    imported: Imported
    compiled: Compiled
    recipe: Recipe


class NotCompiledError(RuntimeError):
    """A graph saturn could not compile, raised where the ``strict`` option asks for it
    instead of running the graph uncompiled; the message says why."""


class _Cache:
    """Compiled recipes by a key computed from the FX graph and the options (bounded LRU,
    thread-safe), and the counters ``saturn.stats()`` reports. ``torch.compiler.reset()``
    clears the recipes (``saturn_backend.reset``); the counters run for the process."""

    def __init__(self, size: int = 64):
        self.size = size
        self.items: OrderedDict[tuple, CompiledGraph] = OrderedDict()
        self.lock = threading.Lock()
        self.compiles = 0  # graphs compiled (cache misses)
        self.disk_hits = 0  # of those, whose compile result came from the disk cache
        self.fallbacks: list[str] = []  # reasons graphs ran uncompiled
        self.failed_calls: list[str] = []  # compiled calls that failed where eager did not
        self.host_ops = 0  # host steps in the graphs compiled
        self.crossings = 0  # host-device crossings in the graphs compiled

    def get(self, key):
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
            return hit

    def put(self, key, value: CompiledGraph) -> None:
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.items.clear()


CACHE = _Cache()
_capture = threading.local()  # saturn.explain collects CompiledGraphs here


def _rules_digest(opts: Options) -> tuple:
    from pathlib import Path

    from saturn.eqsat.rules import rule_files

    from .custom_ops import pattern_files

    files = rule_files([*opts.rules, *pattern_files(list(opts.rewrites))])
    return tuple((str(p), p.read_bytes()) for p in files if Path(p).exists())


def graph_key(gm: torch.fx.GraphModule, opts: Options) -> tuple:
    index = {}
    parts = []
    for i, node in enumerate(gm.graph.nodes):
        index[node.name] = i

        def norm(a):
            if isinstance(a, torch.fx.Node):
                return ("n", index[a.name])
            if isinstance(a, list | tuple):
                return tuple(norm(x) for x in a)
            if isinstance(a, dict):
                return tuple(sorted((k, norm(v)) for k, v in a.items()))
            return repr(a)

        val = node.meta.get("val")
        typ = None
        if isinstance(val, torch.Tensor):
            typ = (str(val.dtype), str(tuple(val.shape)), str(tuple(val.stride())), str(val.device))
        elif isinstance(val, list | tuple):
            typ = tuple(
                (str(v.dtype), str(tuple(v.shape))) if isinstance(v, torch.Tensor) else repr(v)
                for v in val
            )
        elif val is not None:
            typ = repr(val)
        parts.append((node.op, str(node.target), norm(node.args), norm(node.kwargs), typ))
    return (tuple(parts), opts.key(), _rules_digest(opts))


def _generated_rules(text: str):
    """A rule file saturn generated for one compile, kept in the cache by its content."""
    import hashlib

    from saturn.codegen.sources import cache_dir, write_atomic

    d = cache_dir("generated-rules")
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"rules_{hashlib.sha256(text.encode()).hexdigest()[:16]}.egg"
    if not path.exists():
        write_atomic(path, text.encode())
    return path


def _devices_of(example_inputs) -> set[str]:
    return {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}


def _target(opts: Options, example_inputs) -> torch.device:
    """The device a graph compiles for: the option's when given, else the one saturn
    device all its saturn inputs are on, else the default (saturn:1 with a GPU)."""
    devs = {t.device for t in example_inputs if isinstance(t, torch.Tensor)}
    saturn_devs = {d for d in devs if d.type == "saturn"}
    if not opts.device_given and len(saturn_devs) == 1:
        return next(iter(saturn_devs))
    return torch.device(opts.device)


def compile_fx(
    gm: torch.fx.GraphModule,
    example_inputs,
    opts: Options,
    forward: bool = True,
    writes: tuple = (),
) -> CompiledGraph:
    """``writes``: (placeholder name, return position) of each value the recipe writes
    into an input after the call (``import_writes.split_input_writes``)."""
    t0 = time.perf_counter()
    device = _target(opts, example_inputs)
    if device.index >= 1:
        gpu_stack.check_once()
    imported = import_graph(
        gm, replacements=device.index >= 1, keep_packed=frozenset(n for n, _ in writes)
    )
    t_import = time.perf_counter() - t0
    kinds = _devices_of(example_inputs)
    # CPU scalars beside saturn tensors (an optimizer's step counters) are copied in per call
    host_scalars = kinds == {"saturn", "cpu"} and all(
        t.dim() == 0
        for t in example_inputs
        if isinstance(t, torch.Tensor) and t.device.type == "cpu"
    )
    if kinds - {"saturn", "cpu"} or (len(kinds) > 1 and not host_scalars):
        raise UnsupportedError(
            f"inputs on {sorted(kinds)}: saturn compiles graphs whose inputs are all saturn "
            "tensors (and CPU scalars) or all CPU tensors"
        )
    io_on_device = "saturn" in kinds
    if io_on_device:
        devs = {
            t.device
            for t in example_inputs
            if isinstance(t, torch.Tensor) and t.device.type == "saturn"
        }
        if devs != {device}:
            raise UnsupportedError(f"inputs on {sorted(map(str, devs))}, compile target {device}")
    from saturn.eqsat.rules import OPT_IN_RULESETS

    from .custom_ops import pattern_files, placement_rules, resolve

    rules = [*opts.rules, *pattern_files(list(opts.rewrites))]
    if imported.custom_nodes:
        rules.append(
            _generated_rules(
                placement_rules(imported.custom_nodes, imported.graph, imported.replaced)
            )
        )
    compiled, from_disk = compile_cached(
        imported.graph,
        rules=rules,
        rewrites=[r for r in opts.rewrites if r in OPT_IN_RULESETS],
        bounds=opts.bounds,
        machine="gpu" if device.index >= 1 else "cpu-reference",
        io_on_device=io_on_device,
    )
    CACHE.disk_hits += from_disk
    if device.index >= 1 and any(
        k.kind in (Kind.CONV, Kind.CONV_GRAD) for k in compiled.program.kernels
    ):
        from saturn.codegen.conv import cudnn_unavailable

        if (why := cudnn_unavailable()) is not None:
            raise UnsupportedError(f"a convolution on {device}: {why}")
    outs = imported.graph.outputs
    spec, k = [], 0
    for o in imported.outputs:
        if o is None or isinstance(o, tuple):  # None, or ("size", value)
            spec.append(o)
        else:
            spec.append(k)
            k += 1
    from .dtypes import TORCH_DTYPES

    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    sized = len(imported.inputs) - len(names)  # size values lead the recipe's inputs
    recipe = Recipe(
        program=compiled.program,
        device=device,
        io_on_device=io_on_device,
        inputs=[
            InputSpec(None if d == "size" else TORCH_DTYPES[d], s, window=w)
            for (d, s, _), w in zip(imported.input_meta, imported.input_windows, strict=True)
        ],
        output_spec=spec,
        output_types=[
            None
            if m is None
            else InputSpec(None, ())
            if m[0] == "size"
            else InputSpec(TORCH_DTYPES[m[0]], m[1], m[2])
            for m in imported.output_meta
        ],
        ownership=compiled.ownership,
        host_calls=imported.host_calls,
        input_names=imported.inputs,
        resolve_custom=resolve,
        replay=opts.replay,
        precision=opts.precision,
        rerun=forward,
        writes=tuple((sized + names.index(name), pos) for name, pos in writes),
    )
    assert len(outs) == k
    stages = Stages()
    stages.seconds["import"] = t_import
    stages.sizes["import"] = f"{len(imported.graph.nodes)} ops"
    stages.merge(compiled.stages)
    compiled.stages = stages
    if imported.symbols:  # one compile over markers; a concrete recipe per size seen
        from .symbolic import SymbolicRecipe, size_sources

        sources = size_sources(gm, imported.symbols)
        recipe = SymbolicRecipe(recipe, sources, imported.size_values, fallback=gm)
        return CompiledGraph(imported, compiled, recipe)
    stages.restart()
    recipe.prepare()
    stages.mark("kernels and plans")  # code generation, cubins, library plans (a GPU's)
    return CompiledGraph(imported, compiled, recipe)


# False: AOTAutograd writes mutated inputs back itself after the compiled call (one eager
# copy each), the form before decision 0127; for an A/B
KEEP_INPUT_WRITES = True

# a compile taking longer than this logs its stages at INFO (logger "saturn")
SLOW_COMPILE_S = 5.0


def _log_stages(cg: CompiledGraph) -> None:
    stages = cg.compiled.stages
    if stages.total > SLOW_COMPILE_S:
        log.info(
            "saturn: compiled a graph of %d ops in %s",
            len(cg.imported.graph.nodes),
            stages,
        )


def _compiler(opts: Options, forward: bool, planes: dict[str, int]):
    """``planes``: the saved max-pool indices of this joint graph's forward (name -> plane
    size), which its forward compile records and its backward compile clamps (decision
    0133; one dict per ``saturn_backend`` call)."""

    def fw(gm: torch.fx.GraphModule, example_inputs):
        if forward:
            planes.update(saved_index_planes(gm))
        else:  # the same values, bounded: the backward's pool gradient needs no check
            clamp_saved_indices(gm, planes)
        original = gm
        # a graph's writes to its inputs (kept in the graph, see saturn_backend) become
        # returns the recipe writes back after the call
        gm, writes = split_input_writes(gm)
        t_fold = time.perf_counter()
        try:  # values built from no input: computed once, here (decision 0096)
            gm = fold_constants(gm, _target(opts, example_inputs))
        except Exception as e:  # folding is an optimisation: never the reason a compile fails
            log.info("saturn: constants not folded (%s: %s)", type(e).__name__, e)
        gm, consts = lift_constants(gm)
        t_fold = time.perf_counter() - t_fold
        example_inputs = [*consts, *example_inputs]
        key = (graph_key(gm, opts), forward, writes)
        hit = CACHE.get(key)
        if hit is None:
            try:
                hit = compile_fx(gm, example_inputs, opts, forward, writes)
            except RuleError:  # the user's own rule file is broken: theirs to fix, so say so
                raise
            except Exception as e:  # never fail the user's compile: run uncompiled, say why
                reason = f"{type(e).__name__}: {e}"
                if opts.strict:
                    raise NotCompiledError(
                        f"saturn (strict): a graph did not compile: {reason}"
                    ) from e
                if not isinstance(e, UnsupportedError | EqsatError | NotImplementedError):
                    log.exception("saturn: internal error while compiling a graph")
                CACHE.fallbacks.append(reason)
                log.warning("saturn: graph runs uncompiled: %s", reason)
                return make_boxed_func(original.forward)
            CACHE.compiles += 1
            hit.compiled.stages.seconds["fold constants"] = t_fold
            _log_stages(hit)
            prog = hit.compiled.program
            CACHE.host_ops += prog.count("host")
            CACHE.crossings += prog.count("crossing")
            CACHE.put(key, hit)
        captured = getattr(_capture, "graphs", None)
        if captured is not None:
            captured.append(hit)
        recipe = hit.recipe
        stages = hit.compiled.stages
        pending = ["first run"] if "first run" not in stages.seconds else []

        def run(args: list):  # boxed: one list of inputs, the graph's constants first
            if pending:  # the first call's own time: library plans timed, replay captured
                t = time.perf_counter()
                out = recipe([*consts, *args] if consts else args)
                stages.seconds[pending.pop()] = time.perf_counter() - t
                return out
            return recipe([*consts, *args] if consts else args)

        run._boxed_call = True
        return run

    return fw


def saturn_backend(
    gm: torch.fx.GraphModule,
    example_inputs,
    options: dict | None = None,
    mode: str | None = None,
    **kwargs,
):
    """The ``torch_dynamo_backends`` entry point ``saturn``."""
    if kwargs:
        raise ValueError(
            f"saturn: unexpected arguments {sorted(kwargs)}; pass "
            "torch.compile(..., mode=...) or torch.compile(..., options={...})"
        )
    if mode is not None:  # torch.compile passes a mode only where no options are given
        options = {**options_for_mode(mode), **(options or {})}
    opts = parse(options)
    _start_build_workers(opts, example_inputs)
    if _fullgraph() and "strict" not in (options or {}):
        # torch.compile(fullgraph=True): a graph saturn cannot compile raises, as a graph
        # break would (an explicit strict option wins)
        opts = dataclasses.replace(opts, strict=True)
    planes: dict[str, int] = {}
    compiled = aot_autograd(
        fw_compiler=_compiler(opts, forward=True, planes=planes),
        bw_compiler=_compiler(opts, forward=False, planes=planes),
        decompositions=decompositions.table(),
        # input writes (an optimizer's updates; a training forward's batch-norm
        # statistics) stay in the graph: the recipe makes them, instead of one eager copy
        # per input after the call
        keep_inference_input_mutations=KEEP_INPUT_WRITES,
    )(gm, example_inputs)
    return _rerun_on_failure(compiled, gm)


def _start_build_workers(opts: Options, example_inputs) -> None:
    """A GPU target's kernel-build workers started before AOTAutograd traces: their
    start-up (Numba's import and first compile, about a second each) runs beside the
    tracing and the e-graph instead of before the first graph's builds (``build_pool``)."""
    try:
        device = _target(opts, example_inputs)
        if device.index >= 1:
            from saturn.codegen import cubins

            cubins.start_workers(tuple(torch.saturn.get_device_capability(device)))
    except Exception as e:  # the builds start their workers themselves
        log.debug("saturn: build workers not started early: %s", e)


def _fullgraph() -> bool:
    """Whether dynamo is tracing under ``torch.compile(fullgraph=True)``: the frame being
    compiled must be one graph (its translator's ``one_graph``), which backends are not
    told otherwise."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
    except Exception:  # not under dynamo (a direct call of the backend)
        return False
    return bool(getattr(tx, "one_graph", False))


def _reset() -> None:
    """``torch.compiler.reset()`` (and ``torch._dynamo.reset()``) call this through the
    backend: the compiled recipes go with dynamo's compiled frames."""
    CACHE.clear()


saturn_backend.reset = _reset


def stats() -> dict:
    """What saturn did in this process: graphs compiled (cache misses), graphs run
    uncompiled and why, compiled calls that failed and ran uncompiled (eager did not fail),
    host steps and crossings in the graphs compiled, and eager ops that ran through the
    CPU fallback (by ATen op)."""
    from saturn.codegen.gemm_tuning import CONV_PLANS, CONV_TUNINGS, TUNINGS

    from ._runtime import fallback_counts
    from .custom_ops import fallback_counts as custom_fallbacks

    return {
        "graphs_compiled": CACHE.compiles,
        "compile_cache_hits": CACHE.disk_hits,  # of those, read from the disk cache
        "graphs_uncompiled": len(CACHE.fallbacks),
        "uncompiled_reasons": list(CACHE.fallbacks),
        "failed_calls": list(CACHE.failed_calls),
        "host_ops": CACHE.host_ops,
        "crossings": CACHE.crossings,
        "eager_fallbacks": fallback_counts(),
        "custom_op_fallbacks": custom_fallbacks(),
        # library products and convolutions timed, and plans that took a choice timed
        # before (gemm_tuning), and convolution steps that ran a plan built for another
        **TUNINGS.stats(),
        **CONV_TUNINGS.stats(),
        **CONV_PLANS.stats(),
    }


def _rerun_on_failure(compiled, gm: torch.fx.GraphModule):
    """Dynamo's callable for one captured graph. A forward call that fails compiled (an
    index out of range found by a kernel, a library plan that raises at run time) runs the
    captured graph uncompiled, as eager would have run it (docs/decisions/0050): where
    PyTorch raises too, the caller sees PyTorch's own exception, its type and message; where
    it does not, PyTorch's result, with the failure logged (a bug to report). The graph's
    input mutations are applied after the compiled graph returns, so none ran twice."""

    def call(*args):
        try:
            return compiled(*args)
        except CompiledCallError as failed:
            try:
                out = gm(*args)
            except Exception as eager:
                log.debug("saturn: compiled call failed (%s); PyTorch raises too", failed)
                raise eager from None
            CACHE.failed_calls.append(str(failed))
            log.warning("saturn: a compiled call failed; it ran uncompiled: %s", failed)
            return out

    call._saturn_compiled = compiled  # tests reach the AOT callable
    return call
