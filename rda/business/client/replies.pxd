# Types for the compiled build of replies.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every request makes a Pending and a completion, and every get's reply is converted here:
# extension types with typed slots, the per-request steps cpdef. (ReplyFuture, future.py,
# derives from concurrent.futures.Future, a Python class: it cannot be one.) A get's reply
# is a Message and its result built by common.new_acquired: both cimported, called in C.

from rda.business.common cimport new_acquired
from rda.serialization.message cimport Message

cdef class ReplyWaiter:
    cdef object _convert
    cdef object _outcome
    cdef object _wake
    cdef object _wakeup

    cpdef set_result(self, object message)
    cpdef set_exception(self, object error)
    cpdef _complete(self, object outcome)

cdef class LaneCompletion:
    cdef public object outcome

    cpdef set_result(self, object message)
    cpdef set_exception(self, object error)
    cpdef bint ended(self) except -1

cdef class Pending:
    cdef public object future
    cdef public double sent_at
    cdef public object connection
    cdef public str op
    cdef public str device
    cdef public str property
    cdef public double timeout

cpdef complete(object future, object outcome)
cpdef str op_name(object op)
cpdef object get_result(Message message)

cdef object _EXCEPTION
cdef object _REPLY_CONTEXT
