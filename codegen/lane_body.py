"""A vectorised kernel's body written once, as an inlined device function that each lane
calls, instead of once per lane.

A kernel of 8-lane vectors used to repeat its body 8 times per copy of its step (a loop's
three run cases, a rows kernel's passes): Numba's front end, whose time grows with the
statements it is given, spent most of a kernel's build on those copies. NVVM inlines the
function (``forceinline``) at every call, so the code is the same (decision 0112).
"""

from __future__ import annotations

from collections.abc import Callable

from numba import config

from saturn.eqsat.program import leaves

from .expr import BodyWriter

# Helpers are inlined by NVVM (``alwaysinline``), not in Numba's IR: IR inlining costs
# seconds per call site, and a bfloat16 loop of eight lanes has hundreds (ResNet-18's pool
# took 72 s to build, 1.3 s this way). The simulator's jit has no such option.
DEVICE_FN = "@cuda.jit(device=True" + ("" if config.ENABLE_CUDASIM else ", forceinline=True") + ")"

Stage = Callable[[int], tuple[str, str]]  # stage j -> (variable, dtype)


class LaneBodies:
    """The body functions of one kernel (``{fn}_b{n}``), one per distinct body."""

    def __init__(self, fn: str) -> None:
        self.fn = fn
        self.defs: list[str] = []
        self._known: dict[tuple, tuple[str, list[int], list[int], str]] = {}

    def call(
        self,
        e: tuple,
        dtype_of_operand: Callable[[int], str],
        operand: Callable[[int], str],
        stage: Stage | None = None,
    ) -> tuple[str, str]:
        """(an expression computing ``e`` with operand i read as ``operand(i)``, its dtype).
        The operand and stage dtypes must be the same at every call of one body (they are
        the kernel's)."""
        if e not in self._known:
            found = leaves(e)
            ops = sorted(leaf[1] for leaf in found if leaf[0] == "in")
            stages = sorted(leaf[1] for leaf in found if leaf[0] == "stage")
            inner = None if stage is None else (lambda j: (f"st{j}", stage(j)[1]))
            w = BodyWriter(lambda i: f"in{i}_v", dtype_of_operand, "", inner)
            res, dtype = w.emit(e)
            name = f"{self.fn}_b{len(self._known)}"
            params = ", ".join([*(f"in{i}_v" for i in ops), *(f"st{j}" for j in stages)])
            self.defs.append(
                "\n".join(
                    [
                        DEVICE_FN,
                        f"def {name}({params}):",
                        *(f"    {ln}" for ln in w.lines),
                        f"    return {res}",
                    ]
                )
            )
            self._known[e] = (name, ops, stages, dtype)
        name, ops, stages, dtype = self._known[e]
        assert stage is not None or not stages
        args = [*(operand(i) for i in ops), *(stage(j)[0] for j in stages)]  # type: ignore[misc]
        return f"{name}({', '.join(args)})", dtype

    def source(self) -> str:
        """The functions' definitions, to precede the kernel's."""
        return "".join(f"{d}\n\n\n" for d in self.defs)
