"""A table of several conditions (engines, boxes, lengths): splits compare only within
one. The summary, best_by_conc, search and the figures take it condition by condition;
a table of one condition reads as it always did."""

import pandas as pd
import pytest

from pipesim.base.errors import UserError
from pipesim.cli import main
from pipesim.explore.conditions import condition_slug, condition_text, conditions, varying
from pipesim.explore.search import Searches, search
from pipesim.explore.sweep import best_by_conc, summary

# engine -> {(tp, pp): output tok/s at C = 1, 8}: SGLang's best split is TP8 x PP1, vLLM's
# TP2 x PP4, and every vLLM point beats every SGLang one: a search or summary that mixed
# the engines would name vLLM's TP2 x PP4 for both
TOK_S = {
    "sglang": {(8, 1): (100.0, 500.0), (2, 4): (80.0, 400.0)},
    "vllm": {(8, 1): (600.0, 900.0), (2, 4): (700.0, 1200.0)},
}


def table(engines=("sglang", "vllm"), with_lengths=True) -> pd.DataFrame:
    rows = []
    for eng in engines:
        for (tp, pp), toks in TOK_S[eng].items():
            for conc, tok in zip((1, 8), toks):
                row = dict(
                    box="b",
                    gpu="g",
                    model="m",
                    profile="p",
                    engine=eng,
                    input_len="300",
                    output_len="300",
                    gpus=tp * pp,
                    tp=tp,
                    pp=pp,
                    conc=conc,
                    rate_rps=0.0,
                    split=f"TP{tp} x PP{pp}",
                    output_throughput_tok_s=tok,
                    output_throughput_ci_tok_s=0.0,
                    output_tok_s_per_gpu=tok / 8,
                    per_request_tok_s=tok / conc,
                    ttft_ms_p50=10.0 * conc,
                    ttft_ms_p99=20.0 * conc,
                    tpot_ms_p50=1000 * conc / tok,
                    tpot_ms_p99=1100 * conc / tok,
                    compute_share=0.5,
                    allreduce_share=0.2,
                    bubble_fraction=0.3,
                )
                if not with_lengths:
                    del row["input_len"], row["output_len"]
                rows.append(row)
    return pd.DataFrame(rows)


def test_the_conditions_of_a_table():
    df = table()
    assert varying(df) == ["engine"]
    parts = list(conditions(df))
    assert [c for c, _ in parts] == [{"engine": "sglang"}, {"engine": "vllm"}]
    assert all((p.engine == c["engine"]).all() for c, p in parts)
    assert condition_text({"engine": "vllm", "input_len": "100:500"}) == "engine vllm, input 100:500"
    assert condition_slug({"engine": "vllm", "input_len": "100:500"}) == "engine-vllm_input-100-500"
    # a table without the columns (written before they were swept) is one condition
    old = table(("sglang",), with_lengths=False)
    assert varying(old) == [] and [c for c, _ in conditions(old)] == [{}]


def test_best_by_conc_is_each_engines_own_best():
    best = best_by_conc(table())
    got = {(r.engine, r.conc): r.split for r in best.itertuples()}
    assert got == {
        ("sglang", 1): "TP8 x PP1",
        ("sglang", 8): "TP8 x PP1",
        ("vllm", 1): "TP2 x PP4",
        ("vllm", 8): "TP2 x PP4",
    }
    # one condition: the best split of each load, as a grouping by (gpus, load) finds it
    one = best_by_conc(table(("vllm",)))
    assert one.split.tolist() == ["TP2 x PP4", "TP2 x PP4"] and one.conc.tolist() == [1, 8]


def test_search_ranks_within_each_engine_and_names_it():
    res = search(table=table(), objective="throughput")
    assert isinstance(res, Searches)
    by = {r.condition["engine"]: r for r in res.results}
    assert by["sglang"].winner.split == "TP8 x PP1" and by["sglang"].winner.output_throughput_tok_s == 500
    assert by["vllm"].winner.split == "TP2 x PP4" and by["vllm"].winner.output_throughput_tok_s == 1200
    for eng, r in by.items():
        assert set(r.ranked.engine) == {eng} and set(r.table.engine) == {eng}
        assert r.ranked.split.tolist() == (
            ["TP8 x PP1", "TP2 x PP4"] if eng == "sglang" else ["TP2 x PP4", "TP8 x PP1"]
        )
    text = res.text()
    assert "2 conditions in the table, searched one by one" in text
    assert "[engine sglang]" in text and "[engine vllm]" in text
    # SGLang's runner-up is its own TP2 x PP4 at 400 tok/s, not a vLLM row
    assert "25% more than the runner-up split TP2 x PP4 (at its best, C=8: 400.0 output tok/s)" in text


