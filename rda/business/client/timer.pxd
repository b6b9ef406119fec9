# Types for the compiled build of timer.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every request sent on a shared connection puts its deadline on the heap (Timer.deadline):
# an extension type, its state typed slots, deadline cpdef. TimerHandle (reconnection
# attempts only) stays a Python class.

cdef class Timer:
    cdef object __weakref__
    cdef object _clock
    cdef object _expire
    cdef object _live
    cdef Py_ssize_t _prune_at
    cdef object _max_wait
    cdef object _lock
    cdef object _cond
    # Read by tests (its size after pruning).
    cdef readonly list _heap
    cdef object _order
    cdef Py_ssize_t _cancelled
    cdef bint _closed
    cdef public str name
    cdef object _driver
    cdef object _thread
    cdef object _unhook

    cpdef deadline(self, double at, object key)
    cpdef _prune(self)
    cpdef bint _dead(self, object item) except -1

cdef Py_ssize_t _PRUNE_MIN
cdef object _heappush
