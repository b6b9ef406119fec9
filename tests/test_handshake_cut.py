"""Issue 27 (6): a handshake cut short in a restart storm is a loss, not a refusal.

Found by benchmarks/restart_storm.py with 1,000 subscriptions on a loaded machine: libzmq
reports a handshake that a killed or swamped server cut short as ``HANDSHAKE_FAILED_NO_DETAIL``,
the event a keyless client also gets from a CURVE server; taken for a refusal, it ended 800 of
the 1,000 subscriptions with NotAuthorizedError, for good (nothing retries a refusal). Now the
client asks the server for its mechanism (the ZMTP greeting names it): only a CURVE server
refuses a keyless client; a NULL server, or one that cannot be asked, refused nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from rda.testing import free_port
from rda.transport._handshake import HANDSHAKE_CUT, NO_KEY, NOT_CURVE, handshake_failure
from rda.transport.reasons import HANDSHAKE_REFUSED

NO_DETAIL = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


@pytest.fixture
def routers() -> Iterator[tuple[str, str]]:
    """(a NULL ROUTER's endpoint, a CURVE ROUTER's endpoint)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    plain, curve = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    public, secret = zmq.curve_keypair()
    curve.curve_server = True
    curve.curve_secretkey = secret
    curve.curve_publickey = public
    ports = [s.bind_to_random_port("tcp://127.0.0.1") for s in (plain, curve)]
    yield f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}"
    for s in (plain, curve):
        s.close(linger=0)
    ctx.term()


def closed_port() -> str:
    return f"tcp://127.0.0.1:{free_port()}"  # nobody listens there


def test_a_cut_handshake_with_a_server_that_cannot_be_asked_is_retried() -> None:
    reason = handshake_failure(NO_DETAIL, 104, closed_port(), curve=False)
    assert reason == HANDSHAKE_CUT and not reason.startswith(HANDSHAKE_REFUSED)


def test_the_server_mechanism_decides_what_a_cut_handshake_means(
    routers: tuple[str, str],
) -> None:
    plain, curve = routers
    assert handshake_failure(NO_DETAIL, 104, plain, curve=False) == HANDSHAKE_CUT
    assert handshake_failure(NO_DETAIL, 104, curve, curve=False) == (
        f"{HANDSHAKE_REFUSED}: {NO_KEY}"
    )
    assert handshake_failure(NO_DETAIL, 104, plain, curve=True) == (
        f"{HANDSHAKE_REFUSED}: {NOT_CURVE}"
    )
