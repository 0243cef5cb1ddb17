"""Sweeps streamed to a file and resumed: the streamed table is the one a plain sweep
returns, an interruption (a part file cut anywhere) loses no finished row and a resume
runs exactly the scenarios not in it, a resume with other options is refused, and
list flags expand to their product."""

import importlib

import pandas as pd
import pytest
from conftest import SMALL_SWEEP as SMALL

import pipesim
from pipesim.base.files import read_table, write_table
from pipesim.explore.grid import KEY_COLUMNS, row_key
from pipesim.explore.stream import OPTIONS_COLUMN, part_path
from pipesim.explore.sweep import WALL_COLUMNS, sweep

sweep_module = importlib.import_module("pipesim.explore.sweep")  # the package's `sweep` is the function

# Llama 3.1 8B on 2 GPUs: TP2 and PP2 at two concurrencies, four quick scenarios
ARGS = dict(gpus=2, conc=[1, 8], model="llama-3.1-8b", workers=1, **SMALL)


def deterministic(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=list(WALL_COLUMNS)).reset_index(drop=True)


@pytest.fixture(scope="module")
def plain():
    return sweep(**ARGS)


@pytest.fixture
def ran(monkeypatch):
    """The keys of the scenarios a sweep runs in this process (workers=1)."""
    keys = []
    real = sweep_module.run_point

    def counting(*args, **kwargs):
        row = real(*args, **kwargs)
        keys.append(row_key(row))
        return row

    monkeypatch.setattr(sweep_module, "run_point", counting)
    return keys


def test_streamed_csv_is_the_plain_table(plain, tmp_path):
    streamed = sweep(**ARGS, out=tmp_path / "s.csv")
    write_table(plain, tmp_path / "plain.csv")
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["plain.csv", "s.csv"]  # the part file is gone
    pd.testing.assert_frame_equal(deterministic(streamed), deterministic(plain))
    back, ref = read_table(tmp_path / "s.csv"), read_table(tmp_path / "plain.csv")
    pd.testing.assert_frame_equal(deterministic(back), deterministic(ref))
    assert list(back.columns) == list(plain.columns)
    assert back[OPTIONS_COLUMN].nunique() == 1


def test_streamed_parquet_is_the_plain_table(plain, tmp_path):
    pytest.importorskip("pyarrow")
    streamed = sweep(**ARGS, out=tmp_path / "s.parquet")
    assert [p.name for p in tmp_path.iterdir()] == ["s.parquet"]
    pd.testing.assert_frame_equal(
        deterministic(pd.read_parquet(tmp_path / "s.parquet")), deterministic(plain)
    )
    pd.testing.assert_frame_equal(deterministic(streamed), deterministic(plain))


def _interrupted(plain: pd.DataFrame, out, done: int, partial: bool = True) -> pd.DataFrame:
    """The part file a sweep killed after `done` rows leaves (rows in another order than
    the table's, as processes finish them), cut in the middle of the next row; the kept
    rows carry a wall time no run gives, to tell them from rows run again."""
    order = plain.iloc[[2, 0, 3, 1]].reset_index(drop=True)
    order["sim_wall_s"] = 1234.5
    text = order.to_csv(index=False, lineterminator="\n")
    lines = text.splitlines(keepends=True)
    body = "".join(lines[: 1 + done]) + (lines[1 + done][:37] if partial else "")
    part_path(out).write_text(body)
    return order.iloc[:done]


@pytest.mark.parametrize("done, partial", [(0, True), (2, True), (3, False)])
def test_resume_runs_exactly_the_missing_scenarios(plain, tmp_path, ran, done, partial):
    out = tmp_path / "s.csv"
    kept = _interrupted(plain, out, done, partial)
    df = sweep(**ARGS, out=out, resume=True)
    kept_keys = {row_key(r) for r in kept.to_dict("records")}
    assert sorted(ran) == sorted(set(map(row_key, plain.to_dict("records"))) - kept_keys)
    assert len(ran) == len(plain) - done
    pd.testing.assert_frame_equal(deterministic(df), deterministic(plain))
    was_kept = df.sim_wall_s == 1234.5
    assert {row_key(r) for r in df[was_kept].to_dict("records")} == kept_keys
    pd.testing.assert_frame_equal(deterministic(read_table(out)), deterministic(plain))
    assert not part_path(out).exists()


def test_resume_of_a_finished_table_runs_nothing(plain, tmp_path, ran):
    out = tmp_path / "s.csv"
    sweep(**ARGS, out=out)
    ran.clear()
    before = out.read_text()
    df = sweep(**ARGS, out=out, resume=True)
    assert ran == [] and out.read_text() == before
    pd.testing.assert_frame_equal(deterministic(df), deterministic(plain))


def test_resume_extends_a_table_with_new_loads(plain, tmp_path, ran):
    out = tmp_path / "s.csv"
    sweep(**{**ARGS, "conc": [1]}, out=out)
    ran.clear()
    df = sweep(**ARGS, out=out, resume=True)
    assert sorted(k[-2] for k in ran) == [8, 8]  # only C = 8, on both splits
    pd.testing.assert_frame_equal(deterministic(df), deterministic(plain))


