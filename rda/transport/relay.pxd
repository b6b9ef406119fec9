# Types for the compiled build of relay.py (Cython's augmenting .pxd: the .py is the one source;
# without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# begin and end run once per request on the leading dispatcher: an extension type whose
# counters are C slots.

cdef class Relay:
    cdef object _lead
    cdef object _name
    cdef double _tick
    cdef public object lock
    cdef public object leader
    cdef public Py_ssize_t busy
    cdef Py_ssize_t _entries
    cdef readonly bint _parked
    cdef object _wake
    cdef Py_ssize_t _standbys
    cdef Py_ssize_t _spawned
    cdef dict _threads
    cdef set _lent
    cdef public Py_ssize_t handovers
    cdef public object finished

    cpdef begin(self)
    cpdef bint end(self) except -1
