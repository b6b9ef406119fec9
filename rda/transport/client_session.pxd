# Types for the compiled build of client_session.py (Cython's augmenting .pxd: the .py is the
# one source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# LaneSession, the rules of a blocking call's lane, is consulted three times per call: an
# extension type with typed counters and cpdef steps.

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
