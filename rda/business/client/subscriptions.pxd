# Types for the compiled build of subscriptions.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every notification passes Subscription.deliver_message and the queue (_Inbox) on the
# dispatcher, then the queue and _from_message in its consumer: the queue an extension type
# (typed slots, its put/put_many in C), the dispatcher's part of Subscription C-level methods.
# Subscription an extension type too (its state typed slots; what users and the connections
# read or set public). Notification stays a Python class: object.__setattr__ builds it (an
# extension type with its own __setattr__ refuses that) and HistoryChunk extends it.

cimport cython

cdef class _Inbox:
    cdef public Py_ssize_t capacity
    cdef object _counters
    # Read and replaced by tests (the condition a waiting poll sleeps on).
    cdef readonly object _lock
    cdef public object _cond
    cdef readonly Py_ssize_t _waiting
    cdef object _items
    cdef Py_ssize_t _carry
    cdef Py_ssize_t _tail_carry
    cdef object _room
    cdef bint _closed
    cdef public object waker

    @cython.locals(dropped=Py_ssize_t, was_empty=bint)
    cpdef put(self, tuple entry)
    @cython.locals(dropped=Py_ssize_t, was_empty=bint, room=Py_ssize_t)
    cpdef put_many(self, list entries)
    cpdef tuple _carried(self, tuple entry)


cdef class Subscription:
    cdef object __weakref__
    cdef public object id
    cdef public object endpoint
    cdef public object device
    cdef public object property
    cdef public object selector
    cdef public object filters
    cdef public object listener
    cdef object _counters
    cdef object _submit
    cdef object _on_close
    cdef object _group
    # Read by tests (the queue's length and condition).
    cdef readonly _Inbox _inbox
    cdef object _lock
    cdef object _expected
    cdef bint _ended
    cdef bint _closed
    cdef bint _in_outage
    cdef list _batch
    cdef public Py_ssize_t received
    cdef public object connection
    cdef object _backfill

    @cython.locals(gap=object, seq=object, batch=list)
    cpdef deliver_message(self, object message, list staged=*)
    cpdef flush(self)
    cpdef _deliver(self, tuple entry)
    cpdef object _make(self, tuple entry)
    @cython.locals(inbox=_Inbox)
    cpdef _drain_to_listener(self)
    cpdef _call_listener(self, object notification)


@cython.locals(self=object)
cpdef object _from_message(object message, tuple name, object gap, object seq)

cdef object _UNSET
cdef object _FIRST
cdef object _NOTIFICATION_DATA
cdef object _SUBSCRIBE_EXCEPTION
cdef object _new_notification
cdef object _set_message
cdef object _set_name
cdef object _set_data
cdef object _set_context
cdef object _set_error
cdef object _set_update
cdef object _set_gap
cdef object _set_seq
