"""The notebooks: what-if.ipynb is stored executed (its figures and answers readable
without running it, at 100 dpi), runs top to bottom again here in a real kernel, draws
its figures and ends on a conclusion, using pipesim's public API only; every text
output it stores is the fresh run's (`python notebooks/run.py` restores them after a
change that moves a number), and every claim its answers and conclusion make in words
is checked against the fresh numbers; interactive.ipynb runs with its widgets'
callback called once."""

import base64
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

FOLDER = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOK = FOLDER / "what-if.ipynb"
VARIANTS = [
    "baseline",
    "all-reduce x0.5",
    "PCIe x2",
    "micro-batch cap 8",
    "async depth 1",
    "GPU x1.5",
    "deepseek-v3",
]
INTERNALS = (
    "dataclasses",
    "load_profile",
    "load_box",
    "pipesim.profiles.profile",
    "pipesim.inputs.box",
    "pipesim.scenario.build",
    "with_params",
    "._",
)


def outputs(cell, mime: str) -> list:
    return [o["data"][mime] for o in cell.get("outputs", []) if "data" in o and mime in o["data"]]


def run(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    return nb


@pytest.fixture(scope="module")
def executed():
    return run(NOTEBOOK)


def _pngs(nb) -> list[bytes]:
    return [base64.b64decode(p) for c in nb.cells if c.cell_type == "code" for p in outputs(c, "image/png")]


def test_stored_executed_with_small_figures():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)
    pngs = _pngs(nb)
    assert len(pngs) >= 5 and all(p[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    widths = [int.from_bytes(p[16:20], "big") for p in pngs]  # the PNG header's width
    assert min(widths) >= 700, widths  # readable: 8-inch figures at 100 dpi or more
    assert max(map(len, pngs)) < 160_000  # and the stored file stays small
    assert NOTEBOOK.stat().st_size < 1_000_000


def test_uses_the_public_api_only():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert not [name for name in INTERNALS if name in source]
    for knob in ("allreduce_scale=", "pcie_bandwidth_scale=", "kernel_scale="):
        assert knob in source


def test_every_section_asks_runs_and_answers():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    sections = [s for s in text.split("\n## ") if s[:2].strip(". ").isdigit()]
    assert len(sections) >= 6
    for s in sections:
        assert "?" in s.splitlines()[0] or "Engine knobs" in s.splitlines()[0], s.splitlines()[0]
        assert "**Experiment:**" in s
    assert text.count("**Answer:**") >= 5
    assert "## Conclusion" in text and "top of the baseline" in " ".join(text.split())


def test_notebook_runs_and_draws(executed):
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert len(_pngs(executed)) >= 5  # throughput, bubble cause, Pareto, two comparisons
    stderr = "".join(o.get("text", "") for c in code for o in c.outputs if o.get("name") == "stderr")
    assert "Traceback" not in stderr


def test_notebook_compares_every_what_if(executed):
    last = [c for c in executed.cells if c.cell_type == "code" and c.source.strip().endswith("summary")][-1]
    [summary] = outputs(last, "text/plain")
    for name in VARIANTS:
        assert name in summary
    searched = "".join(
        o.get("text", "")
        for c in executed.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "stream"
    )
    assert "best: TP" in searched and "why:" in searched  # pipesim.explore.search's report
    assert "carries C=" in searched  # the max-load answer
    assert "skipped TP" in searched and "does not fit" in searched  # DeepSeek-V3's FP8 experts


def test_interactive_notebook_runs_its_callback_once():
    pytest.importorskip("ipywidgets")
    nb = run(FOLDER / "interactive.ipynb")
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert "callback calls: 1" in "".join(o.get("text", "") for o in last.outputs)


def _texts(nb) -> list[list[str]]:
    """Each code cell's text outputs (streams and plain-text results), figures left out
    (their repr names only their size), whitespace at line ends ignored."""
    out = []
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        texts = []
        for o in c.outputs:
            text = o.get("text") if o.output_type == "stream" else o.get("data", {}).get("text/plain")
            if text and not text.startswith("<Figure"):
                texts.append("\n".join(line.rstrip() for line in text.strip().splitlines()))
        out.append(texts)
    return out


def test_stored_outputs_are_a_fresh_runs(executed):
    stored = _texts(nbformat.read(NOTEBOOK, as_version=4))
    fresh = _texts(executed)
    for k, (a, b) in enumerate(zip(stored, fresh)):
        assert a == b, f"code cell {k}: the stored output is not a fresh run's; run python notebooks/run.py"
    assert len(stored) == len(fresh)


def _namespace(nb) -> dict:
    """The notebook's variables, by running its code cells here (no figures shown)."""
    import matplotlib

    matplotlib.use("Agg")
    ns: dict = {}
    for c in nb.cells:
        if c.cell_type == "code":
            exec(
                compile(
                    "\n".join(line for line in c.source.splitlines() if not line.startswith("%")),
                    "nb",
                    "exec",
                ),
                ns,
            )
    return ns


@pytest.fixture(scope="module")
def numbers():
    return _namespace(nbformat.read(NOTEBOOK, as_version=4))


def test_the_answers_words_hold(numbers):
    """Each claim the markdown makes, against the numbers (sections 1, 4, 6, 7)."""
    base, variants, answer = numbers["base"], numbers["variants"], numbers["answer"]
    by = ["split", "conc"]
    tput = {name: df.set_index(by).output_throughput_tok_s for name, df in variants.items()}
    # 1: TP8 x PP1 wins at low load; at C = 64 TP4 x PP2 and TP8 x PP1 lead within a few
    # percent, a margin inside the likely band
    for conc in (1, 4, 16):
        at = base[base.conc == conc]
        assert at.loc[at.output_throughput_tok_s.idxmax(), "split"] == "TP8 x PP1", conc
    top = base[base.conc == 64].sort_values("output_throughput_tok_s", ascending=False)
    assert set(top.split[:2]) == {"TP4 x PP2", "TP8 x PP1"}
    assert top.output_throughput_tok_s.iloc[1] / top.output_throughput_tok_s.iloc[0] > 0.9
    assert "inside the winner's likely band" in answer.text()
    # 4: PCIe x2 helps in proportion to TP, the deepest pipeline not at all
    gain = (tput["PCIe x2"] / tput["baseline"] - 1).xs(64, level="conc")
    order = ["TP8 x PP1", "TP4 x PP2", "TP2 x PP4", "TP1 x PP8"]
    assert list(gain[order]) == sorted(gain, reverse=True)
    assert 0.1 < gain["TP8 x PP1"] < 0.35 and abs(gain["TP1 x PP8"]) < 0.01
    # 6: a cap of 8 per slot: TP1 x PP8 gains about a third at C = 64; TP8 x PP1 loses from
    # C = 16, TP4 x PP2 at C = 64; nothing changes at C = 1 and 4
    cap = tput["micro-batch cap 8"] / tput["baseline"]
    assert 1.2 < cap[("TP1 x PP8", 64)] < 1.5
    assert cap[("TP8 x PP1", 16)] < 1 and cap[("TP8 x PP1", 64)] < 1 and cap[("TP4 x PP2", 64)] < 1
    assert (cap.xs(1, level="conc") == 1).all() and (cap.xs(4, level="conc") == 1).all()
    # async depth 1: the baseline below C = 64; at C = 64 only TP4 x PP2 moves, by a few percent
    deeper = tput["async depth 1"] / tput["baseline"]
    moved = deeper[deeper != 1]
    assert list(moved.index) == [("TP4 x PP2", 64)] and abs(moved.iloc[0] - 1) < 0.1
    # 7: DeepSeek-V3 fits only TP8 x PP1
    assert set(variants["deepseek-v3"].split) == {"TP8 x PP1"}


def test_the_conclusions_words_hold(numbers):
    summary, variants = numbers["summary"], numbers["variants"]
    change = summary["output tok/s"] / summary.loc["baseline", "output tok/s"] - 1
    assert change["all-reduce x0.5"] > 0.05 and change["PCIe x2"] > 0.05 and change["GPU x1.5"] > 0.05
    assert abs(change["async depth 1"]) < 0.05
    # a faster GPU helps every split at every load
    by = ["split", "conc"]
    faster = variants["GPU x1.5"].set_index(by).output_throughput_tok_s
    assert (faster > variants["baseline"].set_index(by).output_throughput_tok_s).all()
