"""Stop signals that come before a command handles them, kept so that none is lost (standard library only).

Python's own Ctrl-C handling raises KeyboardInterrupt wherever the main thread is. Inside a finalizer (a
``__del__`` or a weakref callback, which the garbage collector runs at any allocation) the interpreter swallows
it ("Exception ignored in ..."), and so does a library that catches everything: the program runs on as if never
asked to stop. CI saw a loop Ctrl-C'd in its first seconds still ticking two minutes later. So from the program's
first line (interfaces/entry.py) until a long-running command installs its own handling (core/stopping.py,
``StopRequest.install``), every stop signal is noted here before anything else happens to it, and that command
adopts what was noted: a loop told to stop while it started stops, whatever swallowed the KeyboardInterrupt.

Invariants:

- The handlers take no lock and do no I/O: they run between two bytecodes of the main thread, possibly while it
  holds a lock.
- A noted signal stays noted until a command adopts it (:func:`adopt`), once.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Any

#: the stop signals noted since the program started and not yet adopted, in order
_noted: list[int] = []


def note(signum: int, frame: FrameType | None) -> None:
    """While the program loads: note the signal, nothing else (nothing can be raised, or swallowed, inside a
    library's import)."""
    _noted.append(signum)


def note_then_interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C after loading, before a command handles it: note it, then do what Python does (KeyboardInterrupt).
    Should the KeyboardInterrupt be swallowed, the note remains for the command to adopt."""
    _noted.append(signum)
    raise KeyboardInterrupt


def noted() -> tuple[int, ...]:
    """The stop signals noted and not yet adopted."""
    return tuple(_noted)


def adopt() -> bool:
    """A command that now handles stop signals itself takes over: whether one was noted before (it should then
    stop as if it had received it); the notes are forgotten."""
    found = bool(_noted)
    _noted.clear()
    return found


def unraisable(unraisable: Any) -> None:
    """``sys.unraisablehook`` for the program: a KeyboardInterrupt a finalizer swallowed is not reported (the Ctrl-C
    was noted first and is handled: the command ends, or a loop adopts it); anything else is, as Python does."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(unraisable)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
