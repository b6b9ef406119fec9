"""Client: what a failed ZeroMQ handshake means, in words that say whose fault it is.

libzmq reports a failed handshake as one of three monitor events, and not always the same one
for the same cause: a client without a key meeting a CURVE server sees either
``HANDSHAKE_FAILED_PROTOCOL`` (mechanism mismatch) or, when the server's close arrives first,
``HANDSHAKE_FAILED_NO_DETAIL``, which is also what a peer that is no ZeroMQ socket at all (a web
server, a database on the wrong port) produces. Issue 26: the first must read the same every
time, and the second must not read as "not authorized".

So on ``NO_DETAIL`` the client looks at the peer once: a ZeroMQ peer opens every connection with
its greeting signature (``0xFF``, eight bytes, ``0x7F``, ZMTP 3, rfc.zeromq.org/spec/23)
whatever it receives, so a fresh TCP connection that sends that signature and receives it back
is a ZeroMQ peer, and one that receives other bytes, or is closed first, is not. The look is bounded
(:data:`PROBE_TIMEOUT`) and happens only on this failure path, never per message.
"""

from __future__ import annotations

import socket
import time

import zmq

from rda.transport.reasons import HANDSHAKE_REFUSED, NOT_RDA

__all__ = ["HANDSHAKE_CUT", "PROBE_TIMEOUT", "handshake_failure", "speaks_zmtp"]

# Long enough for a loaded machine to accept and greet; short because the dispatcher waits.
PROBE_TIMEOUT = 0.5
_SIGNATURE = 10  # bytes of the ZMTP greeting's signature
_GREETING = b"\xff" + bytes(8) + b"\x7f"  # the signature a ZeroMQ peer sends first

NO_KEY = (
    "the server requires CURVE security and this client has no key (--key FILE or RDA_KEY_FILE)"
)
KEY_REFUSED = "the server does not accept this client's key"
NOT_CURVE = "the server does not use CURVE security: connect without a key"
CURVE_FAILED = "the CURVE handshake failed: is the server key the right one?"
HANDSHAKE_CUT = "the ZeroMQ handshake was cut short (the server restarting?)"


# Of a ZMTP 3 greeting: the mechanism, 20 bytes of NUL-padded ASCII. A ZeroMQ peer sends the
# rest of its greeting, this included, once it has read our signature and major version
# (never our mechanism: a mismatch would make it close before it says its own).
_MECHANISM = slice(12, 32)
_MAJOR = b"\x03"


def _greeting(endpoint: str, timeout: float) -> tuple[bytes, bool] | None:
    """(what the peer sent, within ``timeout``, up to the end of its mechanism; whether it
    closed or reset before its signature was complete), or None when it cannot be asked."""
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    host = host.strip("[]")
    try:
        address = (host, int(port))
    except ValueError:
        return None
    deadline = time.monotonic() + timeout
    received = b""
    try:
        with socket.create_connection(address, timeout=timeout) as sock:
            # Speak first, as a ZeroMQ client does: a server of another protocol that waits
            # for its client (HTTP) then answers with an error of its own, or closes.
            sock.sendall(_GREETING)
            major_sent = False
            while len(received) < _MECHANISM.stop:
                if len(received) >= _SIGNATURE and not major_sent:
                    sock.sendall(_MAJOR)
                    major_sent = True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                sock.settimeout(remaining)
                chunk = sock.recv(_MECHANISM.stop - len(received))
                if not chunk:  # closed
                    return received, len(received) < _SIGNATURE
                received += chunk
    except TimeoutError:
        pass  # judged on what arrived in time
    except ConnectionResetError:
        return received, len(received) < _SIGNATURE
    except OSError:
        return None  # refused or unreachable now: nothing to tell
    return received, False


def speaks_zmtp(endpoint: str, timeout: float = PROBE_TIMEOUT) -> bool | None:
    """True if the peer at a ``tcp://`` endpoint greets as ZeroMQ does, False if it sends
    something else or closes first, None when it cannot be told (not tcp, unreachable, silent)."""
    return _judge(_greeting(endpoint, timeout))[0]


def _judge(got: tuple[bytes, bool] | None) -> tuple[bool | None, str | None]:
    """(speaks ZMTP, its mechanism) from what :func:`_greeting` got."""
    if got is None:
        return None, None
    received, cut = got
    if cut:
        # A ZeroMQ peer greets before anything else: a close or reset before a greeting began
        # is no ZeroMQ peer; one cut short in the middle of it cannot be told.
        return (None if received[:1] == b"\xff" else False), None
    if not received:
        return None, None  # silent: cannot tell
    if received[0] != 0xFF:
        return False, None
    if len(received) < _SIGNATURE:
        return None, None
    if received[_SIGNATURE - 1] != 0x7F:
        return False, None
    if len(received) < _MECHANISM.stop:
        return True, None
    return True, received[_MECHANISM].rstrip(b"\x00").decode("ascii", "replace")


def handshake_failure(event: int, value: int, endpoint: str, curve: bool) -> str | None:
    """The disconnect reason for a monitor ``event`` (``value``: its ZMTP error code), or None
    when the event is no handshake failure. Refusals start with ``HANDSHAKE_REFUSED`` (the
    business layer raises NotAuthorizedError); a peer that is not ZeroMQ gives ``NOT_RDA``."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"{HANDSHAKE_REFUSED}: {KEY_REFUSED}"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return f"{HANDSHAKE_REFUSED}: {NOT_CURVE if curve else NO_KEY}"
    elif event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return None
    zmtp, mechanism = _judge(_greeting(endpoint, PROBE_TIMEOUT))
    if zmtp is False:
        return (
            f"{NOT_RDA}: {endpoint} answered, but not with a ZeroMQ greeting "
            "(is it the endpoint of an rda server?)"
        )
    if mechanism == "CURVE":
        return f"{HANDSHAKE_REFUSED}: {CURVE_FAILED if curve else NO_KEY}"
    if mechanism == "NULL" and curve:
        return f"{HANDSHAKE_REFUSED}: {NOT_CURVE}"
    # Issue 27: NO_DETAIL is also what a handshake cut short says (a server killed, restarting
    # or swamped in a restart storm); taken for a refusal, it ended subscriptions for good. A
    # NULL server never refuses a NULL client, and a server that could not be asked refused
    # nothing: an ordinary loss, retried on the back-off (a CURVE server is named next time).
    return HANDSHAKE_CUT
