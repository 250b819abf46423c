"""Backend registration, options, the compile cache, and graphs that run uncompiled."""

from __future__ import annotations

import inspect
import logging

import pytest
import torch

import saturn
from saturn import backend

from .helpers import DEV


def test_registered_through_the_entry_point_only():
    assert "saturn" in torch._dynamo.list_backends()
    src = inspect.getsource(backend)
    assert "register_backend(" not in src.replace("must not also call ``register_backend``", "")


def test_unknown_option_is_rejected_with_the_valid_list():
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + 1, backend="saturn", options={"devcie": "saturn:0"})
    with pytest.raises(Exception, match=r"unknown option\(s\) \['devcie'\]; valid options"):
        fn(torch.ones(2).to(DEV))


def test_precision_options_exclude_each_other():
    from saturn.options import parse

    assert parse({"device": DEV}).precision == "fp32"
    assert parse({"device": DEV, "tf32x3": True}).precision == "tf32x3"
    with pytest.raises(ValueError, match="tf32 and tf32x3 exclude each other"):
        parse({"device": DEV, "tf32": True, "tf32x3": True})
    with pytest.raises(ValueError, match="tf32x3 must be True or False"):
        parse({"device": DEV, "tf32x3": "yes"})


@pytest.mark.parametrize(
    "options,message",
    [
        ({"iterations": -5}, "iterations must be a whole number >= 1, got -5"),
        ({"iterations": 0}, "iterations must be a whole number >= 1, got 0"),
        ({"iterations": 2.7}, "iterations must be a whole number >= 1, got 2.7"),
        ({"iterations": True}, "iterations must be a whole number >= 1, got True"),
        ({"max_enodes": -1}, "max_enodes must be a whole number >= 1, got -1"),
        ({"seconds": float("nan")}, "seconds must be a finite number > 0, got nan"),
        ({"seconds": "10"}, "seconds must be a finite number > 0, got '10'"),
        ({"seconds": 0}, "seconds must be a finite number > 0, got 0"),
        ({"rules": 5}, "option rules must be a path"),
        ({"rules": ["a.egg", 3]}, "option rules: 3 is not a path"),
        ({"rewrites": ["patterns", None]}, "option rewrites: None is not a ruleset name"),
        ({"rewrites": "pattern"}, r"unknown rewrites \['pattern'\]"),
    ],
)
def test_bad_options_raise_clear_errors(options, message):
    from saturn.options import parse

    with pytest.raises(ValueError, match=message):
        parse({"device": DEV, **options})


def test_names_options_take_one_name_or_a_list():
    """A single string is one name, not its letters; None is no extra rules."""
    from saturn.options import parse

    assert parse({"device": DEV, "rewrites": "patterns"}).rewrites == ("patterns",)
    assert parse({"device": DEV, "rules": None}).rules == ()
    assert parse({"device": DEV, "seconds": 2, "iterations": 3}).bounds.seconds == 2.0


def test_a_broken_rule_file_raises_naming_file_and_line(tmp_path):
    """The user's own rule file is theirs to fix: a typo raises (file, line, column),
    it does not run the graph uncompiled with a warning."""
    bad = tmp_path / "typo.egg"
    bad.write_text("(ruleset mine)\n\n(rewrite (Exp x) (Expp x) :ruleset mine)\n")
    torch._dynamo.reset()
    before = len(backend.CACHE.fallbacks)
    fn = torch.compile(lambda x: x.exp() + 1, backend="saturn", options={"rules": str(bad)})
    with pytest.raises(Exception, match=r"typo.egg:3:\d+: .*Expp") as info:
        fn(torch.ones(3).to(DEV))
    assert "RuleError" in str(info.value)
    assert len(backend.CACHE.fallbacks) == before


