"""``rda get``, ``rda set``, ``rda subscribe`` and ``rda admin``: the commands that talk to
a device property (or a server's admin interface) through a ``ClientService``.

Human output by default (tables, summarised arrays, times with units), ``--json`` for
scripts; expected failures print one line and exit with a code from
:class:`~rda.admin.cli.options.ExitCode`.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem

from rda.admin.cli.common import (
    TIMEOUT,
    CliError,
    ExitCode,
    Options,
    cli_error,
    did_you_mean,
    emit_json,
    open_client,
    reporting,
    security_options,
    split_address,
)
from rda.admin.cli.values import BadValueError, build_data, merge_data, parse_assignments
from rda.admin.format import (
    format_duration,
    format_mapping,
    format_table,
    format_value,
    humanize,
)
from rda.business.client.service import ClientService
from rda.business.client.subscriptions import Notification
from rda.business.common import AcquiredData
from rda.business.directory import default_directory
from rda.business.metadata import Field, PropertyDescription, span
from rda.serialization.data import Data
from rda.serialization.errors import NoSuchDeviceError, NotAuthorizedError, RdaError
from rda.serialization.header import DataContext
from rda.transport.reasons import HANDSHAKE_REFUSED

__all__ = ["admin", "describe", "get", "set_", "subscribe"]

_TIMEOUT = click.option(
    "--timeout", type=TIMEOUT, default=None, help="Seconds to wait (default: RDA_REQUEST_TIMEOUT)."
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
_SELECTOR = click.option("--selector", "-s", default="", help="Cycle selector, e.g. CPS.USER.ALL.")


def _complete_address(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Shell completion of DEVICE/ from the directory (names only, not glob patterns).

    Properties would need a request to the server; completion must stay instant and offline.
    """
    try:
        known = default_directory().devices()
    except RdaError:
        return []
    names = sorted(n for n in known if not any(c in n for c in "*?[") and n.startswith(incomplete))
    return [CompletionItem(f"{n}/", type="plain") for n in names]


@click.command()
@click.argument("address", metavar="DEVICE/PROPERTY", shell_complete=_complete_address)
@_SELECTOR
@click.option("--field", "-f", default=None, help="Print only this field (a.b for nested).")
@_JSON
@_TIMEOUT
@security_options
@click.pass_obj
def get(
    options: Options,
    address: str,
    selector: str,
    field: str | None,
    as_json: bool,
    timeout: float | None,
    key_file: Path | None,
    server_key: str | None,
) -> None:
    """Read a property once and print its value.

    Each field the server declares is shown with its precision and units (rda describe), and
    the value's alarm state when it is in alarm."""
    device, prop = split_address(address)
    with open_client(options, key_file, server_key) as client, _suggesting(client, options, device):
        ap = client.access_point(device, prop)
        acq = ap.get(selector=selector or None, timeout=timeout)
        fields = _declared_fields(ap, timeout) if field is None else {}
    if field is not None:
        value = _field(acq.data, field, address)
        if as_json:
            emit_json(value.to_dict() if isinstance(value, Data) else value)
        elif isinstance(value, Data):
            click.echo(format_mapping(value.to_dict()))
        else:
            click.echo(format_value(value))
        return
    if as_json:
        shown = _acquired_json(address, acq)
        shown["units"] = {name: f.units for name, f in fields.items() if f.units}
        shown["alarm"] = acq.alarm.to_dict()
        emit_json(shown)
        return
    click.echo(f"{address}  {_context_line(acq.context)}".rstrip())
    click.echo(format_mapping(_with_units(acq.data.to_dict(), fields), indent=2))
    if acq.alarm:
        click.echo(f"  ALARM {acq.alarm.severity.name}: {acq.alarm.message}")


def _declared_fields(ap: Any, timeout: float | None) -> Mapping[str, Field]:
    """The fields the server declares for the property; none when it cannot say (a server
    from before describe, or one that refuses it): the value is then shown as it comes."""
    try:
        described: PropertyDescription = ap.describe(timeout=timeout)
    except RdaError:
        return {}
    return described.fields


def _with_units(values: dict[str, Any], fields: Mapping[str, Field]) -> dict[str, Any]:
    """Top-level numbers shown by their field's precision and units (``3.142 A``), arrays
    summarised as usual with the units after them."""
    if not fields:
        return values
    shown = dict(values)
    for name, f in fields.items():
        value = shown.get(name)
        if value is None or isinstance(value, bool | str | Mapping):
            continue
        if isinstance(value, int | float):
            shown[name] = f.format(value)
        elif f.units:
            shown[name] = f"{format_value(value)} {f.units}"
    return shown


