# Types for the compiled build of client_session.py (Cython's augmenting .pxd: the .py is the
# one source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# LaneSession, the rules of a blocking call's lane, is consulted three times per call: an
# extension type with typed counters and cpdef steps.

cimport cython
from rda.transport.protocol cimport decode_from_server

cdef class LaneSession:
    cdef public str address
    cdef public object hello
    cdef public double refresh_after
    cdef public Py_ssize_t max_size
    cdef public double last_used
    cdef public Py_ssize_t messages_in
    cdef public Py_ssize_t messages_out
    cdef public Py_ssize_t bytes_in
    cdef public Py_ssize_t bytes_out
    cdef public Py_ssize_t decode_errors
    cdef public Py_ssize_t stale

    cpdef bint needs_hello(self, double now) except -1
    cpdef sent(self, object frames, double now, bint with_hello)
    cpdef object received(self, object frames, object request_id, object log)

# ClientSessions, the rules a client transport's dispatcher runs for every message it sends
# and receives: an extension type with typed counters and slots, cpdef for its steps (the
# I/O layers and tests call them from Python too).

cdef class ClientSessions:
    cdef object _handler
    cdef object _on_messages
    cdef object _awaits
    cdef object _settings
    cdef Py_ssize_t _max_size
    cdef object _hello
    cdef object _wire
    cdef object _clock
    cdef object _log
    cdef object _peer_log
    cdef readonly dict sessions
    cdef list _held
    cdef object _held_session
    cdef public double next_timer
    cdef Py_ssize_t _backlog_total
    cdef bint _intake_paused
    cdef public Py_ssize_t messages_in
    cdef public Py_ssize_t messages_out
    cdef public Py_ssize_t bytes_in
    cdef public Py_ssize_t bytes_out
    cdef public Py_ssize_t connected
    cdef public Py_ssize_t heartbeat_timeouts
    cdef public Py_ssize_t decode_errors
    cdef public Py_ssize_t disconnects
    cdef public Py_ssize_t queued
    cdef public Py_ssize_t expired_unsent
    cdef public Py_ssize_t handler_errors

    cpdef send(self, object conn, object frames)
    cpdef writable(self, object session)
    cpdef flush(self, object session)
    cpdef bint _expired(self, object frames) except -1
    @cython.locals(size=Py_ssize_t)
    cpdef bint _write(self, object session, object frames) except -1
    cpdef _push_backlog(self, object session, object frames)
    cpdef _resume_intake(self)
    @cython.locals(size=Py_ssize_t)
    cpdef object received(self, object session, object frames, double now)
    cpdef deliver(self, object session, object message)
    cpdef hold(self, object session, object message)
    cpdef end_batch(self)
    cpdef double check_timers(self, double now) except? -1.0
    cpdef drop(self, object session, object reason, object event=*)

cdef object _CONNECTING
cdef object _CONNECTED
cdef object _REQUEST
