"""``saturn.custom_op``: operations users add that saturn's eager path, compiler and tests
all understand, built on ``torch.library``.

An operation declares its schema, a reference implementation in PyTorch (run on the host,
on saturn:0 where no kernel runs, for dtypes the kernel does not take, as the test oracle,
and on meta tensors for shapes), the dtypes its kernel takes, and exactly one kind of
implementation:

* ``expression``: an elementwise expression in saturn's graph language over the tensor
  arguments' names, e.g. ``"(Mul x (Sigmoid (Mul x (Scalar 1.702 T))))"``; every constant
  carries a dtype, and ``T`` stands for the first tensor argument's. Compiled graphs
  inline it, so it fuses with its neighbours; eager calls compile it alone.
* ``kernel`` + ``launch``: a Numba CUDA kernel called as ``kernel(out, *tensors, *scalars)``
  (every tensor packed and flattened to 1-D) and a function of the call's arguments
  returning ``(grid, block, shared_bytes, scalars)``.
  The op's output must have its first tensor argument's dtype and shape (a kernel writes an
  output shaped like its input; the op is then placed on the device as one ``Custom`` kernel).
* ``host``: a Python function of the call's arguments (saturn tensors) for work that needs
  host code, called as ``host(out, *args)``; the same placement as a kernel.

A per-op fallback counter counts the calls where the reference ran because the kernel could
not (saturn:0, a dtype the kernel does not take, a CPU tensor). An op may ship a pattern file
(``.egg``) declaring one ruleset; a compile runs it only when asked by that ruleset's name
in ``rewrites``.
"""

from __future__ import annotations

import functools
import inspect
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from saturn.eqsat.errors import EqsatError
from saturn.eqsat.graph import Graph, Node, parse_graph

from .dtypes import DTYPES
from .eager_registry import impl

REGISTRY: dict[str, CustomOp] = {}  # qualified name "ns::op" -> op
_COUNTS: Counter = Counter()
_LOCK = threading.Lock()
_LIBS: dict[str, torch.library.Library] = {}


def count_fallback(name: str) -> None:
    """Count a call of ``name`` that did not run its own implementation."""
    with _LOCK:
        _COUNTS[name] += 1


class CustomOpError(ValueError):
    """A custom op definition saturn refuses; the message names the op."""


def fallback_counts() -> dict[str, int]:
    """Per custom op: calls where the reference ran because the kernel could not."""
    with _LOCK:
        return dict(_COUNTS)


