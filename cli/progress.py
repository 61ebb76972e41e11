"""Progress on stderr for the commands that run a model (index, eval, calibrate, bench): a live
rich bar on a terminal; elsewhere (a log file, a pipe, CI) one plain line every few seconds, as
pip and tqdm do, so the log of a long job shows life. Model loading is a status line of ours:
transformers' own "Loading weights" bar is switched off for the command.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.markup import escape

from faste_mm.cli.common import stderr
from faste_mm.errors import ConfigError

# Seconds between plain progress lines when stderr is not a terminal (0: a line per update).
INTERVAL_ENV = "FASTE_MM_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 5.0
_BAR_WIDTH = 20  # characters: leaves an 80-column terminal room for the count, elapsed and ETA


def interval_s() -> float:
    """The plain-line interval: FASTE_MM_PROGRESS_INTERVAL, else DEFAULT_INTERVAL_S."""
    text = os.environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ConfigError(f"{INTERVAL_ENV}={text!r}: give the seconds between progress lines, a number >= 0")
    return value


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def format_span(seconds: float) -> str:
    """A duration in words, to the precision a forecast has: "40 s", "12 min", "7 h 40 min"."""
    if seconds < 90:
        return f"{max(round(seconds), 1)} s"
    minutes = round(seconds / 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


class Progress:
    """One phase at a time (`start`), advanced by `update`/`advance`, each line showing
    done/total, the caller's rates and an ETA. Use as a context manager around the work.

    console: where it draws (stderr). live: a rich bar (default: when the console is a
    terminal); otherwise plain lines at most every `interval` seconds, plus one when a phase
    completes, so every log ends each phase at 100%.
    """

    def __init__(self, console: Console = stderr, *, live: bool | None = None, interval: float | None = None) -> None:
        self._console = console
        self._live = console.is_terminal if live is None else live
        self._interval = interval_s() if interval is None else interval
        self._bar = None
        self._task = None
        self._label = ""
        self._unit = ""
        self._total: float | None = None
        self._done = 0.0
        self._started = time.monotonic()
        self._printed = float("-inf")
        self.load_s = 0.0  # seconds spent in `loading`

    def __enter__(self) -> "Progress":
        if self._live:
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn
            from rich.table import Column

            # A short bar, then the label and the numbers that matter first (count, elapsed, ETA),
            # the rates after them; at any width the text folds onto a second line, never "…".
            self._bar = RichProgress(BarColumn(bar_width=_BAR_WIDTH),
                                     TextColumn("{task.fields[line]}",
                                                table_column=Column(ratio=1, overflow="fold")),
                                     console=self._console, transient=True, expand=True)
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    # ---- phases ---------------------------------------------------------------------------
    def start(self, label: str, total: float | None, unit: str = "") -> None:
        """Begin a phase: `total` units of work (None: unknown). The signature of
        `faste_mm.datasets.ProgressSink.start`, so eval, calibrate and bench report here."""
        self._label, self._unit, self._total, self._done = label, unit, total, 0.0
        self._started = time.monotonic()
        self._printed = float("-inf")
        if self._bar is not None:
            self._task = self._bar.add_task(escape(label), total=total, line=escape(label))

    def advance(self, n: float = 1, detail: str = "") -> None:
        self.update(self._done + n, detail=detail)

    def update(self, done: float, total: float | None = None, detail: str = "", share: float | None = None,
               eta_s: float | None = None) -> None:
        """`done` units of the phase finished; `detail` is shown after the count (rates);
        `share`, when the caller knows the part done better than done/total, drives the bar
        and the ETA; `eta_s`, when the caller knows the seconds left (index: per input kind at
        its measured rate), is the ETA."""
        if total is not None:
            self._total = total
        self._done = done
        line = self.line(detail, share, eta_s=eta_s)
        if self._bar is not None:
            shown = done if share is None or not self._total else share * self._total  # per batch, not per commit
            text = _packed(f"{self._label}: {self.line(detail, share, numbers_first=True, eta_s=eta_s)}",
                           self._console.width - _BAR_WIDTH - 1)
            self._bar.update(self._task, completed=shown, total=self._total, line=escape(text), refresh=True)
            return
        now = time.monotonic()
        finished = self._total is not None and done >= self._total
        if finished or now - self._printed >= self._interval:
            self._printed = float("inf") if finished else now  # a finished phase prints once
            self._console.print(f"{escape(self._label)}: {escape(line)}", highlight=False, markup=True)

    def line(self, detail: str = "", share: float | None = None, numbers_first: bool = False,
             eta_s: float | None = None) -> str:
        """The text after the label: count, detail, elapsed and ETA (numbers_first: count,
        elapsed, ETA, then the detail, for the live bar where the end may fold away). The ETA
        is `eta_s` when given, else the elapsed time extrapolated over `share`."""
        elapsed = time.monotonic() - self._started
        count = f"{self._done:.0f}" + ("" if self._total is None else f"/{self._total:.0f}")
        count += f" {self._unit}" if self._unit else ""
        if share is None and self._total:
            share = self._done / self._total
        if not detail and self._done and elapsed > 0:
            detail = f"{self._done / elapsed:.2f}/s"
        times = [f"elapsed {format_duration(elapsed)}"]
        if eta_s is None and share is not None and 0 < share < 1:
            eta_s = elapsed * (1 - share) / share
        if eta_s is not None and (share is None or share < 1):
            times.append(f"ETA {format_duration(eta_s)}")
        details = [detail] if detail else []
        return "  ".join([count, *times, *details] if numbers_first else [count, *details, *times])

    # ---- steps without a count --------------------------------------------------------------
    def status(self, text: str) -> None:
        """A one-off line (e.g. what is about to happen)."""
        self._console.print(escape(text), highlight=False)

    @contextmanager
    def loading(self, name: str) -> Iterator[None]:
        """Load a model under our own status line ("loading model NAME ...", then the seconds
        it took) with transformers' per-weight bar switched off. The time it takes is kept out
        of the phase's elapsed time and ETA (`load_s`, for callers' rates too)."""
        quiet_transformers()
        self.status(f"loading model {name} ...")
        started = time.monotonic()
        yield
        seconds = time.monotonic() - started
        self.load_s += seconds
        self._started += seconds
        self.status(f"loaded model {name} in {seconds:.1f} s")


def _packed(text: str, width: int) -> str:
    """`text`'s groups (separated by two spaces: "16 items", "elapsed 0:02") packed into lines of
    at most `width` columns. rich wraps at any space, which at 80 columns left "16" at the end of
    one line and "items" on the next; a group longer than a line is left to rich's fold."""
    lines: list[str] = []
    for group in text.split("  "):
        if lines and len(lines[-1]) + 2 + len(group) <= width:
            lines[-1] += "  " + group
        else:
            lines.append(group)
    return "\n".join(lines)


def quiet_transformers() -> None:
    """Switch off transformers' "Loading weights" bar for this process (called inside the
    commands that load a model, never at import: the library and other programs keep theirs)."""
    from huggingface_hub.utils import enable_progress_bars
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    enable_progress_bars()  # disable_progress_bar also silences downloads; those are worth seeing
