"""Options of ``torch.compile(model, backend="saturn", options={...})``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

import torch

from saturn.eqsat.egraph import Bounds
from saturn.eqsat.errors import EqsatError
from saturn.eqsat.rules import OPT_IN_RULESETS


@dataclass(frozen=True)
class Options:
    device: str = ""  # saturn:1 when a GPU exists, else saturn:0
    # device given by the user; otherwise a graph whose inputs are all on one saturn device
    # compiles for that device (saturn:0 tensors on a machine with a GPU stay on saturn:0)
    device_given: bool = False
    rules: tuple[str, ...] = ()  # extra .egg files or folders
    rewrites: tuple[str, ...] = ()  # opt-in rulesets, e.g. ("patterns",)
    iterations: int = Bounds.iterations
    max_enodes: int | None = Bounds.max_enodes  # None: scaled with the graph (Bounds)
    seconds: float = Bounds.seconds
    replay: bool = True  # CUDA-graph replay of static graphs on a GPU
    tf32: bool = False  # float32 GEMMs and convolutions may round inputs to TF32
    tf32x3: bool = False  # float32 GEMMs and convolutions as three TF32 ones of split operands
    strict: bool = False  # a graph saturn cannot compile raises instead of running uncompiled

    @property
    def precision(self) -> str:
        """How float32 GEMMs and convolutions compute: fp32, tf32 or tf32x3."""
        return "tf32" if self.tf32 else "tf32x3" if self.tf32x3 else "fp32"

    extra: dict = field(default_factory=dict, compare=False)

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.iterations, self.max_enodes, self.seconds)

    def key(self) -> tuple:
        return (
            self.device,
            self.device_given,
            self.rules,
            self.rewrites,
            self.iterations,
            self.max_enodes,
            self.seconds,
            self.replay,
            self.tf32,
            self.tf32x3,
        )  # strict changes what a failed compile does, not what a compile makes


VALID = tuple(f.name for f in fields(Options) if f.name not in ("extra", "device_given"))


def default_device() -> str:
    return "saturn:1" if torch.saturn.gpu_count() > 0 else "saturn:0"


# torch.compile's modes (``mode=`` reaches a backend only where no options are given):
# saturn's default already replays static graphs as CUDA graphs and times the libraries'
# candidate plans on the first call, which is what "reduce-overhead" and "max-autotune" ask
# of Inductor; "max-autotune-no-cudagraphs" turns replay off
MODES: dict[str, dict] = {
    "default": {},
    "reduce-overhead": {"replay": True},
    "max-autotune": {"replay": True},
    "max-autotune-no-cudagraphs": {"replay": False},
}


def options_for_mode(mode: str) -> dict:
    """The options ``torch.compile(..., mode=mode)`` stands for."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"saturn: unknown mode {mode!r}; torch.compile modes: {list(MODES)}")
    return dict(MODES[mode])


def parse(options: dict | None) -> Options:
    """Validate user options; unknown names raise with the list of valid ones."""
    if options is not None and not isinstance(options, dict):
        raise ValueError(f"saturn: options must be a dict, got {type(options).__name__}")
    options = dict(options or {})
    unknown = sorted(set(options) - set(VALID))
    if unknown:
        raise ValueError(f"saturn: unknown option(s) {unknown}; valid options: {list(VALID)}")
    device = str(options.get("device") or default_device())
    d = torch.device(device)
    if d.type != "saturn":
        raise ValueError(f"saturn: option device must be a saturn device, got {device!r}")
    torch.saturn.device(d)  # raises for an index that does not exist
    from .custom_ops import pattern_rulesets

    rewrites = _names(options, "rewrites", "a ruleset name")
    valid = [*OPT_IN_RULESETS, *pattern_rulesets()]  # saturn's and custom ops' patterns
    bad = [r for r in rewrites if r not in valid]
    if bad:
        raise ValueError(f"saturn: unknown rewrites {bad}; valid: {valid}")
    rules = _names(options, "rules", "a path to an .egg file or a folder of them")
    if options.get("tf32") and options.get("tf32x3"):
        raise ValueError("saturn: options tf32 and tf32x3 exclude each other; choose one")
    names = ("iterations", "max_enodes", "seconds")
    bounds = {k: options.get(k, getattr(Bounds, k)) for k in names}
    try:
        Bounds(**bounds)
    except EqsatError as e:
        raise ValueError(f"saturn: option {e}") from None
    return Options(
        device=f"saturn:{d.index if d.index is not None else torch.saturn.current_device()}",
        device_given=bool(options.get("device")),
        rules=rules,
        rewrites=rewrites,
        iterations=bounds["iterations"],
        max_enodes=bounds["max_enodes"],
        seconds=float(bounds["seconds"]),
        replay=_flag(options, "replay", True),
        tf32=_flag(options, "tf32", False),
        tf32x3=_flag(options, "tf32x3", False),
        strict=_flag(options, "strict", False),
    )


def _names(options: dict, name: str, what: str) -> tuple[str, ...]:
    """One name or a list of them (None: none); each a str or a path."""
    v = options.get(name)
    if v is None:
        return ()
    items = [v] if isinstance(v, str | os.PathLike) else v
    if not isinstance(items, list | tuple):
        raise ValueError(f"saturn: option {name} must be {what} or a list of them, got {v!r}")
    for item in items:
        if not isinstance(item, str | os.PathLike):
            raise ValueError(f"saturn: option {name}: {item!r} is not {what}")
    return tuple(os.fspath(i) for i in items)


def _flag(options: dict, name: str, default: bool) -> bool:
    v = options.get(name, default)
    if not isinstance(v, bool):
        raise ValueError(f"saturn: option {name} must be True or False, got {v!r}")
    return v
