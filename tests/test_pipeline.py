"""The pipeline's bookings (pipeline.py): stages are FIFO servers, links first come
first served, and transfers booked ahead of time obey the same rules as those booked
at their own time. Expected relations follow from those rules, not from a run."""

import pytest
from conftest import simulate

import pipesim

SPLITS = ((1, 8), (2, 4), (4, 2), (8, 1))


def _run(profile, tp, pp, conc=16, input_len="300"):
    sc = pipesim.build_scenario(
        tp=tp, pp=pp, concurrency=conc, input_len=input_len, output_len="40", profile=profile
    )
    sim = simulate(sc, conc, 2 * conc)
    return sim, sim.record()


def _overlap(rows) -> bool:
    rows = sorted(rows)
    return any(b[0] < a[1] - 1e-12 for a, b in zip(rows, rows[1:]))


@pytest.mark.parametrize("tp,pp", SPLITS)
def test_each_stage_serves_one_micro_batch_at_a_time_in_order(profile, tp, pp):
    sim, rec = _run(profile, tp, pp)
    for s in range(pp):
        busy = sorted(rec.compute[s] + rec.comm[s])
        assert not _overlap(busy)
        if s > 0:
            # the k-th visit to stage s starts after the k-th hop into it has arrived
            into = rec.hops[rec.inbound_hop(s)]
            for (start, _), (_, arrive) in zip(rec.compute[s], into):
                assert start >= arrive - 1e-12


@pytest.mark.parametrize("tp,pp", SPLITS)
def test_no_two_transfers_share_a_link_at_once(profile, tp, pp):
    # every directed link carries one transfer at a time, whichever user booked it
    # and whether it was booked at its own time or ahead of it
    sim, rec = _run(profile, tp, pp)
    users = sim.backend._users
    rows = {}
    for s in range(pp):
        rows[("ar", s)] = rec.comm[s]
        if pp > 1:
            rows[("hop", s)] = rec.hops[rec.hop_names[s]]
    links = {d for ls in users.values() for d in ls}
    for d in links:
        on = [r for u, ls in users.items() if d in ls for r in rows.get(u, [])]
        assert not _overlap(on), d


@pytest.mark.parametrize("tp,pp", SPLITS)
def test_each_link_serves_transfers_in_the_order_they_became_ready(profile, tp, pp):
    # first come first served, also for transfers booked ahead of their time: on
    # every link, a transfer that became ready later never starts before one that
    # became ready earlier (a collective is ready at its visit's compute end, a hop at
    # the end of its visit to the stage it leaves: the collective's end, or with none
    # the compute's; async depth 0, so the last stage's outputs are not held)
    sim, rec = _run(profile, tp, pp, conc=32, input_len="4000")
    users = sim.backend._users
    ready_start = {}
    for s in range(pp):
        ready_start[("ar", s)] = [(c[1], a[0]) for c, a in zip(rec.compute[s], rec.comm[s])]
        if pp > 1:
            hops = rec.hops[rec.hop_names[s]]
            visit_end = [a[1] for a in rec.comm[s]] if tp > 1 else [c[1] for c in rec.compute[s]]
            ready_start[("hop", s)] = [(r, h[0]) for r, h in zip(visit_end, hops)]
    for d in {d for ls in users.values() for d in ls}:
        on = sorted((start, ready) for u, ls in users.items() if d in ls for ready, start in ready_start[u])
        assert all(b[1] >= a[1] - 1e-12 for a, b in zip(on, on[1:])), d


def test_a_transfer_waits_for_the_link_not_the_other_way(profile):
    # TP2 x PP4 on one PCIe tree: a stage's ring and the hop into it share the down
    # links, so with long prompts (large hops) some transfer waits; every wait ends
    # where another transfer on a shared link ends (first come, first served)
    sim, rec = _run(profile, 2, 4, conc=32, input_len="4000")
    assert rec.link_wait
    ends = {round(e, 12) for s in range(4) for _, e in rec.comm[s]} | {
        round(e, 12) for v in rec.hops.values() for _, e in v
    }
    assert all(round(w1, 12) in ends for _, w1 in rec.link_wait)


def test_links_no_other_user_crosses_are_booked_without_events(profile):
    # PP8 at TP1 on the reference box: every hop's links are its own (pipeline.py),
    # so a visit costs no event; what is left is one per return, the scheduler's CPU
    # and the requests' own (arrivals, front end, detokenizer): below one per visit
    sc = pipesim.build_scenario(tp=1, pp=8, concurrency=16, input_len="300", output_len="40", profile=profile)
    sim = simulate(sc, 16, 32)
    assert all(sim.backend._hop_own) and all(sim.backend._ring_own)
    visits = sum(len(c) for c in sim.rec.compute)
    assert sim.env.scheduled < visits


def test_rows_after_the_stop_are_not_recorded(profile):
    sim, rec = _run(profile, 2, 4)
    for s in range(4):
        assert all(e <= rec.end_s for _, e in rec.compute[s])
        assert all(e <= rec.end_s for _, e in rec.comm[s])
    assert all(w0 <= rec.end_s for w0, _ in rec.link_wait)
