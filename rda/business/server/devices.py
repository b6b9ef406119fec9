"""Declarative devices, in the manner of PyTango's high-level server.

::

    class PowerSupply(Device):
        @Device.property("Setting", schema=SettingModel)
        def setting(self, request: GetRequest) -> Data:
            return Data(current=self.current)

        @setting.setter
        def write_setting(self, value: SettingModel, request: SetRequest) -> None:
            self.current = value.current

    server = ServerBuilder("PS").device("PS1", PowerSupply()).build()

``Device.property(name, schema=None)`` (also importable as :func:`prop`) turns a getter into a
:class:`DeviceProperty`; ``@<attr>.setter`` adds the setter (and returns the same property, so
the setter function may keep the getter's name as with ``builtins.property``; a distinct name, as
above, keeps ``mypy`` from reporting a redefinition). The getter may return ``Data``,
a ``dict``, an ``AcquiredData`` or a pydantic model (stamped with the current time unless it is
an ``AcquiredData``), or ``None`` when it completes the request itself (later, from any thread).
With a schema the setter receives the validated model; without one, the ``Data``. Validation
failures reach the client as ``RemoteError`` naming the field:
``"PS1/Setting: current: Input should be a valid number, ..."``.

This is no second runtime: :class:`DeviceRouter` is an ordinary ``RequestReplyCallback`` and
``SubscriptionCallback`` that routes by device name, and ``Device.publish`` calls
``SubscriptionSource.notify`` on the server's sources.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from rda.business import driver
from rda.business.common import AcquiredData
from rda.business.metadata import Field, PropertyDescription, fields_of_model, limit_problems
from rda.business.server.requests import (
    GetRequest,
    RequestReplyCallback,
    SetRequest,
    SubscriptionRequest,
)
from rda.business.server.subscriptions import (
    SubscriptionCallback,
    SubscriptionSource,
    UnsubscribeRequest,
)
from rda.serialization.data import Data
from rda.serialization.errors import NoSuchDeviceError, RdaError
from rda.serialization.header import DataContext, UpdateType

__all__ = [
    "Device",
    "DeviceProperty",
    "DeviceRouter",
    "PropertyValidationError",
    "ReadOnlyPropertyError",
    "prop",
    "to_acquired",
]

Getter = Callable[[Any, GetRequest], Any]
Setter = Callable[[Any, Any, SetRequest], None]


class PropertyValidationError(ValueError):
    """Set data failed the property's schema; the message names each bad field."""


class ReadOnlyPropertyError(RdaError):
    """A set on a property declared without a setter."""


class DeviceProperty:
    """One property of a :class:`Device` class: wire name, getter, optional setter and schema."""

    def __init__(
        self,
        name: str,
        getter: Getter,
        schema: type[BaseModel] | None = None,
        setter: Setter | None = None,
        blocking: bool | None = None,
        fields: Mapping[str, Field] | None = None,
        description: str | None = None,
    ) -> None:
        if not name:
            raise ValueError("a device property needs a non-empty name")
        self.name = name
        self.getter = getter
        self.schema = schema
        self.set_function = setter
        # Declared metadata: the schema's annotated fields, then ``fields=`` over them.
        declared = dict(fields_of_model(schema)) if schema is not None else {}
        for field_name, field in (fields or {}).items():
            if not isinstance(field, Field):
                raise TypeError(f"{name}: fields[{field_name!r}] must be an rda.Field")
            declared[field_name] = field
        self.fields: Mapping[str, Field] = declared
        self.description = (
            description
            if description is not None
            else " ".join((getter.__doc__ or "").strip().split("\n\n")[0].split())
        )
        self._limited = {n: f for n, f in declared.items() if f.limits is not None}
        # True: getter or setter may block (waits on hardware): they always run on a worker.
        # False: they never block (a cached value, a computation): they run on the dispatcher
        # even with ServerBuilder.inline_handlers(False). None: the server's default
        # (optimistic: on the dispatcher, handed over if it takes long; docs/server.md).
        self.blocking = blocking
        self.__doc__ = getter.__doc__

    def __repr__(self) -> str:
        access = "read/write" if self.set_function is not None else "read-only"
        return f"<DeviceProperty {self.name!r} {access}>"

    def setter(self, function: Setter) -> DeviceProperty:
        """Decorator adding the setter; returns this property (so the attribute stays it)."""
        self.set_function = function
        return self

    def describe(self, device: str) -> PropertyDescription:
        """This property's description as served under ``device``."""
        return PropertyDescription(
            device, self.name, self.fields, self.description, self.set_function is not None
        )

    def validate(self, device: str, data: Data) -> Any:
        """The value the setter receives: the schema's model, or ``data`` without a schema.
        Raises ``PropertyValidationError`` naming each bad field, and each value outside its
        declared control limits (checked on the validated values: what the setter gets)."""
        if self.schema is None:
            self._check_limits(device, data)
            return data
        problems = _unknown_fields(self.schema, data)
        model: BaseModel | None = None
        try:
            model = self.schema.model_validate(data.to_dict())
        except ValidationError as exc:
            problems += [
                f"{'.'.join(str(p) for p in err['loc']) or '(value)'}: {err['msg']}"
                for err in exc.errors()
                if err["type"] != "extra_forbidden"  # named by _unknown_fields, with the known
            ]
        if problems or model is None:
            raise PropertyValidationError(f"{device}/{self.name}: {'; '.join(problems)}")
        if self._limited:
            self._check_limits(device, model.model_dump(by_alias=True))
        return model

    def _check_limits(self, device: str, values: Mapping[str, Any]) -> None:
        if not self._limited:
            return
        problems = limit_problems(self._limited, values)
        if problems:
            raise PropertyValidationError(f"{device}/{self.name}: {'; '.join(problems)}")


