"""Host-side prefetch: batches (or any items) built on a background thread a few steps ahead, so the device
never waits on numpy. Used by the pretraining and fine-tuning loops."""
from __future__ import annotations

import queue
import threading
from typing import Any, Iterable, Iterator


def prefetch(make_batch, steps: range, size: int = 2) -> Iterator[tuple[int, Any]]:
    """(step, make_batch(step)) built on a host thread `size` steps ahead, so the device never waits on numpy."""
    return prefetch_iterator(((s, make_batch(s)) for s in steps), size)


def prefetch_iterator(items: Iterable, size: int = 2) -> Iterator:
    """The items of `items`, produced on a host thread up to `size` ahead; errors surface in the consumer."""
    if size <= 0:
        yield from items
        return
    buffer: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()
    done = object()

    def produce():
        try:
            for item in items:
                if stop.is_set():
                    return
                buffer.put((item, None))
        except BaseException as e:  # surface errors in the consumer, not as a silent dead thread
            buffer.put((done, e))
        buffer.put((done, None))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while True:
            item, error = buffer.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
