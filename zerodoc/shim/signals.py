"""SIGTERM: a run stopped from outside (a preemption, the scheduler's stop or time limit,
`kill`) records that it was, then ends exactly as it would have without zerodoc.

Without a handler the default action ends the process inside the kernel: no Python runs, the
run log has no end, and the rank reads as killed or crashed (ZD013 "(killed, crashed, or
hung)"). `install()` puts a handler in front of whatever was there, on the main thread only
(the only one that may set one) and only where Python owns the disposition:

- the default (`SIG_DFL`): the handler records, puts the default back and raises the signal
  again, so the process still ends by SIGTERM (exit status -15 / 143 for the launcher);
- a Python handler of the job's (set before attach): the handler records, puts the job's back
  and calls it, which decides what happens (exit, a checkpoint, nothing);
- ignored (`SIG_IGN`), or set outside Python (`getsignal()` None): left alone.

A handler the job sets after attach replaces ours (the job's choice; nothing is recorded).
A forked child (a DataLoader worker, which the loader ends with SIGTERM) inherits the
handler: there it records nothing and only passes the signal on (the run log is the parent's).
`undo()` (close) puts the previous disposition back while ours is still the one set. The
recording itself (`on_signal`) is bounded by the monitor (monitor.py `_terminated`); whatever
it raises, the signal is passed on.
"""

from __future__ import annotations

import os
import signal
import threading


def install(on_signal, signum: int = signal.SIGTERM):
    """Put a recording handler for `signum` in front of the current disposition; returns the
    undo, or None where nothing was installed (not the main thread, ignored, not Python's)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prev = signal.getsignal(signum)
    except (ValueError, OSError):
        return None
    if prev is None or prev == signal.SIG_IGN:
        return None

    pid = os.getpid()

    def handler(sig, frame):
        try:
            if os.getpid() == pid:  # not in a forked child (a DataLoader worker)
                on_signal(sig, frame)
        except BaseException:  # noqa: BLE001 - the signal's own effect comes first
            pass
        finally:
            if signal.getsignal(sig) is handler:
                signal.signal(sig, prev)
            if callable(prev):
                prev(sig, frame)
            else:  # the default: end the process by the signal, as without zerodoc
                signal.raise_signal(sig)

    try:
        signal.signal(signum, handler)
    except (ValueError, OSError):
        return None

    def undo() -> None:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signum) is handler:
            signal.signal(signum, prev)
    return undo


def name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
