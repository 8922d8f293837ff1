"""Readable tables, JSON, progress and live status lines for the CLI, drawn with rich.

Every console comes from :func:`console_for`. On a terminal rich picks the width and the
colours (none when NO_COLOR is set, which rich honours itself). Anywhere else (a pipe, a
file, a test) the text is plain, without escape codes (unless FORCE_COLOR asks for them); when
$COLUMNS is set no line is longer (as on a terminal that wide), else a table is never squeezed
below its natural width: one line per row, for grep and awk. Progress and live lines go to stderr and are drawn only when
stderr is an interactive terminal; elsewhere they fall back to one plain line per step, as
logs want.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from enum import Enum
from typing import Any, TextIO
from zoneinfo import ZoneInfo

from rich import box
from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from heartbeat_runner.core.records import JobState, JobStatus, Outcome, TickStatus

#: The control-table columns `status` and the demo print.
STATUS_COLUMNS = ["trigger_job_id", "trigger_job_name", "sensor_source", "sensor_id", "dependency_flag", "job_state",
                  "status", "status_change_timestamp", "job_run_id", "last_error"]
#: Width of what is written to anything but a terminal, unless $COLUMNS says otherwise.
PLAIN_WIDTH = 160
#: The widest a free-text cell is shown on a terminal; longer ones end in an ellipsis (off a terminal: whole).
MAX_CELL_WIDTH = 48
#: The narrowest a free-text column is folded to on a narrow terminal (ids and states are never narrowed).
MIN_FREE_WIDTH = 8
#: What a table puts between two columns (the box's separator and the cell's right padding).
COLUMN_GAP = 2
#: Columns whose values are coloured by what they say.
STATE_COLUMNS = frozenset({"status", "job_state", "outcome", "last_outcome"})
#: Besides every ``*_id`` column: keys and states shown whole, never cut (see :func:`is_whole_column`).
WHOLE_COLUMNS = STATE_COLUMNS | {"source_key", "row_state", "dependency_flag", "dependency", "run"}
STATE_STYLES = {
    JobStatus.COMPLETED.value: "green", TickStatus.OK.value: "green",
    JobStatus.FAILED.value: "bold red", JobStatus.REFUSED.value: "bold red", Outcome.ERROR.value: "bold red", TickStatus.INCOMPLETE.value: "red",
    JobStatus.IN_PROGRESS.value: "cyan",
    JobStatus.NEW_EVENT_AVAILABLE.value: "yellow", Outcome.NEW_DATA.value: "yellow",
    JobState.PAUSED.value: "dim", Outcome.SKIPPED.value: "dim", Outcome.NO_NEW_DATA.value: "dim",
}

#: What :func:`watch` reads each time: the rows, the columns to show and a note for the caption (or None).
Snapshot = tuple[Sequence[dict], Sequence[str], "str | None"]


class _Zone:
    """The zone every time is shown in (HEARTBEAT_TIMEZONE, set once by the CLI; UTC until then).
    Stored times are UTC; a time without a zone is read as UTC."""

    zone: tzinfo = timezone.utc


def show_times_in(name: str) -> None:
    """Show every time from now on in the IANA zone ``name`` (already validated by the settings)."""
    _Zone.zone = timezone.utc if name == "UTC" else ZoneInfo(name)


def local_time(value: datetime) -> datetime:
    """``value`` (UTC when it has no zone) in the display zone."""
    return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).astimezone(_Zone.zone)


def zone_name(at: datetime | None = None) -> str:
    """The display zone's abbreviation at ``at`` (default now): ``UTC``, ``CET``, ``CEST``."""
    return local_time(at or datetime.now(timezone.utc)).tzname() or "UTC"


def short_time(value: datetime | None, now: datetime, *, seconds: bool = False) -> str:
    """``08:30 UTC`` when ``value`` falls on ``now``'s day (in the display zone), else ``05-01 08:30 UTC``;
    ``-`` when unknown. With ``seconds``: ``08:30:15 UTC``."""
    if value is None:
        return "-"
    shown, today = local_time(value), local_time(now)
    day = "" if shown.date() == today.date() else f"{shown:%m-%d} "
    clock = f"{shown:%H:%M:%S}" if seconds else f"{shown:%H:%M}"
    return f"{day}{clock} {shown.tzname()}"


