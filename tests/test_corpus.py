"""The public validation corpus: the shipped CSVs load and agree with their README, known
values read back as the sources print them, and a malformed row is rejected with one line
naming the file and line."""

from __future__ import annotations

import csv
import math
import re
import shutil
from pathlib import Path

import pytest

from pipesim.base.errors import UserError
from pipesim.calibrate.corpus import COLUMNS, METRICS, corpus_dir, load_corpus

REPO = Path(__file__).resolve().parent.parent
README = REPO / "validation" / "README.md"
BAD_INPUT_DOC = REPO / "docs" / "bad-input.md"
SPLIT_KEYS = [
    "source_id",
    "engine",
    "engine_version",
    "model",
    "quantization",
    "kv_cache_dtype",
    "workload",
    "num_prompts",
    "concurrency",
    "request_rate",
]


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_shipped_corpus_loads_with_types(corpus):
    assert len(corpus) > 0 and list(corpus.columns) == list(COLUMNS)
    for column in ("tp", "pp", "dp", "ep", "gpus", "nodes"):
        assert (corpus[column] >= 1).all()
    assert corpus["value"].map(math.isfinite).all() and (corpus["value"] > 0).all()
    assert set(corpus["metric"]) <= set(METRICS)
    assert (corpus["unit"] == corpus["metric"].map(METRICS)).all()
    assert corpus["citation"].str.startswith("https://").all()


def test_every_csv_in_the_folder_is_one_source(corpus):
    names = sorted(p.name[:-4] for p in Path(str(corpus_dir())).iterdir() if p.name.endswith(".csv"))
    assert sorted(corpus["source_id"].unique()) == names


def test_gpu_count_follows_the_engine_rule(corpus):
    """vLLM uses tp x pp x dp GPUs; SGLang's DP attention lives inside the TP group."""
    runs = corpus.drop_duplicates("run_id")
    dp_attention = runs["launch_flags"].str.contains("--enable-dp-attention", regex=False)
    sglang_att = runs[(runs["engine"] == "sglang") & dp_attention]
    others = runs[~((runs["engine"] == "sglang") & dp_attention)]
    assert (sglang_att["gpus"] == sglang_att["tp"] * sglang_att["pp"]).all()
    assert (others["gpus"] == others["tp"] * others["pp"] * others["dp"]).all()


@pytest.mark.parametrize(
    "source, where, metric, value",
    [
        # gpt-oss-120b on H100, vLLM -pp 2 (GPUStack performance lab page, "3. Parallelism in vLLM")
        ("gpustack-perflab-gpt-oss-120b-h100", "#L278", "output_tok_s", 5337.65),
        # Llama-3.3-70B TP4 x PP2 over two nodes without InfiniBand at inf rate (cumulative_results.md row)
        ("llm-k8s-llama33-70b-a100-tp8-vs-tp4pp2", "02_tp4_pp2_no_IB", "total_tok_s", 1818.37),
        # SGLang 0.3.0, Llama 3.1 70B on 4 x H100, online RPS 8: median TTFT 58.11 ms
        ("sglang-bench-vs-vllm060", "RPS 8 SGLang", "ttft_ms_p50", 58.11),
    ],
)
def test_values_read_back_as_the_source_prints_them(corpus, source, where, metric, value):
    rows = corpus[
        (corpus["source_id"] == source)
        & corpus["citation"].str.contains(where, regex=False)
        & (corpus["metric"] == metric)
    ]
    assert len(rows) >= 1
    # cumulative tables round to 6 significant digits; JSON files keep full precision
    assert any(abs(v - value) <= 0.006 for v in rows["value"]), rows["value"].tolist()


def test_readme_totals_match_the_files(corpus):
    text = README.read_text()
    runs = corpus.drop_duplicates("run_id")
    split = runs.assign(split=list(zip(runs.tp, runs.pp, runs.dp, runs.ep))).fillna(
        {"num_prompts": -1, "concurrency": -1, "request_rate": -1}
    )
    groups = split.groupby(SPLIT_KEYS, dropna=False)["split"].nunique()
    multi = {key[0] for key, n in groups.items() if n > 1}
    stated = [
        len(corpus),
        len(runs),
        corpus["source_id"].nunique(),
        int((corpus["pp"] > 1).sum()),
        int((runs["pp"] > 1).sum()),
        len(multi),
    ]
    m = re.search(
        r"rows: (\d+), runs: (\d+), sources: (\d+), rows with PP > 1: (\d+) \(runs: (\d+)\), "
        r"sources with several splits under one condition: (\d+)",
        text,
    )
    assert m, "validation/README.md lost its totals line"
    assert [int(g) for g in m.groups()] == stated
    assert (
        f"{stated[0]} numbers from {stated[1]} runs in {stated[2]} sources"
        in (REPO / "README.md").read_text()
    )
    for source in corpus["source_id"].unique():
        prefix = "gpustack-perflab-" if source.startswith("gpustack-perflab-") else source
        assert prefix in text, f"{source} has no paragraph in validation/README.md"


