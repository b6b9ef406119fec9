# Types for the compiled build of future.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# ReplyFuture must stay a subclass of concurrent.futures.Future (asyncio.wrap_future and
# isinstance checks want one), a Python class: it cannot be an extension type. Compiled, its
# methods run as C; the module's constants are C globals.

cdef str _PENDING
cdef str _RUNNING
cdef str _CANCELLED
cdef str _NOTIFIED
cdef str _FINISHED
cdef object _log
cdef object _new_lock