@pytest.mark.parametrize(
    "change, needle",
    [
        (dict(seed=1), "seed: default in the file, 1 now"),  # seed 0 is the default, left out
        (dict(max_running_requests=4), "max_running_requests: default in the file, 4 now"),
        (dict(model="qwen3-30b-a3b"), 'model: "llama-3.1-8b" in the file, "qwen3-30b-a3b" now'),
        (dict(rate=[1.0], num_requests=20), 'load: "conc" in the file, "rate_rps" now'),
    ],
)
def test_resume_with_other_options_is_refused(plain, tmp_path, ran, change, needle):
    out = tmp_path / "s.csv"
    _interrupted(plain, out, 2)
    before = part_path(out).read_bytes()
    with pytest.raises(pipesim.UserError, match="other options") as exc:
        sweep(**{**ARGS, **change}, out=out, resume=True)
    assert needle in str(exc.value) and ran == []
    # the part file lost only its partial last line, which a resume with the right options reruns
    assert before.startswith(part_path(out).read_bytes()) and not out.exists()


SLOT_COLUMNS = ["occupancy_by_position", "empty_share_by_position", "batches_in_flight"]


def test_resume_widens_a_part_file_written_before_the_slot_columns(plain, tmp_path, ran):
    """A part file of a version without the slots-by-position columns: its two rows are
    kept with those columns empty (not measured), the two missing scenarios run and
    carry them, and the part file takes the new header, so that a second interruption
    resumes as any other."""
    out = tmp_path / "s.csv"
    old = _interrupted(plain, out, 2, partial=False).drop(columns=SLOT_COLUMNS)
    part_path(out).write_text(old.to_csv(index=False, lineterminator="\n"))
    df = sweep(**ARGS, out=out, resume=True)
    assert len(ran) == 2
    kept = df.sim_wall_s == 1234.5
    assert {row_key(r) for r in df[kept].to_dict("records")} == {row_key(r) for r in old.to_dict("records")}
    assert df.loc[kept, SLOT_COLUMNS].isna().all().all()
    new = df[~kept].set_index(list(KEY_COLUMNS))
    ref = plain.set_index(list(KEY_COLUMNS)).loc[new.index]
    pd.testing.assert_frame_equal(new[SLOT_COLUMNS], ref[SLOT_COLUMNS])
    others = [c for c in plain.columns if c not in SLOT_COLUMNS]
    pd.testing.assert_frame_equal(deterministic(df[others]), deterministic(plain[others]))
    back = read_table(out)
    assert (
        set(back.columns) == set(plain.columns)
        and back.loc[back.sim_wall_s == 1234.5, SLOT_COLUMNS].isna().all().all()
    )


def test_a_part_file_is_not_overwritten_without_resume(plain, tmp_path, ran):
    out = tmp_path / "s.csv"
    _interrupted(plain, out, 2)
    before = part_path(out).read_bytes()
    with pytest.raises(pipesim.UserError, match="interrupted sweep; pass --resume"):
        sweep(**ARGS, out=out)
    assert part_path(out).read_bytes() == before and ran == []


@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda lines: lines[:2] + [lines[1]] + lines[2:], "line 3 repeats the scenario of line 2"),
        (lambda lines: [lines[0].replace("conc", "c0nc")] + lines[1:], "no column(s) conc"),
        (lambda lines: lines[:1] + [lines[1].replace(",1,", ",one,", 1)] + lines[2:], "is not a number"),
        (lambda lines: ["\x00\x01binary\n"] + lines[1:], "not a pipesim sweep table"),
    ],
)
def test_a_damaged_part_file_is_one_line(plain, tmp_path, damage, needle):
    out = tmp_path / "s.csv"
    _interrupted(plain, out, 3, partial=False)
    lines = part_path(out).read_text().splitlines(keepends=True)
    part_path(out).write_text("".join(damage(lines)))
    with pytest.raises(pipesim.UserError) as exc:
        sweep(**ARGS, out=out, resume=True)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_resume_needs_an_output_file():
    with pytest.raises(pipesim.UserError, match="give --out"):
        sweep(**ARGS, resume=True)


def test_list_arguments_expand_to_their_product(tmp_path):
    """Two engines x two input lengths x two output lengths x one split x two loads:
    16 scenarios, each key once, each row what one scenario alone gives."""
    args = dict(gpus=1, conc=[1, 4], model="llama-3.1-8b", workers=1)
    lists = dict(engine=["sglang", "vllm"], input_len=["64", 96], output_len=["24", "40"])
    df = sweep(**args, **lists, out=tmp_path / "s.csv")
    keys = [row_key(r) for r in df.to_dict("records")]
    box = "rtx-pro-6000-server-8x"
    assert keys == [
        (box, e, i, o, 1, 1, 1, 1, c, 0.0)  # gpus, tp, pp, dp
        for e in ("sglang", "vllm")
        for i in ("64", "96")
        for o in ("24", "40")
        for c in (1, 4)
    ]
    one = sweep(**args, engine="vllm", input_len="96", output_len="24")
    at = df[(df.engine == "vllm") & (df.input_len == "96") & (df.output_len == "24")]
    pd.testing.assert_frame_equal(deterministic(at), deterministic(one))
    assert set(KEY_COLUMNS) <= set(read_table(tmp_path / "s.csv").columns)


def test_cli_lists_and_resume(tmp_path, capsys):
    from pipesim.cli import main

    out = tmp_path / "s.csv"
    argv = ["sweep", "--gpus", "1", "--conc", "1", "--model", "llama-3.1-8b", "--workers", "1"]
    argv += ["--engine", "sglang,vllm", "--input-len", "64,96", "--output-len", "24", "--out", str(out)]
    main(argv)
    df = read_table(out)
    assert [(r.engine, r.input_len) for r in df.itertuples()] == [
        ("sglang", "64"),
        ("sglang", "96"),
        ("vllm", "64"),
        ("vllm", "96"),
    ]
    assert "4 points in" in capsys.readouterr().out
    main([*argv, "--resume"])
    assert "(4 kept from the file, 0 run)" in capsys.readouterr().out
