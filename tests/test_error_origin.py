"""Errors say whose fault: remote (the peer sent something wrong) or local (this process did
something wrong), for decode and protocol errors, in their classes, their messages and the
server's outcome counts (docs/protocol.md, "Whose fault")."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import zmq

import rda
from rda.business.client.replies import get_result, set_result
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.outcomes import is_handler_fault, outcome_of
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.errors import (
    DecodeError,
    LocalDecodeError,
    LocalProtocolError,
    ProtocolError,
    RemoteDecodeError,
    RemoteError,
    RemoteProtocolError,
    as_remote,
    error_from_remote,
    wire_type,
)
from rda.serialization.header import HEADER_FIXED, Header, RequestType
from rda.serialization.message import BodyKind, Message
from rda.testing import MemoryNetwork, OneServerDirectory, RawPeer, free_port, wait_until
from rda.transport import protocol
from rda.transport.api import ClientHandler, ServerHandler, TransportSettings
from rda.transport.protocol import (
    ConnectAck,
    Incoming,
    Kind,
    UnsupportedVersion,
    decode_frames,
    encode_connect,
    encode_message,
)
from rda.transport.state import ConnEvent, ConnState, next_state

CONFIG = Config(heartbeat_interval=1.0, heartbeat_timeout=30.0, request_timeout=10.0)
GARBAGE = b"\xff\xfe not a Data body \x00\x01"
SERVER_DECODE = "the server could not decode this client's request: "
SERVER_OWN_DECODE = "the server reports a decode error of its own: "
SERVER_PROTOCOL = "the server reports that this client broke the protocol: "


# -- the classes ------------------------------------------------------------------------------


def test_the_base_classes_catch_both_sides_and_origin_says_which() -> None:
    for error in (RemoteDecodeError("x"), LocalDecodeError("x")):
        with pytest.raises(rda.DecodeError):
            raise error
    for perror in (RemoteProtocolError("x"), LocalProtocolError("x"), UnsupportedVersion(7)):
        with pytest.raises(rda.ProtocolError):
            raise perror
    assert (RemoteDecodeError.origin, LocalDecodeError.origin) == ("remote", "local")
    assert (RemoteProtocolError.origin, LocalProtocolError.origin) == ("remote", "local")
    assert DecodeError.origin is None and ProtocolError.origin is None
    assert isinstance(UnsupportedVersion(7), RemoteProtocolError)
    assert not issubclass(RemoteDecodeError, LocalDecodeError)
    assert not issubclass(LocalProtocolError, RemoteProtocolError)


def test_as_remote_keeps_message_offset_and_traceback() -> None:
    try:
        binary.decode(GARBAGE)
    except DecodeError as exc:
        # The codec cannot know whose bytes it reads: the base class.
        assert type(exc) is DecodeError
        remote = as_remote(exc)
        assert type(remote) is RemoteDecodeError
        assert str(remote) == str(exc) and remote.offset == exc.offset
        assert remote.__traceback__ is exc.__traceback__
        assert as_remote(remote) is remote
    else:
        pytest.fail("garbage decoded")


# -- raise sites --------------------------------------------------------------------------------


BAD_FRAMES: dict[str, list[bytes]] = {
    "empty": [b""],
    "unknown kind": [b"\x99\x03"],
    "short header": [bytes([Kind.REQUEST, 3]) + b"\x00" * 5],
    "unknown request type": [
        bytes([Kind.REQUEST]) + HEADER_FIXED.pack(3, 99, 0, 0, 5, 0, 0, 0) + b"\x00"
    ],
    "bytes after the last body": [
        bytes(encode_message(Kind.REQUEST, Header(RequestType.GET, 5, "D", "P"))[0]) + b"zz"
    ],
    "bad handshake": [bytes([Kind.CONNECT, 3]) + b"[not json"],
}


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_a_peers_bad_frames_are_remote_with_either_parser(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames = BAD_FRAMES[name]
    seen: list[tuple[type[BaseException], str]] = []
    for parser in (protocol._parse_compiled, None):
        monkeypatch.setattr(protocol, "_parse_compiled", parser)
        with pytest.raises(rda.DecodeError) as info:
            decode_frames(list(frames), from_server=False)
        seen.append((type(info.value), str(info.value)))
    # The same class and message whichever parser saw the frames first.
    assert seen[0] == seen[1] and seen[0][0] is RemoteDecodeError


def test_a_kind_of_the_wrong_side_and_another_version_are_remote_protocol_errors() -> None:
    reply = encode_message(Kind.REPLY, Header(RequestType.REPLY, 1))
    with pytest.raises(RemoteProtocolError, match="may not be sent by a client"):
        decode_frames(reply, from_server=False)
    with pytest.raises(RemoteProtocolError, match="version 7"):
        decode_frames([bytes([Kind.HEARTBEAT, 7])], from_server=False)


def test_a_received_body_that_does_not_decode_is_remote() -> None:
    body = [
        (BodyKind.DATA, GARBAGE),
        (BodyKind.REQUEST_CONTEXT, GARBAGE),
        (BodyKind.DATA_CONTEXT, b"\x01"),
        (BodyKind.EXCEPTION, b"\x09"),
    ]
    event = decode_frames(
        encode_message(Kind.REQUEST, Header(RequestType.SET, 3, "D", "P"), body),
        from_server=False,
    )
    assert isinstance(event, Incoming)
    message = event.message
    accessors: list[Callable[[Message], object]] = [
        lambda m: m.data,
        lambda m: m.timeout,
        lambda m: m.context,
        lambda m: m.exception,
    ]
    for read in accessors:
        with pytest.raises(RemoteDecodeError) as info:
            read(message)
        assert info.value.offset is not None


def test_a_forbidden_transition_is_a_local_bug() -> None:
    with pytest.raises(LocalProtocolError, match="bug of this side"):
        next_state(ConnState.CLOSED, ConnEvent.ACK_RECEIVED)


def test_a_reply_missing_its_frame_is_the_servers_fault() -> None:
    no_data = Message(Header(RequestType.REPLY, 1, "D", "P"))
    with pytest.raises(RemoteProtocolError, match="without a DATA frame"):
        get_result(no_data)
    no_exception = Message(Header(RequestType.EXCEPTION, 1, "D", "P"))
    with pytest.raises(RemoteProtocolError, match="without an EXCEPTION frame"):
        set_result(no_exception)
    garbage = decode_frames(
        encode_message(
            Kind.REPLY, Header(RequestType.REPLY, 1, "D", "P"), [(BodyKind.DATA, GARBAGE)]
        ),
        from_server=True,
    )
    assert isinstance(garbage, Incoming)
    with pytest.raises(RemoteDecodeError):
        get_result(garbage.message)


# -- across the wire ----------------------------------------------------------------------------


def test_the_wire_name_is_the_senders_view_and_the_receiver_flips_it() -> None:
    cases: list[tuple[BaseException, str, type[rda.RdaError], str]] = [
        (RemoteDecodeError("body"), "DecodeError", LocalDecodeError, SERVER_DECODE),
        (RemoteProtocolError("kind"), "ProtocolError", LocalProtocolError, SERVER_PROTOCOL),
        (UnsupportedVersion(7), "ProtocolError", LocalProtocolError, SERVER_PROTOCOL),
        (LocalDecodeError("own"), "LocalDecodeError", RemoteDecodeError, SERVER_OWN_DECODE),
        (DecodeError("own"), "LocalDecodeError", RemoteDecodeError, SERVER_OWN_DECODE),
        (
            ProtocolError("own"),
            "LocalProtocolError",
            RemoteProtocolError,
            "the server reports a protocol error of its own: ",
        ),
    ]
    for error, name, received, prefix in cases:
        assert wire_type(error) == name
        back = error_from_remote(name, str(error))
        assert type(back) is received and str(back) == prefix + str(error)
    assert wire_type(KeyError("k")) == "KeyError"
    assert type(error_from_remote("KeyError", "k")) is RemoteError
    assert type(error_from_remote("NoSuchDeviceError", "D")) is rda.NoSuchDeviceError


def test_the_server_counts_only_remote_errors_as_the_clients_fault() -> None:
    assert outcome_of(RemoteDecodeError("x")) == "bad_request"
    assert outcome_of(RemoteProtocolError("x")) == "bad_request"
    assert outcome_of(UnsupportedVersion(7)) == "bad_request"
    for own in (
        DecodeError("x"),
        LocalDecodeError("x"),
        ProtocolError("x"),
        LocalProtocolError("x"),
    ):
        assert outcome_of(own) == "handler_error" and is_handler_fault(own)


# -- end to end ---------------------------------------------------------------------------------


class Handler(RequestReplyCallback):
    """``set`` reads the client's value; ``get`` of ``Own`` decodes bytes of its own and fails."""

    def __init__(self) -> None:
        self.sets = 0

    def get(self, request: GetRequest) -> None:
        if request.property == "Own":
            request.complete(binary.decode(GARBAGE))  # the server's bug, not the client's
            return
        request.complete(Data(value=1))

    def set(self, request: SetRequest) -> None:
        self.sets += 1
        request.data  # noqa: B018 -- the body decodes here, or raises RemoteDecodeError
        request.complete()