@click.command("describe")
@click.argument("address", metavar="DEVICE/PROPERTY", shell_complete=_complete_address)
@_JSON
@_TIMEOUT
@security_options
@click.pass_obj
def describe(
    options: Options,
    address: str,
    as_json: bool,
    timeout: float | None,
    key_file: Path | None,
    server_key: str | None,
) -> None:
    """Print a property's declared metadata: units, precision, limits, alarm limits.

    Also its description and whether it can be set; --json prints the description as JSON."""
    device, prop = split_address(address)
    with open_client(options, key_file, server_key) as client, _suggesting(client, options, device):
        described = client.access_point(device, prop).describe(timeout=timeout)
    if as_json:
        emit_json(described.to_dict())
        return
    click.echo(f"{address}  {'settable' if described.settable else 'read-only'}")
    if described.description:
        click.echo(f"  {described.description}")
    if not described.fields:
        click.echo("  (no field metadata declared)")
        return
    rows = [_field_row(name, f) for name, f in described.fields.items()]
    columns = ["field", "units", "precision", "limits", "warning", "alarm", "description"]
    click.echo(_indented(format_table(rows, columns)))


def _field_row(name: str, f: Field) -> dict[str, Any]:
    return {
        "field": name,
        "units": f.units or "-",
        "precision": "-" if f.precision is None else str(f.precision),
        "limits": "-" if f.limits is None else span(f.limits),
        "warning": "-" if f.warning is None else span(f.warning),
        "alarm": "-" if f.alarm is None else span(f.alarm),
        "description": f.description,
    }


