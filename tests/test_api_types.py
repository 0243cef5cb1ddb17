"""The Python API checks types as the command line does: numpy integers are whole
numbers, bools are not numbers, strings are not booleans, floats are not counts."""

from __future__ import annotations

import numpy as np
import pytest

import pipesim
from pipesim import api
from pipesim.base.errors import UserError
from pipesim.explore.grid import positive_numbers, whole_numbers
from pipesim.scenario.build import build_scenario

FAST = dict(model="llama-3.1-8b", input_len=16, output_len=8)

REFUSED = [
    (dict(tp=2.5, concurrency=1), "tp must be a whole number >= 1, got 2.5"),
    (dict(tp=True, concurrency=1), "tp must be a whole number >= 1, got True"),
    (dict(pp="2", concurrency=1), "pp must be a whole number >= 1, got '2'"),
    (dict(concurrency=4.0), "concurrency must be a whole number >= 1, got 4.0"),
    (dict(concurrency=True), "concurrency must be a whole number >= 1, got True"),
    (dict(concurrency="4"), "concurrency must be a whole number >= 1, got '4'"),
    (dict(concurrency=np.float64(4)), "concurrency must be a whole number >= 1"),
    (dict(rate_rps=True), "arrival rate must be > 0 requests/s and finite, got True"),
    (dict(rate_rps="1"), "arrival rate must be > 0 requests/s and finite, got '1'"),
    (dict(rate_rps=1.0, num_requests=2.5), "number of requests must be >= 1"),
    (dict(rate_rps=1.0, num_requests=True), "number of requests must be >= 1"),
    (dict(concurrency=1, seed=1.0), "seed must be a whole number >= 0"),
    (dict(concurrency=1, seed=False), "seed must be a whole number >= 0"),
    (dict(concurrency=1, input_len=16.5), "input length 16.5 is not a token count"),
    (dict(concurrency=1, output_len=True), "output length True is not a token count"),
    (
        dict(concurrency=1, disable_cuda_graph="false"),
        "--disable-cuda-graph must be True or False, got 'false'",
    ),
    (dict(concurrency=1, disable_cuda_graph=1), "--disable-cuda-graph must be True or False, got 1"),
    (
        dict(concurrency=1, engine="vllm", async_scheduling="no"),
        "--async-scheduling must be True or False, got 'no'",
    ),
    (
        dict(concurrency=1, max_running_requests=8.0),
        "--max-running-requests must be a whole number >= 1, got 8.0",
    ),
    (
        dict(concurrency=1, max_running_requests=True),
        "--max-running-requests must be a whole number >= 1, got True",
    ),
    (
        dict(concurrency=1, pp=2, layers=(16.0, 16.0)),
        "--layers (16.0, 16.0) must be comma-separated whole numbers",
    ),
    (
        dict(concurrency=1, mem_fraction_static="0.8"),
        "--mem-fraction-static must be a number in (0, 1), got '0.8'",
    ),
    (dict(concurrency=1, nodes=True), "--nodes must be a whole number >= 1, got True"),
    (dict(trace=5), "trace must be the path of a CSV file, got 5"),
]


@pytest.mark.parametrize("kwargs, message", REFUSED, ids=[str(k) for k, _ in REFUSED])
def test_api_refuses_wrong_types(kwargs, message):
    with pytest.raises(UserError) as exc:
        build_scenario(**{**FAST, **kwargs})
    assert message in str(exc.value)


def test_predict_refuses_fractional_tp():
    with pytest.raises(UserError, match="tp must be a whole number >= 1, got 2.5"):
        api.predict(tp=2.5, conc=1, **FAST)


def test_numpy_integers_are_whole_numbers():
    sc = build_scenario(
        tp=np.int64(2),
        pp=np.int32(1),
        concurrency=np.int64(3),
        seed=np.uint8(1),
        max_running_requests=np.int64(16),
        input_len=np.int64(16),
        output_len=8,
        model="llama-3.1-8b",
    )
    assert (sc.plan.tp, sc.plan.pp, sc.workload.concurrency, sc.workload.seed) == (2, 1, 3, 1)
    assert type(sc.workload.concurrency) is int and sc.settings.max_running_requests == 16


def test_numpy_bool_is_a_flag():
    sc = build_scenario(concurrency=1, disable_cuda_graph=np.bool_(True), **FAST)
    assert sc.settings.cuda_graph_max_bs == 0


def test_sweep_counts_take_numpy_integers_and_refuse_bools():
    assert whole_numbers(np.array([4, 2, 4]), "gpus") == [2, 4]
    with pytest.raises(UserError, match="True is not a whole number"):
        whole_numbers([True], "gpus")
    with pytest.raises(UserError, match="above the limit of 65536"):
        whole_numbers([10**11], "gpus")


def test_sweep_lists_refuse_what_is_neither_a_number_nor_a_list():
    """A bool, or None (a sweep given conc=None and no rate), is the one-line error, not
    a TypeError from iterating it."""
    with pytest.raises(UserError, match="gpus True must be a whole number or a sequence of them"):
        whole_numbers(True, "gpus")
    with pytest.raises(UserError, match="rate False must be a number or a sequence of them"):
        positive_numbers(False, "rate")
    with pytest.raises(UserError, match="conc None must be a whole number or a sequence of them"):
        pipesim.sweep(gpus=1, conc=None, workers=1, **FAST)
