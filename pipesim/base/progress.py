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
    delay: float = 0.0,
) -> tqdm:
    """A tqdm bar over `total` units (its rate gives the ETA), to stderr. `initial`: units
    done before (a resumed sweep's), counted but not in the rate; `leave`: the final count
    stays on the terminal; `delay`: drawn only once the work has taken that many seconds
    (work that may be quick draws nothing then). Every unit is drawn (a unit is a whole
    run: no refresh interval hides the last ones)."""
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
        delay=delay,
    )


class RequestBar:
    """A bar over one run's requests: the simulation tells `tick` (requests finished,
    the most it may still need) as requests finish; the total is that expectation,
    which a stopping rule keeps honest (its ETA never too early, at worst too late).
    Shown only once the run has taken `delay` seconds, so a quick prediction draws
    nothing."""

    def __init__(self, desc: str, progress: bool | None = None, delay: float = 2.0) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=1,
            desc=desc,
            unit="request",
            disable=None if progress is None else not progress,
            leave=False,
            delay=delay,
            mininterval=0.2,
        )

    def tick(self, done: int, expected: int) -> None:
        self.bar.total = max(expected, done)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        self.bar.close()
