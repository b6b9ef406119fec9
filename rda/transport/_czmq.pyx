# cython: language_level=3, boundscheck=False, wraparound=False
"""Receives and sends that keep the GIL when they cannot wait, and release it when they do:
libzmq called directly, for the dispatchers and the lanes.

pyzmq releases the GIL around every call into libzmq, because a call may block. A dispatcher's
receive never blocks (``ZMQ_DONTWAIT``: a message is there or ``EAGAIN`` at once), so the
release buys nothing, and it costs a GIL hand-over per message: when another thread of the
process wants the GIL (a consumer woken by the previous message, a worker), the dispatcher
gives it up inside the receive and waits to get it back, up to the switch interval. That
convoy, not libzmq, was half of the client dispatcher's time per notification (py-spy:
``recv_frames``' receive line). The critical path's rule: do not hand the CPU over on
every message. A lane's receive does wait (``recv(..., block=True)``, up to the socket's
``RCVTIMEO``): only that wait runs without the GIL, and the message comes back as ``bytes``
without pyzmq's ``Frame`` objects around it.

libzmq is the library pyzmq loaded (``bind``: the module of pyzmq's backend, opened again with
``dlopen(RTLD_NOLOAD)``, never a new copy, and each function looked up with ``dlsym`` in it and
the libraries it was linked with: pyzmq's bundled ``libzmq``, a system one, or the backend
itself for a static build), so the sockets and the library are the same. A frame below
``copy_below`` bytes becomes ``bytes`` (one copy, the message closed at once); a larger one
becomes a :class:`ReceivedFrame` that owns the libzmq message and exposes it through the
buffer protocol (zero-copy, closed when the last view goes). Errors other than ``EAGAIN``
are not interpreted here: ``recv`` returns the errno and the caller lets pyzmq raise its own
exception for it.
"""

from cpython.buffer cimport (
    PyBUF_SIMPLE,
    PyBuffer_FillInfo,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport EAGAIN, EINTR
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    int dlclose(void* handle)
    int RTLD_NOW
    int RTLD_NOLOAD


cdef extern from *:
    """
    /* libzmq's zmq_msg_t (zmq.h): 64 opaque bytes, pointer-aligned. */
    typedef struct { unsigned char _[64]; } __attribute__((aligned(sizeof(void*)))) rda_zmq_msg_t;
    """
    ctypedef struct rda_zmq_msg_t:
        pass

ctypedef int (*f_msg_init)(rda_zmq_msg_t*) noexcept nogil
ctypedef int (*f_msg_recv)(rda_zmq_msg_t*, void*, int) noexcept nogil
ctypedef void* (*f_msg_data)(rda_zmq_msg_t*) noexcept nogil
ctypedef size_t (*f_msg_size)(const rda_zmq_msg_t*) noexcept nogil
ctypedef int (*f_msg_more)(const rda_zmq_msg_t*) noexcept nogil
ctypedef int (*f_msg_close)(rda_zmq_msg_t*) noexcept nogil
ctypedef int (*f_errno)() noexcept nogil
ctypedef int (*f_msg_move)(rda_zmq_msg_t*, rda_zmq_msg_t*) noexcept nogil
ctypedef int (*f_send)(void*, const void*, size_t, int) noexcept nogil
ctypedef int (*f_msg_get)(const rda_zmq_msg_t*, int) noexcept nogil
ctypedef const char* (*f_msg_gets)(const rda_zmq_msg_t*, const char*) noexcept nogil

cdef f_msg_init _msg_init = NULL
cdef f_msg_recv _msg_recv = NULL
cdef f_msg_data _msg_data = NULL
cdef f_msg_size _msg_size = NULL
cdef f_msg_more _msg_more = NULL
cdef f_msg_close _msg_close = NULL
cdef f_msg_move _msg_move = NULL
cdef f_errno _errno = NULL
cdef f_send _send = NULL
cdef f_msg_get _msg_get = NULL
cdef f_msg_gets _msg_gets = NULL

DEF DONTWAIT = 1  # ZMQ_DONTWAIT
DEF SNDMORE = 2  # ZMQ_SNDMORE
DEF SRCFD = 2  # ZMQ_SRCFD, a zmq_msg_get property


_NAMES = (
    b"zmq_msg_init", b"zmq_msg_recv", b"zmq_msg_data", b"zmq_msg_size", b"zmq_msg_more",
    b"zmq_msg_close", b"zmq_msg_move", b"zmq_errno", b"zmq_send", b"zmq_msg_get",
    b"zmq_msg_gets",
)


def bind(str loaded_module):
    """Take libzmq's functions from ``loaded_module``, a file already loaded in this process
    (pyzmq's backend extension), and the libraries it was linked with. True when every
    function was found (then the calls below may be used), False otherwise."""
    global _msg_init, _msg_recv, _msg_data, _msg_size, _msg_more, _msg_close, _msg_move, _errno
    global _send, _msg_get, _msg_gets
    path = loaded_module.encode()
    cdef void* handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD)
    if handle == NULL:
        return False
    cdef void* found[11]
    cdef int i
    for i in range(11):
        found[i] = dlsym(handle, <const char*>_NAMES[i])
        if found[i] == NULL:
            dlclose(handle)
            return False
    # The handle is kept open: pyzmq's backend stays loaded for the life of the process anyway.
    _msg_init = <f_msg_init>found[0]
    _msg_recv = <f_msg_recv>found[1]
    _msg_data = <f_msg_data>found[2]
    _msg_size = <f_msg_size>found[3]
    _msg_more = <f_msg_more>found[4]
    _msg_close = <f_msg_close>found[5]
    _msg_move = <f_msg_move>found[6]
    _errno = <f_errno>found[7]
    _send = <f_send>found[8]
    _msg_get = <f_msg_get>found[9]
    _msg_gets = <f_msg_gets>found[10]
    return True


