"""Which compiled parts of the transport are in use: the frame parser and the direct libzmq
calls. Each falls back to pure Python when its extension was not built, its libzmq could not
be bound, or ``RDA_PURE_PYTHON=1`` was set before rda was imported (``rda.implementation()``
reports the whole picture)."""

from __future__ import annotations

from rda.transport import protocol

__all__ = ["frame_parser", "libzmq_calls"]


def frame_parser() -> str:
    """ "compiled" (``_cframe`` parses REQUEST/REPLY frames first) or "python"."""
    return protocol.frame_parser


def libzmq_calls() -> str:
    """ "compiled" (the dispatchers' non-blocking sends and receives call libzmq directly,
    ``_czmq``) or "python" (through pyzmq). Loads zmq."""
    from rda.transport import _direct_zmq

    return "python" if _direct_zmq.recv is None else "compiled"
