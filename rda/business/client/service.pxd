# Types for the compiled build of service.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every request passes through ClientService (call, request, _send_request) and every reply
# through _Inbound: extension types, their parts typed slots, the per-request steps cpdef.

cdef class _Inbound:
    cdef object _awaits
    cdef object _connections
    cdef object _reply
    cdef object _route

cdef class ClientService:
    cdef readonly object config
    cdef double _request_timeout
    cdef public object directory
    cdef object _clock
    cdef bint _closing
    cdef object _close_lock
    cdef object _counters
    cdef object _requests
    cdef object _transport
    # Read by tests (the reconnection and subscription suites).
    cdef readonly object _subscriptions
    cdef readonly object _connections
    cdef object _resolved
    cdef object _lanes

    cpdef object call(self, object op, str endpoint, str device, str prop, str selector, list body, object timeout, object convert)
    cpdef object request(self, object op, str endpoint, str device, str prop, str selector, list body, object timeout, object convert)
    cpdef _send_request(self, object fut, object op, str endpoint, str device, str prop, str selector, list body, object timeout)
    cpdef object endpoint_of(self, object device)
    cpdef bytes request_context(self, object timeout, object filters)

cdef object _REQUEST
cdef object _ADMIN
