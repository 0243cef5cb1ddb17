"""Independent simulations spread over local processes: what a fit's evaluations, a
tornado's runs and the corpus check's runs are.

`map_shared(fn, shared, tasks, jobs)` returns `[fn(shared, task) for task in tasks]`.
`shared` is what every task needs and is large (a profile or a scenario: megabytes of
tables, and the lookups a first run builds from them): it reaches each worker process
once, through the pool's initializer, and stays there, so a task carries only what
differs (a parameter vector, a point, a perturbation). With `jobs` <= 1 or one task,
everything runs in this process, the same calls in the same order; a simulation is
deterministic, so the results are the same either way. `on_done(i)` is called in this
process as the i-th task finishes (a progress bar's update).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")

# A worker process's shared input and function, set once by its initializer: the one
# piece of module state, and only in a worker (each is a process of its own).
_WORKER: dict[str, Any] = {}


def default_jobs(limit: int = 4) -> int:
    """Processes to use when the user did not say: the CPUs, at most `limit` (each
    worker holds a copy of the shared input)."""
    return max(1, min(os.cpu_count() or 1, limit))


def map_shared(
    fn: Callable[[S, T], R],
    shared: S,
    tasks: Iterable[T],
    jobs: int = 1,
    on_done: Callable[[int], object] | None = None,
) -> list[R]:
    """fn(shared, task) for every task, in the tasks' order, on up to `jobs` local
    processes (`fn` a module-level function, so a worker can find it)."""
    todo = list(tasks)
    n = min(jobs, len(todo))
    if n <= 1:
        out = []
        for i, task in enumerate(todo):
            out.append(fn(shared, task))
            if on_done:
                on_done(i)
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: list[Any] = [None] * len(todo)
    pool = ProcessPoolExecutor(n, initializer=_start_worker, initargs=(fn, shared, os.getpid()))
    finished = False
    try:
        futures = [pool.submit(_run_task, i, task) for i, task in enumerate(todo)]
        for fut in as_completed(futures):
            i, value = fut.result()
            results[i] = value
            if on_done:
                on_done(i)
        finished = True
    finally:
        # stopped early (an error, an interrupt): the tasks not started are dropped
        pool.shutdown(wait=finished, cancel_futures=not finished)
    return results


def _start_worker(fn: Callable[[Any, Any], Any], shared: object, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    _WORKER["fn"], _WORKER["shared"] = fn, shared


def _run_task(i: int, task: object) -> tuple[int, object]:
    return i, _WORKER["fn"](_WORKER["shared"], task)


def die_with_parent(parent_pid: int) -> None:
    """In a worker process: exit when the parent process dies (a killed parent would
    otherwise leave its workers running). Linux: the kernel sends SIGKILL
    (prctl PR_SET_PDEATHSIG); elsewhere a thread watches the parent's pid."""
    import signal
    import threading
    import time

    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
