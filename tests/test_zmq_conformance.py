"""H2's conformance suite (``rda.testing.check_transport``) against the ZeroMQ transports."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator

import pytest

from rda.testing import CONFORMANCE_CHECKS, TransportPair, check_transport, transport_pair
from rda.transport.zmq_client import ZmqClientTransport
from rda.transport.zmq_server import ZmqServerTransport

make_tcp_pair = transport_pair(
    lambda h, s, info: ZmqServerTransport("tcp://127.0.0.1:0", h, s, info),
    lambda h, s, info: ZmqClientTransport(h, s, info),
)


@contextlib.contextmanager
def make_ipc_pair() -> Iterator[TransportPair]:
    # A fresh directory per pair: ipc endpoints are paths, and the suite may make several
    # servers in one check.
    with tempfile.TemporaryDirectory(prefix="rda-ipc-") as directory:
        names = iter(range(1_000_000))
        make = transport_pair(
            lambda h, s, info: ZmqServerTransport(f"ipc://{directory}/s{next(names)}", h, s, info),
            lambda h, s, info: ZmqClientTransport(h, s, info),
        )
        with make() as pair:
            yield pair


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS)
def test_zmq_tcp_conformance(check: str) -> None:
    check_transport(make_tcp_pair, only=[check])


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS)
def test_zmq_ipc_conformance(check: str) -> None:
    check_transport(make_ipc_pair, only=[check])