def test_the_compile_target_follows_the_inputs_unless_given():
    """Without the ``device`` option a graph compiles for the saturn device its inputs are
    on (so saturn:0 tensors on a machine with a GPU are compiled for saturn:0, not refused
    for not being on saturn:1); a given device is kept, and a mismatch is the logged
    reason the graph runs uncompiled."""
    from saturn.options import Options

    x = torch.ones(2).to(DEV)
    default_gpu = Options(device="saturn:1")
    assert backend._target(default_gpu, [x, torch.tensor(1.0)]) == torch.device(DEV)
    given = Options(device="saturn:1", device_given=True)
    assert backend._target(given, [x]) == torch.device("saturn:1")
    assert backend._target(default_gpu, [torch.ones(2)]) == torch.device("saturn:1")


@pytest.mark.gpu
def test_a_saturn0_graph_compiles_for_saturn0_on_a_gpu_machine():
    torch._dynamo.reset()
    before = len(backend.CACHE.fallbacks)
    fn = torch.compile(lambda x: torch.relu(x) * 2, backend="saturn")
    x = torch.randn(8)
    assert torch.equal(fn(x.to(DEV)).cpu(), torch.relu(x) * 2)
    assert backend.CACHE.fallbacks[before:] == [], "ran uncompiled"
    g = next(reversed(backend.CACHE.items.values()))
    assert g.recipe.device == torch.device(DEV)


def test_same_graph_from_two_call_sites_compiles_once_until_a_reset():
    torch._dynamo.reset()
    backend.CACHE.clear()
    x = torch.randn(3, 5).to(DEV)

    def site_a(x):
        return torch.tanh(x) * 3.0

    def site_b(y):
        return torch.tanh(y) * 3.0

    before = backend.CACHE.compiles
    with torch.no_grad():
        a = torch.compile(site_a, backend="saturn", dynamic=False)(x)
        b = torch.compile(site_b, backend="saturn", dynamic=False)(x)
    assert backend.CACHE.compiles == before + 1
    assert len(backend.CACHE.items) == 1
    torch.compiler.reset()  # drops dynamo's compiled frames and saturn's recipes
    assert len(backend.CACHE.items) == 0
    with torch.no_grad():
        c = torch.compile(site_a, backend="saturn", dynamic=False)(x)
    assert backend.CACHE.compiles == before + 2
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(a.cpu(), c.cpu())


def test_unrepresentable_graph_runs_uncompiled_with_a_logged_reason(caplog):
    torch._dynamo.reset()
    fn = torch.compile(lambda x: (x * 2).sum(), backend="saturn", dynamic=False)
    x = torch.randn(4, dtype=torch.complex64)
    with caplog.at_level(logging.WARNING, logger="saturn"), torch.no_grad():
        got = fn(x.to(DEV))
    assert torch.allclose(got.cpu(), (x * 2).sum())
    assert any("runs uncompiled" in r.message and "complex64" in r.message for r in caplog.records)


def test_recipe_checks_its_inputs():
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(lambda x: x.exp(), backend="saturn", dynamic=False)(torch.ones(3).to(DEV))
    recipe = next(reversed(backend.CACHE.items.values())).recipe
    with pytest.raises(RuntimeError, match="takes 1 inputs"):
        recipe([])
    with pytest.raises(RuntimeError, match=r"compiled for torch.float32\[3\]"):
        recipe([torch.ones(4).to(DEV)])
    assert saturn is not None


@pytest.mark.parametrize(
    "mode,replay",
    [
        ("default", True),
        ("reduce-overhead", True),
        ("max-autotune", True),
        ("max-autotune-no-cudagraphs", False),
    ],
)
def test_torch_compile_modes_map_to_options(mode, replay):
    torch._dynamo.reset()
    x = torch.randn(3, 4).to(DEV)
    fn = torch.compile(lambda x: torch.cos(x) + 1, backend="saturn", mode=mode, dynamic=False)
    with torch.no_grad():
        got = fn(x)
    torch.testing.assert_close(got.cpu(), torch.cos(x.cpu()) + 1, rtol=1e-5, atol=1e-5)
    assert next(reversed(backend.CACHE.items.values())).recipe.replay == replay


