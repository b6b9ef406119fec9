# Types for the compiled build of message.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every reply, request and notification is a Message, and every get reads its data and
# context: an extension type whose decoded-on-first-read values are C slots (no descriptor
# call, no instance __dict__). The slots the compiled frame parser (transport/_cframe.pyx)
# fills by name are public.

cimport cython

cdef class Message:
    cdef public object header
    cdef public object _body
    cdef public object _frame
    cdef public tuple _spans
    cdef public object _seq
    cdef object _data
    cdef object _request_context
    cdef object _context_seq
    cdef object _alarm
    cdef object _exception

    @cython.locals(i=Py_ssize_t, spans=tuple)
    cpdef object frame(self, object kind)
    cpdef object peek_seq(self)
    @cython.locals(i=Py_ssize_t, spans=tuple, found=list)
    cpdef list arrays(self)
    @cython.locals(i=Py_ssize_t, spans=tuple)
    cpdef tuple _context_and_seq(self)

cdef object _DATA
cdef object _DATA_CONTEXT
cdef object _REQUEST_CONTEXT
cdef object _REPLY_CONTEXT
cdef object _EXCEPTION
cdef object _ARRAY
cdef tuple _NO_ALARM
