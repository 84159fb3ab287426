"""What a refused save leaves behind in the process: Orbax closes the save's event loop at the first failed write,
with the other writes still pending; write_failures.close_abandoned_writes closes them, so that no "never awaited"
warning prints after the run's one line."""
from __future__ import annotations

import asyncio
import errno
import gc
import warnings

import pytest

from pretrain.workdir import write_failures


def _save_refused_like_orbax() -> list[asyncio.Task]:
    """A save whose first write fails while the others are scheduled, in a loop closed after it (Orbax's
    asyncio_utils: run_until_complete, then close); -> the writes left pending."""
    async def write_fragment():
        pass

    abandoned = []

    def schedule_the_other_writes(_):  # in the loop's last iteration, as the writes of Orbax's other arrays
        abandoned.extend(asyncio.ensure_future(write_fragment()) for _ in range(3))

    async def save():
        asyncio.current_task().add_done_callback(schedule_the_other_writes)
        raise OSError(errno.EFBIG, "File too large")

    loop = asyncio.new_event_loop()
    with pytest.raises(OSError):
        loop.run_until_complete(save())
    loop.close()
    return abandoned


def _never_awaited_warnings_when_collected(tasks: list[asyncio.Task]) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tasks.clear()
        gc.collect()
    return sum("was never awaited" in str(w.message) for w in caught)


def test_the_writes_a_refused_save_abandons_are_closed_without_a_warning():
    left_alone = _save_refused_like_orbax()
    assert _never_awaited_warnings_when_collected(left_alone) == 3  # what the run printed after its one line

    closed = _save_refused_like_orbax()
    assert write_failures.close_abandoned_writes() == 3
    assert all(task.get_coro().cr_frame is None for task in closed)
    assert _never_awaited_warnings_when_collected(closed) == 0
    assert write_failures.close_abandoned_writes() == 0
