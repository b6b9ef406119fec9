# Types for the compiled build of service.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every request passes through ClientService (call, request, _send_request) and every reply
# through _Inbound: extension types, their parts typed slots, the per-request steps cpdef.
# The request table, the pending entry and the request's encoder are cimported: called
# through their C entry points, no Python call per request.

cimport cython
from rda.business.client.replies cimport Pending, op_name
from rda.business.client.requests cimport RequestTable
from rda.serialization.message cimport Message
from rda.transport.protocol cimport encode_routed

cdef class _Inbound:
    cdef object _awaits
    cdef object _connections
    cdef RequestTable _requests
    cdef object _route

cdef class ClientService:
    cdef readonly object config
    cdef double _request_timeout
    cdef public object directory
    cdef object _clock
    cdef bint _closing
    cdef object _close_lock
    cdef object _counters
    cdef RequestTable _requests
    cdef object _abandon
    cdef object _transport
    # Read by tests (the reconnection and subscription suites).
    cdef readonly object _subscriptions
    cdef readonly object _connections
    cdef object _resolved
    cdef object _lanes

    cpdef object call(self, object op, str endpoint, str device, str prop, str selector, list body, object timeout, object convert)
    cpdef object request(self, object op, str endpoint, str device, str prop, str selector, list body, object timeout, object convert)
    @cython.locals(requests=RequestTable)
    cpdef _send_request(self, object fut, object op, str endpoint, str device, str prop, str selector, list body, object timeout)
    cpdef object endpoint_of(self, object device)
    cpdef bytes request_context(self, object timeout, object filters)

cdef object _REQUEST
cdef object _ADMIN
