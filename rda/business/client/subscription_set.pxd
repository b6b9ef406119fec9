# Types for the compiled build of subscription_set.py (Cython's augmenting .pxd: the .py is the
# one source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every notification a client receives is routed here on the dispatcher (route): the set an
# extension type, its table a typed slot. The routed subscription is not typed: a test puts a
# stand-in in the table.

cdef class Subscriptions:
    cdef object _transport
    cdef object _requests
    cdef object _counters
    cdef object _detach
    cdef object _retry
    cdef object _workers
    cdef object _queue_limit
    cdef object _lock
    # Read by a test (a stand-in put in a subscription's place).
    cdef readonly dict _subs
    cdef object _scheduler
    cdef bint _closed

    cpdef route(self, object message, list staged, object connection)

cdef object _SUBSCRIBE_EXCEPTION
