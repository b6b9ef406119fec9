# Types for the compiled build of zmq_lane.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# A blocking get's send and wait on its own DEALER: an extension type over lanes.Lane.

from rda.transport cimport _zmq_common as common
from rda.transport.lanes cimport Lane

cdef class ZmqLane(Lane):
    cdef object _sock
    cdef double _spin
    cdef Py_ssize_t _handle
