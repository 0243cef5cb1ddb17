"""The engine protocol: a scheduler that uses only what `EngineSimulation` declares
runs a simulation to completion, and settings that provide only `EngineSettings`
are enough for the simulation and the metrics."""

from dataclasses import dataclass

from conftest import finished, simulate

import pipesim
from pipesim.engines.protocol import EngineScheduler, EngineSimulation
from pipesim.measure.metrics import collect


class OneAtATime:
    """The simplest engine: admit one request, run its prompt and its decode steps,
    one batch in flight; nothing but the protocol's names."""

    def __init__(self, sim: EngineSimulation):
        self.sim = sim

    def run(self):
        sim = self.sim
        while True:
            if not sim.waiting:
                yield sim.wait_arrival()
                continue
            r = sim.waiting.popleft()
            assert sim.kv_free >= r.input_len + r.output_len and sim.running == 0
            sim.admit(r)
            yield from sim.cpu(sim.cpu_iteration_s)
            finished = yield sim.launch(0, [], [(r, r.input_len, 0)]).returned
            while not finished:
                finished = yield sim.launch(0, [r], []).returned

    def on_return(self, mb, finished) -> None:
        pass


@dataclass(frozen=True)
class StubSettings:
    kv_tokens: int = 100_000
    slots: int = 1
    running_cap: int = 1
    slot_cap: int = 0
    async_depth: int = 0
    inflight_groups: int = 0
    in_flight: int = 1

    def describe(self) -> dict:
        return {"engine": "stub"}

    def graphed(self, decode: int, prefill_tokens: int) -> bool:
        return False

    def scheduler(self, sim: EngineSimulation) -> EngineScheduler:
        return OneAtATime(sim)


def test_stub_engine_runs_to_completion(profile):
    """Four requests of 5 output tokens, served one at a time: every request finishes
    with all its tokens, never two at once, and each decode batch holds one request."""
    sc = pipesim.build_scenario(
        tp=1,
        pp=2,
        rate_rps=100.0,
        num_requests=4,
        model="llama-3.1-8b",
        input_len="32",
        output_len="5",
        profile=profile,
    )
    st = StubSettings()
    sim = simulate(sc, 0, 4, settings=st)
    assert len(finished(sim)) == 4 and all(r.generated == 5 for r in finished(sim))
    spans = sorted((r.arrival_s, r.finish_s) for r in finished(sim))
    rec = sim.record()
    assert len(rec.batches) == 4 * 5  # a prefill and 4 decode steps each
    assert all(b.requests == 1 for b in rec.batches)
    assert sum(t.tokens for t in rec.tokens) == 20
    res = collect(rec, {"engine": st.describe()}, 0.0)
    assert res.completed_requests == 4 and res.mean_decode_batch == 1.0
    firsts = sorted(r.first_token_s for r in finished(sim))
    finishes = sorted(r.finish_s for r in finished(sim))
    assert all(f <= nxt for f, nxt in zip(finishes, firsts[1:]))  # never two running at once
    assert spans[0][0] <= spans[0][1]


# ---- what each side declares, and uses ------------------------------------------------------


def _members(protocol: type) -> set[str]:
    """The names a Protocol declares: its annotations, properties and methods."""
    own = {n for n in vars(protocol) if not n.startswith("_")}
    return own | set(getattr(protocol, "__annotations__", {}))


def test_every_engine_config_has_what_engine_config_declares():
    from pipesim.engines import ENGINES
    from pipesim.engines.knobs import knob_names
    from pipesim.engines.protocol import EngineConfig

    assert _members(EngineConfig) == {
        "name",
        "title",
        "partition_rule",
        "running_cap_knob",
        "prefill_chunk_knob",
        "derived_from",
        "__dataclass_fields__",  # a frozen dataclass: replace() changes its knobs
        "validate",
        "memory_fraction",
        "memory_rule",
        "resolve",
    }
    for name, cls in ENGINES.items():
        assert all(hasattr(cls, m) for m in _members(EngineConfig)), cls
        assert cls.name == name
        # a derived knob and its source are both the engine's knobs, as are the knobs a
        # planner sweeps (explore/screen.py)
        for source, derived in cls.derived_from.items():
            assert {source, *derived} <= set(knob_names(cls))
        assert {cls.running_cap_knob, cls.prefill_chunk_knob} <= set(knob_names(cls))


def test_every_engine_settings_has_what_engine_settings_declares():
    from pipesim.engines.protocol import EngineSettings
    from pipesim.engines.sglang_loop import SGLangSettings
    from pipesim.engines.vllm_loop import VLLMSettings

    fields_or_members = lambda cls: set(vars(cls)) | set(cls.__dataclass_fields__)  # noqa: E731
    for cls in (SGLangSettings, VLLMSettings):
        assert _members(EngineSettings) <= fields_or_members(cls), cls


def _attributes_of(path, owner: str) -> set[str]:
    """Attributes a module reads or writes on `owner`: a name, or any `x.<owner>`
    (self.sim, scenario.settings)."""
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            v = node.value
            if (isinstance(v, ast.Name) and v.id == owner) or (
                isinstance(v, ast.Attribute) and v.attr == owner
            ):
                out.add(node.attr)
    return out


def test_the_schedulers_use_only_what_engine_simulation_declares():
    from pathlib import Path

    import pipesim.engines as engines
    from pipesim.engines.protocol import EngineSimulation

    declared = _members(EngineSimulation)
    used = set()
    for path in sorted(Path(engines.__file__).parent.glob("*.py")):
        used |= _attributes_of(path, "sim")
    assert used, "the check read no scheduler"
    assert used <= declared, sorted(used - declared)
    assert {"next_iteration", "pp", "kv_free", "launch"} <= used  # what the schedulers do use


def test_the_simulation_asks_settings_only_what_engine_settings_declares():
    from pathlib import Path

    import pipesim.sim as sim
    from pipesim.engines.protocol import EngineSettings

    used = set()
    for path in sorted(Path(sim.__file__).parent.glob("*.py")):
        used |= _attributes_of(path, "settings")
    assert used, "the check read no simulation module"
    assert used <= _members(EngineSettings), sorted(used - _members(EngineSettings))
