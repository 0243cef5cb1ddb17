"""Every engine knob is declared once, on its config field (pipesim/engines/knobs.py), and
reaches the engine from the command line and from the Python API.

The cases below are written by hand from the engines' own flags (SGLang
python/sglang/srt/server_args.py; vLLM vllm/engine/arg_utils.py, where every boolean
has a --no- form), not read from the declarations: a declaration with the wrong flag,
or one left off the command line, fails them. A coverage test makes the list grow with
the declarations."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
from click.testing import CliRunner

import pipesim
from pipesim.base.errors import UserError
from pipesim.base.files import read_table
from pipesim.cli import cli, main
from pipesim.engines import ENGINES
from pipesim.engines.knobs import KEY, by_name, knob, knobs, markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "engines.md"
LLAMA = dict(model="llama-3.1-8b", input_len="16", output_len="8")
LLAMA_ARGS = ["--model", "llama-3.1-8b", "--conc", "1", "--input-len", "16", "--output-len", "8"]

# (engine, command-line flags, the same as build_scenario keywords, the knob, what the
# resolved settings (Scenario.describe()["engine"]) must then hold)
CASES = [
    ("sglang", ["--max-running-requests", "48"], dict(max_running_requests=48), "max_running_requests",
     lambda e: e["max_running_requests"] == 48),
    ("sglang", ["--pp-max-micro-batch-size", "5"], dict(pp_max_micro_batch_size=5), "pp_max_micro_batch_size",
     lambda e: e["pp_max_micro_batch_size"] == 5),
    # event_loop_pp: pp_loop_size = pp_size + pp_async_batch_depth slots
    ("sglang", ["--pp", "2", "--pp-async-batch-depth", "2"], dict(pp=2, pp_async_batch_depth=2),
     "pp_async_batch_depth", lambda e: e["pp_async_batch_depth"] == 2 and e["slots"] == 4),
    ("sglang", ["--chunked-prefill-size", "1024"], dict(chunked_prefill_size=1024), "chunked_prefill_size",
     lambda e: e["chunked_prefill_size"] == 1024),
    ("sglang", ["--max-prefill-tokens", "4096"], dict(max_prefill_tokens=4096), "max_prefill_tokens",
     lambda e: e["max_prefill_tokens"] == 4096),
    ("sglang", ["--mem-fraction-static", "0.6"], dict(mem_fraction_static=0.6), "mem_fraction_static",
     lambda e: e["mem_fraction_static"] == 0.6),
    # init_memory_pool: max_total_num_tokens = min(profiled, max_total_tokens)
    ("sglang", ["--max-total-tokens", "5000"], dict(max_total_tokens=5000), "max_total_tokens",
     lambda e: e["kv_tokens"] == 5000),
    # --disable-cuda-graph: no batch size is captured (cuda_graph_max_bs 0: every batch eager)
    ("sglang", ["--disable-cuda-graph"], dict(disable_cuda_graph=True), "disable_cuda_graph",
     lambda e: e["cuda_graph_max_bs"] == 0),
    ("sglang", ["--cuda-graph-max-bs", "24"], dict(cuda_graph_max_bs=24), "cuda_graph_max_bs",
     lambda e: e["cuda_graph_max_bs"] == 24),
    # the overlap scheduler (on by default from 0.3.6 at pp 1) off
    ("sglang", ["--disable-overlap-schedule"], dict(disable_overlap_schedule=True), "disable_overlap_schedule",
     lambda e: e["host"]["overlap"] is False),
    ("vllm", ["--max-num-seqs", "12"], dict(max_num_seqs=12), "max_num_seqs", lambda e: e["max_num_seqs"] == 12),
    ("vllm", ["--max-num-batched-tokens", "1024"], dict(max_num_batched_tokens=1024), "max_num_batched_tokens",
     lambda e: e["max_num_batched_tokens"] == 1024),
    # max_concurrent_batches: pp + 1 with async scheduling; pp (here 1) without it
    ("vllm", ["--pp", "2", "--async-scheduling"], dict(pp=2, async_scheduling=True), "async_scheduling",
     lambda e: e["async_scheduling"] is True and e["max_concurrent_batches"] == 3),
    ("vllm", ["--no-async-scheduling"], dict(async_scheduling=False), "async_scheduling",
     lambda e: e["async_scheduling"] is False and e["max_concurrent_batches"] == 1),
    ("vllm", ["--gpu-memory-utilization", "0.6"], dict(gpu_memory_utilization=0.6), "gpu_memory_utilization",
     lambda e: e["gpu_memory_utilization"] == 0.6),
    # --enforce-eager captures nothing; without it the largest capture is
    # min(max_num_seqs x 2, 512) = 512 at the default 1024 sequences (_set_cudagraph_sizes)
    ("vllm", ["--enforce-eager"], dict(enforce_eager=True), "enforce_eager",
     lambda e: e["cudagraph_max_tokens"] == 0 and list(e["cudagraph_capture_sizes"]) == []),
    ("vllm", ["--no-enforce-eager"], dict(enforce_eager=False), "enforce_eager",
     lambda e: e["cudagraph_max_tokens"] == 512),
    ("vllm", ["--no-enable-prefix-caching"], dict(enable_prefix_caching=False), "enable_prefix_caching",
     lambda e: e["enable_prefix_caching"] is False),
    ("vllm", ["--enable-prefix-caching"], dict(enable_prefix_caching=True), "enable_prefix_caching",
     lambda e: e["enable_prefix_caching"] is True),
    ("vllm", ["--no-enable-chunked-prefill"], dict(enable_chunked_prefill=False), "enable_chunked_prefill",
     lambda e: e["chunked_prefill"] is False),
    ("vllm", ["--enable-chunked-prefill"], dict(enable_chunked_prefill=True), "enable_chunked_prefill",
     lambda e: e["chunked_prefill"] is True),
    # V0's (0.6-0.7): multi-step scheduling and the async output processor
    ("vllm", ["--engine-version", "0.6.3.post1", "--num-scheduler-steps", "8"],
     dict(engine_version="0.6.3.post1", num_scheduler_steps=8), "num_scheduler_steps",
     lambda e: e["host"]["scheduler_steps"] == 8 and e["host"]["generation"] == "V0"),
    ("vllm", ["--engine-version", "0.6.3.post1", "--disable-async-output-proc"],
     dict(engine_version="0.6.3.post1", disable_async_output_proc=True), "disable_async_output_proc",
     lambda e: e["host"]["async_output"] is False and e["host"]["generation"] == "V0"),
]  # fmt: skip
IDS = [" ".join(c[1]) for c in CASES]


def test_the_cases_cover_every_declared_knob_and_flag():
    declared = {(name, k.name) for name, cls in ENGINES.items() for k in knobs(cls)}
    assert {(engine, knob_name) for engine, _, _, knob_name, _ in CASES} == declared
    flags = {f for cls in ENGINES.values() for k in knobs(cls) for f in k.flags}
    given = {
        a
        for _, argv, *_ in CASES
        for a in argv
        if a.startswith("--") and a not in ("--pp", "--engine-version")
    }
    assert given == flags


@pytest.mark.parametrize("engine, argv, kwargs, knob_name, holds", CASES, ids=IDS)
def test_each_flag_reaches_the_resolved_settings(capsys, engine, argv, kwargs, knob_name, holds):
    main(["predict", *LLAMA_ARGS, "--engine", engine, "--json", "--no-intervals", *argv])
    sc = json.loads(capsys.readouterr().out)["scenario"]
    assert sc["knob_sources"][knob_name] == "user"
    assert holds(sc["engine"]), sc["engine"]
    assert [k for k, source in sc["knob_sources"].items() if source == "user"] == [knob_name]


@pytest.mark.parametrize("engine, argv, kwargs, knob_name, holds", CASES, ids=IDS)
def test_each_keyword_reaches_the_resolved_settings(engine, argv, kwargs, knob_name, holds):
    sc = pipesim.build_scenario(engine=engine, concurrency=1, **LLAMA, **kwargs)
    assert sc.knob_sources[knob_name] == "user"
    assert holds(sc.describe()["engine"])


@pytest.mark.parametrize("command", ["predict", "trace", "sweep", "search"])
def test_every_command_takes_every_flag_with_its_help(command):
    text = " ".join(CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output.split())
    for cls in ENGINES.values():
        for k in knobs(cls):
            assert " / ".join(k.flags) in text
            help_text = f"{cls.title}: {k.help}" + ("" if k.switch else f" [default: {k.default_text}]")
            assert help_text in text


def test_the_sweep_keeps_a_knob_among_its_options(tmp_path, capsys):
    out = tmp_path / "r.csv"
    main(["sweep", "--gpus", "1", *LLAMA_ARGS, "--engine", "vllm", "--workers", "1", "--out", str(out),
          "--no-enable-prefix-caching"])  # fmt: skip
    capsys.readouterr()
    options = json.loads(read_table(out).sweep_options.iloc[0])
    assert options["enable_prefix_caching"] is False


# ---- the message that lists an engine's knobs ---------------------------------------------


@pytest.mark.parametrize("engine, foreign", [("sglang", "max_num_seqs"), ("vllm", "max_running_requests")])
def test_an_unknown_knob_lists_exactly_the_engines_knobs(engine, foreign):
    with pytest.raises(UserError) as exc:
        pipesim.build_scenario(engine=engine, concurrency=1, **LLAMA, **{foreign: 8})
    head, listed = str(exc.value).split(f"; {engine} knobs: ")
    assert head == f"{foreign} is not a {engine} knob"
    names = listed.split(", ")
    assert names == sorted(names)
    assert set(names) == {knob_name for e, _, _, knob_name, _ in CASES if e == engine}
    assert set(names) == {f.name for f in fields(ENGINES[engine])}


def test_a_typo_on_the_command_line_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["predict", *LLAMA_ARGS, "--max-num-seqs", "8"])  # a vLLM knob, SGLang the default engine
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.strip().endswith(
        "max_num_seqs is not a sglang knob; sglang knobs: chunked_prefill_size, cuda_graph_max_bs, "
        "disable_cuda_graph, disable_overlap_schedule, max_prefill_tokens, max_running_requests, max_total_tokens, "
        "mem_fraction_static, pp_async_batch_depth, pp_max_micro_batch_size"
    )


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--max-prefill-tokens", "0"], "--max-prefill-tokens must be a whole number >= 1, got 0"),
        (["--cuda-graph-max-bs", "70000"], "--cuda-graph-max-bs 70000 is above the limit of 65536"),
        (["--engine", "vllm", "--max-num-batched-tokens", "-3"], "--max-num-batched-tokens must be a whole"),
    ],
)
def test_a_bad_value_of_a_new_flag_is_one_line(capsys, argv, says):
    with pytest.raises(SystemExit) as exc:
        main(["predict", *LLAMA_ARGS, *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_a_bad_value_through_the_api_names_the_flag():
    with pytest.raises(UserError, match="--enforce-eager must be True or False, got 'yes'"):
        pipesim.build_scenario(engine="vllm", concurrency=1, enforce_eager="yes", **LLAMA)


# ---- the declarations themselves ----------------------------------------------------------


def test_every_config_field_is_a_declared_knob():
    for cls in ENGINES.values():
        assert [k.name for k in knobs(cls)] == [f.name for f in fields(cls)]
        assert all(KEY in f.metadata for f in fields(cls))


def test_an_undeclared_field_is_refused():
    @dataclass(frozen=True)
    class Sneaky:
        declared: int = knob(1, help="h", source="s", bounds=(1, 2))
        extra: int = 0

    with pytest.raises(TypeError, match=r"Sneaky\.extra is not declared"):
        knobs(Sneaky)


def test_a_knob_without_its_rule_or_bounds_is_refused():
    with pytest.raises(TypeError, match="says what the engine derives"):
        knob(None, help="h", source="s")

    @dataclass(frozen=True)
    class Unbounded:
        n: int = knob(1, help="h", source="s")

    with pytest.raises(TypeError, match="declares its bounds"):
        knobs(Unbounded)


def test_two_engines_may_share_a_knob_only_as_one_flag():
    @dataclass(frozen=True)
    class A:
        eager: bool = knob(False, help="h", source="s", negatable=True)

    @dataclass(frozen=True)
    class B:
        eager: bool = knob(False, help="h", source="s")  # a switch: another flag set

    @dataclass(frozen=True)
    class C:
        eager: bool = knob(False, help="h", source="s", negatable=True)

    with pytest.raises(TypeError, match="declare it apart"):
        by_name([A, B])
    assert by_name([A, C])["eager"][1] == (A, C)


def test_the_flags_are_the_engines():
    # SGLang's --disable-cuda-graph is store_true (a switch); vLLM's booleans have --no- forms
    sglang = {k.name: k.flags for k in knobs(ENGINES["sglang"])}
    vllm = {k.name: k.flags for k in knobs(ENGINES["vllm"])}
    assert sglang["disable_cuda_graph"] == ("--disable-cuda-graph",)
    assert vllm["enable_prefix_caching"] == ("--enable-prefix-caching", "--no-enable-prefix-caching")
    assert vllm["enforce_eager"] == ("--enforce-eager", "--no-enforce-eager")


# ---- the table of docs/engines.md ---------------------------------------------------------

BEGIN = "<!-- knob table: generated from pipesim/engines/knobs.py, do not edit by hand -->\n"
END = "\n<!-- end of knob table -->"


def doc_table(text: str) -> str:
    m = re.search(re.escape(BEGIN) + "(.*?)" + re.escape(END), text, re.DOTALL)
    assert m, "docs/engines.md has no knob table between its markers"
    return m.group(1)


def test_the_docs_table_matches_the_declarations():
    want = markdown(ENGINES.values())
    assert doc_table(DOC.read_text()) == want, (
        "docs/engines.md's knob table is stale: run python tests/test_knob_declarations.py"
    )


if __name__ == "__main__":  # rewrite the table from the declarations
    text = DOC.read_text()
    DOC.write_text(text.replace(BEGIN + doc_table(text) + END, BEGIN + markdown(ENGINES.values()) + END))
