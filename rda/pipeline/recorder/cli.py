"""``rda record ROOT PATTERN...`` (and ``compact``): the recorder from the command line.

``record`` is a plain click command so the ``rda`` group (rda.admin.cli.main) can register it
without this module importing rda.admin; it reads ``--endpoint`` from the group's context
object when there is one. Standalone: ``python -m rda.pipeline.recorder.cli record ROOT PATTERN...``.
"""

from __future__ import annotations

import datetime
import json
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import click

from rda.pipeline.recorder.compaction import compact as compact_day
from rda.pipeline.recorder.metrics import start_recorder_metrics
from rda.pipeline.recorder.model import DEFAULT_ENDPOINT
from rda.pipeline.recorder.service import Recorder, RecorderStatistics
from rda.pipeline.recorder.store import Store

__all__ = ["compact", "main", "parse_duration", "record"]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``"90"``, ``"30s"``, ``"10m"``, ``"24h"``, ``"2d"`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise click.BadParameter(f"{text!r} is not a duration like 30s, 10m, 24h or 2d")
    return float(match[1]) * _UNITS[match[2]]


def _counter_line(stats: RecorderStatistics, rate: float) -> str:
    return (
        f"{stats.state:7}  {rate:9.0f} rows/s  acked seq {stats.acked_seq}  "
        f"queue {stats.queue_depth}/{stats.queue_limit}  lag {stats.lag_seconds:.2f}s  "
        f"overflow {stats.overflow}  parquet files {stats.parquet_files}"
    )


def _client(ctx: click.Context) -> Any:
    """A ClientService honouring the ``rda`` group's ``--endpoint``/``--config``, if any."""
    endpoint = getattr(ctx.obj, "endpoint", None)
    make_config = getattr(ctx.obj, "config", None)
    if endpoint is None and make_config is None:
        return None  # the recorder makes a ClientService on the default directory
    from rda.business.client.service import ClientService
    from rda.business.directory import StaticDirectory

    config = make_config() if make_config is not None else None
    # No directory given: the service makes the configured default itself, so it owns it and
    # closes it (etcd's watch thread and HTTP pool) when the recorder closes the service.
    directory = None if endpoint is None else StaticDirectory({"*": endpoint})
    return ClientService(directory=directory, config=config)


HISTORY_NICE = 10  # the niceness of the history server ``--serve`` starts


def _start_history_process(
    root: str, recorder: Recorder, journal: Path | None, endpoint: str
) -> subprocess.Popen[str]:
    """``--serve``: ``rda history serve`` in a process of its own (the recorder's ingest never
    shares a GIL with readers), named ``recorder-<id>``, serving ``history:<glob>`` for each
    recorded device pattern; returns once it serves (its first line says where)."""
    args = [sys.executable, "-m", "rda._cli", "history", "serve", root]
    args += ["--recorder", recorder.recorder_id, "--endpoint", endpoint]
    # At niceness 10: on a busy machine its readers yield the CPU to the recorder's ingest
    # (measured: docs/performance.md, "Columnar history at the full sizes").
    args += ["--name", f"recorder-{recorder.recorder_id}", "--nice", str(HISTORY_NICE)]
    for glob in dict.fromkeys(glob for glob, _, _ in recorder.patterns):
        args += ["--device", glob]
    if journal is not None:
        args += ["--journal", str(journal)]
    process = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    line = process.stderr.readline()
    if not line.startswith("serving history at "):
        rest = process.stderr.read() if process.wait(30) is not None else ""
        process.stderr.close()
        raise click.ClickException(f"the history server did not start: {line}{rest}".strip())
    click.echo(line.rstrip(), err=True)
    return process


def _stop_history_process(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)
    if process.stderr is not None:
        process.stderr.close()


@click.command()
@click.argument("root", metavar="ROOT")
@click.argument("patterns", nargs=-1, required=True, metavar="DEVICE/PROPERTY[@SELECTOR]...")
@click.option(
    "--journal",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Local journal directory (required when ROOT is a URI such as s3://bucket/history).",
)
@click.option("--id", "recorder_id", default=None, help="Recorder id (default: host name).")
@click.option(
    "--retention",
    default="24h",
    help="Keep converted journal segments this long (24h); see --keep for Parquet.",
)
@click.option(
    "--keep",
    default=None,
    help="Delete Parquet day partitions older than this (e.g. 30d; default: keep all).",
)
@click.option(
    "--compact-every",
    default="10m",
    help="Compact small Parquet files into one per signal-hour this often (0: never).",
)
@click.option(
    "--compact-grace",
    default="10m",
    help="Compact an hour only once it ended this long ago.",
)
@click.option(
    "--compact-linger",
    default="1m",
    help="Delete compacted inputs this long after their output (for readers mid-query).",
)
@click.option("--queue-limit", type=int, default=100_000, show_default=True)
@click.option("--convert-every", default="5s", help="Convert segments to Parquet this often.")
@click.option("--duration", default=None, help="Stop after this long (default: Ctrl-C).")
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus /metrics here.")
@click.option(
    "--serve",
    "serve_endpoint",
    is_flag=False,
    flag_value=DEFAULT_ENDPOINT,
    default=None,
    metavar="[ENDPOINT]",
    help="Serve the recorded history over rda from a process of its own (rda history "
    "serve: history:<device>, registered in the "
    f"directory); ENDPOINT defaults to {DEFAULT_ENDPOINT}, a free port on "
    "loopback only, as for every server.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the final statistics as JSON.")
@click.pass_context
def record(
    ctx: click.Context,
    root: str,
    patterns: tuple[str, ...],
    journal: Path | None,
    recorder_id: str | None,
    retention: str,
    keep: str | None,
    compact_every: str,
    compact_grace: str,
    compact_linger: str,
    queue_limit: int,
    convert_every: str,
    duration: str | None,
    metrics_port: int | None,
    serve_endpoint: str | None,
    as_json: bool,
) -> None:
    """Record subscriptions into ROOT (journal, then Parquet) until Ctrl-C or --duration.

    ROOT is a directory or a pyarrow.fs URI (file://, s3://, gs://, hdfs://); a URI store keeps
    its journal in --journal on this machine.

    Device names may be globs (resolved through the directory): rda record /data 'PS*/Acq'.
    """
    # Every argument is checked before the client exists: a usage error must not leave its
    # threads running.
    retention_s, convert_s = parse_duration(retention), parse_duration(convert_every)
    keep_s = None if keep is None else parse_duration(keep)
    compact_s = parse_duration(compact_every) or None
    grace_s, linger_s = parse_duration(compact_grace), parse_duration(compact_linger)
    seconds = None if duration is None else parse_duration(duration)
    client = None
    try:
        client = _client(ctx)
        recorder = Recorder(
            root,
            patterns,
            client,
            recorder_id=recorder_id,
            journal=journal,
            queue_limit=queue_limit,
            retention=retention_s,
            convert_interval=convert_s,
            compact_interval=compact_s if Store.open(root).local else None,
            compact_grace=grace_s,
            compact_linger=linger_s,
            keep=keep_s,
            serve=False,
        )
    except ValueError as exc:
        if client is not None:
            client.close()
        raise click.BadParameter(str(exc)) from None
    stop = threading.Event()
    limit = None if seconds is None else time.monotonic() + seconds

    def terminate(signum: int, frame: FrameType | None) -> None:
        stop.set()

    endpoint = None
    history_process = None
    try:
        recorder.start()  # stops itself when it fails; the client is ours to close
    except BaseException:
        if client is not None:
            client.close()
        raise
    # Installed only once the recorder runs, inside the try whose finally puts the previous
    # handler back: a recording refused at start must not leave its handler in the caller.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminate) if main_thread else None
    try:
        if serve_endpoint is not None:
            history_process = _start_history_process(root, recorder, journal, serve_endpoint)
        if metrics_port is not None:
            endpoint = start_recorder_metrics(recorder, metrics_port)
        _run(recorder, stop, limit)
    except KeyboardInterrupt:
        pass
    finally:
        if history_process is not None:
            _stop_history_process(history_process)
        recorder.stop()
        if client is not None:
            client.close()
        if endpoint is not None:
            endpoint.close()
        if main_thread:
            # None: a handler not installed from Python, which Python cannot put back.
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    stats = recorder.statistics()
    if as_json:
        click.echo(json.dumps(asdict(stats)))
    else:
        click.echo(
            f"stopped: {stats.acked_rows} rows acked (last seq {stats.acked_seq}), "
            f"overflow {stats.overflow}, write errors {stats.write_errors}, "
            f"{stats.parquet_files} parquet files",
            err=True,
        )
    if stats.write_errors or stats.conversion_errors:
        raise click.exceptions.Exit(1)


def _run(recorder: Recorder, stop: threading.Event, limit: float | None) -> None:
    interactive = sys.stderr.isatty()
    last = recorder.statistics()
    last_time = time.monotonic()
    overwriting = False  # a counter line without its newline is on the terminal
    try:
        while not stop.is_set():
            wait = 1.0 if limit is None else max(0.0, min(1.0, limit - time.monotonic()))
            if stop.wait(wait) or (limit is not None and time.monotonic() >= limit):
                return
            now, stats = time.monotonic(), recorder.statistics()
            rate = (stats.acked_rows - last.acked_rows) / max(1e-9, now - last_time)
            line = _counter_line(stats, rate)
            click.echo(f"\r{line}" if interactive else line, err=True, nl=not interactive)
            overwriting = interactive
            last, last_time = stats, now
    finally:
        if overwriting:  # end the counter line, so the summary starts on its own line
            click.echo("", err=True)


@click.command()
@click.argument("root", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("address", metavar="DEVICE/PROPERTY")
@click.argument("date", metavar="YYYY-MM-DD")
def compact(root: Path, address: str, date: str) -> None:
    """Rewrite a closed day of one property into one file per recorder and schema version."""
    device, _, prop = address.partition("/")
    if not device or not prop:
        raise click.BadParameter(f"{address!r}: expected DEVICE/PROPERTY")
    try:
        datetime.date.fromisoformat(date)
    except ValueError:
        raise click.BadParameter(
            f"{date!r} is not a date like 2026-11-20", param_hint="DATE"
        ) from None
    try:
        outputs = compact_day(root, device, prop, date)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{len(outputs)} file(s) written" + "".join(f"\n  {p}" for p in outputs))


@click.group()
def main() -> None:
    """The history recorder (``rda record`` is the same ``record`` command)."""


main.add_command(record)
main.add_command(compact)

if __name__ == "__main__":
    main()
