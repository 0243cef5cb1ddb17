"""Re-execute the stored notebooks in place, so that their outputs are a fresh run's.

    python notebooks/run.py                 # what-if.ipynb
    python notebooks/run.py interactive.ipynb

Needs `pip install '.[notebook]'`. tests/test_notebook.py executes what-if.ipynb again
and compares every stored text output with its fresh one: run this after a change that
moves the notebook's numbers, and commit the result.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbclient
import nbformat

FOLDER = Path(__file__).resolve().parent


def execute(path: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    return nb


def main(names: list[str]) -> None:
    for name in names or ["what-if.ipynb"]:
        path = FOLDER / name
        nb = execute(path)
        nbformat.write(nb, path)
        print(f"executed and stored {path.name}")


if __name__ == "__main__":
    main(sys.argv[1:])
