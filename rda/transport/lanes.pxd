# Types for the compiled build of lanes.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every blocking get and set on a lane goes through LanePool.of_thread and Lane.call: extension
# types (Lane is the base of zmq_lane.ZmqLane, compiled too, and of the in-memory transport's
# lane, a Python subclass); the I/O methods stay def (the subclasses supply them).

from rda.transport.client_session cimport LaneSession

cdef class Lane:
    cdef object __weakref__
    cdef object _lock
    cdef bint _orphaned
    cdef public object connection
    cdef public LaneSession session
    cdef public object thread

    cpdef object call(self, object frames, object request_id, object ended, double now)
    cpdef bint close(self, double timeout) except -1

cdef class LanePool:
    cdef object _open_lane
    cdef Py_ssize_t _limit
    cdef object _local
    cdef object _lock
    cdef list _all
    cdef bint _closed
    cdef list _retired

    cpdef object of_thread(self, str address, object connection, double refresh_after)
