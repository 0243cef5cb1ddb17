"""Progress bars with an ETA for the commands that take more than a few seconds.

`progress=None` shows the bar only on a terminal (stderr), `True` always, `False`
never; the command line's `--progress/--no-progress` passes it through. Work reports
each finished unit through a plain callable, so the computing code stays free of
tqdm and of any state outside the call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm import tqdm


def bar(
    total: int | None,
    desc: str,
    progress: bool | None = None,
    unit: str = "run",
    initial: int = 0,
    leave: bool = False,
) -> tqdm:
    """A tqdm bar over `total` units (its rate gives the ETA), to stderr. `initial`: units
    done before (a resumed sweep's), counted but not in the rate; `leave`: the final count
    stays on the terminal. Every unit is drawn (a unit is a whole run: no refresh interval
    hides the last ones)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        initial=initial,
        disable=None if progress is None else not progress,
        leave=leave,
        mininterval=0,
        miniters=1,
    )
