"""Reads only another process can fill, skipped while the runner's own commits are all that happened.

Operators' asks (``trigger``), and catch-up sequences whose run a job's own ``complete``
recorded, come from events the runner never writes: the runner's own commits can never make
such a read find something. So once one came back empty at events version v, it stays empty
for as long as every commit after v is one of the runner's: each own commit that lands exactly
one version after the last one known carries the empty reads along. Anything else (a commit by
another process, an append retried after an unclear failure, a version not read) drops them,
and the next tick reads again. On Spark each such read is a job over the events (~1 s at 100
sensors); a version read is a listing of the Delta log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: the operators' asks for a run now (heartbeat_trigger_asks)
ASKS = "trigger_asks"
#: sequences whose latest run succeeded without the runner recording it (heartbeat_job_sequences)
SEQUENCES = "next_windows_due"
#: runs the jobs service skipped (any RUN_SKIPPED event)
SKIPS = "skipped_requests"


@dataclass
class EmptyReads:
    """Which reads were empty at which events version, and the version this process knows of.

    Invariant: every entry of ``empty_at`` is a version at which that read found nothing, and
    only the runner's own commits came after it up to ``known`` when the two are equal.
    """

    #: read name -> the events version at which it was last found empty
    empty_at: dict[str, int] = field(default_factory=dict)
    #: the events version this process last read or committed (None: unknown)
    known: int | None = None

    def seen(self, version: int | None) -> None:
        """The events version was read now (any process may have committed since the last one known)."""
        self.known = version

    def still_empty(self, name: str) -> bool:
        """True when ``name`` was read empty at the version known now: no need to read it again."""
        return self.known is not None and self.empty_at.get(name) == self.known

    def found(self, name: str, *, empty: bool) -> None:
        """``name`` was read now, at (or after) the version known."""
        if empty and self.known is not None:
            self.empty_at[name] = self.known
        else:
            self.empty_at.pop(name, None)

    @property
    def carrying(self) -> bool:
        """Some read is empty at the version known: an own commit should say which version it made."""
        return self.known is not None and self.known in self.empty_at.values()

    def committed(self, version: int | None) -> None:
        """This process made one commit, after which the table is at ``version`` (None: not read)."""
        before, self.known = self.known, version
        if before is None or version != before + 1:
            self.empty_at.clear()
            return
        for name, at in self.empty_at.items():
            if at == before:
                self.empty_at[name] = version