def _indented(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


@click.command("set")
@click.argument("address", metavar="DEVICE/PROPERTY", shell_complete=_complete_address)
@click.argument("values", nargs=-1, metavar="NAME=VALUE...")
@click.option("--json", "json_text", default=None, help="The value as a JSON object.")
@_SELECTOR
@_TIMEOUT
@click.option(
    "--no-read",
    is_flag=True,
    help="Do not read the current value first: send only the given fields, their types "
    "inferred from the literals (for write-only properties).",
)
@security_options
@click.pass_obj
def set_(
    options: Options,
    address: str,
    values: tuple[str, ...],
    json_text: str | None,
    selector: str,
    timeout: float | None,
    no_read: bool,
    key_file: Path | None,
    server_key: str | None,
) -> None:
    """Write a property. It is read first: the NAME=VALUE fields replace theirs in the value
    read, each converted to that field's type, and the whole value is sent, so a partial set
    keeps the other fields (--no-read sends only the given ones)."""
    device, prop = split_address(address)
    given = _set_values(values, json_text)
    with open_client(options, key_file, server_key) as client, _suggesting(client, options, device):
        ap = client.access_point(device, prop)
        template: Data | None = None
        unread: str | None = None  # why the value could not be read first
        if not no_read:
            try:
                template = ap.get(selector=selector or None, timeout=timeout).data
            except NotAuthorizedError as exc:
                if HANDSHAKE_REFUSED in str(exc):
                    raise  # the connection itself was refused: the set would be too
                # A set-only role: report what the set itself gets, not the refused read.
                unread = f"not read first: {exc}"
        with reporting():
            data = build_data(given, template)
            if template is not None:
                _check_fields(address, given, template)
                data = merge_data(template, data)
        try:
            ap.set(data, selector=selector or None, timeout=timeout)
        except RdaError as exc:
            if unread is None:
                raise
            raise cli_error(exc, unread) from None
    note = f" ({unread}; types inferred from the values)" if unread else ""
    click.echo(f"{address}: set {', '.join(given)}{note}", err=True)


@contextmanager
def _suggesting(client: ClientService, options: Options, device: str) -> Iterator[None]:
    """An unknown ``device`` ends the command with the close names that exist (a typo:
    ``PS11`` -> ``did you mean 'PS1'?``)."""
    try:
        yield
    except NoSuchDeviceError as exc:
        hint = _device_hint(client, options, device, exc)
        if not hint:
            raise
        raise cli_error(exc, hint=hint) from None


def _device_hint(client: ClientService, options: Options, device: str, exc: RdaError) -> str:
    """``did you mean ...?`` for an unknown ``device``, from the directory's names and, with
    ``--endpoint``, the server's ``devices``; ``""`` for an unknown property or no close name.
    Only on this error path: a request more or less does not matter there."""
    if not str(exc).startswith(f"{device}: no such device"):
        return ""  # the device exists; its property does not (the message lists those)
    known: set[str] = set()
    with suppress(RdaError):
        known.update(client.directory.devices())
    if options.endpoint is not None:
        with suppress(RdaError):
            reply = client.admin(options.endpoint, "devices", timeout=2.0).to_dict()
            known.update(str(name) for name in reply.get("devices", []))
    return did_you_mean(device, known)


def _check_fields(address: str, given: Mapping[str, Any], template: Data) -> None:
    """A name the value read does not have is most likely misspelt: name it, the close known
    one and all known ones before anything is sent (--no-read sends it anyway)."""
    unknown = [name for name in given if name not in template]
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        hints = "; ".join(h for n in unknown if (h := did_you_mean(n, template)))
        raise CliError(
            f"{address} has no field {names}{': ' + hints if hints else ''} "
            f"(fields: {', '.join(template)}; --no-read sends it as given)",
            ExitCode.NO_SUCH_DEVICE,
        )


def _set_values(values: tuple[str, ...], json_text: str | None) -> dict[str, Any]:
    if values and json_text is not None:
        raise click.UsageError("give NAME=VALUE pairs or --json, not both")
    if json_text is not None:
        try:
            parsed = json.loads(json_text)
        except json.JSONDecodeError as exc:
            raise CliError(f"--json: not valid JSON: {exc.msg}", ExitCode.BAD_VALUE) from None
        if not isinstance(parsed, dict) or not parsed:
            raise CliError("--json: expected a non-empty JSON object", ExitCode.BAD_VALUE)
        return parsed
    if not values:
        raise click.UsageError("nothing to set: give NAME=VALUE pairs or --json '{...}'")
    try:
        return dict(parse_assignments(values))
    except BadValueError as exc:
        raise CliError(str(exc), ExitCode.BAD_VALUE) from None


@click.command()
@click.argument("address", metavar="DEVICE/PROPERTY", shell_complete=_complete_address)
@_SELECTOR
@click.option("--count", "-n", type=click.IntRange(min=1), default=None, help="Stop after N.")
@click.option("--duration", "-d", type=float, default=None, help="Stop after S seconds.")
@click.option(
    "--backfill",
    metavar="DURATION",
    callback=lambda _ctx, _param, value: None if value is None else _seconds(value),
    help="First the recorded updates of the last DURATION (30s, 5m, 1h), from the recorder "
    "serving the signal's history, marked HISTORY; then live.",
)
@_JSON
@security_options
@click.pass_obj
def subscribe(
    options: Options,
    address: str,
    selector: str,
    count: int | None,
    duration: float | None,
    as_json: bool,
    key_file: Path | None,
    server_key: str | None,
    backfill: float | None = None,
) -> None:
    """Print a line per update until --count/--duration or Ctrl-C, then a summary."""
    device, prop = split_address(address)
    tally = _Tally()
    if not as_json:
        click.echo(TIME_COLUMN, err=True)
    with open_client(options, key_file, server_key) as client, _suggesting(client, options, device):
        point = client.access_point(device, prop)
        sub = point.subscribe(selector=selector or None, backfill=backfill)
        try:
            deadline = None if duration is None else time.monotonic() + duration
            while count is None or tally.updates < count:
                wait = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if wait <= 0:
                    break
                notification = sub.poll(timeout=wait)
                if notification is None:
                    if sub.closed:
                        break
                    continue
                line = tally.add(notification)
                if as_json:
                    emit_json(line)
                else:
                    click.echo(_notification_line(line))
        except KeyboardInterrupt:
            pass
        finally:
            # Connections re-established while watching (server restarts, moves: issue 12).
            tally.reconnects = client.statistics().reconnects
            sub.close()
        hint = ""
        if tally.updates == 0 and isinstance(tally.last_error, NoSuchDeviceError):
            hint = _device_hint(client, options, device, tally.last_error)
    summary = tally.summary()
    if as_json:
        emit_json({"summary": summary})
    else:
        click.echo(_summary_line(summary), err=True)
    if tally.updates == 0 and tally.last_error is not None:
        if hint:
            raise cli_error(tally.last_error, hint=hint)
        raise tally.last_error


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _seconds(text: str) -> float:
    """``30s``, ``5m``, ``1.5h``, ``2d`` or plain seconds, as seconds (> 0)."""
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number) :] or "s"
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise click.BadParameter(f"{text!r} is not a duration like 30s, 5m, 1h") from None
    if not value > 0:
        raise click.BadParameter(f"{text!r} must be positive")
    return value


