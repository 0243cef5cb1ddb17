"""Where a sweep's scenarios run: in this process, on local worker processes, or on a
Dask distributed cluster. Each back end yields rows as the runs finish (in whatever order
they finish), so the caller can write each one at once; stopping early (an interrupt, an
error) cancels the runs not yet started.

A task is (tp, pp, load, combo): `fn(tp, pp, load, shared, run_kwargs, open_loop, combo)`
computes one row. `shared` (the inputs every run has, a Profile object can be megabytes) is
sent to each worker once; `combo` (box, engine, lengths) travels with its task.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from ..base.errors import UserError
from ..base.pool import die_with_parent

if TYPE_CHECKING:
    from dask.distributed import Client, Future

Task = tuple[int, int, float, dict]  # (tp, pp, load, combo)
# fn(tp, pp, load, shared, run_kwargs, open_loop, combo) -> one row
RowFn = Callable[[int, int, float, dict, dict, bool, dict], dict]


def run_tasks(
    fn: RowFn,
    tasks: Sequence[Task],
    shared: dict,
    run_kwargs: dict,
    open_loop: bool,
    workers: int | None = None,
    scheduler: str | None = None,
) -> Iterator[dict]:
    """The rows of `tasks`, as they finish: on the Dask cluster at `scheduler`, else on
    `workers` local processes (default: every core; 1 runs in this process)."""
    if not tasks:
        return iter(())
    if scheduler:
        return _run_dask(scheduler, fn, tasks, shared, run_kwargs, open_loop)
    n = min(workers or os.cpu_count() or 1, len(tasks))
    if n <= 1:
        return (fn(tp, pp, load, shared, run_kwargs, open_loop, combo) for tp, pp, load, combo in tasks)
    return _run_local(n, fn, tasks, shared, run_kwargs, open_loop)


def _run_local(
    n: int, fn: RowFn, tasks: Sequence[Task], shared: dict, run_kwargs: dict, open_loop: bool
) -> Iterator[dict]:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(max_workers=n, initializer=die_with_parent, initargs=(os.getpid(),))
    finished = False
    try:
        futures = [
            pool.submit(fn, tp, pp, load, shared, run_kwargs, open_loop, combo)
            for tp, pp, load, combo in tasks
        ]
        for fut in as_completed(futures):
            yield fut.result()
        finished = True
    finally:
        # all done: the idle workers exit and are joined; stopped early, the runs not
        # started are dropped, not waited for
        pool.shutdown(wait=finished, cancel_futures=not finished)


def connect(address: str) -> Client:
    """A Dask client of the scheduler at `address`; a missing Dask or an unreachable
    scheduler is one line."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise UserError("--scheduler needs Dask: pip install 'pipesim[cluster]'") from None
    try:
        return Client(address, timeout="10s", set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise UserError(f"cannot reach the Dask scheduler at {address}: {exc}") from None


def _run_dask(
    address: str, fn: RowFn, tasks: Sequence[Task], shared: dict, run_kwargs: dict, open_loop: bool
) -> Iterator[dict]:
    from dask.distributed import as_completed as dask_completed

    client = connect(address)  # before the first row is asked for: said at once
    return _dask_rows(client, dask_completed, fn, tasks, shared, run_kwargs, open_loop)


def _dask_rows(
    client: Client,
    dask_completed: Callable[..., Iterable[Future]],
    fn: RowFn,
    tasks: Sequence[Task],
    shared: dict,
    run_kwargs: dict,
    open_loop: bool,
) -> Iterator[dict]:
    with client:  # closing the client releases the futures not yet run
        [remote] = client.scatter([shared], broadcast=True, hash=False)
        futures = [
            client.submit(fn, tp, pp, load, remote, run_kwargs, open_loop, combo, pure=False)
            for tp, pp, load, combo in tasks
        ]
        for fut in dask_completed(futures, loop=client.loop):
            yield fut.result()
