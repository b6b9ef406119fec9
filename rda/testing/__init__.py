"""rda.testing: fakes for testing code built on rda, without a network or real time.

* :class:`FakeClock`: time that moves only when the test says so;
* :class:`MemoryNetwork`: in-memory client and server transports that speak the real wire
  protocol, with fault hooks (partition, kill/restart, stalled client), and :func:`memory_pair`;
* :class:`OneServerDirectory`: every device at one endpoint (a memory network's ``mem://``);
* :func:`check_transport`: the conformance suite every transport passes (in-memory and ZeroMQ);
* :class:`LocalEtcd`: a real, throwaway etcd on free ports (for ``rda.EtcdDirectory`` tests);
* :class:`PvaIsland`, :class:`LocalIoc`, :class:`GatewayProcess`: a loopback-only pvAccess
  neighbourhood, a real EPICS IOC and the rda pvAccess gateway in processes of their own;
  :class:`PvaMonitor`: p4p monitors that never lose their first update;
* :func:`free_port`: a port for a test's own server, outside the ephemeral range;
* :class:`RecordingClientHandler` / :class:`RecordingServerHandler`: handlers that record calls
  and let a test wait for a condition with a bound;
* :func:`wait_until`: a bounded wait for a condition another thread or process will make
  true, whose failure says what never happened.
"""

from rda.testing._clock import FakeClock
from rda.testing._conformance import (
    CONFORMANCE_CHECKS,
    MakePair,
    TransportPair,
    check_transport,
    transport_pair,
)
from rda.testing._etcd import LocalEtcd
from rda.testing._memory import (
    MemoryNetwork,
    MemoryPair,
    OneServerDirectory,
    RawPeer,
    memory_pair,
)
from rda.testing._memory_client import MemoryClientTransport
from rda.testing._memory_server import MemoryServerTransport
from rda.testing._ports import free_port
from rda.testing._pva import GatewayProcess, LocalIoc, PvaIsland, PvaMonitor, PvaProcess
from rda.testing._recorders import RecordingClientHandler, RecordingServerHandler
from rda.testing._waiting import wait_until

__all__ = [
    "CONFORMANCE_CHECKS",
    "FakeClock",
    "GatewayProcess",
    "LocalEtcd",
    "LocalIoc",
    "MakePair",
    "MemoryClientTransport",
    "MemoryNetwork",
    "MemoryPair",
    "MemoryServerTransport",
    "OneServerDirectory",
    "PvaIsland",
    "PvaMonitor",
    "PvaProcess",
    "RawPeer",
    "RecordingClientHandler",
    "RecordingServerHandler",
    "TransportPair",
    "check_transport",
    "free_port",
    "memory_pair",
    "transport_pair",
    "wait_until",
]