class _Tally:
    """Counts what a subscription delivered, for the live lines and the exit summary."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.updates = 0
        self.gaps = 0
        self.errors = 0
        self.reconnects = 0
        self.last_error: RdaError | None = None

    def add(self, notification: Notification) -> dict[str, Any]:
        self.gaps += notification.gap
        line: dict[str, Any] = {
            "time": time.time(),
            "update": notification.update_type.name,
            "seq": notification.seq,
            "gap": notification.gap,
        }
        error = notification.error
        if error is not None:
            self.errors += 1
            self.last_error = error
            line["error"] = str(error)
            line["error_type"] = type(error).__name__
            return line
        self.updates += 1
        line["context"] = _context_json(notification.context)
        line["data"] = notification.data.to_dict()
        return line

    def summary(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        return {
            "updates": self.updates,
            "seconds": round(elapsed, 3),
            "rate": self.updates / elapsed if elapsed > 0 else 0.0,
            "gaps": self.gaps,
            "errors": self.errors,
            "reconnects": self.reconnects,
        }


#: What the first column of ``rda subscribe``'s lines is (printed once, on stderr).
TIME_COLUMN = "time = acquisition stamp (acq_stamp), local; * = time received (errors, no stamp)"


def _notification_line(line: dict[str, Any]) -> str:
    # The acquisition stamp, not the time the line was printed: backfilled HISTORY lines
    # arrive in a burst but were acquired over the whole backfill window.
    acquired = line.get("context", {}).get("acq_stamp", 0)
    when = acquired / 1e9 if acquired else line["time"]
    stamp = _dt.datetime.fromtimestamp(when).strftime("%H:%M:%S.%f")[:-3]
    stamp += " " if acquired else "*"
    # An error is labelled as one, not with the update type it came under (a lost
    # connection arrives as a NORMAL notification carrying the error).
    label = "ERROR" if "error" in line else line["update"]
    head = f"{stamp} {label:<9} seq={line['seq']}"
    if line["gap"]:
        head += f" gap={line['gap']}"
    if "error" in line:
        return f"{head}  {line['error_type']}: {line['error']}"
    fields = ", ".join(f"{k}={format_value(v)}" for k, v in line["data"].items())
    return f"{head}  {fields}"


def _summary_line(summary: dict[str, Any]) -> str:
    return (
        f"{summary['updates']} updates in {format_duration(summary['seconds'])} "
        f"({summary['rate']:.3g}/s), {summary['gaps']} missed (gaps), {summary['errors']} errors"
        + (f", {summary['reconnects']} reconnects" if summary["reconnects"] else "")
    )


@click.command()
@click.argument("target")
@click.argument("command")
@click.argument("arguments", nargs=-1, metavar="[KEY=VALUE]...")
@_JSON
@_TIMEOUT
@security_options
@click.pass_obj
def admin(
    options: Options,
    target: str,
    command: str,
    arguments: tuple[str, ...],
    as_json: bool,
    timeout: float | None,
    key_file: Path | None,
    server_key: str | None,
) -> None:
    """Run an admin COMMAND on TARGET (server name, device name or endpoint).

    Commands: ping, info, clients, subscriptions, stats, devices, log-level, disconnect,
    commands (and plugins). Values are sent as text; the server's argument model converts them.
    """
    try:
        args = parse_assignments(arguments)
    except BadValueError as exc:
        raise CliError(str(exc), ExitCode.BAD_VALUE) from None
    with open_client(options, key_file, server_key) as client:
        reply = client.admin(target, command, timeout=timeout, **args)
    result = reply.to_dict()
    if as_json:
        emit_json(result)
    else:
        click.echo(format_mapping(humanize(result, now=time.time())))


def _field(data: Data, path: str, address: str) -> Any:
    value: Any = data
    for part in path.split("."):
        if not isinstance(value, Data) or part not in value:
            fields = ", ".join(value) if isinstance(value, Data) else "none"
            hint = did_you_mean(part, value) if isinstance(value, Data) else ""
            raise CliError(
                f"{address} has no field {path!r}{': ' + hint if hint else ''} (fields: {fields})",
                ExitCode.NO_SUCH_DEVICE,
            )
        value = value[part]
    return value


def _context_json(context: DataContext) -> dict[str, Any]:
    return {
        "cycle_name": context.cycle_name,
        "cycle_stamp": context.cycle_stamp,
        "acq_stamp": context.acq_stamp,
        "selector": context.selector,
    }


def _acquired_json(address: str, acq: AcquiredData) -> dict[str, Any]:
    return {"address": address, "context": _context_json(acq.context), "data": acq.data.to_dict()}


def _context_line(context: DataContext) -> str:
    parts = []
    if context.acq_stamp:
        stamp = _dt.datetime.fromtimestamp(context.acq_stamp / 1e9)
        parts.append("acquired " + stamp.isoformat(sep=" ", timespec="milliseconds"))
    if context.cycle_name:
        parts.append(f"cycle {context.cycle_name}")
    if context.selector:
        parts.append(f"selector {context.selector}")
    return "  ".join(parts)
