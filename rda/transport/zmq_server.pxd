# Types for the compiled build of zmq_server.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# The transport is an extension type: the dispatcher loop reads its slots in C and calls the
# peer table's per-message methods directly.

cimport cython
from rda.transport cimport _zmq_common as common
from rda.transport.relay cimport Relay
from rda.transport.server_session cimport PeerTable

# The ROUTER's side of every reply (write): the poller typed and send_routed a C call with the
# socket's handle kept; its other attributes stay in an instance dict (tests replace methods).
cdef class _Wire:
    cdef dict __dict__
    cdef public common.Selector poller
    cdef public object router
    cdef public Py_ssize_t handle
    cdef public object table

cdef class ZmqServerTransport(common.DispatcherShell):
    cdef object _requested
    cdef object _endpoint
    cdef object _sndhwm
    cdef readonly object _router
    cdef object _monitor
    cdef readonly object _wire
    cdef readonly PeerTable _table
    cdef object _curve
    cdef object _zap
    cdef readonly Relay _relay

    @cython.locals(table=PeerTable, relay=Relay)
    cpdef bint _lead(self) except -1
    cpdef int _poll_timeout_ms(self) except? -2
    cpdef bint _on_dispatcher(self) except -1
    @cython.locals(table=PeerTable)
    cpdef _drain_mailbox(self, object mailbox)
    @cython.locals(table=PeerTable, relay=Relay, now=double, curve=bint)
    cpdef _drain_router(self, object router)
