"""The Chrome trace: valid trace event format, one track per GPU and per hop, slices
that never overlap on a track, bubbles counted as the gaps a reader sees, and the
idle breakdown adding up to the Result's bubble fraction."""

import dataclasses
import json
from collections import defaultdict
from functools import partial

import pytest
from conftest import small_kv_scenario

from pipesim.cli import main
from pipesim.measure.metrics import idle_breakdown
from pipesim.measure.tally import covered_s, gaps, merge
from pipesim.report.trace import build_trace
from pipesim.scenario.build import build_scenario
from pipesim.sim.runner import simulate as run_scenario

simulate = partial(run_scenario, record="full")  # a trace draws every row

SMALL = dict(model="kimi-k2.6", input_len="64", output_len="24")
META_NAMES = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


def _ns(us: float) -> int:
    return int(round(us * 1000))


def validate(trace: dict) -> None:
    """The trace event format (JSON object form): what Perfetto and chrome://tracing need."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    assert trace["displayTimeUnit"] in ("ms", "ns")
    json.dumps(trace, allow_nan=False)  # plain JSON: no NaN or Infinity
    for ev in trace["traceEvents"]:
        assert isinstance(ev["name"], str) and isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ev["ph"] == "X":
            assert isinstance(ev["ts"], (int, float)) and isinstance(ev["dur"], (int, float))
            assert ev["ts"] >= 0 and ev["dur"] >= 0
            assert isinstance(ev.get("cat", ""), str) and isinstance(ev.get("args", {}), dict)
            if "bind_id" in ev:  # a flow (version 2): bound to this slice, in or out or both
                assert isinstance(ev["bind_id"], int) and (ev.get("flow_in") or ev.get("flow_out"))
        elif ev["ph"] == "M":
            assert ev["name"] in META_NAMES
            key = "name" if ev["name"].endswith("_name") else "sort_index"
            assert set(ev["args"]) == {key}
        elif ev["ph"] == "C":  # a counter sample: numeric series values at a time
            assert ev["args"] and all(isinstance(v, (int, float)) for v in ev["args"].values())
            assert ev["ts"] >= 0
        elif ev["ph"] == "i":  # an instant event, process-scoped
            assert ev["s"] == "p" and ev["ts"] >= 0
        else:
            raise AssertionError(f"unexpected event phase {ev['ph']}")


def tracks(trace: dict) -> dict:
    """(pid, tid) -> sorted [(start ns, end ns, event)] of the complete slices."""
    out = defaultdict(list)
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X":
            a = _ns(ev["ts"])
            out[(ev["pid"], ev["tid"])].append((a, a + _ns(ev["dur"]), ev))
    return {k: sorted(v, key=lambda x: x[:2]) for k, v in out.items()}


def names(trace: dict, kind: str) -> dict:
    return {
        (ev["pid"], ev["tid"]): ev["args"]["name"]
        for ev in trace["traceEvents"]
        if ev["ph"] == "M" and ev["name"] == kind
    }


@pytest.fixture(scope="module")
def tp2pp4(profile):
    sim, result = simulate(
        build_scenario(tp=2, pp=4, concurrency=8, profile=profile, **SMALL), ci_target=None
    )
    return sim, result, build_trace(sim, result)


def test_window_ends_at_the_stopping_completion(tp2pp4):
    """A fixed-length closed loop stops at the completion that meets its target: the
    window (and the trace's window slice) ends at the last measured finish, measures
    at least max(2C, 16) requests, and starts after the C warm-up completions."""
    rec, r, trace = tp2pp4
    t0, t1 = r.window_s
    assert rec.end_s == t1 == r.requests.finish_s.max()
    assert r.completed_requests >= 16 and (r.requests.finish_s > t0).all() and t0 > 0
    [win] = [ev for ev in trace["traceEvents"] if ev.get("cat") == "window"]
    assert _ns(win["ts"]) == round(t0 * 1e9) and _ns(win["ts"] + win["dur"]) == pytest.approx(
        round(t1 * 1e9), abs=1
    )


def test_trace_is_valid_and_slices_never_overlap(tp2pp4):
    _, _, trace = tp2pp4
    validate(trace)
    for key, slices in tracks(trace).items():
        for (_a0, a1, _), (b0, _b1, _) in zip(slices, slices[1:]):
            assert b0 >= a1, f"track {key}: slices overlap at {b0} ns"


def test_one_track_per_gpu_and_per_hop(tp2pp4):
    sim, _, trace = tp2pp4
    threads = names(trace, "thread_name")
    gpu_tracks = {tid for (pid, tid) in threads if pid == 1}
    hop_tracks = {tid for (pid, tid) in threads if pid == 2}
    assert gpu_tracks == set(range(8))  # TP2 x PP4 = 8 GPUs
    assert hop_tracks == set(range(4))  # 3 stage-to-stage hops + tokens back
    assert "stage 1, TP rank 0" in threads[(1, 2)]  # GPUs 2, 3 hold stage 1
    assert "stage3->stage0" in threads[(2, 3)]
    assert set(names(trace, "process_name")) >= {(1, 0), (2, 0), (3, 0)}
    tr = tracks(trace)
    for s in range(4):
        # every compute and all-reduce of the stage, on each of its GPUs, identically
        a, b = tr[(1, 2 * s)], tr[(1, 2 * s + 1)]
        assert [x[:2] for x in a] == [x[:2] for x in b]
        assert len(a) == len(sim.compute[s]) + len(sim.comm[s])
        cats = {ev["cat"] for _, _, ev in a}
        assert cats == {"compute", "allreduce"}
        assert len(tr[(2, s)]) == len(sim.hops[sim.hop_names[s]])


def test_micro_batch_labels_follow_fifo_order(tp2pp4):
    """Slices are labelled with the i-th launched micro-batch; that holds because each
    stage and hop serves micro-batches in order: the i-th compute of stage s+1 starts
    after the i-th hop out of stage s has arrived."""
    sim, _, _ = tp2pp4
    rec = sim
    for i, (a, _) in enumerate(rec.compute[0]):
        assert a >= rec.batches[i][0] - 1e-12
    for s in range(sim.pp - 1):
        hop = rec.hops[rec.hop_names[s]]
        for i, (a, _) in enumerate(rec.compute[s + 1]):
            assert a >= hop[i][1] - 1e-9 and hop[i][0] >= rec.compute[s][i][1] - 1e-9


def test_bubbles_in_metadata_are_the_gaps_on_gpu_tracks(tp2pp4):
    _, result, trace = tp2pp4
    meta = trace["otherData"]
    t0_ns, t1_ns = (_ns(x * 1e3) for x in meta["window_ms"])
    tr = tracks(trace)
    assert len(meta["stages"]) == 4
    for st in meta["stages"]:
        busy = [
            (max(a, t0_ns), min(b, t1_ns)) for a, b, _ in tr[(1, st["gpus"][0])] if b > t0_ns and a < t1_ns
        ]
        # gaps between slices, counted from the file alone (touching slices are one stretch)
        count, idle, cursor = 0, 0, t0_ns
        for a, b in busy:
            if a - cursor > 1:
                count += 1
                idle += a - cursor
            cursor = max(cursor, b)
        if t1_ns - cursor > 1:
            count, idle = count + 1, idle + t1_ns - cursor
        assert st["bubbles"] == count
        assert st["bubble_ms"] == pytest.approx(idle / 1e6, abs=1e-3)
        assert st["idle_share"] == pytest.approx(1 - result.stage_busy_fraction[st["stage"]], abs=1e-9)
    assert meta["bubble_fraction"] == pytest.approx(result.bubble_fraction)
    assert meta["scenario"]["tp"] == 2 and meta["scenario"]["pp"] == 4


def test_idle_breakdown_adds_up(tp2pp4):
    sim, result, _ = tp2pp4
    parts = idle_breakdown(sim)
    for st, busy in zip(parts, result.stage_busy_fraction):
        assert st.compute + st.allreduce == pytest.approx(busy, abs=1e-9)
        assert st.idle_p2p + st.idle_cpu + st.idle_bubble == pytest.approx(1 - busy, abs=1e-9)
        assert min(st.idle_p2p, st.idle_cpu, st.idle_bubble) >= -1e-12
        if st.stage:
            assert st.idle_cpu == 0.0  # the scheduler runs on stage 0's host only


def test_cpu_wait_appears_only_with_cpu_cost(profile):
    """With a scheduler CPU cost per iteration in series with the GPU (no overlap
    scheduler), stage 0 waits on it; without, never."""
    slow_cpu = dataclasses.replace(profile, params=dataclasses.replace(profile.params, cpu_iteration_ms=2.0))
    sc = build_scenario(tp=8, pp=1, concurrency=4, profile=slow_cpu, disable_overlap_schedule=True, **SMALL)
    sim, r = simulate(sc, ci_target=None)
    [st] = idle_breakdown(sim)
    assert st.idle_cpu > 0.01 and st.idle_p2p == 0.0
    trace = build_trace(sim, r)
    assert any(ev["cat"] == "cpu" for ev in trace["traceEvents"] if ev["ph"] == "X")
    assert not any(pid == 2 for pid, _ in names(trace, "thread_name"))  # PP1: no hop tracks


def test_interval_helpers():
    assert merge([(3, 4), (0, 1), (0.5, 2), (2, 2.5)]).tolist() == [[0, 2.5], [3, 4]]
    assert merge([(0, 1), (2, 3)], 0.5, 2.5).tolist() == [[0.5, 1], [2, 2.5]]
    assert merge([]).shape == (0, 2)
    assert covered_s([(0, 2), (1, 3), (5, 6)], 0, 10) == pytest.approx(4.0)
    assert gaps(merge([(1, 2), (4, 5)]), 0, 6).tolist() == [[0, 1], [2, 4], [5, 6]]


def test_cli_trace_writes_perfetto_json(tmp_path, capsys):
    out = tmp_path / "pp8.json"
    main(
        [
            "trace",
            "--tp",
            "1",
            "--pp",
            "8",
            "--conc",
            "16",
            "--output-len",
            "20",
            "--input-len",
            "64",
            "--out",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    trace = json.loads(out.read_text())
    validate(trace)
    # GPUs, hops, the engine loop, the window, and the host's own processes (detokenizer,
    # API streaming, front end, the first stage's kernel launches: prefill runs eagerly)
    threads = names(trace, "thread_name")
    assert len(threads) == 8 + 8 + 2 + 4
    assert {"detokenizer", "api stream", "front end", "kernel launch"} <= set(threads.values())
    assert "stage 7 (GPU 7)" in text and "bubbles" in text
    assert [p.name for p in tmp_path.iterdir()] == ["pp8.json"]  # no temporary file left


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--out", "/nonexistent-dir/t.json"], "does not exist"),
        (["--out", "trace.txt"], "must end in .json"),
        (
            ["--tp", "two"],
            "'--tp' / '-tp' / '--tensor-parallel-size' / '--tp-size': 'two' is not a valid integer",
        ),
        (["--conc", "0", "--model", "llama-3.1-8b"], "concurrency must be a whole number >= 1"),
    ],
)
def test_cli_trace_bad_input(capsys, args, needle):
    with pytest.raises(SystemExit) as exc:
        main(["trace", "--conc", "2", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_idle_breakdown_of_a_hand_built_record():
    """Two stages over a 10 s window, intervals chosen by hand: stage 0 computes
    [0, 2] and [5, 6], all-reduces [2, 3], the scheduler CPU works [3, 4]; stage 1
    computes [4, 8] and waits for the hop into it [3, 4]; tokens return [8, 8.5].
    Shares by hand: stage 0 busy 4 s, P2P-idle 0.5 s, CPU-idle 1 s, bubble 4.5 s
    (gaps [3, 5] and [6, 10]); stage 1 busy 4 s, P2P-idle 1 s, bubble 5 s (gaps
    [0, 4] and [8, 10])."""
    from pipesim.measure.record import freeze
    from pipesim.measure.rows import Interval, Recorder
    from pipesim.measure.tally import busy_in

    r = Recorder(2)
    r.compute[0] += [Interval(0, 2), Interval(5, 6)]
    r.comm[0].append(Interval(2, 3))
    r.compute[1].append(Interval(4, 8))
    r.hops[0].append(Interval(3, 4))  # stage0 -> stage1
    r.hops[1].append(Interval(8, 8.5))  # tokens back to stage 0, after its work
    r.cpu.append(Interval(3, 4))
    rec = freeze(
        r,
        stage_gpus=((0,), (1,)),
        layers_per_stage=(2, 2),
        slots=2,
        clients=None,
        window_start_s=0.0,
        end_s=10.0,
        events=0,
    )
    s0, s1 = idle_breakdown(rec)
    assert (s0.compute, s0.allreduce, s0.idle_cpu, s0.idle_p2p, s0.idle_bubble) == pytest.approx(
        (0.3, 0.1, 0.1, 0.05, 0.45)
    )
    assert (s0.bubbles, s0.bubble_s) == (2, pytest.approx(6.0))
    assert (s1.compute, s1.allreduce, s1.idle_cpu, s1.idle_p2p, s1.idle_bubble) == pytest.approx(
        (0.4, 0.0, 0.0, 0.1, 0.5)
    )
    assert (s1.bubbles, s1.bubble_s) == (2, pytest.approx(6.0))
    assert busy_in(rec.compute[0] + rec.comm[0], 2.5, 5.5) == pytest.approx(1.0)


def test_flow_arrows_link_each_micro_batch_across_stages(tp2pp4):
    """One flow per micro-batch in the version-2 form (fields on the slices, no
    separate flow events): out of stage 0's compute, in and out of every hop and later
    stage, into the hop that returns the tokens; the slices in time order, alternating
    a GPU track (stage s, TP rank 0) and a hop track, each the same micro-batch."""
    _, _, obj = tp2pp4
    ev = obj["traceEvents"]
    assert not [e for e in ev if e["ph"] in ("s", "t", "f")]  # no version-1 flow events
    by_id = {}
    for e in ev:
        if "bind_id" in e:
            by_id.setdefault(e["bind_id"], []).append(e)
    assert len(by_id) > 10
    pp = len(obj["otherData"]["stages"])
    for i, chain in by_id.items():
        chain.sort(key=lambda e: e["ts"])
        roles = [(bool(e.get("flow_in")), bool(e.get("flow_out"))) for e in chain]
        assert roles == [(False, True)] + [(True, True)] * (2 * pp - 2) + [(True, False)]
        assert [e["pid"] for e in chain] == [1, 2] * pp
        assert [e["tid"] for e in chain if e["pid"] == 2] == list(range(pp))
        assert all(e["ph"] == "X" and e["args"]["micro_batch"] == i for e in chain)


# ---- counter tracks: slot / in-flight group occupancy, free KV, evictions ------------------


def occupancy(trace: dict) -> dict:
    """Counter series name -> [(ts us, requests)] of the occupancy tracks."""
    out = defaultdict(list)
    for ev in trace["traceEvents"]:
        if ev["ph"] == "C" and ev["name"].endswith("occupancy"):
            out[ev["name"]].append((ev["ts"], ev["args"]["requests"]))
    return out


def test_slot_occupancy_counters_follow_the_launched_batches(tp2pp4):
    # one sample per launched micro-batch on its slot's track (after a zero at t = 0),
    # valued at the batch's requests: what the engine put in that slot at that time
    rec, r, trace = tp2pp4
    occ = occupancy(trace)
    assert set(occ) == {f"slot {k} occupancy" for k in range(rec.slots)}
    for k in range(rec.slots):
        mine = [b for b in rec.batches if b.slot == k]
        assert [v for _, v in occ[f"slot {k} occupancy"]] == [0] + [b.requests for b in mine]
    kv = [ev for ev in trace["traceEvents"] if ev["ph"] == "C" and ev["name"] == "KV cache"]
    assert len(kv) == len(rec.batches)
    assert all(0 <= ev["args"]["free tokens"] <= r.scenario["kv_cache_tokens"] for ev in kv)


def test_vllm_group_counters_and_preempt_instants():
    # vLLM has no slots: its groups are the batches in flight (largest first), so at
    # each launch the group tracks add up to the requests in flight; every preemption
    # is an instant on the scheduler track
    sc = small_kv_scenario("vllm", 1500, concurrency=16, output_len="100:300")
    rec, result = simulate(sc, warmup_requests=8, measure_requests=24, ci_target=None)
    trace = build_trace(rec, result)
    validate(trace)
    occ = occupancy(trace)
    n = sc.settings.max_concurrent_batches
    assert set(occ) == {f"group {k} occupancy" for k in range(n)}
    ret = [t.time_s for t in rec.tokens] + [float("inf")] * len(rec.batches)  # in launch order
    expected = []
    for i, b in enumerate(rec.batches):
        flying = sorted(
            (c.requests for j, c in enumerate(rec.batches[: i + 1]) if ret[j] > b.launch_s), reverse=True
        )
        expected.append((flying + [0] * n)[:n])
    for k in range(n):
        assert [v for _, v in occ[f"group {k} occupancy"]] == [0] + [e[k] for e in expected]
    marks = [ev for ev in trace["traceEvents"] if ev["ph"] == "i" and ev["name"] == "preempt"]
    assert len(marks) == result.preemptions_total == len(rec.evictions) > 0
    assert result.group_sizes is not None and len(result.group_sizes) == n


# ---- the slots by position over time --------------------------------------------------


def _series(trace: dict, name: str) -> list[tuple[float, dict]]:
    return [
        (ev["ts"] / 1e6, ev["args"]) for ev in trace["traceEvents"] if ev["ph"] == "C" and ev["name"] == name
    ]


def _time_mean(samples: list[tuple[float, float]], t0: float, t1: float) -> float:
    """The mean over [t0, t1] of a step function given as (time, value) samples."""
    total = 0.0
    for (a, v), (b, _) in zip(samples, samples[1:] + [(t1, 0.0)]):
        total += v * max(0.0, min(b, t1) - max(a, t0))
    return total / (t1 - t0)


def test_slot_position_counters_average_to_the_result(tp2pp4):
    """The trace's "slots occupied" and "requests by slot position" tracks, averaged over
    the window as a reader of the timeline would, give the Result's positions: the mean
    number occupied is the busy shares summed, each position's mean its requests (to the
    nanosecond rounding of the trace's times). At every sample the positions are
    fullest first and as many hold a batch as the occupied track says."""
    rec, r, trace = tp2pp4
    t0, t1 = r.window_s
    occupied = _series(trace, "slots occupied")
    by_position = _series(trace, "requests by slot position")
    assert len(occupied) == len(by_position) == 1 + len(rec.batches) + len(rec.tokens)
    held = _time_mean([(t, a["batches in flight"]) for t, a in occupied], t0, t1)
    assert held == pytest.approx(sum(1 - e for e in r.empty_share_by_position), rel=1e-6)
    names = ["1st", "2nd", "3rd", "4th"]
    for k, name in enumerate(names):
        mean = _time_mean([(t, a[name]) for t, a in by_position], t0, t1)
        assert mean == pytest.approx(r.occupancy_by_position[k], rel=1e-6, abs=1e-9)
    for (_, n), (_, sizes) in zip(occupied, by_position):
        values = [sizes[x] for x in names]
        assert values == sorted(values, reverse=True)
        assert n["batches in flight"] == sum(1 for v in values if v) <= rec.slots
    assert trace["otherData"]["occupancy_by_position"] == pytest.approx(r.occupancy_by_position)


def test_slot_position_counters_of_a_hand_built_record():
    """Three slots: batches of 3 (launched at 0) and 5 (at 1) return at 2 and 4, one of
    2 launches at 2 as the first returns. The tracks step 1, 2, 3 for an instant (at a
    tie the launch goes first), 2, 1."""
    from pipesim.measure.record import freeze
    from pipesim.measure.rows import Batch, Recorder, TokenReturn
    from pipesim.report.trace import positions

    rows = Recorder(2)
    rows.batches += [Batch(0.0, 0, 3, "decode"), Batch(1.0, 1, 5, "decode"), Batch(2.0, 0, 2, "decode")]
    rows.tokens += [TokenReturn(2.0, 3), TokenReturn(4.0, 5)]
    rec = freeze(
        rows, stage_gpus=((0,), (1,)), layers_per_stage=(1, 1), slots=3, clients=None,
        window_start_s=0.0, end_s=5.0, events=0,
    )  # fmt: skip
    out = positions(rec, "slots")
    occupied = [(e["ts"], e["args"]["batches in flight"]) for e in out if e["name"] == "slots occupied"]
    sizes = [(e["ts"], *e["args"].values()) for e in out if e["name"] == "requests by slot position"]
    us = 1e6
    assert occupied == [(0.0, 0), (0.0, 1), (us, 2), (2 * us, 3), (2 * us, 2), (4 * us, 1)]
    assert sizes == [
        (0.0, 0, 0, 0),
        (0.0, 3, 0, 0),
        (us, 5, 3, 0),
        (2 * us, 5, 3, 2),
        (2 * us, 5, 2, 0),
        (4 * us, 2, 0, 0),
    ]
