# Types for the compiled build of requests.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# The request table is entered and left once per request: an extension type with typed
# counters, the per-request steps cpdef.

cdef class RequestTable:
    cdef object _clock
    cdef object _lock
    cdef object _ids
    cdef object _made
    cdef public object new_id
    cdef public object count_request
    cdef dict _shared
    cdef dict _lane
    cdef public bint closed
    cdef public object shared_waiting
    cdef Py_ssize_t _replies
    cdef Py_ssize_t _errors
    cdef Py_ssize_t _late
    cdef Py_ssize_t _timeouts
    cdef Py_ssize_t _disconnected
    cdef object _round_trips
    cdef public object timer

    cpdef object add(self, object pending)
    cpdef object add_lane(self, object pending)
    cpdef object reply(self, object message)
    cpdef object lane_reply(self, object rid, object message, object done)

cdef object _EXCEPTION