def timestamp(value: datetime) -> str:
    """``2026-05-01 08:30:00 UTC``: a time in the display zone, with the zone."""
    shown = local_time(value)
    return f"{shown:%Y-%m-%d %H:%M:%S} {shown.tzname()}"


class _Console(Console):
    """rich's Console, except that a reader who went away (``… | head -1``) is the command's business:
    rich would end the process with status 1; here the BrokenPipeError goes on to ``cli.main``, which
    ends quietly with 0 (and the page's server, which drops that one answer)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError("the reader of the output went away")


def console_for(stream: TextIO | None = None) -> Console:
    """A rich Console writing to ``stream`` (default: stdout as it is now).

    On a terminal: rich's width and colours (none when NO_COLOR is set). Elsewhere: a fixed width
    ($COLUMNS or PLAIN_WIDTH) and no escape codes (rich's own choice off a terminal, unless
    FORCE_COLOR asks for colour). Markup, emoji codes and highlighting are off: what is printed
    is data, shown as it is.
    """
    console = _Console(file=stream if stream is not None else sys.stdout, highlight=False, markup=False, emoji=False)
    if not on_screen(console):
        console.width = _plain_width()
    return console


def on_screen(console: Console) -> bool:
    """Whether ``console`` writes to a real terminal (FORCE_COLOR may colour a pipe; it stays a pipe)."""
    return _is_terminal(console.file)


def can_redraw(console: Console) -> bool:
    """Whether ``console`` may redraw in place: an interactive terminal (not a dumb one, not a pipe)."""
    return console.is_interactive and on_screen(console)


def _plain_width() -> int:
    """$COLUMNS when it is a sensible number, else PLAIN_WIDTH."""
    try:
        return max(40, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        return PLAIN_WIDTH


def _is_terminal(stream: object) -> bool:
    """Whether ``stream`` is a terminal (a closed one is not)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed
        return False


def columns_set() -> bool:
    """Whether $COLUMNS asks for a width (then output off a terminal is never wider: ``… | less``, a log)."""
    return bool(os.environ.get("COLUMNS", "").strip())


def fits_width(console: Console) -> bool:
    """Whether what ``console`` prints must fit its width: on a terminal, or off one when $COLUMNS is set."""
    return on_screen(console) or columns_set()


def show(console: Console, renderable: RenderableType) -> None:
    """Print on ``console``; off a terminal at least as wide as the renderable needs (no wider than $COLUMNS
    when that is set), lines without trailing blanks."""
    if on_screen(console):
        # plain text (the rows one after another) is left to the terminal to wrap: no value is broken by us
        console.print(renderable, soft_wrap=isinstance(renderable, Text))
        return
    needed = console.measure(renderable, options=console.options.update_width(10_000)).maximum
    width = console.width if columns_set() else max(console.width, needed)
    wide = Console(file=console.file, width=width, force_terminal=console.is_terminal,
                   color_system=console.color_system, no_color=console.no_color,  # type: ignore[arg-type]
                   highlight=False, markup=False, emoji=False)
    with wide.capture() as captured:
        wide.print(renderable)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    console.file.flush()


# -- tables and JSON ---------------------------------------------------------------------------

def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, datetime):
        return timestamp(value)
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _styled(column: str, value: Any, max_width: int | None) -> Text:
    """A cell as rich Text, cut to ``max_width`` (None: whole); a state column's value in its colour."""
    shown = _cell(value)
    text = Text(shown, style=STATE_STYLES.get(shown, "") if column in STATE_COLUMNS else "")
    if max_width is not None:
        text.truncate(max_width, overflow="ellipsis")
    return text


