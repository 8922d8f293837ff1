"""Reads only another process can fill, skipped while the runner's own commits are all that happened.

Operators' asks (``trigger``), and catch-up sequences whose run a job's own ``complete``
recorded, come from events the runner never writes: the runner's own commits can never make
such a read find something. So once one came back empty, it stays empty for as long as every
commit after it is one of the runner's. Which commits are the runner's own is not decided here:
the control table keeps that one record (lakehouse/control_table.py, ``OwnCommits``), checked
at each refresh against the events version it reads. Anything else (a commit by another process,
an append retried after an unclear failure) makes the next tick read again. On Spark each such
read is a job over the events (~1 s at 100 sensors); the version is read at each refresh anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from heartbeat_runner.lakehouse.control_table import OwnCommits

#: the operators' asks for a run now (heartbeat_trigger_asks)
ASKS = "trigger_asks"
#: sequences whose latest run succeeded without the runner recording it (heartbeat_job_sequences)
SEQUENCES = "next_windows_due"
#: runs the jobs service skipped (any RUN_SKIPPED event)
SKIPS = "skipped_requests"


@dataclass
class EmptyReads:
    """Which reads were empty, and where in the events table's commits each was.

    Invariant: every entry of ``empty_at`` is an :attr:`OwnCommits.position` at which that read found nothing;
    it is still empty while ``own`` says only the runner's commits came after that position.
    """

    #: the control table's record of the runner's own commits
    own: OwnCommits
    #: read name -> the position (OwnCommits.position) at which it was last found empty
    empty_at: dict[str, int] = field(default_factory=dict)

    def still_empty(self, name: str) -> bool:
        """True when ``name`` was read empty and only the runner committed since: no need to read it again."""
        at = self.empty_at.get(name)
        return at is not None and self.own.only_own_after(at)

    def found(self, name: str, *, empty: bool) -> None:
        """``name`` was read now (``empty``: it found nothing)."""
        position = self.own.position
        if empty and position is not None:
            self.empty_at[name] = position
        else:
            self.empty_at.pop(name, None)
