"""rda: a Python device-property middleware in the style of CERN's RDA3, over ZeroMQ.

This module is the curated public face: every public name is re-exported here once.
"""

from rda.serialization._header import DataContext, UpdateType
from rda.serialization.errors import (
    DecodeError,
    DisconnectedError,
    NoSuchDeviceError,
    NotAuthorizedError,
    OverloadError,
    ProtocolError,
    RdaError,
    RemoteError,
    TimeoutError,
    TransportError,
)

__version__ = "0.1.0"

__all__ = [
    "DataContext",
    "DecodeError",
    "DisconnectedError",
    "NoSuchDeviceError",
    "NotAuthorizedError",
    "OverloadError",
    "ProtocolError",
    "RdaError",
    "RemoteError",
    "TimeoutError",
    "TransportError",
    "UpdateType",
    "__version__",
]
