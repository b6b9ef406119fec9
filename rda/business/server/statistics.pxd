# Types for the compiled build of statistics.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# record() runs once per answered request, under the counters' lock.

cimport cython
# The histograms record() adds to are typed and the bucket found in C: a C call each instead
# of a Python call (histogram.pxd).
from rda.business.histogram cimport Histogram, bucket_of

cdef class _Count:
    cdef public Py_ssize_t n

cdef class _Pair:
    cdef public Py_ssize_t requests
    cdef public Py_ssize_t errors
    cdef public Histogram durations

cdef class RequestCounters:
    cdef object _lock
    cdef dict _requests
    cdef dict _durations
    cdef Py_ssize_t _handler_errors
    cdef Py_ssize_t _late
    cdef dict _denied
    cdef set _principals
    cdef Py_ssize_t _device_limit
    cdef dict _pairs
    cdef _Pair _other
    cdef Py_ssize_t _accepted
    cdef Py_ssize_t _closed
    cdef Py_ssize_t _zero_copy
    cdef Py_ssize_t _copied

    @cython.locals(index=Py_ssize_t, pair=_Pair, histogram=Histogram, count=_Count)
    cpdef record(
        self, str request_type, str outcome, object duration, object device=*, str prop=*
    )