def is_whole_column(column: str) -> bool:
    """Ids, keys, times and states: what people copy into the next command or read at a glance, never cut or wrapped."""
    return column.endswith(("_id", "_timestamp", "_ts", "_at")) or column in WHOLE_COLUMNS


def rows_table(rows: Sequence[dict], columns: Sequence[str], *, title: str | None = None,
               caption: str | None = None, max_width: int | None = MAX_CELL_WIDTH, wrap: bool = True,
               screen_width: int | None = None) -> Table:
    """Rows as a rich Table: upper-case headers, coloured states.

    Id, key and state columns (:func:`is_whole_column`) are always shown whole on one line.
    Other cells are cut with an ellipsis past ``max_width`` (None: never cut); with ``wrap`` and a
    ``screen_width`` they share what the whole columns leave of the screen (at least
    MIN_FREE_WIDTH each) and fold onto more lines. Without ``wrap`` every row stays one line.
    """
    table = Table(title=Text(title) if title else None, title_justify="left", title_style="bold",
                  caption=Text(caption) if caption else None, caption_justify="left", caption_style="dim",
                  header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    widths = _column_widths(rows, columns)
    free = [c for c in columns if not is_whole_column(c)]
    share = _free_share(widths, free, screen_width) if wrap and screen_width else None
    for column in columns:
        if not is_whole_column(column):
            limit = min(x for x in (max_width, share) if x is not None) if (max_width or share) else None
            table.add_column(column.upper(), no_wrap=not wrap, overflow="fold" if wrap else "ellipsis",
                             max_width=limit, min_width=min(widths[column], limit or widths[column]))
        else:
            header = folded_header(column, widths[column]) if wrap else column.upper()
            table.add_column(header, no_wrap=True, min_width=_whole_width(column, widths[column]) if wrap else None)
    for row in rows:
        table.add_row(*(_styled(column, row.get(column), None if is_whole_column(column) else max_width)
                        for column in columns))
    return table


def folded_header(column: str, width: int) -> str:
    """``column`` upper-cased, broken after underscores onto lines of at most ``width`` (or its longest part)."""
    parts = [p + "_" for p in column.upper().split("_")]
    parts[-1] = parts[-1][:-1]
    width = max(width, *(len(p) for p in parts))
    lines = [""]
    for part in parts:
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


def _column_widths(rows: Sequence[dict], columns: Sequence[str]) -> dict[str, int]:
    """Each column's natural width: its widest value (a header may fold onto two lines), at least 4."""
    return {c: max([4, *(len(_cell(r.get(c))) for r in rows)]) for c in columns}


def table_min_width(rows: Sequence[dict], columns: Sequence[str]) -> int:
    """The narrowest a table of ``rows`` can be drawn with its whole columns whole."""
    widths = _column_widths(rows, columns)
    return sum(_whole_width(c, w) if is_whole_column(c) else min(w, MIN_FREE_WIDTH)
               for c, w in widths.items()) + COLUMN_GAP * len(columns)


def _whole_width(column: str, width: int) -> int:
    """The width a whole column takes: its widest value or the widest line of its folded header."""
    return max(width, *map(len, folded_header(column, width).splitlines()))


def records_view(rows: Sequence[dict], columns: Sequence[str], title: str | None = None) -> RenderableType:
    """Rows one after another, a ``COLUMN  value`` line each (psql's expanded display): for a terminal too
    narrow for the table with its ids whole."""
    label = max(len(c) for c in columns)
    lines = [Text(title, style="bold")] if title else []
    for number, row in enumerate(rows, 1):
        lines.append(Text(f"-[ {number} ]" + "-" * max(0, label - 4), style="dim"))
        for column in columns:
            lines.append(Text(f"{column.upper():<{label}}  ") + _styled(column, row.get(column), None))
    return Text("\n").join(lines)


def _free_share(widths: dict[str, int], free: Sequence[str], screen_width: int) -> int | None:
    """The width each free-text column may take so the table fits ``screen_width`` (None: it fits as it is)."""
    if sum(widths.values()) + COLUMN_GAP * len(widths) <= screen_width or not free:
        return None
    left = screen_width - COLUMN_GAP * len(widths) - sum(_whole_width(c, w) for c, w in widths.items() if c not in free)
    return max(MIN_FREE_WIDTH, left // len(free))


def emit(rows: Sequence[dict], columns: Sequence[str], *, as_json: bool, title: str | None = None,
         out: TextIO | None = None) -> None:
    """Print rows as a table (with an optional title; its leading newlines stay blank lines) or as a JSON array."""
    out = out if out is not None else sys.stdout
    if as_json:
        json.dump([{c: r.get(c) for c in columns} for r in rows], out, default=_json_default, indent=2)
        out.write("\n")
        return
    console = console_for(out)
    heading = (title or "").lstrip("\n")
    if title and heading != title:
        console.line(len(title) - len(heading))
    show(console, _table_or_none(console, rows, columns, heading or None))


def _table_or_none(console: Console, rows: Sequence[dict], columns: Sequence[str], title: str | None,
                   caption: str | None = None) -> RenderableType:
    """The rows' table, or the title over ``(none)`` when there are no rows; on a terminal too narrow for the
    table with its ids whole, the rows one after another (:func:`records_view`)."""
    if rows and fits_width(console) and table_min_width(rows, columns) > console.width:
        return records_view(rows, columns, title)
    if rows:
        screen = fits_width(console)  # off a terminal (a pipe, a file) every value is printed whole, unless $COLUMNS
        return rows_table(rows, columns, title=title, caption=caption, wrap=screen,
                          max_width=MAX_CELL_WIDTH if screen else None, screen_width=console.width)
    lines = [Text(title, style="bold")] if title else []
    lines += [Text("(none)")] + ([Text(caption, style="dim")] if caption else [])
    return Text("\n").join(lines)


def emit_json(value: Any, out: TextIO | None = None) -> None:
    """Print a value as indented JSON (datetimes in ISO 8601)."""
    out = out if out is not None else sys.stdout
    json.dump(value, out, default=_json_default, indent=2)
    out.write("\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def watch(read: Callable[[], Snapshot], *, title: str, interval: float, count: int | None = None,
          as_json: bool = False, out: TextIO | None = None) -> int:
    """Show what ``read`` returns every ``interval`` seconds, ``count`` times (None: until Ctrl-C).

    On a terminal (and without ``as_json``) the table is redrawn in place with rich Live; otherwise a
    fresh table (or JSON array) is appended each time, so a pipe or a script gets every reading.
    Ctrl-C ends it normally. Returns how many readings were shown.
    """
    out = out if out is not None else sys.stdout
    console = console_for(out)
    in_place = can_redraw(console) and not as_json
    shown = 0
    try:
        with Live(console=console, auto_refresh=False, transient=False) if in_place else nullcontext() as live:
            while count is None or shown < count:
                started = time.monotonic()
                rows, columns, note = read()
                heading = f"{title} at {timestamp(datetime.now(timezone.utc))}, every {interval:g} s"
                if isinstance(live, Live):
                    caption = "; ".join(filter(None, [note, "Ctrl-C to stop"]))
                    live.update(_table_or_none(console, rows, columns, heading, caption), refresh=True)
                else:
                    if shown and not as_json:
                        console.line()
                    emit(rows, columns, as_json=as_json, title=None if as_json else heading, out=out)
                    if note and not as_json:
                        console.print(Text(f"({note})"))
                    out.flush()
                shown += 1
                if count is None or shown < count:
                    time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
    return shown


# -- compact views: one line per record, fitted to the width -----------------------------------

class Fit(str, Enum):
    """How a column of a compact view gives way when the line is too long."""

    WHOLE = "whole"    # never cut (ids, states, times, figures)
    MIDDLE = "middle"  # cut in the middle with "…" (names: their start and end tell them apart)
    END = "end"        # cut at the end with "…" (free text: its start says most)


@dataclass(frozen=True)
class Column:
    header: str
    fit: Fit = Fit.WHOLE
    #: the narrowest a cut column gets before the others give way
    min_width: int = 8


#: the most of a line's free room (what the whole columns leave) a name takes before free text gives way
NAME_SHARE = 0.35
#: a compact view's cell: its text and a rich style ("" for none)
Cell = tuple[str, str]


def fit_width(console: Console) -> int | None:
    """The width a compact view must fit: the terminal's; off a terminal $COLUMNS when set, else None
    (no line is cut: one whole record per line, for grep and awk)."""
    return console.width if fits_width(console) else None


def middle_cut(text: str, width: int) -> str:
    """``text`` at most ``width`` characters, its middle replaced by "…" when too long."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = (width - 1 + 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def end_cut(text: str, width: int) -> str:
    """``text`` at most ``width`` characters, ending in "…" when too long."""
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"[:width]


def compact_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int | None) -> list[Text]:
    """A header line and one line per row, columns two spaces apart, every line at most ``width`` characters
    (None: nothing cut). WHOLE columns are never cut; when the line is too long the END columns shrink first
    (to their min_width), then the MIDDLE ones, then the END ones to nothing."""
    natural = [max([len(c.header)] + [len(r[i][0]) for r in rows]) for i, c in enumerate(columns)]
    widths = list(natural) if width is None else _fitted(columns, natural, width)
    lines = [_joined([(c.header, "bold") for c in columns], widths, columns)]
    lines += [_joined(row, widths, columns) for row in rows]
    return lines


def _fitted(columns: Sequence[Column], natural: list[int], width: int) -> list[int]:
    """Column widths for a line of at most ``width``: a MIDDLE column first takes at most NAME_SHARE of the
    room the WHOLE columns leave; then END columns shrink to their min_width, MIDDLE ones to theirs, then
    both to one character. WHOLE columns keep their width even when the line cannot fit."""
    widths = list(natural)
    room = width - COLUMN_GAP * (len(widths) - 1) - sum(w for w, c in zip(widths, columns) if c.fit is Fit.WHOLE)
    over = sum(widths) + COLUMN_GAP * (len(widths) - 1) - width
    if over <= 0:
        return widths
    for i, column in enumerate(columns):
        if column.fit is Fit.MIDDLE:
            capped = min(widths[i], max(column.min_width, int(room * NAME_SHARE)))
            over -= widths[i] - capped
            widths[i] = capped
    for fit, floor in ((Fit.END, True), (Fit.MIDDLE, True), (Fit.END, False), (Fit.MIDDLE, False)):
        for i in reversed(range(len(columns))):
            if over <= 0:
                return widths
            if columns[i].fit is not fit:
                continue
            lowest = min(widths[i], columns[i].min_width) if floor else 1
            give = min(over, widths[i] - lowest)
            widths[i] -= give
            over -= give
    return widths


def _joined(cells: Sequence[Cell], widths: Sequence[int], columns: Sequence[Column]) -> Text:
    line = Text()
    for i, ((text, style), column) in enumerate(zip(cells, columns)):
        shown = middle_cut(text, widths[i]) if column.fit is Fit.MIDDLE else end_cut(text, widths[i]) \
            if column.fit is Fit.END else text
        last = i == len(columns) - 1
        line.append(shown if last else shown.ljust(widths[i]), style=style)
        if not last:
            line.append(" " * COLUMN_GAP)
    line.rstrip()
    return line


def cut_line(text: Text | str, width: int | None) -> Text:
    """One line of a compact view, cut at the end with "…" to ``width`` (None: whole)."""
    line = text.copy() if isinstance(text, Text) else Text(text)
    if width is not None and len(line) > width:
        line.truncate(width - 1)
        line.append("…")
    return line


def print_lines(console: Console, lines: Sequence[Text]) -> None:
    """Print already fitted lines as they are: never wrapped, never padded."""
    for line in lines:
        console.print(line, soft_wrap=True)


def watch_lines(read: Callable[[int | None], list[Text]], *, interval: float, count: int | None = None,
                out: TextIO | None = None) -> int:
    """Show what ``read(height)`` returns every ``interval`` seconds, ``count`` times (None: until Ctrl-C).

    On a terminal the view is redrawn in place (rich Live), ``read`` told the terminal's height so the view
    fits it; elsewhere each reading is appended after a blank line (on a terminal that cannot redraw, fitted to
    its height too; off a terminal ``read(None)``: whole). Ctrl-C ends it normally.
    Returns how many readings were shown."""
    out = out if out is not None else sys.stdout
    console = console_for(out)
    in_place = can_redraw(console)
    shown = 0
    try:
        with Live(console=console, auto_refresh=False, transient=False) if in_place else nullcontext() as live:
            while count is None or shown < count:
                started = time.monotonic()
                if isinstance(live, Live):
                    live.update(Text("\n").join(read(console.height - 1)), refresh=True)
                else:
                    if shown:
                        console.line()
                    print_lines(console, read(console.height - 1 if on_screen(console) else None))
                    out.flush()
                shown += 1
                if count is None or shown < count:
                    time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
    return shown


# -- progress and live lines (stderr) ----------------------------------------------------------

class Steps:
    """The steps of long work, reported on stderr; call it with each step's name as it starts.

    Inside ``with`` on a terminal: a spinner, the step, a bar over ``total`` steps (when known) and
    the time taken, gone when the work ends. Elsewhere one plain line per step (``prefix`` +
    the step), or none when ``quiet``.
    """

    def __init__(self, total: int | None = None, *, prefix: str = "  … ", quiet: bool = False,
                 stream: TextIO | None = None):
        self.console = console_for(stream if stream is not None else sys.stderr)
        self.total, self.prefix, self.quiet = total, prefix, quiet
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._started = 0

    def __enter__(self) -> Steps:
        if can_redraw(self.console):
            columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}", markup=False)]
            if self.total:
                columns += [BarColumn(), MofNCompleteColumn()]
            self._progress = Progress(*columns, TimeElapsedColumn(), console=self.console, transient=True,
                                      redirect_stdout=_is_terminal(sys.stdout), redirect_stderr=True)
            self._progress.start()
            self._task = self._progress.add_task("", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __call__(self, message: str, *, plain: bool = True) -> None:
        """Start the next step (on a terminal the one before counts as done); ``plain``: also as a plain line."""
        if self._progress is not None and self._task is not None:
            done = self._started if self.total is None else min(self._started, self.total)
            self._progress.update(self._task, description=message, completed=done)
            self._started += 1
        elif plain and not self.quiet:
            print(f"{self.prefix}{message}", file=self.console.file, flush=True)


class LiveLine:
    """One line of state on stderr: inside ``with`` on a terminal it is redrawn in place (rich Live),
    and since ``show`` takes a function it may change between redraws (a countdown). Elsewhere each
    ``show`` prints it once as a plain line, unless ``quiet``."""

    def __init__(self, *, quiet: bool = False, stream: TextIO | None = None):
        self.console = console_for(stream if stream is not None else sys.stderr)
        self.quiet = quiet
        self._render: Callable[[], str | Text] = lambda: ""
        self._live: Live | None = None

    @property
    def is_live(self) -> bool:
        return self._live is not None

    def __enter__(self) -> LiveLine:
        if can_redraw(self.console):
            self._live = Live(console=self.console, get_renderable=self._line, refresh_per_second=4,
                              redirect_stdout=_is_terminal(sys.stdout), redirect_stderr=True)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def show(self, render: Callable[[], str | Text], *, plain: bool = True) -> None:
        """The line now reads ``render()``; off a terminal it is printed now (if ``plain``)."""
        self._render = render
        if self._live is not None:
            self._live.refresh()
        elif plain and not self.quiet:
            print(str(render()), file=self.console.file, flush=True)

    def _line(self) -> Text:
        line = self._render()
        text = line.copy() if isinstance(line, Text) else Text(line)
        text.no_wrap, text.overflow = True, "ellipsis"
        return text
