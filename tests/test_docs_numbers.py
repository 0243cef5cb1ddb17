"""The numbers the README (and docs/uncertainty.md's example) quote, each checked
against a fresh run.

Every entry of QUOTES is a phrase the README holds verbatim and the function that
produces the same numbers now (the README's command, or the Python call it stands
for). A phrase no longer in the README fails, so an edit of the text updates this
table; a number that moved fails, so a change of the simulator updates the text. The
runs are deterministic (fixed lengths and seed), so the tolerance is the printed
precision: each quoted number must equal the fresh one to within half a unit of its
last printed digit, or 0.5% of it, whichever is larger (TOLERANCE). Lists the README
gives (the shipped profiles, the model presets) are checked whole.

The commands run here take a few seconds each; the README's slow ones (an output
length of 1,000, the corpus validation) are checked through the quantity they quote
(the KV pool a scenario builds, the corpus's counts) rather than by running them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

import pipesim
from pipesim.cli import cli

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
TOLERANCE = 0.005  # relative; or half a unit of the last printed digit
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _cli(*args: str) -> str:
    out = CliRunner().invoke(cli, [*args, "--no-progress"], terminal_width=200)
    assert out.exit_code == 0, out.output
    return out.output


def _numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in NUMBER.findall(text)]


def _decimals(n: str) -> int:
    return len(n.split(".")[1]) if "." in n else 0


# ---- the fresh runs ----------------------------------------------------------------------


def headline() -> list[float]:
    """`pipesim predict --tp 2 --pp 4 --conc 64`: throughput and its likely band."""
    out = _cli("predict", "--tp", "2", "--pp", "4", "--conc", "64")
    m = re.search(r"output throughput\s+([\d,.]+) tok/s.*\(likely ([\d,.]+)-([\d,.]+)\)", out)
    assert m, out
    return _numbers(" ".join(m.groups()))


def default_band_error() -> list[float]:
    """The default profile's largest leave-one-out error, which sets its band."""
    out = _cli("predict", "--tp", "2", "--pp", "4", "--conc", "64")
    m = re.search(r"the largest, ([\d,.]+)%", out)
    assert m, out
    return _numbers(m.group(1))


def overloaded() -> list[float]:
    """`pipesim predict --tp 2 --pp 4 --rate 2 --num-requests 200`: arrival vs served."""
    out = _cli("predict", "--tp", "2", "--pp", "4", "--rate", "2", "--num-requests", "200")
    m = re.search(
        r"overloaded: ([\d.]+) req/s arrive; over the second half of the arrivals ([\d.]+) arrive, ([\d.]+) served",
        out,
    )
    assert m, out
    return _numbers(" ".join(m.groups()))


def kv_pool() -> list[float]:
    """The KV pool of `--tp 1 --pp 8 --conc 64 --output-len 1000 --mem-fraction-static
    0.803` and what its 64 requests need (256 + 1000 tokens each)."""
    from pipesim.scenario.build import build_scenario

    sc = build_scenario(tp=1, pp=8, concurrency=64, output_len="1000", mem_fraction_static=0.803)
    need = 64 * (sc.workload.input_len.hi + sc.workload.output_len.hi)
    return [sc.memory.kv_tokens, need]


def simulated(tp: int, pp: int, conc: int) -> float:
    return pipesim.predict(tp=tp, pp=pp, conc=conc, intervals=False).output_throughput_tok_s


def cap_plateau() -> list[float]:
    """The performance table: C = 256 and 4096 give the same throughput (the running
    cap of 64 admits the same requests; the clients beyond it only queue)."""
    a, b = simulated(2, 4, 256), simulated(2, 4, 4096)
    assert a == b
    return [a]


def events() -> list[float]:
    """Simulated events at C = 64 for TP8, PP8 and TP2 x PP4."""
    return [
        float(pipesim.predict(tp=tp, pp=pp, conc=64, intervals=False).sim_events)
        for tp, pp in ((8, 1), (1, 8), (2, 4))
    ]


def period() -> list[float]:
    """TP2 x PP4 at C = 64 repeats: its period in requests and the requests it measured."""
    r = pipesim.predict(tp=2, pp=4, conc=64, intervals=False)
    return [r.period_requests, r.completed_requests]


def corpus_counts() -> list[float]:
    """The public corpus: numbers, runs, sources, numbers with PP > 1."""
    from pipesim.calibrate.corpus import load_corpus

    c = load_corpus()
    return [len(c), c.run_id.nunique(), c.source_id.nunique(), int((c.pp > 1).sum())]


def validated() -> list[float]:
    """`pipesim validate` on the default profile: the three points' predictions and the MAPE."""
    import json

    report = json.loads(_cli("validate", "--profile", "rtx-pro-6000-sglang-deployment", "--json"))
    return [p["predicted"] for p in report["points"]] + [report["mape_pct"]]


