# Types for the compiled build of dispatch.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# on_message runs once per request: Dispatch is an extension type, its parts typed slots.

cdef class Dispatch:
    cdef object _gate
    cdef object _runner
    cdef object _subscriptions
    cdef object _counters
    cdef object _clock
    cdef bint _trust_declared
    cdef dict _peers
    cdef object _peers_lock
    cdef object _start

    cpdef on_message(self, object peer, object message)
