"""The same names in Python as on the command line (scenario/aliases.py): every flag of
`pipesim predict`, spelt as a Python keyword, is a keyword build_scenario takes or an
alias of one; an alias and its name that disagree are one clear line."""

import inspect

import pytest

import pipesim
from pipesim.base.errors import UserError
from pipesim.cli import cli
from pipesim.cli.options import KNOBS
from pipesim.scenario.aliases import ALIASES, canonical
from pipesim.scenario.build import build_scenario

# the command's own options, not scenario keywords
NOT_SCENARIO = {"as_json", "intervals", "ensemble", "sensitivity", "step", "plot_file", "progress", "help"}
SMALL = dict(model="llama-3.1-8b", input_len="32", output_len="8", intervals=False)


def _keywords() -> set[str]:
    return set(inspect.signature(build_scenario).parameters) | set(KNOBS)


def test_every_predict_flag_is_a_python_keyword_or_an_alias_of_one():
    accepted = _keywords()
    missing = []
    for param in cli.commands["predict"].params:
        if param.name in NOT_SCENARIO:
            continue
        for flag in param.opts:
            if not flag.startswith("--"):
                continue  # -tp, -pp: short forms of a long flag checked here too
            name = flag[2:].replace("-", "_")
            if name.startswith("no_"):
                continue
            key = next(iter(canonical({name: 1})))
            if key not in accepted:
                missing.append(f"{flag} -> {key}")
    assert not missing, missing


def test_aliases_name_the_same_scenario():
    a = pipesim.predict(2, 2, 8, **SMALL)
    b = pipesim.predict(tensor_parallel_size=2, pipeline_parallel_size=2, max_concurrency=8, **SMALL)
    assert b.output_throughput_tok_s == a.output_throughput_tok_s
    r = pipesim.predict(tp=2, rate=4.0, num_requests=20, **SMALL)
    assert r.scenario["workload"]["rate_rps"] == 4.0
    sc = build_scenario(tp_size=2, request_rate=1.0, num_requests=10, model="llama-3.1-8b")
    assert (sc.plan.tp, sc.workload.rate_rps) == (2, 1.0)
    assert all(v in _keywords() for v in ALIASES.values())


def test_an_alias_and_its_name_that_disagree_are_refused():
    with pytest.raises(UserError, match="tp is given twice"):
        pipesim.predict(tp=8, tensor_parallel_size=2, conc=4, **SMALL)
    with pytest.raises(UserError, match="rate=2.0 and rate_rps=3.0 name one setting"):
        build_scenario(rate=2.0, rate_rps=3.0, num_requests=10)
    # the same value twice is not a conflict
    assert build_scenario(tp=2, tp_size=2, concurrency=1, model="llama-3.1-8b").plan.tp == 2