cdef class ReceivedFrame:
    """A received libzmq message kept without a copy: a read-only buffer, closed on release."""

    cdef rda_zmq_msg_t msg
    cdef bint open

    def __dealloc__(self):
        if self.open:
            _msg_close(&self.msg)

    def __len__(self):
        return _msg_size(&self.msg)

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, _msg_data(&self.msg), _msg_size(&self.msg), 1, flags)


cdef object _frame(rda_zmq_msg_t* msg, Py_ssize_t copy_below):
    """The frame of ``msg`` as bytes (``msg`` closed) or as a ReceivedFrame (``msg`` moved)."""
    cdef size_t size = _msg_size(msg)
    cdef ReceivedFrame kept
    if <Py_ssize_t>size < copy_below:
        out = PyBytes_FromStringAndSize(<const char*>_msg_data(msg), size)
        _msg_close(msg)
        return out
    kept = ReceivedFrame.__new__(ReceivedFrame)
    _msg_init(&kept.msg)
    _msg_move(&kept.msg, msg)
    _msg_close(msg)
    kept.open = True
    return memoryview(kept)


cdef inline double _monotonic() noexcept nogil:
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)
    return now.tv_sec + now.tv_nsec * 1e-9


cdef int _spin_recv(rda_zmq_msg_t* msg, void* sock, double spin) noexcept nogil:
    """Receive without waiting, again and again, for up to ``spin`` seconds: libzmq's result
    (-1 with errno ``EAGAIN`` when nothing came). Each try lets the socket read its command
    mailbox (a non-blocking receive processes the pipe's activation), so a reply is taken
    as soon as libzmq's I/O thread hands it over, without this thread going to sleep and
    being woken."""
    cdef double end = _monotonic() + spin
    cdef int rc
    while True:
        rc = _msg_recv(msg, sock, DONTWAIT)
        if rc >= 0 or _errno() != EAGAIN or _monotonic() >= end:
            return rc


def recv(size_t handle, Py_ssize_t copy_below, bint block=False, double spin=0.0):
    """One whole message from the socket at ``handle`` (``zmq.Socket.underlying``): a list of
    frames (``bytes`` below ``copy_below``, otherwise a read-only ``memoryview`` over the
    libzmq message); ``None`` when no message is waiting; an ``int`` (libzmq's errno) on any
    other failure. Without ``block`` it neither waits nor releases the GIL; with ``block`` it
    waits for the first frame up to the socket's ``RCVTIMEO`` with the GIL released (``None``
    when that passes, or when a signal interrupted the wait and its handler did not raise),
    after polling for it without sleeping for up to ``spin`` seconds (GIL released too)."""
    cdef rda_zmq_msg_t msg
    cdef void* sock = <void*>handle
    cdef int more, rc, err
    _msg_init(&msg)
    if block:
        with nogil:
            rc = -1
            err = EAGAIN
            if spin > 0.0:
                rc = _spin_recv(&msg, sock, spin)
                err = _errno() if rc < 0 else 0
            if rc < 0 and err == EAGAIN:
                rc = _msg_recv(&msg, sock, 0)
                err = _errno() if rc < 0 else 0
    else:
        rc = _msg_recv(&msg, sock, DONTWAIT)
        err = _errno() if rc < 0 else 0
    if rc < 0:
        _msg_close(&msg)
        if err == EINTR:
            PyErr_CheckSignals()  # a KeyboardInterrupt from the handler is raised here
            return None
        return None if err == EAGAIN else err
    more = _msg_more(&msg)
    frames = [_frame(&msg, copy_below)]
    while more:
        _msg_init(&msg)
        if _msg_recv(&msg, sock, DONTWAIT) < 0:  # the rest of a message arrives with it
            err = _errno()
            _msg_close(&msg)
            return err
        more = _msg_more(&msg)
        frames.append(_frame(&msg, copy_below))
    return frames


