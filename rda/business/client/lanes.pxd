# Types for the compiled build of lanes.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# LaneCaller.call is every blocking get's and set's way: an extension type, so that its own
# attributes are C reads (call stays a def: it makes a closure).

cdef class LaneCaller:
    cdef object _requests
    cdef object _endpoint_at
    cdef object _clock
    cdef object _lane_of
    cdef public object wake_later
    cdef public bint enabled

cdef object _REQUEST