@dataclass
class CustomOp:
    name: str  # "ns::op"
    schema: torch._C.FunctionSchema
    reference: Callable
    dtypes: tuple[torch.dtype, ...]
    expression: str | None = None
    kernel: object = None
    launch: Callable | None = None
    host: Callable | None = None
    pattern: Path | None = None
    pattern_ruleset: str | None = None
    replaces: str | None = None  # the ATen op (aten.x.overload) this op stands in for
    when: Callable | None = None  # whether the kernel takes a call's non-tensor arguments
    packed: tuple[str, ...] = ()  # tensor arguments a host function reads packed
    _eager: dict = field(default_factory=dict, repr=False)  # expression recipes by types

    @property
    def kind(self) -> str:
        return "expression" if self.expression else "kernel" if self.kernel else "host"

    @property
    def target(self) -> str:
        """How the op appears as an FX node target."""
        ns, op = self.name.split("::")
        return f"{ns}.{op}.default"

    @property
    def tensor_args(self) -> list[str]:
        return [a.name for a in self.schema.arguments if _is_tensor(a)]

    @functools.cached_property
    def packed_positions(self) -> tuple[int, ...]:
        """Positions among the tensor arguments that a compiled graph hands over packed
        (copied into a buffer of the step's own where the operand is a strided view):
        every argument of a kernel (it reads them flattened) but those it writes (copied
        back after the kernel), the declared ones of a host function. Read at every
        uncaptured call of a custom step, so worked out once (``packed`` is set at
        definition)."""
        written = _written(self.schema)
        names = self.tensor_args
        if self.kind == "kernel":
            return tuple(i for i, n in enumerate(names) if n not in written)
        return tuple(i for i, n in enumerate(names) if n in self.packed)

    def __call__(self, *args, **kwargs):
        ns, op = self.name.split("::")
        return getattr(getattr(torch.ops, ns), op)(*args, **kwargs)

    # --- eager ---------------------------------------------------------------------------

    def takes(self, tensors: list[torch.Tensor], args: tuple = ()) -> bool:
        """Whether saturn's implementation runs for these operands (else the reference)."""
        if not tensors or any(t.device.type != "saturn" for t in tensors):
            return False
        if self.when is not None and args and not self.when(*args):
            return False
        if any(t.dtype not in self.dtypes for t in tensors if t.is_floating_point()):
            return False
        gpu = tensors[0].device.index >= 1
        return self.kind == "expression" or gpu

    def cpu_impl(self, *args):
        """CPU tensors: the kernel cannot run there, so the reference does (counted)."""
        count_fallback(self.name)
        return self.reference(*args)

    @property
    def mutated(self) -> list[int]:
        """Positions of the arguments the op writes (``Tensor(a!)`` in its schema)."""
        written = _written(self.schema)
        return [i for i, a in enumerate(self.schema.arguments) if a.name in written]

    def run_reference(self, *args):
        """The reference on host copies, the result back where the inputs were; what it
        wrote into a mutated argument is copied back into the caller's tensor."""
        count_fallback(self.name)
        dev = next(a.device for a in args if isinstance(a, torch.Tensor))
        host = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
        out = self.reference(*host)
        for i in self.mutated:
            if isinstance(args[i], torch.Tensor):
                args[i].copy_(host[i])
        return out.to(dev)

    def device_impl(self, *args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not self.takes(tensors, args):
            return self.run_reference(*args)
        if self.kind == "expression":
            return self._run_expression(tensors)
        first = tensors[0]
        out = torch.empty(first.shape, dtype=first.dtype, device=first.device)
        self.run_into(out, list(args))
        return out

    def run_into(self, out: torch.Tensor, args: list) -> None:
        """The kernel (or host function) writing ``out``: the compiled path calls this
        with the recipe's own buffer."""
        if self.kind == "host":
            self.host(out, *args)
            return
        from numba import cuda

        grid, block, shared, scalars = self.launch(*args)
        # kernels see every tensor packed and flattened (1-D); shapes travel as scalars
        packed = {i: a.detach().contiguous() for i, a in enumerate(args) if torch.is_tensor(a)}
        stream = cuda.external_stream(torch.saturn.stream_handle(out.device))
        with torch.saturn.device(out.device):
            self.kernel[grid, block, stream, shared](
                _Array(out.detach().view(-1)),
                *(_Array(t.view(-1)) for t in packed.values()),
                *scalars,
            )
        for i in self.mutated:  # a strided argument the kernel wrote through a packed copy
            if i in packed and packed[i].data_ptr() != args[i].data_ptr():
                args[i].copy_(packed[i])

    def _run_expression(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        key = (tensors[0].device, tuple((t.dtype, tuple(t.shape)) for t in tensors))
        recipe = self._eager.get(key)
        if recipe is None:
            recipe = self._eager[key] = _expression_recipe(self, tensors)
        (out,) = recipe([t if t.is_contiguous() else t.contiguous() for t in tensors])
        return out

    # --- the compiler's view -------------------------------------------------------------

    def expression_graph(self, types: list[tuple[str, tuple[int, ...]]]) -> Graph:
        """The expression as a graph over inputs of the given (dtype, shape)s."""
        lines = [
            f"(input {n} {d} [{' '.join(map(str, s))}])"
            for n, (d, s) in zip(self.tensor_args, types, strict=True)
        ]
        # a constant typed T takes the first tensor argument's dtype
        expr = re.sub(r"\(Scalar (\S+) T\)", rf"(Scalar \1 {types[0][0]})", self.expression)
        lines += [f"(let result {expr})", "(output result)"]
        return parse_graph("\n".join(lines) + "\n", f"<{self.name} expression>")


class _Array:
    """A saturn GPU tensor for Numba: its CUDA array interface without a stream, so that
    Numba does not synchronise (the launch is ordered on saturn's stream)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, t: torch.Tensor):
        cai = dict(t.__cuda_array_interface__)
        cai["stream"] = None
        self.__cuda_array_interface__ = cai


def _is_tensor(arg) -> bool:
    return isinstance(arg.type, torch._C.TensorType)


def _expression_recipe(op: CustomOp, tensors: list[torch.Tensor]):
    from saturn.eqsat.pipeline import compile_graph

    from .recipe import InputSpec, Recipe

    graph = op.expression_graph([(DTYPES[t.dtype], tuple(t.shape)) for t in tensors])
    device = tensors[0].device
    compiled = compile_graph(
        graph, machine="gpu" if device.index >= 1 else "cpu-reference", io_on_device=True
    )
    out = graph.nodes[graph.outputs[0]]
    from .dtypes import TORCH_DTYPES

    recipe = Recipe(
        program=compiled.program,
        device=device,
        io_on_device=True,
        inputs=[InputSpec(t.dtype, tuple(t.shape)) for t in tensors],
        output_spec=[0],
        output_types=[InputSpec(TORCH_DTYPES[out.dtype], tuple(out.shape))],
        host_calls={},
        input_names=list(op.tensor_args),
        resolve_custom=resolve,
        replay=False,
    )
    recipe.prepare()
    return recipe


_NAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*$")


def custom_op(
    name: str,
    schema: str,
    *,
    reference: Callable,
    dtypes: tuple[torch.dtype, ...] = (torch.float32,),
    expression: str | None = None,
    kernel=None,
    launch: Callable | None = None,
    host: Callable | None = None,
    mutates_args: tuple[str, ...] = (),
    backward: Callable | None = None,
    setup_context: Callable | None = None,
    pattern: str | Path | None = None,
    replaces: str | None = None,
    when: Callable | None = None,
    packed: tuple[str, ...] = (),
) -> CustomOp:
    """Define ``name`` ("namespace::op") with ``schema`` ("(Tensor x, float eps) -> Tensor").

    Raises ``CustomOpError`` naming the op when the definition is inconsistent."""

    def fail(msg: str):
        raise CustomOpError(f"custom op {name}: {msg}")

    if not _NAME.match(name):
        fail('the name must be "namespace::op"')
    if name in REGISTRY:
        fail("already defined")
    try:
        parsed = torch._C.parse_schema(f"{name}{schema}")
    except RuntimeError as e:
        fail(f"schema {schema!r} does not parse: {str(e).splitlines()[0]}")
    kinds = [k for k, v in (("expression", expression), ("kernel", kernel), ("host", host)) if v]
    if len(kinds) != 1:
        fail(f"declare exactly one of expression, kernel, host (got {kinds or 'none'})")
    if kernel is not None and launch is None:
        fail("a kernel needs a launch function returning (grid, block, shared, scalars)")
    params = list(inspect.signature(reference).parameters)
    names = [a.name for a in parsed.arguments]
    if params != names:
        fail(f"the reference takes {params}, the schema declares {names}")
    mutated = sorted(_written(parsed))
    if mutated != sorted(mutates_args):
        fail(f"mutates_args {sorted(mutates_args)} but the schema writes {mutated}")
    if len(parsed.returns) != 1 or not isinstance(parsed.returns[0].type, torch._C.TensorType):
        fail("must return exactly one tensor")
    if not any(_is_tensor(a) for a in parsed.arguments):
        fail("takes no tensor")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        fail(f"dtypes {bad} are not saturn dtypes")
    op = CustomOp(name, parsed, reference, tuple(dtypes), expression, kernel, launch, host)
    op.when = when
    tensor_names = {a.name for a in parsed.arguments if _is_tensor(a)}
    if set(packed) - tensor_names:
        fail(f"packed names {sorted(set(packed) - tensor_names)}, not tensor arguments")
    if packed and host is None:
        fail("packed is for host functions (a kernel reads every argument packed)")
    if set(packed) & set(mutates_args):
        fail("an argument the op writes cannot be handed over as a packed copy")
    op.packed = tuple(packed)
    if replaces is not None:
        op.replaces = _check_replacement(replaces, parsed, fail)
    if expression is not None:
        others = [a.name for a in parsed.arguments if not _is_tensor(a)]
        if mutates_args:
            fail(
                "an expression computes a new value; "
                "an op that writes its arguments needs a kernel or a host function"
            )
        if others:
            fail(f"an expression takes tensors only; {others} are not")
        try:  # parse it once over float32 scalars: untyped constants and bad ops raise here
            op.expression_graph([("f32", ())] * len(op.tensor_args))
        except EqsatError as e:
            fail(f"expression: {e}")
    if pattern is not None:
        p = Path(pattern)
        if not p.exists():
            fail(f"pattern file {p} does not exist")
        m = re.search(r"\(ruleset\s+([^\s)]+)\)", p.read_text())
        if not m:
            fail(f"pattern file {p} declares no ruleset")
        op.pattern, op.pattern_ruleset = p.resolve(), m.group(1)
    ns, opname = name.split("::")
    lib = _LIBS.get(ns)
    if lib is None:
        lib = _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    lib.define(f"{opname}{schema}")
    lib.impl(opname, op.cpu_impl, "CPU")
    impl(lib, opname, op.device_impl)
    torch.library.register_fake(name, reference, lib=lib)
    if backward is not None:
        torch.library.register_autograd(name, backward, setup_context=setup_context, lib=lib)
    if op.replaces is not None:
        _install_replacement(op)
    REGISTRY[name] = op
    return op


def _check_replacement(replaces: str, parsed, fail) -> str:
    """``aten::_softmax`` or ``aten._softmax.default`` -> the FX target form, after checking
    the op exists, is not CompositeImplicitAutograd, and has the custom op's arguments."""
    m = re.match(r"^(\w+)(?:::|\.)(\w+)(?:\.(\w+))?$", replaces)
    if not m:
        fail(f"replaces={replaces!r}: name an op as 'aten::op' or 'aten.op.overload'")
    ns, opname, overload = m.group(1), m.group(2), m.group(3) or "default"
    try:
        packet = getattr(getattr(torch.ops, ns), opname)
        target = getattr(packet, overload)
    except AttributeError:
        fail(f"replaces={replaces!r}: no such op")
    qual = f"{ns}::{opname}" + ("" if overload == "default" else f".{overload}")
    if torch._C._dispatch_has_kernel_for_dispatch_key(qual, "CompositeImplicitAutograd"):
        inner = _decomposes_into(target)
        hint = f"; replace the op it decomposes into instead ({inner})" if inner else ""
        fail(
            f"{qual} is CompositeImplicitAutograd: it decomposes before it reaches a device, "
            f"so a replacement would never run{hint}"
        )
    theirs = [(a.name, str(a.type)) for a in target._schema.arguments]
    ours = [(a.name, str(a.type)) for a in parsed.arguments]
    if theirs != ours:
        fail(f"replaces {qual}, whose arguments are {theirs}; this op takes {ours}")
    return f"{ns}.{opname}.{overload}"


def _decomposes_into(target) -> str | None:
    """The first ATen op a CompositeImplicitAutograd op runs, on small meta tensors."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func).replace(".default", ""))
            return func(*args, **(kwargs or {}))

    sample = {"Tensor": lambda: torch.empty(2, 3, device="meta"), "int": lambda: 1}
    try:
        args = []
        for a in target._schema.arguments:
            if a.has_default_value():
                break
            args.append(sample[str(a.type)]())
        with Record():
            target(*args)
    except Exception:
        return None
    real = [s for s in seen if not s.startswith("aten.detach") and "view" not in s]
    return real[0].replace("aten.", "aten::") if real else None


def _install_replacement(op: CustomOp) -> None:
    """Eager calls of the replaced op on saturn tensors go to this op's implementation."""
    ns, opname, overload = op.replaces.split(".")
    lib = _LIBS.get(f"{ns}-impl")
    if lib is None:
        lib = _LIBS[f"{ns}-impl"] = torch.library.Library(ns, "IMPL")
    name = opname if overload == "default" else f"{opname}.{overload}"
    impl(lib, name, op.device_impl)


def replacement_for(target: str) -> CustomOp | None:
    """The custom op that replaces the ATen op ``target`` (aten.x.overload), if any."""
    for op in REGISTRY.values():
        if op.replaces == target:
            return op
    return None


def _written(schema: torch._C.FunctionSchema) -> set[str]:
    """The arguments a schema writes (``Tensor(a!)``)."""
    return {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}


def by_target(target: str) -> CustomOp | None:
    """The custom op an FX node calls (``ns.op.default``), if it is one: a saturn custom op,
    or a ``torch.library`` op adopted by ``library_op``."""
    for op in REGISTRY.values():
        if op.target == target:
            return op
    return _ADOPTED.get(target)


_ADOPTED: dict[str, CustomOp] = {}  # "ns.op.overload" -> the torch.library op's stand-in
# namespaces whose ops saturn compiles itself (or must not call as a black box)
_OWN_NAMESPACES = {
    "aten",
    "prims",
    "saturn",
    "saturn_rt",
    "higher_order",
    "_c10d_functional",
    "profiler",
}


def library_op(target) -> CustomOp | None:
    """A ``torch.library`` op (``torch.library.custom_op``, ``Library.define``) with a
    kernel registered for saturn (PrivateUse1), one tensor result and no argument written,
    seen as a saturn custom op whose host function calls it: compiled graphs place it on
    the device as one ``Custom`` step, calling the user's saturn kernel on the device's
    tensors (saturn:0 calls the op on host copies, as with any custom op). None for
    anything else (it stays an opaque host call)."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    key = str(target)
    if key in _ADOPTED:
        return _ADOPTED[key]
    schema = target._schema
    if target.namespace in _OWN_NAMESPACES:
        return None
    if not torch._C._dispatch_has_kernel_for_dispatch_key(schema.name, "PrivateUse1"):
        return None
    if len(schema.returns) != 1 or not isinstance(schema.returns[0].type, torch._C.TensorType):
        return None
    if _written(schema):
        return None
    if not any(_is_tensor(a) for a in schema.arguments):
        return None

    def host(out: torch.Tensor, *args) -> None:
        out.copy_(target(*args))

    def on_saturn0(*args):  # run_reference's host copies, on saturn:0 (host memory) again
        moved = [a.to("saturn:0") if isinstance(a, torch.Tensor) else a for a in args]
        return target(*moved).cpu()

    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    op = CustomOp(schema.name, schema, on_saturn0, floats, host=host)
    _ADOPTED[key] = op
    return op


def pattern_files(rewrites: list[str]) -> list[Path]:
    """The pattern files of the custom ops whose ruleset a compile asks for."""
    return [op.pattern for op in REGISTRY.values() if op.pattern_ruleset in rewrites]


def pattern_rulesets() -> list[str]:
    return [op.pattern_ruleset for op in REGISTRY.values() if op.pattern_ruleset]


# Custom kernels the built-in rules (rules/patterns.egg) name, and the op that runs each.
BUILTIN_PATTERNS = {"rmsnorm": "saturn::rmsnorm"}


def resolve(name: str, host_calls: dict) -> tuple[CustomOp, Callable[[list, int], list]]:
    """The op a ``Custom`` kernel named ``name`` runs, and how to build its arguments from
    the kernel's tensors and float-attribute bits. ``name`` is a host call (an op node of the
    graph, placed on the device) or an op's own name (a pattern's result, whose one float
    argument, if any, travels as the attribute's bits)."""
    from saturn.eqsat.graph import bits_float

    from .host_ops import call_args

    call = host_calls.get(name)
    if call is not None:
        op = by_target(call.target) or replacement_for(call.target)
        if op is None:
            raise RuntimeError(f"custom kernel {name}: {call.target} is not a saturn custom op")
        return op, lambda tensors, bits: call_args(call, tensors)[0]
    if name in BUILTIN_PATTERNS:
        import saturn.library  # noqa: F401  (defines the ops the built-in rules name)
    op = REGISTRY.get(BUILTIN_PATTERNS.get(name, name))
    if op is None:
        raise RuntimeError(f"custom kernel {name}: no custom op of that name is defined")

    def build(tensors: list, bits: int) -> list:
        it = iter(tensors)
        return [next(it) if _is_tensor(a) else bits_float(bits) for a in op.schema.arguments]

    return op, build


def placement_rules(
    custom_nodes: dict[str, int], graph: Graph, replaced: dict[str, Node] | None = None
) -> str:
    """egglog rules placing each custom-op node on the device as one ``Custom`` kernel (the
    importer has checked its dtypes and that its output is typed like its first operand).
    A node that replaces an ATen op also states which op-table term it stands for."""
    from saturn.eqsat.egraph import node_term

    replaced = replaced or {}
    lines = ["(ruleset custom-placement)"]
    for name, arity in sorted(custom_nodes.items()):
        node = graph.nodes[name]
        label = node.attrs[0]
        xs = [f"a{i}" for i in range(arity)]
        host = "(TNil)"
        dev = "(TNil)"
        for x in reversed(xs):
            host = f"(TCons {x} {host})"
            dev = f"(TCons (ToDev {x}) {dev})"
        stands = ""
        if (shadow := replaced.get(name)) is not None and set(shadow.args) <= set(node.args):
            names = {a: f"a{node.args.index(a)}" for a in shadow.args}
            stands = f" (stands-for e {node_term(shadow, graph, names)})"
        lines.append(
            f'(rule ((= e (Opaque "{label}" u {host}))) '
            f'((union e (ToHost (Custom "{label}" {dev} 0))){stands}) '
            f':ruleset custom-placement :name "place-custom-{label}")'
        )
    return "\n".join(lines) + "\n"
