# Types for the compiled build of requests.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every get, set and subscribe is one of these request objects, made on the dispatcher and
# read by its handler: extension types whose fields are C slots and whose accessors, settle
# and complete run without a Python frame. The zero-copy hand-over measures what their calls
# hide (replies.references_a_completion_hides), never assumes it.

# The message typed: its REQUEST_CONTEXT frame found by a C call (message.pxd).
from rda.serialization.message cimport Message

cdef class ServerRequest:
    cdef object _argument
    cdef object _filters
    cdef object _on_answer
    cdef object _on_late
    cdef object _responder
    cdef public object client
    cdef public double deadline
    cdef public object handler_caller
    cdef public object held_reply
    cdef public object message
    cdef public double received_at

    cpdef bint settle(self, object result, object error) except -1

cdef class _Completable(ServerRequest):
    pass

cdef class GetRequest(_Completable):
    pass

cdef class SetRequest(_Completable):
    pass

cdef class SubscriptionRequest(ServerRequest):
    pass

cpdef object client_timeout(Message message)

cdef object _ANSWER_LOCK
cdef object _UNSET
cdef dict _TIMEOUTS
cdef object _REQUEST_CONTEXT
cpdef object completed_with(ServerRequest request)