def test_an_unknown_mode_names_the_modes():
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + 1, backend="saturn", mode="fastest")
    with pytest.raises(Exception, match=r"unknown mode 'fastest'.*reduce-overhead"):
        fn(torch.ones(2).to(DEV))


def test_strict_raises_with_the_reason_instead_of_running_uncompiled():
    torch._dynamo.reset()
    x = torch.randn(4, dtype=torch.complex64).to(DEV)
    fn = torch.compile(
        lambda x: (x * 2).sum(), backend="saturn", options={"strict": True}, dynamic=False
    )
    before = len(backend.CACHE.fallbacks)
    with pytest.raises(Exception, match=r"saturn \(strict\).*complex64") as e, torch.no_grad():
        fn(x)
    # dynamo wraps what a backend raises; the inner exception is saturn's
    assert isinstance(getattr(e.value, "inner_exception", e.value), saturn.NotCompiledError)
    assert backend.CACHE.fallbacks[before:] == []  # nothing ran uncompiled
    # not strict (the default): the same graph runs uncompiled, counted with its reason
    torch._dynamo.reset()
    stats = saturn.stats()
    with torch.no_grad():
        torch.compile(lambda x: (x * 2).sum(), backend="saturn", dynamic=False)(x)
    after = saturn.stats()
    assert after["graphs_uncompiled"] == stats["graphs_uncompiled"] + 1
    assert "complex64" in after["uncompiled_reasons"][-1]


def test_fullgraph_is_strict_unless_told_otherwise():
    """torch.compile(fullgraph=True) asks for one graph: a graph saturn cannot compile
    raises with the reason, as a graph break would, instead of running uncompiled; an
    explicit ``strict: False`` still runs it uncompiled."""
    x = torch.randn(4, dtype=torch.complex64).to(DEV)
    torch._dynamo.reset()
    before = len(backend.CACHE.fallbacks)
    fn = torch.compile(lambda x: (x * 2).sum(), backend="saturn", fullgraph=True, dynamic=False)
    with pytest.raises(Exception, match=r"saturn \(strict\).*complex64"), torch.no_grad():
        fn(x)
    assert backend.CACHE.fallbacks[before:] == []
    torch._dynamo.reset()
    fn = torch.compile(
        lambda x: (x * 2).sum(),
        backend="saturn",
        fullgraph=True,
        options={"strict": False},
        dynamic=False,
    )
    with torch.no_grad():
        torch.testing.assert_close(fn(x).cpu(), (x.cpu() * 2).sum())
    assert len(backend.CACHE.fallbacks) == before + 1
    # without fullgraph the backend is not strict (the default)
    assert backend._fullgraph() is False


def test_stats_count_graphs_host_ops_and_crossings():
    torch._dynamo.reset()
    before = saturn.stats()
    x = torch.randn(5, 3)  # CPU inputs compiled for saturn:0: they cross to the device
    fn = torch.compile(
        lambda x: torch.sin(x) * 2, backend="saturn", options={"device": DEV}, dynamic=False
    )
    with torch.no_grad():
        fn(x)
    after = saturn.stats()
    prog = next(reversed(backend.CACHE.items.values())).compiled.program
    assert after["graphs_compiled"] == before["graphs_compiled"] + 1
    assert after["crossings"] - before["crossings"] == prog.count("crossing")
    assert after["host_ops"] - before["host_ops"] == prog.count("host")
    assert set(after) >= {"failed_calls", "eager_fallbacks", "custom_op_fallbacks"}


def test_explain_leaves_the_callers_compiled_functions_compiled():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    x = torch.randn(4, 4).to(DEV)

    def f(x):
        return torch.sin(x) * 2 + x.sum()

    g = torch.compile(f, backend="saturn", dynamic=False)
    with torch.no_grad():
        g(x)
        ex = saturn.explain(f, x)
        graphs = counters["stats"]["unique_graphs"]
        got = g(x)  # still compiled: dynamo traces nothing again
    assert counters["stats"]["unique_graphs"] == graphs
    torch.testing.assert_close(got.cpu(), f(x.cpu()), rtol=1e-5, atol=1e-5)
    # the summary comes first: one line per graph with its totals
    first = str(ex).splitlines()
    assert first[0] == "saturn compiled 1 graph(s), 0 ran uncompiled"
    assert first[1].startswith("  graph 0: 4 ops; kernels: ") and "launches" in first[1]