def _garbage_set(rid: int) -> list[Any]:
    header = Header(RequestType.SET, rid, "DEV", "Value")
    return encode_message(Kind.REQUEST, header, [(BodyKind.DATA, GARBAGE)])


def _counted(server: Server) -> dict[tuple[str, str], int]:
    return {key: n for key, n in server.statistics().requests.items() if n}


def _check_garbage_reply(reply: Message, rid: int) -> None:
    """The server's answer to a garbage set: "DecodeError" on the wire (the client's fault), and
    the client's own reconstruction makes it this client's LocalDecodeError, naming the server."""
    assert reply.header.request_type is RequestType.EXCEPTION and reply.header.id == rid
    assert reply.exception is not None and reply.exception[0] == "DecodeError"
    with pytest.raises(LocalDecodeError) as info:
        set_result(reply)
    assert str(info.value).startswith(SERVER_DECODE)
    assert "DEV/Value" in str(info.value)


@pytest.fixture
def memory() -> Iterator[tuple[MemoryNetwork, Server, Handler]]:
    network = MemoryNetwork()
    handler = Handler()

    def transport(
        handler_: ServerHandler, settings: TransportSettings, info: dict[str, Any]
    ) -> Any:
        return network.server("srv", handler_, settings, info)

    server = (
        ServerBuilder("Mem")
        .config(CONFIG)
        .request_reply(handler)
        .directory(None)
        .transport(transport)
        .build()
        .start()
    )
    yield network, server, handler
    server.stop()
    network.close()


