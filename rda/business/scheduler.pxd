# Types for the compiled build of scheduler.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# A server runs every get and set through run_inline (or submit): the scheduler, its groups
# and the inline rule are extension types, their per-request steps C calls.

cimport cython

cdef class _Group:
    cdef public str key
    cdef public object tasks
    cdef public bint running

cdef class GroupTaskScheduler:
    cdef public str name
    cdef public Py_ssize_t queue_limit
    cdef public object policy
    cdef object _lock
    cdef list _sleepers
    cdef readonly dict _groups  # readonly: tests look at what is left
    cdef readonly object _ready
    cdef bint _closed
    cdef Py_ssize_t _queued
    cdef Py_ssize_t _running
    cdef Py_ssize_t _executed
    cdef Py_ssize_t _failed
    cdef Py_ssize_t _rejected
    cdef Py_ssize_t _dropped_oldest
    cdef Py_ssize_t _dropped_newest
    cdef Py_ssize_t _max_depth
    cdef Py_ssize_t _places
    cdef object _driver
    cdef readonly list _threads

    @cython.locals(entry=_Group)
    cpdef bint submit(self, str group, object task, object on_drop=*) except -1
    @cython.locals(entry=_Group, ok=bint)
    cpdef bint run_inline(self, str group, object task) except -1
    cpdef _finish(self, _Group group, bint ok)

cdef class InlineRule:
    cdef tuple _blocking
    cdef dict _cache
    cdef tuple _patterns
    cdef public bint everything

    cpdef bint allows(self, str device, str prop) except -1
    @cython.locals(rule=InlineRule)
    cpdef InlineRule declared_only(self)
