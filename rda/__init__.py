"""rda: a Python device-property middleware in the style of CERN's RDA3, over ZeroMQ.

This module is the curated public face: every public name is re-exported here exactly once
(``tests/test_exports.py`` checks it). ``rda.aio`` (asyncio client), ``rda.admin`` (admin
commands, CLI, metrics), ``rda.testing`` (in-memory transports, fake clock, conformance suite)
and ``rda.pipeline`` (history; extra ``[pipeline]``) are sub-packages.
"""

import rda.admin as admin
import rda.security as security
from rda._server import ServerBuilder
from rda.business.client.access import AccessPoint
from rda.business.client.service import ClientService
from rda.business.client.statistics import ClientStatistics, ServerConnectionStatistics
from rda.business.client.subscriptions import Notification, Subscription
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
from rda.serialization._data import Data, DataType
from rda.serialization._header import DataContext, UpdateType
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

__version__ = "0.1.0"

__all__ = [
    "AccessPoint",
    "AcquiredData",
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
    "FileDirectory",
    "GetRequest",
    "GroupTaskScheduler",
    "HistoryUnavailableError",
    "LocalDecodeError",
    "LocalProtocolError",
    "NameTakenError",
    "NoSuchDeviceError",
    "NotAuthorizedError",
    "Notification",
    "OverloadError",
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
    "prop",
    "security",
]