def _next_reply(peer: RawPeer) -> Message:
    while True:
        event = decode_frames(peer.recv(20.0), from_server=True)
        if isinstance(event, Incoming):
            return event.message


def test_memory_a_garbage_body_is_the_clients_fault(
    memory: tuple[MemoryNetwork, Server, Handler],
) -> None:
    network, server, handler = memory
    peer = network.raw_peer("srv")
    peer.send(encode_connect({"application": "raw"}))
    assert isinstance(decode_frames(peer.recv(), from_server=True), ConnectAck)
    peer.send(_garbage_set(21))
    _check_garbage_reply(_next_reply(peer), 21)
    assert handler.sets == 1
    wait_until(lambda: bool(_counted(server)), timeout=20.0)
    assert _counted(server) == {("set", "bad_request"): 1}
    assert server.statistics().handler_errors == 0
    # A request type no client may send: the client's protocol error.
    peer.send(encode_message(Kind.REQUEST, Header(RequestType.NOTIFICATION_DATA, 22, "D", "P")))
    reply = _next_reply(peer)
    assert reply.exception is not None and reply.exception[0] == "ProtocolError"
    with pytest.raises(LocalProtocolError) as info:
        set_result(reply)
    assert str(info.value).startswith(SERVER_PROTOCOL)
    peer.close()


def test_memory_a_handlers_own_decode_error_is_the_servers_fault(
    memory: tuple[MemoryNetwork, Server, Handler],
) -> None:
    network, server, _ = memory

    def transport(handler: ClientHandler, settings: TransportSettings, info: dict[str, Any]) -> Any:
        return network.client(handler, settings, info)

    directory = OneServerDirectory(server.endpoint)
    with ClientService(directory=directory, config=CONFIG, transport_factory=transport) as client:
        with pytest.raises(RemoteDecodeError) as info:
            client.access_point("DEV", "Own").get(timeout=10)
        assert str(info.value).startswith(SERVER_OWN_DECODE)
        assert client.access_point("DEV", "Value").get(timeout=10).data == Data(value=1)
    wait_until(lambda: sum(_counted(server).values()) == 2, timeout=20.0)
    assert _counted(server) == {("get", "handler_error"): 1, ("get", "ok"): 1}
    assert server.statistics().handler_errors == 1


@pytest.fixture
def zmq_server() -> Iterator[tuple[Server, Handler]]:
    handler = Handler()
    server = (
        ServerBuilder("Origin")
        .config(CONFIG)
        .endpoint(f"tcp://127.0.0.1:{free_port()}")
        .request_reply(handler)
        .directory(None)
        .build()
        .start()
    )
    yield server, handler
    server.stop()


def _dealer(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart(encode_connect({"application": "raw"}))
    assert dealer.poll(20_000)
    assert isinstance(decode_frames(dealer.recv_multipart(), from_server=True), ConnectAck)
    return dealer


def _dealer_reply(dealer: zmq.Socket[bytes]) -> Message:
    while True:
        assert dealer.poll(20_000)
        frames: Sequence[bytes] = dealer.recv_multipart()
        event = decode_frames(list(frames), from_server=True)
        if isinstance(event, Incoming):
            return event.message


def test_zmq_a_garbage_body_is_the_clients_fault_end_to_end(
    zmq_server: tuple[Server, Handler],
) -> None:
    server, handler = zmq_server
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        dealer = _dealer(ctx, server.endpoint)
        dealer.send_multipart(_garbage_set(31))
        _check_garbage_reply(_dealer_reply(dealer), 31)
        dealer.close()
    finally:
        ctx.term()
    assert handler.sets == 1
    wait_until(lambda: bool(_counted(server)), timeout=20.0)
    assert _counted(server) == {("set", "bad_request"): 1}
    assert server.statistics().handler_errors == 0


def test_zmq_a_real_client_sees_the_servers_own_fault_as_remote(
    zmq_server: tuple[Server, Handler],
) -> None:
    server, _ = zmq_server
    directory = StaticDirectory({"*": server.endpoint})
    with ClientService(directory=directory, config=CONFIG) as client:
        with pytest.raises(rda.DecodeError) as info:
            client.access_point("DEV", "Own").get(timeout=10)
        assert type(info.value) is RemoteDecodeError
        assert str(info.value).startswith(SERVER_OWN_DECODE)
        client.access_point("DEV", "Value").set(Data(value=2), timeout=10)
    wait_until(lambda: sum(_counted(server).values()) == 2, timeout=20.0)
    assert _counted(server) == {("get", "handler_error"): 1, ("set", "ok"): 1}
