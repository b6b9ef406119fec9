"""``AccessPoint``: get, set and subscribe on one ``(device, property)`` of a client service.

An access point is a light handle: the service resolves its device through the directory on
first use (and keeps the answer until the connection is lost), builds the request's body frames in the caller's thread, and
hands them to the service, which owns connections, ids, deadlines and the pending table.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from rda.business import driver
from rda.business.client.replies import describe_result, get_result, set_result
from rda.business.common import AcquiredData
from rda.business.metadata import DESCRIBE_SELECTOR, PropertyDescription
from rda.serialization import binary
from rda.serialization.data import Data, DataType
from rda.serialization.header import RequestType
from rda.serialization.message import BodyKind, Buffer, Message, encode_data_body

if TYPE_CHECKING:
    from rda.business.client.subscriptions import BackfillHook, Notification, Subscription

__all__ = ["AccessPoint", "Requester", "build_request_context", "to_data"]


class Requester(Protocol):
    """What an access point needs from its service (``ClientService`` is the one there is).

    A protocol rather than the class, so that this module does not import service.py, which
    imports it: no import circle in the client (tests/test_layout.py).
    """

    def endpoint_of(self, device: str) -> str: ...

    def request_context(self, timeout: float | None, filters: Data | None) -> bytes: ...

    def request(
        self,
        op: RequestType,
        endpoint: str,
        device: str,
        prop: str,
        selector: str,
        body: list[tuple[BodyKind, Buffer]],
        timeout: float | None,
        convert: Callable[[Message], Any],
    ) -> Future[Any]: ...

    def call(
        self,
        op: RequestType,
        endpoint: str,
        device: str,
        prop: str,
        selector: str,
        body: list[tuple[BodyKind, Buffer]],
        timeout: float | None,
        convert: Callable[[Message], Any],
    ) -> Any: ...

    def subscribe(
        self,
        endpoint: str,
        device: str,
        prop: str,
        selector: str,
        filters: Data | None,
        listener: Callable[[Notification], object] | None,
        queue_size: int,
        backfill: BackfillHook | None = None,
    ) -> Subscription: ...

    def backfill_rows(
        self,
        device: str,
        prop: str,
        selector: str | None,
        start: int,
        until: int,
        columnar: bool = False,
    ) -> Iterator[Notification]: ...


# Encoded REQUEST_CONTEXT frames for requests without filters, by timeout in ms: nearly every
# request of a program uses the default timeout, so this is one dict lookup instead of an
# encode per request.
_CONTEXTS: dict[int | None, bytes] = {}

# Enum members read once: each ``RequestType.X`` (``BodyKind.X``, ``Kind.X``) read goes through
# the enum class's ``__getattr__`` hook on Python 3.11, ten times a module global's cost.
_GET, _SET = RequestType.GET, RequestType.SET
_REQUEST_CONTEXT = BodyKind.REQUEST_CONTEXT


def build_request_context(timeout_ms: int | None, filters: Data | None) -> bytes:
    """The REQUEST_CONTEXT frame: a Data with ``timeout_ms`` (int64) and optional ``filters``
    (docs/protocol.md, "Application messages")."""
    if filters is None:
        frame = _CONTEXTS.get(timeout_ms)
        if frame is not None:
            return frame
    context = Data()
    if timeout_ms is not None:
        context.append("timeout_ms", timeout_ms, DataType.INT64)
    if filters is not None:
        context.append("filters", filters)
    frame = binary.encode(context)
    if filters is None and len(_CONTEXTS) < 256:
        _CONTEXTS[timeout_ms] = frame
    return frame


def to_data(value: Data | Mapping[str, Any] | None, what: str) -> Data:
    """A user's value as a Data: a Data is taken as is, a mapping converted (types inferred)."""
    if value is None:
        return Data()
    if isinstance(value, Data):
        return value
    if isinstance(value, Mapping):
        return Data.from_dict(value)
    raise TypeError(f"{what}: expected rda.Data or a mapping, got {type(value).__name__}")


