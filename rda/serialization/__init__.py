"""rda.serialization: the Data container, its codecs, and the message header and body.

``implementation`` names the binary codec in use: "compiled" (the Cython extension, built by
``pip install``) or "python" (the fallback, or forced with ``RDA_PURE_PYTHON=1``).
"""

from rda.serialization._text import from_csv, from_json, to_csv, to_json
from rda.serialization.binary import DecodeLimits, decode, encode, implementation
from rda.serialization.data import Data, DataType
from rda.serialization.errors import DecodeError, RdaError
from rda.serialization.header import (
    DataContext,
    Header,
    HeaderFlags,
    RequestType,
    UpdateType,
    decode_context,
    decode_header,
    encode_context,
    encode_header,
)
from rda.serialization.message import BodyKind, Message, decode_exception, encode_exception

__all__ = [
    "BodyKind",
    "Data",
    "DataContext",
    "DataType",
    "DecodeError",
    "DecodeLimits",
    "Header",
    "HeaderFlags",
    "Message",
    "RdaError",
    "RequestType",
    "UpdateType",
    "decode",
    "decode_context",
    "decode_exception",
    "decode_header",
    "encode",
    "encode_context",
    "encode_exception",
    "encode_header",
    "from_csv",
    "from_json",
    "implementation",
    "to_csv",
    "to_json",
]
