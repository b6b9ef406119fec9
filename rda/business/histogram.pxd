cimport cython

# Types for the compiled build of histogram.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every get is counted in two or three histograms on each side: their counts are typed slots
# and their adds C calls.

cpdef Py_ssize_t bucket_of(double seconds) except -1

cdef class Histogram:
    cdef public list counts
    cdef public double sum
    cdef public Py_ssize_t count
    cpdef add(self, Py_ssize_t index, double seconds)

cdef class CappedHistograms:
    cdef object _lock
    cdef dict _kinds
    cdef dict _names
    cdef Histogram _other
    cdef public Py_ssize_t limit

    # The histograms it picks are its own: typed, so their add is a C call.
    @cython.locals(index=Py_ssize_t, histogram=Histogram, named=Histogram)
    cpdef add(self, str kind, str name, double seconds)