class AccessPoint:
    """``device/property`` on the servers known to a ``ClientService``.

    ``get``/``set`` block until the reply or the timeout (default ``Config.request_timeout``);
    ``get_async``/``set_async`` return ``concurrent.futures.Future`` s. Errors are rda errors
    naming the device and property: ``NoSuchDeviceError``, ``RemoteError``, ``TimeoutError``,
    ``DisconnectedError``, ``OverloadError``, ...
    """

    __slots__ = ("_service", "device", "property")

    def __init__(self, service: Requester, device: str, prop: str) -> None:
        if not device or not prop:
            raise ValueError(
                f"an access point needs a device and a property, got {device!r}/{prop!r}"
            )
        self._service = service
        self.device = device
        self.property = prop

    def __repr__(self) -> str:
        return f"<AccessPoint {self.device}/{self.property}>"

    @property
    def endpoint(self) -> str:
        """The server endpoint of the device: resolved through the directory on first use and
        kept by the service, which resolves it again after a lost connection (a device that
        moved to another server or port is followed)."""
        return self._service.endpoint_of(self.device)

    def get(
        self,
        selector: str | None = None,
        filters: Data | Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> AcquiredData:
        """Read the property's value with its acquisition context."""
        result: AcquiredData = self._call(_GET, [], selector, filters, timeout, get_result)
        return result

    def describe(self, timeout: float | None = None) -> PropertyDescription:
        """The property's declared metadata: units, precision, limits and alarm limits of
        each field, its description, whether it is settable. A get with the reserved selector
        ``rda:describe`` (docs/protocol.md, "Describe"): read access, through the directory,
        CURVE and the policy like any get. ``RemoteProtocolError`` from a server that predates
        it (it answers with the value)."""
        result: PropertyDescription = self._call(
            RequestType.GET, [], DESCRIBE_SELECTOR, None, timeout, describe_result
        )
        return result

    def describe_async(self, timeout: float | None = None) -> Future[PropertyDescription]:
        return self._request(RequestType.GET, [], DESCRIBE_SELECTOR, None, timeout, describe_result)

    def set(
        self,
        data: Data | Mapping[str, Any],
        selector: str | None = None,
        filters: Data | Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Write ``data`` (an ``rda.Data`` or a mapping) to the property."""
        body = encode_data_body(to_data(data, f"set {self.device}/{self.property}"))
        self._call(_SET, body, selector, filters, timeout, set_result)

    def get_async(
        self,
        selector: str | None = None,
        filters: Data | Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Future[AcquiredData]:
        return self._request(_GET, [], selector, filters, timeout, get_result)

    def set_async(
        self,
        data: Data | Mapping[str, Any],
        selector: str | None = None,
        filters: Data | Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Future[None]:
        body = encode_data_body(to_data(data, f"set {self.device}/{self.property}"))
        return self._request(_SET, body, selector, filters, timeout, set_result)

    def subscribe(
        self,
        selector: str | None = None,
        filters: Data | Mapping[str, Any] | None = None,
        listener: Callable[[Notification], object] | None = None,
        queue_size: int = 1000,
        backfill: float | datetime.timedelta | None = None,
        backfill_columnar: bool = False,
    ) -> Subscription:
        """Subscribe; the first notification is the server's ``FIRST`` update.

        Without ``listener``, read with ``poll(timeout)`` or iterate; the queue keeps at most
        ``queue_size`` notifications (the oldest is dropped and counted as a gap). With a
        listener, it is called on the client scheduler, in order, never on the dispatcher.

        ``backfill`` (seconds or a timedelta): first the recorded updates of that window,
        from the recorder that serves the signal's history, as ``UpdateType.HISTORY``
        notifications in acquisition-stamp order, then the live ones, with none twice and none
        missing at the seam (docs/client.md, "Backfill"). Without a reachable recorder, one
        notification whose ``.error`` is a ``HistoryUnavailableError``, then live.
        ``backfill_columnar``: the past as ``rda.HistoryChunk`` notifications instead (each a
        ``pyarrow.Table`` of many rows, the columns of ``history_table``), same seam.
        """
        flt = None if filters is None else to_data(filters, "filters")
        hook = None
        if backfill is not None:
            from rda.business.client.history import Backfill

            seconds = (
                backfill.total_seconds()
                if isinstance(backfill, datetime.timedelta)
                else float(backfill)
            )
            if not seconds > 0:
                raise ValueError(f"backfill must be a positive duration, got {backfill!r}")
            service, device, prop, sel = self._service, self.device, self.property, selector
            start = driver.wall_time_ns() - round(seconds * 1e9)

            def fetch(first: int, until: int) -> Iterator[Notification]:
                return service.backfill_rows(
                    device, prop, sel or None, first, until, backfill_columnar
                )

            hook = Backfill(fetch, start)
        return self._service.subscribe(
            self.endpoint,
            self.device,
            self.property,
            selector or "",
            flt,
            listener,
            queue_size,
            hook,
        )

    def _request(
        self,
        op: RequestType,
        body: list[tuple[BodyKind, Buffer]],
        selector: str | None,
        filters: Data | Mapping[str, Any] | None,
        timeout: float | None,
        convert: Callable[[Any], Any],
    ) -> Future[Any]:
        service = self._service
        try:
            endpoint = self.endpoint
        except Exception as exc:
            failed: Future[Any] = Future()
            failed.set_exception(exc)
            return failed
        flt = None if filters is None else to_data(filters, "filters")
        body.append((_REQUEST_CONTEXT, service.request_context(timeout, flt)))
        return service.request(
            op, endpoint, self.device, self.property, selector or "", body, timeout, convert
        )

    def _call(
        self,
        op: RequestType,
        body: list[tuple[BodyKind, Buffer]],
        selector: str | None,
        filters: Data | Mapping[str, Any] | None,
        timeout: float | None,
        convert: Callable[[Any], Any],
    ) -> Any:
        """The blocking form of ``_request``: the same request, waited for without a Future."""
        service = self._service
        endpoint = self.endpoint
        flt = None if filters is None else to_data(filters, "filters")
        body.append((_REQUEST_CONTEXT, service.request_context(timeout, flt)))
        return service.call(
            op, endpoint, self.device, self.property, selector or "", body, timeout, convert
        )