def _unknown_fields(schema: type[BaseModel], data: Data) -> list[str]:
    """``["unknown field 'volts' (fields: current, mode)"]`` for names the schema lacks.

    pydantic ignores extra fields by default, so a misspelt name would vanish and the set report
    only what is now missing (issue 26). Unknown names are refused unless the model says what
    to do with extras itself (``extra="allow"`` or ``"ignore"`` in its ``model_config``).
    """
    if schema.model_config.get("extra") in ("allow", "ignore"):
        return []
    known = {name: info.alias or name for name, info in schema.model_fields.items()}
    accepted = set(known) | set(known.values())
    unknown = [name for name in data if name not in accepted]
    if not unknown:
        return []
    names = ", ".join(repr(n) for n in unknown)
    plural = "s" if len(unknown) > 1 else ""
    return [f"unknown field{plural} {names} (fields: {', '.join(known.values())})"]


def prop(
    name: str,
    schema: type[BaseModel] | None = None,
    *,
    blocking: bool | None = None,
    fields: Mapping[str, Field] | None = None,
    description: str | None = None,
) -> Callable[[Getter], DeviceProperty]:
    """Declare a device property from its getter (``Device.property`` is the same function).
    ``blocking=True`` sends its getter and setter to a worker always (they wait on hardware);
    ``blocking=False`` promises that they never block (run on the dispatcher even when the
    server's ``inline_handlers`` is off); unset, the server's default applies (docs/server.md,
    "Threads and order"). ``fields``: the metadata of its fields (``rda.Field``: units,
    precision, control and alarm limits), over what the schema's annotations declare;
    ``description`` (default: the getter's docstring's first paragraph) is what ``describe``
    shows (docs/server.md, "Property metadata")."""

    def decorate(getter: Getter) -> DeviceProperty:
        return DeviceProperty(
            name, getter, schema, blocking=blocking, fields=fields, description=description
        )

    return decorate


def to_acquired(value: Any, what: str) -> AcquiredData:
    """A getter's or publisher's value as ``AcquiredData``; plain values get a time stamp."""
    if isinstance(value, AcquiredData):
        return value
    if isinstance(value, Data):
        data = value
    elif isinstance(value, BaseModel):
        data = Data.from_dict(value.model_dump())
    elif isinstance(value, Mapping):
        data = Data.from_dict(value)
    else:
        raise TypeError(
            f"{what}: expected Data, dict, AcquiredData or a pydantic model, "
            f"got {type(value).__name__}"
        )
    return AcquiredData(data, DataContext(acq_stamp=driver.wall_time_ns()))


