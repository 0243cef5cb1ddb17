"""The notebooks: what-if.ipynb is stored executed (its figures and answers readable
without running it), runs top to bottom again here in a real kernel, draws its figures
and ends on a conclusion, using pipesim's public API only; interactive.ipynb runs with
its widgets' callback called once."""

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
    assert max(map(len, pngs)) < 80_000  # modest dpi: the stored file stays small
    assert NOTEBOOK.stat().st_size < 600_000


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
    last = [c for c in executed.cells if c.cell_type == "code"][-1]
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