def test_pyproject_ships_the_corpus_as_package_data():
    text = (REPO / "pyproject.toml").read_text()
    assert '"pipesim.validation" = "validation"' in text
    assert re.search(r'"pipesim\.validation" = \[[^\]]*"\*\.csv"', text)
    assert '"pipesim.validation"' in text.split("packages = [", 1)[1].split("]", 1)[0]


# ---- malformed input -----------------------------------------------------------------------

SOURCE = "sglang-bench-vs-vllm060"


def _broken(tmp_path, change, line=2):
    """A copy of one shipped source with `change(row)` applied to data line `line`."""
    src = Path(str(corpus_dir())) / f"{SOURCE}.csv"
    with src.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    change(rows[line - 2])
    folder = tmp_path / "corpus"
    folder.mkdir()
    with (folder / f"{SOURCE}.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return folder


def _set(**fields):
    return lambda row: row.update(fields)


CASES = [
    ("metric", _set(metric="throughput"), 3, "column metric: 'throughput' is not allowed"),
    ("negative", _set(value="-5"), 2, "column value: '-5' is not allowed (a finite number > 0)"),
    ("nan", _set(value="nan"), 4, "column value: 'nan' is not allowed (a finite number > 0)"),
    ("tp0", _set(tp="0"), 2, "column tp: '0' is not allowed (a whole number >= 1)"),
    ("pp_half", _set(pp="1.5"), 2, "column pp: '1.5' is not allowed (a whole number >= 1)"),
    ("citation", _set(citation=""), 5, "column citation: must not be empty"),
    ("url", _set(citation="the README"), 5, "must start with the exact URL"),
    ("unit", _set(unit="s"), 2, "is not the unit of"),
    ("engine", _set(engine="tgi"), 2, "column engine: 'tgi' is not allowed"),
    ("rate", _set(request_rate="-1"), 2, "column request_rate: '-1' is not allowed"),
    ("source", _set(source_id="other"), 2, "must match the file name"),
    ("run", _set(tp="8"), 3, "(one configuration per run_id)"),
]


@pytest.mark.parametrize("change, line, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_row_is_rejected_with_file_and_line(tmp_path, change, line, message):
    folder = _broken(tmp_path, change, line)
    with pytest.raises(UserError) as exc:
        load_corpus(folder)
    text = str(exc.value)
    assert "\n" not in text
    assert f"{SOURCE}.csv: line {line}" in text, text
    assert message in text, text


def test_missing_column_and_empty_folder_are_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no corpus CSV files in"):
        load_corpus(tmp_path / "empty")
    with pytest.raises(UserError, match="corpus folder not found"):
        load_corpus(tmp_path / "nothere")
    folder = tmp_path / "nocol"
    folder.mkdir()
    src = Path(str(corpus_dir())) / f"{SOURCE}.csv"
    lines = src.read_text().splitlines()
    (folder / f"{SOURCE}.csv").write_text("\n".join(line.rsplit(",", 1)[0] for line in lines[:3]) + "\n")
    with pytest.raises(UserError, match=r"missing column\(s\) notes; needed: row_id"):
        load_corpus(folder)


def test_a_row_id_may_appear_once(tmp_path):
    folder = _broken(tmp_path, lambda row: None)
    shutil.copy(folder / f"{SOURCE}.csv", folder / "copy.csv")
    text = (folder / "copy.csv").read_text().replace(f",{SOURCE},", ",copy,")
    (folder / "copy.csv").write_text(text)
    with pytest.raises(UserError, match="appears twice in the corpus"):
        load_corpus(folder)


def test_every_rejection_is_documented():
    doc = re.sub(r"\s+", " ", BAD_INPUT_DOC.read_text())
    for _, _, _, message in CASES:
        assert message in doc, message
    for message in (
        "no corpus CSV files in",
        "corpus folder not found",
        "missing column(s)",
        "appears twice in the corpus",
    ):
        assert message in doc, message