class Device:
    """Base class of declarative devices; see the module docstring."""

    _properties_cache: ClassVar[dict[type, dict[str, DeviceProperty]]] = {}
    # Class-level defaults, so a subclass whose __init__ forgets super().__init__() (as
    # PyTango users often write) still works.
    _name: str | None = None
    _sources: Callable[[str], list[SubscriptionSource]] | None = None

    def __init__(self) -> None:
        self._name = None
        self._sources = None

    @property
    def name(self) -> str | None:
        """The name it is served under (None until a server starts serving it)."""
        return self._name

    @classmethod
    def properties(cls) -> dict[str, DeviceProperty]:
        """Wire name -> property, including those inherited from base classes."""
        found = Device._properties_cache.get(cls)
        if found is None:
            found = {}
            for klass in reversed(cls.__mro__):
                for value in vars(klass).values():
                    if isinstance(value, DeviceProperty):
                        found[value.name] = value
            Device._properties_cache[cls] = found
        return found

    def publish(
        self,
        property: str,
        value: Any,
        update_type: UpdateType = UpdateType.NORMAL,
        selector: str | None = None,
    ) -> int:
        """Push a value to the subscribers of ``property`` (all selectors, or only the sources
        subscribed with ``selector``); returns how many sources were notified."""
        sources = self._sources_of(property, selector)
        if not sources:
            return 0
        acquired = to_acquired(value, f"{self._name}/{property}")
        for source in sources:
            source.notify(acquired, update_type)
        return len(sources)

    def publish_error(
        self, property: str, error: BaseException | str, selector: str | None = None
    ) -> int:
        """Send subscribers of ``property`` an error notification."""
        sources = self._sources_of(property, selector)
        for source in sources:
            source.notify_error(error)
        return len(sources)

    def _sources_of(self, property: str, selector: str | None) -> list[SubscriptionSource]:
        if property not in self.properties():
            raise NoSuchDeviceError(f"{self._name}/{property}: no such property")
        if self._sources is None:
            return []
        sources = self._sources(property)
        if selector is not None:
            sources = [s for s in sources if s.selector == selector]
        return sources

    def bind(self, name: str, sources: Callable[[str], list[SubscriptionSource]]) -> None:
        """Called by the server that starts serving this object as ``name``: ``sources(prop)``
        gives the subscription sources ``publish`` notifies. One object, one name."""
        if self._name is not None and self._name != name:
            raise ValueError(f"device object already served as {self._name!r}, not {name!r}")
        self._name = name
        self._sources = sources

    def unbind(self) -> None:
        """Called by the server at stop: ``publish`` then notifies nobody."""
        self._sources = None

    # ``Device.property(...)`` is the decorator; bound last so the builtin ``property`` above
    # still means the builtin.
    property = staticmethod(prop)


class DeviceRouter(RequestReplyCallback, SubscriptionCallback):
    """Routes requests by device name to :class:`Device` objects; other devices go to the
    raw callbacks given (or are answered NoSuchDeviceError)."""

    def __init__(
        self,
        devices: Mapping[str, Device],
        request_reply: RequestReplyCallback | None = None,
        subscription: SubscriptionCallback | None = None,
    ) -> None:
        self._devices = dict(devices)
        self._rr = request_reply
        self._subs = subscription

    def _property(self, device: str, name: str) -> tuple[Device, DeviceProperty] | None:
        obj = self._devices.get(device)
        if obj is None:
            return None
        found = obj.properties().get(name)
        if found is None:
            known = ", ".join(sorted(obj.properties())) or "none"
            raise NoSuchDeviceError(f"{device}/{name}: no such property (known: {known})")
        return obj, found

    def get(self, request: GetRequest) -> None:
        target = self._property(request.device, request.property)
        if target is None:
            if self._rr is None:
                raise NoSuchDeviceError(f"{request.device}: no such device")
            self._rr.get(request)
            return
        obj, p = target
        value = p.getter(obj, request)
        if value is None:
            return  # the getter completes the request itself
        request.complete(to_acquired(value, f"{request.device}/{request.property}"))

    def set(self, request: SetRequest) -> None:
        target = self._property(request.device, request.property)
        if target is None:
            if self._rr is None:
                raise NoSuchDeviceError(f"{request.device}: no such device")
            self._rr.set(request)
            return
        obj, p = target
        if p.set_function is None:
            raise ReadOnlyPropertyError(f"{request.device}/{request.property}: read-only property")
        value = p.validate(request.device, request.data)
        p.set_function(obj, value, request)
        if not request.done:
            request.complete()

    def subscribe(self, request: SubscriptionRequest) -> None:
        if request.device in self._devices:
            self._property(request.device, request.property)  # raises for an unknown property
            request.accept()
        elif self._subs is not None:
            self._subs.subscribe(request)
        elif self._rr is not None:
            request.accept()  # raw devices without a subscription callback: accept, as default
        else:
            raise NoSuchDeviceError(f"{request.device}: no such device")

    def unsubscribe(self, request: UnsubscribeRequest) -> None:
        if request.device not in self._devices and self._subs is not None:
            self._subs.unsubscribe(request)

    def source_added(self, source: SubscriptionSource) -> None:
        if source.device not in self._devices and self._subs is not None:
            self._subs.source_added(source)

    def source_removed(self, source: SubscriptionSource) -> None:
        if source.device not in self._devices and self._subs is not None:
            self._subs.source_removed(source)
