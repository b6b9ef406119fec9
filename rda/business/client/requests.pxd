# Types for the compiled build of requests.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# The request table is entered and left once per request: an extension type with typed
# counters, the per-request steps cpdef. Its parts (the timer, the round-trip histograms, the
# entries and their completion) are cimported: called through their C entry points, no Python
# call per request.

cimport cython
from rda.business.client.replies cimport Pending, complete
from rda.business.client.timer cimport Timer
from rda.business.histogram cimport CappedHistograms
from rda.serialization.message cimport Message

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
    cdef CappedHistograms _round_trips
    cdef public Timer timer

    cpdef object add(self, Pending pending)
    cpdef object add_lane(self, object pending)
    @cython.locals(p=Pending, elapsed=double, late=bint)
    cpdef object reply(self, Message message)
    @cython.locals(p=Pending)
    cpdef object lane_reply(self, object rid, Message message, object done)

cdef object _EXCEPTION
