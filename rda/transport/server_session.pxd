# Types for the compiled build of server_session.py (Cython's augmenting .pxd: the .py is the
# one source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# PeerTable becomes an extension type: its attributes are slots read in C, and the per-message
# methods are cpdef (C calls between them, the same Python methods to everyone else).

cdef class PeerTable:
    cdef object _handler
    cdef object _settings
    cdef object _ack
    cdef object _wire
    cdef object _clock
    cdef object _log
    cdef dict _gone
    cdef public object peer_log
    cdef public dict peers
    cdef public dict blocked
    cdef public double next_check
    cdef public Py_ssize_t messages_in
    cdef public Py_ssize_t messages_out
    cdef public Py_ssize_t bytes_in
    cdef public Py_ssize_t bytes_out
    cdef public Py_ssize_t heartbeat_timeouts
    cdef public Py_ssize_t decode_errors
    cdef public Py_ssize_t protocol_errors
    cdef public Py_ssize_t queue_depth
    cdef public Py_ssize_t conflated
    cdef public Py_ssize_t dropped
    cdef public Py_ssize_t handler_errors
    cdef public Py_ssize_t lanes

    cpdef object received(
        self, object rid, object io, object frames, double now, int fd=*, object principal=*
    )
    cpdef object deliver(self, object rid, object message)
    cpdef object send(self, object rid, object frames, object key)
    cpdef object _send(self, object p, object frames, object key)
    @cython.locals(n=Py_ssize_t)
    cpdef bint _write(self, object p, object frames) except -1
    cpdef object _enqueue(self, object p, object frames, object key)
