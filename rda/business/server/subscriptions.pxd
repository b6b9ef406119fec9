# Types for the compiled build of subscriptions.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every notification runs SubscriptionSource.notify and its fan-out over the subscriber table:
# the source and each subscriber extension types (typed slots, not instance dicts), the
# fan-out's per-subscriber loop in C. The registry, the callbacks and UnsubscribeRequest (a
# frozen dataclass) stay Python classes: they run when subscriptions come and go.

cimport cython
from rda.transport.protocol cimport encode_tail

cdef class _Subscriber:
    cdef public object peer
    cdef public object id
    cdef public object client
    cdef public object seq
    cdef public bint active
    cdef public Py_ssize_t missed
    cdef public dict headers


cdef class SubscriptionSource:
    cdef object __weakref__
    cdef public object device
    cdef public object property
    cdef public object selector
    cdef public object filters
    cdef public object key
    cdef object _transport
    cdef object _lock
    cdef object _send_lock
    cdef dict _subscribers
    cdef bint _closed
    cdef public object notifications_sent
    cdef public object errors_sent
    cdef public object last_update
    cdef public object alarm

    @cython.locals(sub=_Subscriber, sent=Py_ssize_t, groups=dict, group=list)
    cpdef _fan_out(
        self, object rtype, object update_type, list bodies, object context, object acq_stamp
    )
    cpdef bytes _header(self, _Subscriber sub, object rtype, object update_type)
    cpdef _count(self, object rtype, Py_ssize_t sent)
    cpdef _publish(self, object targets, object tail, bint conflate)


cpdef list _tail(list bodies, bytes context)

cdef object _DATA_CONTEXT
cdef object _REPLY_CONTEXT
cdef object _NOTIFICATION_DATA
cdef object _NOTIFICATION_EXC
cdef object _NORMAL
cdef object _NO_CONTEXT
