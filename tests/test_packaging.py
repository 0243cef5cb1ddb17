"""A non-editable install ships every subpackage and data file: pyproject.toml lists
packages by hand, so a new subpackage or data file left out of it breaks
`pip install pipesim` while an editable checkout still works."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path

from pipesim.base.toml import toml_reader

REPO = Path(__file__).resolve().parent.parent
SETUP = toml_reader.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_subpackage_is_listed():
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "pipesim").rglob("__init__.py")}
    missing = sorted(found - set(SETUP["packages"]))
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}"


def test_every_data_file_matches_a_package_data_pattern():
    data = REPO / "pipesim" / "data"
    patterns = SETUP["package-data"]["pipesim.data"]
    for f in data.rglob("*"):
        if f.is_file() and f.suffix != ".py" and "__pycache__" not in f.parts:
            rel = f.relative_to(data).as_posix()
            assert any(fnmatch(rel, p) for p in patterns), f"pipesim/data/{rel} is not shipped"


def test_every_shipped_catalogue_file_is_installed():
    """The derived AIConfigurator tables (calibration/catalogue) reach a plain install."""
    folder = REPO / SETUP["package-dir"]["pipesim.data.catalogue"]
    patterns = SETUP["package-data"]["pipesim.data.catalogue"]
    files = [
        f for f in folder.rglob("*") if f.is_file() and f.suffix != ".py" and "__pycache__" not in f.parts
    ]
    assert any(f.suffix == ".npz" for f in files)
    for f in files:
        rel = f.relative_to(folder).as_posix()
        assert any(fnmatch(rel, p) for p in patterns), f"calibration/catalogue/{rel} is not shipped"


def test_the_notebook_extra_installs_a_way_to_open_a_notebook():
    """`pip install '.[notebook]'` (README) gives Jupyter itself, not only the kernel and
    the runner the tests use."""
    meta = toml_reader.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    extra = meta["project"]["optional-dependencies"]["notebook"]
    names = {re.split(r"[<>=\[ ;]", req, maxsplit=1)[0].lower() for req in extra}
    assert names & {"notebook", "jupyterlab", "jupyter"}, extra
    assert {"ipykernel", "ipywidgets", "nbclient"} <= names


def test_uninstalled_fallbacks_are_the_folders_package_dir_maps(monkeypatch):
    """Run from a checkout whose install is not editable, `pipesim` is the source tree,
    where pipesim.data.profiles and the others do not exist as folders: each reader falls
    back to the folder pyproject.toml's package-dir maps to that package."""
    from importlib import resources

    from pipesim.calibrate import corpus
    from pipesim.profiles import derived, profile

    def missing(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(resources, "files", missing)
    for package, where in [
        ("pipesim.data.profiles", profile._shipped()),
        ("pipesim.data.catalogue", derived._root()),
        ("pipesim.validation", corpus.corpus_dir()),
    ]:
        assert Path(where) == REPO / SETUP["package-dir"][package], package
