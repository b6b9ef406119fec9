# Types for the compiled build of access.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Every get, set and their futures start here: AccessPoint an extension type (its device and
# property readable as before), the request's first steps cpdef.

cdef class AccessPoint:
    cdef object _service
    cdef public str device
    cdef public str property

    cpdef object _request(self, object op, list body, object selector, object filters, object timeout, object convert)
    cpdef object _call(self, object op, list body, object selector, object filters, object timeout, object convert)

cdef dict _CONTEXTS
cpdef bytes build_request_context(object timeout_ms, object filters)
cpdef object to_data(object value, str what)
cdef object _GET
cdef object _SET
cdef object _REQUEST_CONTEXT
