"""rda: a Python device-property middleware in the style of CERN's RDA3, over ZeroMQ.

This module is the curated public face: every public name is re-exported here exactly once
(``tests/test_exports.py`` checks it). ``rda.aio`` (asyncio client), ``rda.admin`` (admin
commands, CLI, metrics), ``rda.testing`` (in-memory transports, fake clock, conformance suite)
and ``rda.pipeline`` (history; extra ``[pipeline]``) are sub-packages.

The names are loaded on first use (PEP 562 ``__getattr__``): ``import rda`` costs only this
module, and ``rda.Data`` loads the codec but not zmq, pydantic or prometheus_client. Type
checkers read the ``TYPE_CHECKING`` imports below, which name the same defining modules as
``_EXPORTS`` (``tests/test_imports.py`` checks that the two agree).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from rda import _compiled_python

# Before any module of the request path is imported: its compiled build, when there is one.
_compiled_python.install()

if TYPE_CHECKING:
    import rda.admin as admin
    import rda.security as security
    from rda._implementation import Implementation, implementation
    from rda._server import ServerBuilder
    from rda.business.client.access import AccessPoint
    from rda.business.client.service import ClientService
    from rda.business.client.statistics import ClientStatistics, ServerConnectionStatistics
    from rda.business.client.subscriptions import HistoryChunk, Notification, Subscription
    from rda.business.common import AcquiredData
    from rda.business.config import Config, ConfigError
    from rda.business.directory import (
        ChainDirectory,
        Directory,
        DirectoryUnavailableError,
        FileDirectory,
        NameTakenError,
        StaticDirectory,
        default_directory,
    )
    from rda.business.etcd.directory import EtcdDirectory
    from rda.business.metadata import Alarm, Field, PropertyDescription, Severity
    from rda.business.scheduler import GroupTaskScheduler
    from rda.business.server.builder import Server
    from rda.business.server.devices import Device, prop
    from rda.business.server.requests import (
        ClientInfo,
        GetRequest,
        RequestReplyCallback,
        SetRequest,
        SubscriptionRequest,
    )
    from rda.business.server.statistics import ServerStatistics
    from rda.business.server.subscriptions import SubscriptionCallback, SubscriptionSource
    from rda.serialization.data import Data, DataType
    from rda.serialization.errors import (
        DecodeError,
        DisconnectedError,
        HistoryUnavailableError,
        LocalDecodeError,
        LocalProtocolError,
        NoSuchDeviceError,
        NotAuthorizedError,
        OverloadError,
        ProtocolError,
        RdaError,
        RemoteDecodeError,
        RemoteError,
        RemoteProtocolError,
        TimeoutError,
        TransportError,
    )
    from rda.serialization.header import DataContext, UpdateType

__version__ = "0.1.0"

# Public name -> the module that defines it (the name is that module's attribute, except for
# the two sub-packages, which are the modules themselves).
_EXPORTS: dict[str, str] = {
    "Implementation": "rda._implementation",
    "implementation": "rda._implementation",
    "ServerBuilder": "rda._server",
    "admin": "rda.admin",
    "AccessPoint": "rda.business.client.access",
    "ClientService": "rda.business.client.service",
    "ClientStatistics": "rda.business.client.statistics",
    "ServerConnectionStatistics": "rda.business.client.statistics",
    "HistoryChunk": "rda.business.client.subscriptions",
    "Notification": "rda.business.client.subscriptions",
    "Subscription": "rda.business.client.subscriptions",
    "AcquiredData": "rda.business.common",
    "Config": "rda.business.config",
    "ConfigError": "rda.business.config",
    "ChainDirectory": "rda.business.directory",
    "Directory": "rda.business.directory",
    "DirectoryUnavailableError": "rda.business.directory",
    "FileDirectory": "rda.business.directory",
    "NameTakenError": "rda.business.directory",
    "StaticDirectory": "rda.business.directory",
    "default_directory": "rda.business.directory",
    "EtcdDirectory": "rda.business.etcd.directory",
    "Alarm": "rda.business.metadata",
    "Field": "rda.business.metadata",
    "PropertyDescription": "rda.business.metadata",
    "Severity": "rda.business.metadata",
    "GroupTaskScheduler": "rda.business.scheduler",
    "Server": "rda.business.server.builder",
    "Device": "rda.business.server.devices",
    "prop": "rda.business.server.devices",
    "ClientInfo": "rda.business.server.requests",
    "GetRequest": "rda.business.server.requests",
    "RequestReplyCallback": "rda.business.server.requests",
    "SetRequest": "rda.business.server.requests",
    "SubscriptionRequest": "rda.business.server.requests",
    "ServerStatistics": "rda.business.server.statistics",
    "SubscriptionCallback": "rda.business.server.subscriptions",
    "SubscriptionSource": "rda.business.server.subscriptions",
    "security": "rda.security",
    "Data": "rda.serialization.data",
    "DataType": "rda.serialization.data",
    "DataContext": "rda.serialization.header",
    "UpdateType": "rda.serialization.header",
    "DecodeError": "rda.serialization.errors",
    "DisconnectedError": "rda.serialization.errors",
    "HistoryUnavailableError": "rda.serialization.errors",
    "LocalDecodeError": "rda.serialization.errors",
    "LocalProtocolError": "rda.serialization.errors",
    "RemoteDecodeError": "rda.serialization.errors",
    "RemoteProtocolError": "rda.serialization.errors",
    "NoSuchDeviceError": "rda.serialization.errors",
    "NotAuthorizedError": "rda.serialization.errors",
    "OverloadError": "rda.serialization.errors",
    "ProtocolError": "rda.serialization.errors",
    "RdaError": "rda.serialization.errors",
    "RemoteError": "rda.serialization.errors",
    "TimeoutError": "rda.serialization.errors",
    "TransportError": "rda.serialization.errors",
}
_MODULES = frozenset({"admin", "security"})


def __getattr__(name: str) -> object:
    """Import the defining module of a public name the first time the name is used."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if name in _MODULES else getattr(loaded, name)
    globals()[name] = value  # later uses are plain global lookups
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AccessPoint",
    "AcquiredData",
    "Alarm",
    "ChainDirectory",
    "ClientInfo",
    "ClientService",
    "ClientStatistics",
    "Config",
    "ConfigError",
    "Data",
    "DataContext",
    "DataType",
    "DecodeError",
    "Device",
    "Directory",
    "DirectoryUnavailableError",
    "DisconnectedError",
    "EtcdDirectory",
    "Field",
    "FileDirectory",
    "GetRequest",
    "GroupTaskScheduler",
    "HistoryChunk",
    "HistoryUnavailableError",
    "Implementation",
    "LocalDecodeError",
    "LocalProtocolError",
    "NameTakenError",
    "NoSuchDeviceError",
    "NotAuthorizedError",
    "Notification",
    "OverloadError",
    "PropertyDescription",
    "ProtocolError",
    "RdaError",
    "RemoteDecodeError",
    "RemoteError",
    "RemoteProtocolError",
    "RequestReplyCallback",
    "Server",
    "ServerBuilder",
    "ServerConnectionStatistics",
    "ServerStatistics",
    "SetRequest",
    "Severity",
    "StaticDirectory",
    "Subscription",
    "SubscriptionCallback",
    "SubscriptionRequest",
    "SubscriptionSource",
    "TimeoutError",
    "TransportError",
    "UpdateType",
    "__version__",
    "admin",
    "default_directory",
    "implementation",
    "prop",
    "security",
]
