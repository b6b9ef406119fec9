# Types for the compiled build of common.py (Cython's augmenting .pxd: the .py is the one
# source; without Cython it runs as it is). rda/_compiled_python.py says how it is loaded.
# AcquiredData stays a Python class (a frozen dataclass users build, compare and replace);
# what runs per get reply and per notification, building one, is called in C inside the
# module.

cpdef object stamped(object acquired)
cpdef object stamped_data(object data)
cpdef object new_acquired(object data, object context, object alarm=*)
cpdef object _context(object cycle_name, object cycle_stamp, object acq_stamp, object selector)
