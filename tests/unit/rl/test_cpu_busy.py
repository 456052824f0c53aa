"""The machine's busy CPU share that every RL metrics row carries (the bench's async ceiling rests on it)."""

import os
import threading
import time


def _spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def _window(work) -> tuple[float, float]:
    """(ours, psutil.cpu_percent's) busy share of the machine over the same window."""
    import psutil

    from roboloop.rl.run import _cpu_times, busy_share

    psutil.cpu_percent(None)
    a = _cpu_times()
    work()
    b = _cpu_times()
    theirs = psutil.cpu_percent(None) / 100
    return busy_share(a, b), theirs


def test_busy_share_agrees_with_psutil_and_counts_a_spinning_core():
    def spin() -> None:
        t = threading.Thread(target=_spin, args=(0.6,))
        t.start()
        _spin(0.6)
        t.join()

    for work in (lambda: time.sleep(0.6), spin):
        ours, theirs = _window(work)
        assert 0 <= ours <= 1 and abs(ours - theirs) < 0.05, (ours, theirs)
    # a spinning thread (the GIL runs one at a time) keeps at least one core of the machine busy
    assert ours >= 0.8 / (os.cpu_count() or 1), ours
