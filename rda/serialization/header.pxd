# Types for the compiled build of header.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every reply and notification read decodes its DATA_CONTEXT body here (Message.context):
# decode_context cpdef, its helpers C globals. The classes (Header, DataContext, the enums)
# stay Python classes.

cimport cython

cdef Py_ssize_t _CONTEXT_SIZE
cdef object _unpack_context
cdef object _new
cdef object _set_name
cdef object _set_cycle_stamp
cdef object _set_acq_stamp
cdef object _set_selector

cpdef tuple decode_context(object frame, str selector=*)
@cython.locals(size=Py_ssize_t)
cpdef tuple decode_context_at(object buffer, Py_ssize_t start, Py_ssize_t end, str selector)
