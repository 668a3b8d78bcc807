"""Running an ``async def`` handler to its end from the bus's synchronous delivery path.

A delivery runs on a thread (the polling worker's, or the one the Functions app hands each
invocation to), and the handler's effect must be in its context before the commit, so the
delivery waits for the handler's coroutine to end. Where it runs:

* on the event loop the delivery was handed off from, when there is one (``handed_off_from``:
  the Functions app's trigger, whose loop waits for the delivery meanwhile) - so an async
  handler runs on the worker's event loop like any async function of the app, and the clients
  it keeps between invocations stay on one loop;
* otherwise on the delivering thread's own event loop, kept for that thread's later handlers
  and closed with the thread;
* and, on a thread whose event loop is running already (synchronous bus code called from async
  code, which must not block its own loop), on a helper thread's new loop.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

_here = threading.local()


def is_async(function: object) -> bool:
    """Whether calling ``function`` gives a coroutine (``async def``, a ``functools.partial``
    of one, or an object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(function) or (
        callable(function) and inspect.iscoroutinefunction(type(function).__call__))


def completed(handler: Callable[..., Any]) -> Callable[..., None]:
    """``handler``, which may return an awaitable: awaited to its end before this returns."""

    def run(*args: Any) -> None:
        result = handler(*args)
        if inspect.isawaitable(result):
            run_to_end(result)

    run.__wrapped__ = handler  # type: ignore[attr-defined]
    return run


@contextmanager
def handed_off_from(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """On this thread, while the block runs, handlers' coroutines run on ``loop`` (which
    waits for this thread meanwhile)."""
    previous = getattr(_here, "origin", None)
    _here.origin = loop
    try:
        yield
    finally:
        _here.origin = previous


def run_to_end(awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable`` (or its exception), run where the module docstring says."""
    running = _running_loop()
    origin: asyncio.AbstractEventLoop | None = getattr(_here, "origin", None)
    if origin is not None and origin is not running and origin.is_running():
        return asyncio.run_coroutine_threadsafe(_awaited(awaitable), origin).result()
    if running is None:
        return _own_loop().run_until_complete(_awaited(awaitable))
    with ThreadPoolExecutor(1, thread_name_prefix="bus-async-handler") as helper:
        return helper.submit(asyncio.run, _awaited(awaitable)).result()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _OwnLoop:
    """A thread's own event loop, closed when the thread ends (its locals are dropped)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __del__(self) -> None:
        if not self.loop.is_closed():
            self.loop.close()


def _own_loop() -> asyncio.AbstractEventLoop:
    own: _OwnLoop | None = getattr(_here, "own", None)
    if own is None or own.loop.is_closed():
        own = _here.own = _OwnLoop()
    return own.loop


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
