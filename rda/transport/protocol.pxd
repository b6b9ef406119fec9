# Types for the compiled build of protocol.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# cpdef: C calls inside this module, the same Python functions to every other.

cpdef Py_ssize_t _nbytes(object buf) except -1
cpdef list encode_routed(
    int kind,
    int request_type,
    object rid,
    str device,
    str prop,
    str selector,
    object body=*,
)
cpdef list encode_tail(object body)
cpdef list join_tail(object header, object tail)
cpdef object _incoming(object message)
cpdef object decode_from_server(object frames, Py_ssize_t max_size)
cdef int _SERVER_KINDS
