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


# The shell both transports derive from: an extension type so that the server's transport,
# compiled, is one too (its slots read in C); plain Python classes may still derive from it.
cdef class DispatcherShell:
    cdef public object _side
    cdef public object _settings
    cdef public bint _own_context
    cdef public object _context
    cdef public object _clock
    cdef public object _log
    cdef public object _mailbox
    cdef public Selector _poller
    cdef public object _thread
    cdef public object _thread_id
    cdef public bint _closing
    cdef public bint _closed
    cdef public object _close_lock
    cdef public Py_ssize_t _internal_errors


# Once per message sent, both sides: C calls from the transports that cimport this module,
# the socket's handle passed in when the caller keeps it.
cpdef send_frames(object sock, object frames, bint block=*, Py_ssize_t handle=*)
cpdef send_routed(object sock, object rid, object frames, Py_ssize_t handle=*)
