"""``rda history search|get|stats ROOT ...``: pulls from the history store on the command line.

Small pulls read the Parquet files with pyarrow (``rda.pipeline.history.local``; no JVM);
``--spark`` runs the same call through ``rda.pipeline.history.api.History`` on a local Spark session.
Output is a table on stdout, or ``--json`` (one document), ``--csv FILE``, ``--parquet FILE``.
Times are ISO 8601 (UTC unless an offset is given), ns integers, ``now``, or ``-1h`` (that long
before now); signals are ``DEV/Prop``, ``DEV/Prop#field`` or globs. Exit codes are those of
every ``rda`` command (docs/cli.md): 2 for a usage error (bad time, bad signal, clashing
options), 4 when a signal has no recorded data or names a field no recorded value has (the line
lists what exists), 1 for any other failure.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from rda.pipeline.history.local import local_get, local_search, local_stats
from rda.pipeline.history.paths import (
    Signal,
    StoreIndex,
    days_between,
    parse_duration,
    parse_signals,
    parse_time,
)
from rda.pipeline.recorder.model import DEFAULT_ENDPOINT
from rda.pipeline.recorder.store import Store

__all__ = ["NOT_FOUND", "NotRecordedError", "check_recorded", "history", "parse_cli_time"]

_MAX_CELL = 60
# rda.admin.cli.common.ExitCode.NO_SUCH_DEVICE (this layer may not import rda.admin; a test
# checks that the two agree).
NOT_FOUND = 4
_LISTED = 12  # names listed in a "not found" line before "..."


class NotRecordedError(click.ClickException):
    """A signal with no recorded data, or a field no recorded value has: one line, exit 4."""

    exit_code = NOT_FOUND

    def show(self, file: Any = None) -> None:
        click.echo(f"rda: not found: {self.format_message()}", err=True)


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _LISTED else "") or "none"


def _field_paths(kind: pa.DataType | None, prefix: str = "") -> list[str]:
    """``a``, ``b``, ``b.c`` ...: every field path of a ``data`` struct type."""
    if kind is None or not pa.types.is_struct(kind):
        return []
    paths: list[str] = []
    for i in range(kind.num_fields):
        child = kind.field(i)
        paths.append(prefix + child.name)
        paths += _field_paths(child.type, f"{prefix}{child.name}.")
    return paths


def check_recorded(
    root: Store, signals: Sequence[str], fields: Sequence[str], window: tuple[int, int]
) -> None:
    """Refuse, naming them, signals that match nothing recorded and fields that no recorded
    value of theirs has: a typo must not pass as an empty answer (issue 26).

    Fields are looked up in the files of the window's days (the last recorded day when the
    window has none): Parquet footers only, no data is read.
    """
    try:
        parsed = parse_signals(list(signals))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="SIGNALS") from None
    index = StoreIndex(root)
    recorded = index.keys([Signal("*", "*")])
    problems: list[str] = []
    for signal in parsed:
        keys = [key for key in recorded if signal.matches(*key)]
        if not keys:
            known = _listing([f"{d}/{p}" for d, p in recorded])
            problems.append(f"no recorded data for {signal.text!r} (recorded: {known})")
            continue
        wanted = [signal.field] if signal.field is not None else list(fields)
        if not wanted:
            continue
        paths: set[str] = set()
        for device, prop in keys:
            days = index.days(device, prop)
            chosen = [d for d in days_between(*window) if d in days] or days[-1:]
            for path in index.files(device, prop, chosen):
                paths.update(_field_paths(index.data_type(path)))
        unknown = [name for name in wanted if name not in paths]
        if unknown:
            where = f"{signal.device}/{signal.prop}"
            names = ", ".join(repr(n) for n in unknown)
            problems.append(f"{where} has no field {names} (fields: {_listing(sorted(paths))})")
    if problems:
        raise NotRecordedError("; ".join(problems))


def parse_cli_time(text: str, argument: str, now: int | None = None) -> int:
    """ns UTC from ``now``, ``-<duration>`` (before now), an ns integer or an ISO 8601 time."""
    text = text.strip()
    current = time.time_ns() if now is None else now
    if text == "now":
        return current
    if text.startswith("-") and not text[1:].isdigit():
        return current - parse_duration(text[1:], argument)
    if text.lstrip("-").isdigit():
        return int(text)
    return parse_time(text, argument)


class _Output:
    """Where the result goes: a table on stdout, JSON, a CSV or a Parquet file."""

    def __init__(self, as_json: bool, csv_file: Path | None, parquet_file: Path | None) -> None:
        if sum((as_json, csv_file is not None, parquet_file is not None)) > 1:
            raise click.UsageError("give at most one of --json, --csv, --parquet")
        self.as_json = as_json
        self.csv_file = csv_file
        self.parquet_file = parquet_file

    def write(self, table: pa.Table) -> None:
        if self.parquet_file is not None:
            pq.write_table(table, self.parquet_file)
            click.echo(f"{table.num_rows} rows written to {self.parquet_file}", err=True)
        elif self.csv_file is not None:
            pacsv.write_csv(_flat(table), self.csv_file)
            click.echo(f"{table.num_rows} rows written to {self.csv_file}", err=True)
        elif self.as_json:
            rows = _json_value(table.to_pylist())
            click.echo(json.dumps(rows, default=_json_default, allow_nan=False))
        else:
            click.echo(_format_table(table))


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _flat(table: pa.Table) -> pa.Table:
    """Nested columns (lists, structs) as JSON text: CSV has no nested types."""
    columns = []
    for column in table.columns:
        kind = column.type
        if pa.types.is_nested(kind):
            text = [
                None if v is None else json.dumps(_json_value(v), default=_json_default)
                for v in column.to_pylist()
            ]
            columns.append(pa.array(text, pa.string()))
        else:
            columns.append(column)
    return pa.table(columns, names=table.schema.names)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ").replace("+00:00", "Z")
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list) and len(value) > 8:
        head = ", ".join(_cell(v) for v in value[:6])
        return f"[{head}, … ({len(value)})]"
    text = str(value)
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"


def _format_table(table: pa.Table) -> str:
    names = table.schema.names
    rows = [[_cell(v) for v in row.values()] for row in table.to_pylist()]
    widths = [max([len(n), *(len(r[i]) for r in rows)]) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append(f"({len(rows)} rows)")
    return "\n".join(lines)


def _spark_history(root: Store) -> Any:
    from rda.pipeline.history.api import History

    return History.local(root)


def _spark_table(frame: Any) -> pa.Table:
    table: pa.Table = frame.toArrow()
    return table


def _from_recorder(
    signals: list[str],
    window: tuple[int, int],
    fields: Sequence[str] | None,
    selector: str | None,
    errors: bool,
) -> pa.Table:
    from rda.pipeline.history.remote import remote_get
    from rda.serialization.errors import NoSuchDeviceError, RdaError

    try:
        return remote_get(signals, *window, fields, selector, errors)
    except RdaError as exc:
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc.__cause__, NoSuchDeviceError):  # no recorder serves it: exit 4
            raise NotRecordedError(text) from None
        raise click.ClickException(text) from None


def _run(action: Callable[[], pa.Table], output: _Output) -> None:
    try:
        table = action()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    output.write(table)


def _output_options(command: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--spark", is_flag=True, help="Run through Spark (History) instead of pyarrow."
        ),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document."),
        click.option(
            "--csv",
            "csv_file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Write CSV here (nested values as JSON).",
        ),
        click.option(
            "--parquet",
            "parquet_file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Write Parquet here.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _store(ctx: click.Context, param: click.Parameter, value: str) -> Store | str:
    """ROOT: an existing local directory or a URI pyarrow.fs resolves (s3://, file://, ...).

    With ``--from-recorder`` there is no ROOT: the word is the first signal (kept as text)."""
    if ctx.meta.get(_FROM_RECORDER):
        return value
    try:
        store = Store.open(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if store.local and not store.is_dir(store.base):
        raise click.BadParameter(f"{value!r} is not a directory")
    return store


_FROM_RECORDER = "rda.history.from_recorder"
_ROOT = click.argument("root", metavar="ROOT", callback=_store)
_SIGNALS = click.argument("signals", nargs=-1, required=True, metavar="DEV/PROP[#FIELD]...")
_START = click.option("--start", "-s", default="-1h", show_default=True, help="Window start.")
_END = click.option("--end", "-e", default="now", show_default=True, help="Window end (excluded).")


def _window(start: str, end: str) -> tuple[int, int]:
    now = time.time_ns()
    times = []
    for text, name in ((start, "start"), (end, "end")):
        try:
            times.append(parse_cli_time(text, name, now))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=f"--{name}") from None
    return times[0], times[1]


@click.group()
def history() -> None:
    """Search and pull recorded values from a history store (ROOT of `rda record`).

    ROOT is a directory or a pyarrow.fs URI (file://, s3://, gs://, hdfs://).
    """


@history.command()
@_ROOT
@click.argument("pattern", default="*/*")
@_output_options
def search(
    root: Store,
    pattern: str,
    spark: bool,
    as_json: bool,
    csv_file: Path | None,
    parquet_file: Path | None,
) -> None:
    """Recorded DEVICE/PROPERTY pairs matching PATTERN (a glob, default */*), with their days."""
    output = _Output(as_json, csv_file, parquet_file)
    if "#" in pattern:
        raise click.BadParameter(f"{pattern!r}: a search names no field", param_hint="PATTERN")
    if spark:
        _run(lambda: _spark_table(_spark_history(root).search(pattern)), output)
    else:
        _run(lambda: local_search(root, pattern), output)


@history.command()
@_ROOT
# Not required here: with --from-recorder one signal (in ROOT's place) is enough.
@click.argument("signals", nargs=-1, metavar="DEV/PROP[#FIELD]...")
@_START
@_END
@click.option("--field", "-f", "fields", multiple=True, help="Only these fields (a.b: nested).")
@click.option("--selector", default=None, help="Only rows of this selector (a glob is allowed).")
@click.option("--errors", is_flag=True, help="Include error rows (and the error column).")
@click.option(
    "--from-recorder",
    is_flag=True,
    is_eager=True,  # read before ROOT, which it turns into the first signal
    callback=lambda ctx, _param, value: ctx.meta.__setitem__(_FROM_RECORDER, value) or value,
    help="Ask the running recorder that serves the signals (found through the directory) "
    "instead of reading a store: no ROOT; unconverted rows included; exact selector.",
)
@_output_options
def get(
    root: Store | str,
    signals: tuple[str, ...],
    start: str,
    end: str,
    fields: tuple[str, ...],
    selector: str | None,
    errors: bool,
    from_recorder: bool,
    spark: bool,
    as_json: bool,
    csv_file: Path | None,
    parquet_file: Path | None,
) -> None:
    """Values of SIGNALS with start <= acq_stamp < end (default: the last hour).

    With --from-recorder: `rda history get --from-recorder SIGNAL... [options]` (no ROOT)."""
    output = _Output(as_json, csv_file, parquet_file)
    window = _window(start, end)
    chosen: Sequence[str] | None = list(fields) or None
    if from_recorder:
        if spark:
            raise click.ClickException("--spark and --from-recorder exclude each other")
        wanted = [str(root), *signals]
        _run(lambda: _from_recorder(wanted, window, chosen, selector, errors), output)
        return
    assert isinstance(root, Store)
    if not signals:
        raise click.UsageError("Missing argument 'DEV/PROP[#FIELD]...'.")
    check_recorded(root, signals, fields, window)
    if spark:
        _run(
            lambda: _spark_table(
                _spark_history(root).get(list(signals), *window, chosen, selector, errors)
            ),
            output,
        )
    else:
        _run(lambda: local_get(root, list(signals), *window, chosen, selector, errors), output)


@history.command()
@_ROOT
@_SIGNALS
@_START
@_END
@click.option("--every", default=None, help="Bin width, e.g. 10s, 5min, 1h (default: one bin).")
@_output_options
def stats(
    root: Store,
    signals: tuple[str, ...],
    start: str,
    end: str,
    every: str | None,
    spark: bool,
    as_json: bool,
    csv_file: Path | None,
    parquet_file: Path | None,
) -> None:
    """count, first, last, min, max, mean, std, errors, NaN count per signal (and bin)."""
    output = _Output(as_json, csv_file, parquet_file)
    window = _window(start, end)
    try:
        width = None if every is None else parse_duration(every, "every")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--every") from None
    check_recorded(root, signals, (), window)
    if spark:
        _run(
            lambda: _spark_table(_spark_history(root).stats(list(signals), *window, every=every)),
            output,
        )
    else:
        _run(lambda: local_stats(root, list(signals), *window, every=width), output)


if __name__ == "__main__":  # pragma: no cover
    history()


@history.command("serve")
@click.argument("root", metavar="STORE")
@click.option(
    "--recorder", "recorder_id", default=None, help="Whose journal (default: the only one)."
)
@click.option(
    "--journal", default=None, help="The local directory holding _journal/ (a remote STORE)."
)
@click.option("--endpoint", default=DEFAULT_ENDPOINT, show_default=True, help="Where to listen.")
@click.option(
    "--device",
    "devices",
    multiple=True,
    default=("*",),
    show_default=True,
    help="Serve history:DEVICE for these device globs.",
)
@click.option("--duration", default=None, help="Stop after this long (default: Ctrl-C, SIGTERM).")
@click.option("--name", default=None, help="The server's name (default: history-<recorder>).")
@click.option(
    "--nice",
    type=click.IntRange(0, 19),
    default=0,
    show_default=True,
    help="Lower this process's CPU priority by this much (rda record --serve: 10).",
)
def serve(
    root: str,
    recorder_id: str | None,
    journal: str | None,
    endpoint: str,
    devices: tuple[str, ...],
    duration: str | None,
    name: str | None,
    nice: int,
) -> None:
    """Serve a store's history over rda in this process (history:<device>, registered in the
    directory): the recorder's journal and Parquet files read from disk, so readers never
    share the recorder's process."""
    import os
    import signal
    import threading

    from rda.admin import install
    from rda.business.server.builder import ServerBuilder
    from rda.pipeline.recorder.standalone import serve_store

    try:
        seconds = None if duration is None else parse_duration(duration, "duration") / 1e9
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--duration") from None
    try:
        name = name or (f"history-{recorder_id}" if recorder_id else "history")
        builder = install(ServerBuilder(name).endpoint(endpoint))
        served = serve_store(root, recorder_id, builder, journal, devices)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if nice:
        # Readers yield the CPU to the recorder on a busy machine (docs/history.md).
        os.nice(nice)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    click.echo(f"serving history at {served.endpoint}", err=True)
    try:
        stop.wait(seconds)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        served.stop()