def test_a_profiler_trace_names_saturns_steps_by_the_ops_they_compute(tmp_path):
    torch._dynamo.reset()
    x = torch.randn(8, 8).to(DEV)

    def f(x):
        return torch.relu(torch.sin(x) * 2 + 1).sum(0)

    g = torch.compile(f, backend="saturn", dynamic=False)
    with torch.no_grad():
        g(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
            g(x)
    names = [e.name for e in p.events() if e.name.startswith("saturn ")]
    prog = next(reversed(backend.CACHE.items.values())).compiled.program
    assert len(names) == len(prog.kernels), names
    fused = names[0]  # one kernel computing the whole graph: every op named in its range
    assert all(op in fused for op in ("sin", "mul", "add", "relu", "sum")), fused
    trace = tmp_path / "trace.json"
    p.export_chrome_trace(str(trace))
    assert fused in trace.read_text()
    # no profiler, no ranges: the labels are made only while one records
    recipe = next(reversed(backend.CACHE.items.values())).recipe
    recipe._labels.clear()
    with torch.no_grad():
        g(x)
    assert recipe._labels == {}


def test_a_slow_compile_logs_its_stages_at_info(caplog, monkeypatch):
    """Every compile times its stages; one longer than the threshold logs them (here the
    threshold is 0 s, so any compile is slow), explain and --emit stats show them."""
    monkeypatch.setattr(backend, "SLOW_COMPILE_S", 0.0)
    torch._dynamo.reset()
    x = torch.randn(6, 5).to(DEV)

    def f(x):
        return torch.softmax(x * 2, -1)

    with caplog.at_level(logging.INFO, logger="saturn"), torch.no_grad():
        torch.compile(f, backend="saturn", dynamic=False)(x)
    lines = [r.message for r in caplog.records if "compiled a graph" in r.message]
    assert len(lines) == 1, [r.message for r in caplog.records]
    for stage in ("import", "saturate", "read back", "typing", "extract", "lower"):
        assert f"{stage} " in lines[0], lines[0]
    assert "e-nodes" in lines[0] and "kernels" in lines[0]
    stages = next(reversed(backend.CACHE.items.values())).compiled.stages
    assert stages.total == pytest.approx(sum(stages.seconds.values()))
    assert min(stages.seconds.values()) >= 0 and stages.slowest() in stages.seconds
    # around the compile: constants folded before it, the first call's own run after it
    assert {"fold constants", "first run"} <= set(stages.seconds), stages.seconds
    assert "compiled in" in saturn.explain(f, x).summary()
    # the default threshold: a compile this small logs nothing
    monkeypatch.setattr(backend, "SLOW_COMPILE_S", 60.0)
    caplog.clear()
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="saturn"), torch.no_grad():
        torch.compile(f, backend="saturn", dynamic=False)(x)
    assert not [r for r in caplog.records if "compiled a graph" in r.message]


def test_the_decomposition_table_is_built_once_and_again_for_new_composite_kernels():
    """Decision 0093: the table is kept; a library registering a CompositeImplicitAutograd
    kernel afterwards gets a table built again. Callers get copies."""
    from saturn import decompositions

    first = decompositions.table()
    kept = decompositions._TABLE["table"]
    first.clear()  # a caller's change stays its own
    second = decompositions.table()
    assert decompositions._TABLE["table"] is kept and second and second.keys() == kept.keys()
    assert torch.ops.aten.gather.default in second  # saturn's own entries are in it
    assert "aten.gelu.default" not in {str(op) for op in second}  # imported whole
    lib = torch.library.Library("saturn_test_cia", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
    decompositions.table()
    assert decompositions._TABLE["table"] is not kept
