# Types for the compiled build of runner.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.

cimport cython
from rda.business.scheduler cimport GroupTaskScheduler, InlineRule
from rda.business.server.statistics cimport RequestCounters
# The request objects' slots read and written in C, settle and completed_with called in C
# (requests.pxd; client_timeout stays a module global: tests replace it).
from rda.business.server.requests cimport ServerRequest, completed_with

cdef class RequestRunner:
    cdef GroupTaskScheduler _scheduler
    cdef object _deadlines
    cdef RequestCounters _counters
    cdef object _rr
    cdef object _subs
    cdef object _admin
    cdef object _clock
    cdef double _default_timeout
    cdef object _accepted
    cdef object _updated
    cdef object _properties
    cdef object _described
    cdef public InlineRule inline
    cdef object _log
    cdef object _transport
    cdef public bint stopping
    cdef object _respond
    cdef object _late
    cdef object _run_task

    @cython.locals(inline=InlineRule)
    cpdef start(self, object message, object client, double received_at)
    @cython.locals(deadline=double)
    cpdef run(self, ServerRequest request)
    cpdef run_answered(self, ServerRequest request)
    cpdef _send_held(self, ServerRequest request)
    cpdef _arm(self, ServerRequest request, double deadline, double timeout)
    @cython.locals(now=double, took=double)
    cpdef respond(self, ServerRequest request, object result, object error)
    cpdef _send(self, object peer, object frames)


cdef class _ResponderProbe:
    cpdef respond(self, ServerRequest request, object result, object error)
