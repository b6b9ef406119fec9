# Types for the compiled build of zmq_client.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# The client's dispatcher loop and the per-request entry points (send, lane, wake_later): an
# extension type over _zmq_common's DispatcherShell, its parts typed slots; its rules
# (ClientSessions) called through their C entry points.

cimport cython
from rda.transport cimport _zmq_common as common
from rda.transport.client_session cimport ClientSessions

cdef class ZmqClientTransport(common.DispatcherShell):
    cdef bint _bursty
    cdef object _curve
    cdef object _info
    cdef object _ids
    cdef object _wire
    cdef ClientSessions _sessions
    cdef dict _by_socket
    cdef dict _by_monitor
    cdef list _wakes
    cdef object _lanes

    cpdef _set_wakes(self)
    @cython.locals(sessions=ClientSessions)
    cpdef _drain_mailbox(self, object mailbox)
    @cython.locals(sessions=ClientSessions, n=Py_ssize_t, bursty=bint, now=double)
    cpdef _drain_dealer(self, object c)

# The DEALER sockets as the session rules see them: every request's send goes through write.
cdef class _Wire:
    cdef public common.Selector poller
    cdef public dict by_socket
    cdef public dict by_monitor
    cdef public object sessions

    cpdef object write(self, object session, object frames)

cdef object _get_ident