def test_max_load_ranks_within_each_engine():
    """TPOT p99 (1100 x C / tok/s) <= 20 ms: SGLang's TP8 x PP1 carries C = 8 (17.6 ms),
    its TP2 x PP4 only C = 1 (22 ms at C = 8); both vLLM splits carry C = 8 and TP2 x PP4
    has the more throughput there."""
    res = search(table=table(), objective="max-load", max_tpot_p99_ms=20.0)
    by = {r.condition["engine"]: r for r in res.results}
    assert by["sglang"].ranked.split.tolist() == ["TP8 x PP1", "TP2 x PP4"]
    assert by["sglang"].ranked.conc.tolist() == [8, 1]
    assert by["vllm"].ranked.split.tolist() == ["TP2 x PP4", "TP8 x PP1"]
    assert by["vllm"].ranked.conc.tolist() == [8, 8]


def test_a_condition_where_nothing_qualifies_is_said_and_the_others_answered():
    # TTFT p99 is 20 ms at C = 1 in both engines; a limit of 10 ms fails both: one line each
    with pytest.raises(UserError, match=r"\[engine sglang\].*\[engine vllm\]"):
        search(table=table(), max_ttft_p99_ms=10.0)
    df = table()
    df.loc[df.engine == "sglang", "ttft_ms_p99"] = 1e6
    res = search(table=df, max_ttft_p99_ms=1000.0)
    assert [r.condition for r in res.results] == [{"engine": "vllm"}]
    assert "nothing qualifies [engine sglang]" in res.text()


def test_one_best_across_conditions_only_when_asked():
    res = search(table=table(), objective="throughput", across_conditions=True)
    assert res.winner.split == "TP2 x PP4 [engine vllm]" and res.winner.engine == "vllm"
    assert len(res.ranked) == 4  # each split of each engine
    assert "one best over 2 conditions, as asked" in res.text()


def test_one_condition_reads_as_before():
    """A table of one engine, with or without the condition columns: the same Search."""
    a = search(table=table(("sglang",)), objective="throughput")
    b = search(table=table(("sglang",), with_lengths=False), objective="throughput")
    assert not isinstance(a, Searches) and a.condition == {} and a.across == ()
    assert a.winner.split == b.winner.split == "TP8 x PP1"
    assert a.ranked.split.tolist() == b.ranked.split.tolist() and a.why == b.why
    assert "[" not in a.text().splitlines()[0]


def test_summary_has_one_table_per_engine_with_its_own_best():
    text = summary(table())
    assert text.count("pipesim sweep") == 1  # the heading once, not per condition
    assert "2 conditions, one table each" in text
    sg, vl = text.split("[engine sglang]")[1].split("[engine vllm]")
    for block, best, other in ((sg, "500.0", "400.0"), (vl, "1,200.0", "900.0")):
        assert f"*{best}" in block and f"*{other}" not in block
        assert block.count("*") == 2  # one best per (gpus, load) row
    one = summary(table(("vllm",)))
    assert "conditions" not in one and "[engine" not in one
    assert one.count("*") == 3  # the legend and one mark per row


def test_figures_per_condition(serial, tmp_path):
    from pipesim.explore.plot import save_all

    df = pd.concat([serial, serial.assign(engine="other")], ignore_index=True)
    names = sorted(p.name for p in save_all(df, tmp_path))
    assert "throughput_engine-sglang.png" in names and "throughput_engine-other.png" in names
    assert len(names) == 2 * len(save_all(serial, tmp_path / "one"))
    assert "throughput.png" in [p.name for p in (tmp_path / "one").iterdir()]


def test_cli_search_from_a_table_of_two_engines(tmp_path, capsys):
    out = tmp_path / "t.csv"
    table().to_csv(out, index=False)
    main(["search", "--from", str(out)])
    text = capsys.readouterr().out
    assert "[engine sglang]" in text and "[engine vllm]" in text
    main(["search", "--from", str(out), "--across-conditions", "--plot", str(tmp_path / "p.png")])
    text = capsys.readouterr().out
    assert "one best over 2 conditions" in text and "TP2 x PP4 [engine vllm]" in text
    main(["search", "--from", str(out), "--plot", str(tmp_path / "q.png")])
    assert (tmp_path / "q.png").stat().st_size > 0