def recv_routed(size_t handle, Py_ssize_t copy_below, int handshake_kind):
    """``recv`` for a ROUTER, whose frame 1 starts with the message's kind byte. For a message
    whose kind is ``handshake_kind`` (a CONNECT) it returns ``(frames, srcfd, user_id)``: the
    libzmq message properties the server keeps for a new peer, read before the message is
    closed (``srcfd`` -1 when libzmq has none, ``user_id`` the ZAP User-Id or None)."""
    cdef rda_zmq_msg_t msg
    cdef void* sock = <void*>handle
    cdef int more, index = 0, fd = -1
    cdef const char* user = NULL
    cdef bint handshake = False
    user_id = None
    _msg_init(&msg)
    if _msg_recv(&msg, sock, DONTWAIT) < 0:
        err = _errno()
        _msg_close(&msg)
        return None if err == EAGAIN else err
    frames = []
    while True:
        more = _msg_more(&msg)
        if index == 1 and _msg_size(&msg) > 0 and (<const unsigned char*>_msg_data(&msg))[0] == handshake_kind:
            handshake = True
            fd = _msg_get(&msg, SRCFD)
            user = _msg_gets(&msg, b"User-Id")
            if user != NULL:
                user_id = user.decode("utf-8", "replace")
        frames.append(_frame(&msg, copy_below))
        if not more:
            break
        index += 1
        _msg_init(&msg)
        if _msg_recv(&msg, sock, DONTWAIT) < 0:  # the rest of a message arrives with it
            err = _errno()
            _msg_close(&msg)
            return err
    if handshake:
        return frames, fd, user_id
    return frames


cdef Py_ssize_t _small_size(object frame, Py_ssize_t copy_below):
    """The byte size of ``frame`` when it is a simple buffer below ``copy_below``, else -1."""
    cdef Py_buffer buf
    if type(frame) is bytes:
        n = len(<bytes>frame)
        return n if n < copy_below else -1
    try:
        PyObject_GetBuffer(frame, &buf, PyBUF_SIMPLE)
    except (BufferError, TypeError):
        return -1
    cdef Py_ssize_t size = buf.len
    PyBuffer_Release(&buf)
    return size if size < copy_below else -1


cdef int _send_one(void* sock, object frame, int flags):
    """zmq_send of one frame (libzmq copies it); 0, or libzmq's errno."""
    cdef Py_buffer buf
    cdef int rc
    if type(frame) is bytes:  # most frames: no buffer to take and release
        rc = _send(sock, PyBytes_AS_STRING(frame), PyBytes_GET_SIZE(frame), flags)
        return 0 if rc >= 0 else _errno()
    PyObject_GetBuffer(frame, &buf, PyBUF_SIMPLE)
    rc = _send(sock, buf.buf, buf.len, flags)
    PyBuffer_Release(&buf)
    return 0 if rc >= 0 else _errno()


def send(size_t handle, object first, object frames, Py_ssize_t copy_below):
    """Send ``[first, *frames]`` (``first`` may be None: then ``frames`` alone) without
    waiting and without releasing the GIL; every frame is copied into libzmq's message, so
    only frames below ``copy_below`` bytes go this way. Returns 0 when sent, -1 when a frame
    is too big or not a simple buffer (nothing sent: pyzmq sends it, zero-copy), or libzmq's
    errno (``EAGAIN``: the pipe is full, nothing sent; a multipart message is all or nothing
    once its first part is accepted)."""
    cdef void* sock = <void*>handle
    cdef Py_ssize_t i, n = len(frames)
    cdef int rc
    if first is not None and _small_size(first, copy_below) < 0:
        return -1
    for i in range(n):
        if _small_size(frames[i], copy_below) < 0:
            return -1
    if first is not None:
        rc = _send_one(sock, first, DONTWAIT | (SNDMORE if n else 0))
        if rc:
            return rc
    for i in range(n):
        rc = _send_one(sock, frames[i], DONTWAIT | (SNDMORE if i < n - 1 else 0))
        if rc:
            return rc
    return 0