def steady_model_error() -> list[float]:
    """The search's screening model against the simulation: its 90th percentile
    throughput error (pipesim/data/steady_model_error.json, written by
    calibration/validate_steady_model.py)."""
    import json

    data = json.loads((REPO / "pipesim" / "data" / "steady_model_error.json").read_text())
    return [100 * data["p90_abs_error"]["output_throughput_tok_s"]]


def headline_line() -> list[float]:
    """The throughput line of `pipesim predict --tp 2 --pp 4 --conc 64` whole: the
    headline, its CI, requests/s and the likely band."""
    out = _cli("predict", "--tp", "2", "--pp", "4", "--conc", "64")
    line = next(x for x in out.splitlines() if x.strip().startswith("output throughput"))
    return [v for k, v in enumerate(_numbers(line)) if k != 1]  # not the CI's "95%"


@dataclass(frozen=True)
class Quote:
    text: str  # verbatim in the document; its numbers, in order, are checked
    fresh: Callable[[], list[float]]
    skip: tuple[int, ...] = ()  # positions of numbers in `text` that are not results (a C=64)
    doc: str = "README.md"


QUOTES = [
    Quote("# 621.2 tok/s (likely 163-2,355)", headline),
    Quote("the default profile's three give 282%", default_band_error),
    Quote(
        "overloaded: 1.77 req/s arrive; over the second half of the arrivals 1.85 arrive, 1.79 served",
        overloaded,
    ),
    Quote("KV for 30,033 tokens, 64 requests need 80,384", kv_pool, skip=(1,)),
    Quote("C = 256 and 4096: the same 623.5 tok/s", cap_plateau, skip=(0, 1)),
    Quote("C = 64: 623.3 tok/s", lambda: [simulated(2, 4, 64)], skip=(0,)),
    Quote(
        "cycle (TP2 x PP4: 64 requests a period); batch means cut through it would report a spread the "
        "estimate does not have, so the run takes one batch per period and stops after two (128 measured",
        period,
        skip=(0, 1),
    ),
    Quote(
        "TP8 C=1 26.3 tok/s (predicted 26.4), TP8 C=32 in the 578-808 band (613.7) and PP8 C=1 36-37 tok/s "
        "(34.0) are reproduced within 6% (MAPE 1.9%)",
        validated,
        skip=(0, 1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 14),
    ),
    Quote("within 1.5% of the simulated throughput at the 90th percentile", steady_model_error, skip=(1,)),
    Quote(
        "| events at C = 64 (TP8 / PP8 / TP2 x PP4) | 2,067 / 13,823 / 36,291 |", events, skip=(0, 1, 2, 3, 4)
    ),
    Quote(
        "output throughput 621.2 tok/s (95% CI +/- 0.0; 2.07 req/s) (likely 163-2,355)",
        headline_line,
        skip=(1,),
        doc="docs/uncertainty.md",
    ),
    Quote(
        "(2849 numbers from 267 runs in 22 sources on H100, H200 and A100, 168 of them with PP > 1)",
        corpus_counts,
        skip=(3, 4, 5, 7),
    ),
]


def _readme(doc: str = "README.md") -> str:
    """A document with its line breaks and runs of spaces as one space (a quote may wrap)."""
    return " ".join((REPO / doc).read_text().split())


@pytest.mark.parametrize("quote", QUOTES, ids=[q.fresh.__name__ for q in QUOTES])
def test_readme_quote_matches_a_fresh_run(quote):
    text = _readme(quote.doc)
    assert quote.text in text, f"{quote.doc} no longer says {quote.text!r}: update QUOTES with the text"
    printed = [n for k, n in enumerate(NUMBER.findall(quote.text)) if k not in quote.skip]
    fresh = quote.fresh()
    assert len(printed) == len(fresh), (printed, fresh)
    for shown, now in zip(printed, fresh):
        value = float(shown.replace(",", ""))
        allowed = max(TOLERANCE * abs(now), 0.5 * 10 ** -_decimals(shown))
        assert abs(value - now) <= allowed, (
            f"{quote.doc} quotes {shown} in {quote.text!r}; a fresh run gives {now:,.{_decimals(shown)}f}"
        )


def test_every_shipped_profile_is_in_the_readmes_table():
    from pipesim.profiles.profile import profile_names

    text = _readme()
    table = text[text.index("Shipped profiles") : text.index("Rebuild them")]
    missing = [name for name in profile_names() if f"| `{name}`" not in table]
    assert not missing, f"profiles the README's table leaves out: {missing}"


def test_every_model_preset_family_is_named_in_the_readme():
    from pipesim.inputs.model_presets import preset_names

    text = _readme().lower()
    listed = text[
        text.index("other presets (`pipesim/data/models`)") : text.index("which architectures a config may")
    ]
    # a preset's family: its name's first word (deepseek, gemma, glm, gpt, llama, qwen3, ...)
    families = {re.match(r"[a-z]+\d*", name).group(0) for name in preset_names()} - {"kimi"}  # the default
    missing = sorted(f for f in families if f not in listed)
    assert not missing, f"model preset families the README's list leaves out: {missing}"
