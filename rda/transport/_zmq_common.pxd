# Types for the compiled build of _zmq_common.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# Selector.poll runs once per dispatcher wake-up (a def: it holds a generator), settle and
# touch once per message: an extension type with its tables as typed slots.

cdef class Selector:
    cdef dict _flags
    cdef dict _by_fd
    cdef dict _fd
    cdef set _dirty
    cdef object _poll
    cdef object _mailbox
    cdef bint _mailbox_on

    cpdef touch(self, object sock)
    cpdef settle(self, object sock)
    cpdef list _ready(self, object socks)
