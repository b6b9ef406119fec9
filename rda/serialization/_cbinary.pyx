# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""The binary Data codec compiled with Cython: the same wire format and the same errors as the
pure-Python codec (``rda.serialization._binary_encoder`` and ``_binary_decoder``, the layout
in ``_binary_format``; docs/serialization.md, "Binary format").

``_binary`` imports this module when it was built (and ``RDA_PURE_PYTHON`` is not set) and
rebinds its ``encode``/``decode`` to these. The decoder mirrors the Python one check for check,
in the same order, so that any input gives the same Data or a ``DecodeError`` in both (the
fuzz tests compare them). Every length read from the input is checked against the bytes left
before it is used: pointer arithmetic past the buffer would be a crash here, not an exception.

Why Cython and the numpy C API: the pure decoder spends its time in interpreter glue between
a dozen C calls per entry; here the glue is C, and a numeric array is a numpy view made with
``PyArray_NewFromDescr`` over the input buffer (what ``np.frombuffer`` does, minus its
argument parsing), read-only, its base the input object, so decoding stays zero-copy.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_Size
from cpython.exc cimport PyErr_Occurred
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLong, PyLong_AsLongLong, PyLong_FromLongLong
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy

cimport numpy as cnp

import math
import types

import numpy as np

from rda.serialization.data import Data, DataType
from rda.serialization.errors import DecodeError

cnp.import_array()

cdef extern from "Python.h":
    int Py_EnterRecursiveCall(const char* where) except -1
    void Py_LeaveRecursiveCall()
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    double PyFloat_AsDouble(object o) except? -1.0
    object PyFloat_FromDouble(double v)
    object PyBool_FromLong(long v)
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object s)
    # The same three on a borrowed pointer (the string cache's slots).
    void* PyUnicode_DATA_P "PyUnicode_DATA"(PyObject* s)
    Py_ssize_t PyUnicode_GET_LENGTH_P "PyUnicode_GET_LENGTH"(PyObject* s)
    bint PyUnicode_IS_COMPACT_ASCII(object s)
    bint PyUnicode_IS_COMPACT_ASCII_P "PyUnicode_IS_COMPACT_ASCII"(PyObject* s)
    bint PyUnicode_CheckExact_P "PyUnicode_CheckExact"(PyObject* s)
    PyObject* PyList_GET_ITEM_P "PyList_GET_ITEM"(object l, Py_ssize_t i)
    void PyList_SET_ITEM_P "PyList_SET_ITEM"(object l, Py_ssize_t i, PyObject* o)
    void Py_INCREF_P "Py_INCREF"(PyObject* o)
    bint PyUnicode_CheckExact(object s)
    Py_ssize_t PyUnicode_GET_LENGTH(object s)
    void Py_XDECREF_P "Py_XDECREF"(PyObject* o)
    # A Data is allocated by its type's tp_alloc and its two slots written at their offsets
    # (see _slot_offset): what object.__new__ plus two setattr calls do, without the calls.
    object PyType_GenericAlloc(PyTypeObject* t, Py_ssize_t n)
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member

cdef extern from *:
    """
    static int rda_generic_alloc(PyObject* t) {
        return ((PyTypeObject*)t)->tp_alloc == PyType_GenericAlloc;
    }
    static Py_ssize_t rda_basicsize(PyObject* t) { return ((PyTypeObject*)t)->tp_basicsize; }
    """
    bint rda_generic_alloc(object t)
    Py_ssize_t rda_basicsize(object t)

cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags
    enum:
        T_OBJECT_EX
        READONLY

cdef extern from "numpy/arrayobject.h":
    PyTypeObject PyArray_Type
    # Steals the reference to ``descr`` (hence the Py_INCREF before each call).
    object PyArray_NewFromDescr(PyTypeObject* subtype, cnp.dtype descr, int nd,
                                cnp.npy_intp* dims, cnp.npy_intp* strides, void* data,
                                int flags, PyObject* obj)

cdef extern from "float.h":
    double FLT_MAX

cdef enum:
    MAX_NDIM = 32
    TAG_BOOL = 1
    TAG_STRING = 8
    TAG_DATA = 9
    ENCODE_MAX_DEPTH = 64
    # Levels of Data the decoder nests at most, whatever max_depth says: C recursion must
    # stop long before the thread's stack does (about 1 KiB per level; the pure decoder
    # meets Python's recursion limit near the same depth, and says the same).
    C_MAX_DEPTH = 500
    BIG = 1 << 16
    OOB_BIT = 0x80  # _binary_format.OUT_OF_BAND

# _binary_format.OUT_OF_BAND_MIN; _binary refuses a build whose value differs (an older format).
OUT_OF_BAND_MIN = 1 << 16
cdef Py_ssize_t OOB_MIN = OUT_OF_BAND_MIN

# Nested-list and element counts saturate here instead of overflowing int64: any count this
# large is already beyond every input's bytes and every sane max_elements.
cdef int64_t SATURATE = (<int64_t>1) << 62

# By tag (index 0 unused): element width of numeric/bool types, the DataType members, the
# little-endian dtypes. Filled once at import.
cdef Py_ssize_t WIDTH[10]
WIDTH[:] = [0, 1, 1, 2, 4, 8, 4, 8, 0, 0]
cdef list SCALAR_TYPES = [None] + [DataType(k) for k in range(1, 10)]
cdef list ARRAY_TYPES = [None] + [DataType(k | 0x10) for k in range(1, 10)]
cdef list DTYPES = [None, np.dtype("?"), np.dtype("<i1"), np.dtype("<i2"), np.dtype("<i4"),
                    np.dtype("<i8"), np.dtype("<f4"), np.dtype("<f8"), None, None]
cdef object T_STRING_ARRAY = DataType.STRING_ARRAY
cdef object T_DATA = DataType.DATA
cdef object T_DATA_ARRAY = DataType.DATA_ARRAY
cdef object DataClass = Data
cdef object NDARRAY = np.ndarray
cdef object EMPTY = ""


cdef Py_ssize_t _slot_offset(str name) except -1:
    """Where Data's ``__slots__`` member ``name`` lives in its objects, or 0 when it cannot be
    used directly (then the codec goes through getattr/setattr, as before). Checked once here:
    a plain object slot of a Data allocated by PyType_GenericAlloc, and a value written with
    setattr reads back at that offset."""
    cdef PyMemberDef* member
    cdef Py_ssize_t offset
    descr = DataClass.__dict__.get(name)
    if type(descr) is not types.MemberDescriptorType or not rda_generic_alloc(DataClass):
        return 0
    member = (<PyMemberDescrObject*><PyObject*>descr).d_member
    offset = member.offset
    if (
        member.type != T_OBJECT_EX
        or member.flags & READONLY
        or not 0 < offset <= rda_basicsize(DataClass) - <Py_ssize_t>sizeof(PyObject*)
    ):
        return 0
    probe = PyType_GenericAlloc(<PyTypeObject*>DataClass, 0)
    marker = object()
    setattr(probe, name, marker)
    if (<PyObject**>(<char*><PyObject*>probe + offset))[0] != <PyObject*>marker:
        return 0
    return offset


cdef Py_ssize_t VALUES_AT = _slot_offset("_values")
cdef Py_ssize_t TYPES_AT = _slot_offset("_types")
# Whether Data's slots are read and written in place (False: through getattr/setattr).
DIRECT_SLOTS = VALUES_AT != 0 and TYPES_AT != 0


cdef inline object _new_data(dict values, dict types):
    """A Data over ``values`` and ``types`` (what Data.from_parts makes)."""
    if VALUES_AT == 0 or TYPES_AT == 0:
        data = object.__new__(DataClass)
        data._values = values
        data._types = types
        return data
    data = PyType_GenericAlloc(<PyTypeObject*>DataClass, 0)
    Py_INCREF(values)
    Py_INCREF(types)
    (<PyObject**>(<char*><PyObject*>data + VALUES_AT))[0] = <PyObject*>values
    (<PyObject**>(<char*><PyObject*>data + TYPES_AT))[0] = <PyObject*>types
    return data


cdef inline dict _values_of(object data):
    """``data._values`` of a Data (an exact Data: read at its slot; others: getattr)."""
    cdef PyObject* v
    if VALUES_AT and type(data) is DataClass:
        v = (<PyObject**>(<char*><PyObject*>data + VALUES_AT))[0]
        if v != NULL and type(<object>v) is dict:
            return <dict>v
    return data._values


cdef inline dict _types_of(object data):
    cdef PyObject* v
    if TYPES_AT and type(data) is DataClass:
        v = (<PyObject**>(<char*><PyObject*>data + TYPES_AT))[0]
        if v != NULL and type(<object>v) is dict:
            return <dict>v
    return data._types


# The string cache: decoded short ASCII strings (values and field names), looked up by their
# bytes, so that the same text in the next message is the same str object instead of a new
# one (a device sends the same names and labels in every update). Bounded: SCACHE_SETS sets
# of two slots, each holding at most one str of at most SCACHE_MAX_LEN bytes: at most 2048
# strings, under 250 KiB. A lookup compares the bytes in full, so a hash collision is only a
# miss; an entry is replaced, never chained, so no input makes a lookup cost more. Strings
# are immutable, so sharing one between decoded Data is invisible to their users. The GIL
# guards the table (nothing between a lookup and its update runs Python code).
cdef enum:
    SCACHE_BITS = 10
    SCACHE_SETS = 1 << SCACHE_BITS
    SCACHE_MAX_LEN = 64

cdef PyObject* scache[2 * SCACHE_SETS]


cdef inline uint64_t _load8(const uint8_t* q) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, q, 8)
    return v


cdef inline Py_ssize_t _set_of(const uint8_t* q, Py_ssize_t k) noexcept nogil:
    """The cache set of the ``k`` bytes at ``q`` (k <= SCACHE_MAX_LEN): a hash of the length
    and the first and last eight bytes (the middle is compared on a hit, never hashed)."""
    cdef uint64_t a = 0, b = 0
    cdef Py_ssize_t i
    if k >= 8:
        a = _load8(q)
        b = _load8(q + k - 8)
    else:
        for i in range(k):
            a = (a << 8) | q[i]
    # The top bits of a product depend on every bit of its factor (the low bits only on the
    # low bits, which are the same first byte in "element_00", "element_01", ...).
    cdef uint64_t h = a ^ (b * <uint64_t>0xC2B2AE3D27D4EB4F) ^ <uint64_t>k
    return <Py_ssize_t>((h * <uint64_t>0x9E3779B97F4A7C15) >> (64 - SCACHE_BITS))


cdef inline bint _same(PyObject* c, const uint8_t* q, Py_ssize_t k) noexcept:
    # Cached strings are compact ASCII: their data is their UTF-8 bytes (and a NUL after).
    cdef const uint8_t* d
    if c == NULL or PyUnicode_GET_LENGTH_P(c) != k:
        return False
    d = <const uint8_t*>PyUnicode_DATA_P(c)
    if 8 <= k <= 16:  # two overlapping words cover it, without a call
        return _load8(d) == _load8(q) and _load8(d + k - 8) == _load8(q + k - 8)
    return memcmp(d, q, k) == 0


cdef object _ascii(const uint8_t* q, Py_ssize_t k):
    """A new str of the ``k`` ASCII bytes at ``q``: a copy into a new compact str, skipping
    the UTF-8 decoder's per-call setup."""
    s = PyUnicode_New(k, 127)
    memcpy(PyUnicode_DATA(s), q, k)
    return s


cdef inline PyObject* _cached(const uint8_t* q, Py_ssize_t k, PyObject*** slot) noexcept:
    """The cached str of the ``k`` bytes at ``q`` (borrowed), or NULL; ``slot`` is set to
    the set a new one would go in (NULL: never cached, empty or too long)."""
    cdef PyObject** s
    if k > SCACHE_MAX_LEN or k == 0:
        slot[0] = NULL
        return NULL
    s = &scache[2 * _set_of(q, k)]
    slot[0] = s
    if _same(s[0], q, k):
        return s[0]
    if _same(s[1], q, k):
        return s[1]
    return NULL


cdef inline object _text(const uint8_t* q, Py_ssize_t k, bint ascii):
    """The str of the ``k`` UTF-8 bytes at ``q`` (``ascii``: known to be all below 0x80),
    from the string cache when it holds them; raises UnicodeDecodeError as
    PyUnicode_DecodeUTF8 does."""
    cdef PyObject** slot
    cdef PyObject* c = _cached(q, k, &slot)
    if c != NULL:
        return <object>c
    return _text_miss(q, k, ascii, slot)


cdef object _text_miss(const uint8_t* q, Py_ssize_t k, bint ascii, PyObject** slot):
    """_text when the cache does not hold the string: a new one, cached when ASCII and
    ``slot`` is a set."""
    if ascii:
        s = _ascii(q, k)
    else:
        s = PyUnicode_DecodeUTF8(<const char*>q, k, NULL)
        if not PyUnicode_IS_COMPACT_ASCII(s):
            return s
    if slot == NULL:
        return s
    # The newest string goes first; the older of the two leaves the cache.
    Py_XDECREF_P(slot[1])
    slot[1] = slot[0]
    Py_INCREF(s)
    slot[0] = <PyObject*>s
    return s


STRING_CACHE_SLOTS = 2 * SCACHE_SETS
STRING_CACHE_MAX_BYTES = SCACHE_MAX_LEN


def string_cache_size():
    """How many strings the decoder's string cache holds now (at most STRING_CACHE_SLOTS)."""
    cdef Py_ssize_t i, n = 0
    for i in range(2 * SCACHE_SETS):
        n += scache[i] != NULL
    return n


# Set by _binary through set_default_limits() (_binary_format: the one source of the defaults).
cdef int64_t default_max_depth = 64
cdef int64_t default_max_elements = 1 << 27


def set_default_limits(limits):
    """Take the defaults of ``decode(buffer, None)`` from ``_binary_format.DEFAULT_LIMITS``."""
    global default_max_depth, default_max_elements
    default_max_depth = _clamp(limits.max_depth)
    default_max_elements = _clamp(limits.max_elements)


cdef int64_t _clamp(object n) except? -1:
    return SATURATE if n > SATURATE else <int64_t>n


cdef inline uint32_t rd_u32(const uint8_t* p) noexcept nogil:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint64_t rd_u64(const uint8_t* p) noexcept nogil:
    return rd_u32(p) | (<uint64_t>rd_u32(p + 4) << 32)


cdef inline void wr_u32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = v >> 24


# ---------------------------------------------------------------------------------- decode


cdef struct Reader:
    const uint8_t* buf
    Py_ssize_t buflen
    int64_t max_depth
    int64_t max_elements
    int64_t budget
    # The out-of-band arrays (a tuple of byte views, kept alive by decode()), how many there
    # are and how many entries have claimed one.
    PyObject* ext
    Py_ssize_t ext_n
    Py_ssize_t ext_used


cdef object _byte_view(object buffer):
    try:
        mv = memoryview(buffer)
        return mv.toreadonly() if mv.format == "B" else mv.cast("B").toreadonly()
    except TypeError as exc:
        raise TypeError(f"decode needs a bytes-like object: {exc}") from None


def decode(buffer, limits=None, arrays=()):
    """Decode a binary body into a Data (compiled; see ``rda.serialization.decode``)."""
    cdef Py_buffer view
    cdef bint has_view = False
    cdef Reader r
    cdef Py_ssize_t pos = 0
    cdef tuple ext = None
    if type(buffer) is not bytes:
        # A read-only byte view, so decoded arrays can never be written through (as in
        # _binary_decoder); it is also the base object of every decoded array.
        buffer = _byte_view(buffer)
        try:
            PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
        except BufferError as exc:  # a strided view: the format needs contiguous bytes
            raise TypeError(f"decode needs a contiguous bytes-like object: {exc}") from None
        has_view = True
        r.buf = <const uint8_t*>view.buf
        r.buflen = view.len
    else:
        r.buf = <const uint8_t*>PyBytes_AS_STRING(buffer)
        r.buflen = PyBytes_GET_SIZE(buffer)
    r.ext = NULL
    r.ext_n = 0
    r.ext_used = 0
    try:
        if arrays:
            ext = tuple([_byte_view(a) for a in arrays])
            r.ext = <PyObject*>ext
            r.ext_n = len(ext)
        if limits is None:
            r.max_depth, r.max_elements = default_max_depth, default_max_elements
        else:
            r.max_depth, r.max_elements = _clamp(limits.max_depth), _clamp(limits.max_elements)
        r.budget = r.max_elements
        try:
            data = _read_data(&r, buffer, &pos, r.buflen, 1)
        except RecursionError:  # max_depth set beyond what the C stack is allowed to nest
            raise DecodeError("Data nested too deeply for the Python stack", 0) from None
        if pos != r.buflen:
            raise DecodeError(f"{r.buflen - pos} trailing bytes after the Data", pos)
        if r.ext_used != r.ext_n:
            raise DecodeError(
                f"{r.ext_n} out-of-band arrays came with the Data, it refers to {r.ext_used}",
                r.buflen,
            )
        return data
    finally:
        if has_view:
            PyBuffer_Release(&view)


cdef object _limit_error(Reader* r, Py_ssize_t at):
    return DecodeError(f"more than max_elements={r.max_elements} elements", at)


cdef object _read_data(Reader* r, object owner, Py_ssize_t* ppos, Py_ssize_t end, int64_t depth):
    """Read one ``data`` at ``*ppos`` (advanced past it), ending at or before ``end``."""
    if depth > r.max_depth:
        raise DecodeError(f"Data nested deeper than max_depth={r.max_depth}", ppos[0])
    if depth > C_MAX_DEPTH:
        raise DecodeError("Data nested too deeply for the Python stack", 0)
    Py_EnterRecursiveCall(" while decoding nested Data")
    try:
        return _read_entries(r, owner, ppos, end, depth)
    finally:
        Py_LeaveRecursiveCall()


cdef object _read_entries(Reader* r, object owner, Py_ssize_t* ppos, Py_ssize_t end,
                          int64_t depth):
    cdef const uint8_t* buf = r.buf
    cdef Py_ssize_t pos = ppos[0]
    cdef Py_ssize_t start, bpos, nlen, size, n, i
    cdef uint32_t count
    cdef int tag, ndim
    cdef const uint8_t* p
    cdef cnp.npy_intp dim1[1]
    if pos + 4 > end:
        raise DecodeError(f"truncated: a Data needs a 4-byte entry count, {end - pos} left", pos)
    count = rd_u32(buf + pos)
    pos += 4
    if <int64_t>count * 9 > end - pos:  # every entry takes at least 9 bytes (8 + a name)
        raise DecodeError(
            f"Data declares {count} entries but only {end - pos} bytes remain", pos - 4
        )
    r.budget -= count
    if r.budget < 0:
        raise _limit_error(r, pos - 4)
    cdef dict values = {}
    cdef dict types = {}
    start = pos
    for i in range(count):
        start = pos
        if pos + 8 > r.buflen:  # as _binary_decoder: only a header past the whole buffer says this
            raise DecodeError(f"truncated: an entry header needs 8 bytes, {end - pos} left", pos)
        p = buf + pos
        tag = p[0]
        ndim = p[1]
        nlen = p[2] | (p[3] << 8)
        size = rd_u32(p + 4)
        bpos = pos + 8 + nlen
        pos = bpos + size
        if pos > end or not nlen:
            if nlen:
                raise DecodeError(
                    f"entry declares a {nlen}-byte name and a {size}-byte body, "
                    f"{end - start - 8} bytes remain",
                    start,
                )
            raise DecodeError("empty field name", start)
        try:
            name = _text(p + 8, nlen, False)
        except UnicodeDecodeError as exc:
            raise DecodeError("field name is not valid UTF-8", start + 8 + exc.start) from None
        if memchr(p + 8, 0, nlen) != NULL:
            raise DecodeError(f"field name {name!r} contains NUL", start + 8)
        if ndim == 1 and 2 <= tag <= 7:  # 1-D numeric, the common case: a view, no checks
            n = WIDTH[tag]
            if size % n:
                raise DecodeError(
                    f"field {name!r}: {size} bytes is not a whole number of "
                    f"{n}-byte elements",
                    start + 4,
                )
            n = size // n
            r.budget -= n
            dim1[0] = n
            values[name] = _view(owner, buf + bpos, tag, 1, dim1)
            types[name] = ARRAY_TYPES[tag]
        elif ndim == 1 and tag == TAG_STRING:
            values[name] = _read_strings(r, bpos, pos, name)
            types[name] = T_STRING_ARRAY
        else:
            values[name], types[name] = _read_other(
                r, owner, start, tag, ndim, bpos, pos, depth, name
            )
    if r.budget < 0:
        raise _limit_error(r, start)
    if PyDict_Size(values) != count:
        raise DecodeError("duplicate field names in one Data", start)
    ppos[0] = pos
    return _new_data(values, types)


cdef object _view(object owner, const uint8_t* data, int tag, int ndim, cnp.npy_intp* dims):
    """A read-only array over ``data`` (inside ``owner``'s buffer), based on ``owner``."""
    cdef cnp.dtype descr = <cnp.dtype>DTYPES[tag]
    Py_INCREF(descr)  # PyArray_NewFromDescr steals a reference to the descriptor
    arr = PyArray_NewFromDescr(&PyArray_Type, descr, ndim, dims, NULL, <void*>data, 0, NULL)
    cnp.set_array_base(<cnp.ndarray>arr, owner)
    # PyArray_NewFromDescr sets contiguity from the dims (C order, as no strides are given)
    # and alignment from the pointer (views are often unaligned); WRITEABLE is not among the
    # flags given, so the view is read-only. tests/test_binary_codec.py compares every flag
    # with the pure decoder's np.frombuffer views.
    return arr


cdef object _read_strings(Reader* r, Py_ssize_t pos, Py_ssize_t end, object name):
    """A list of the NUL-terminated UTF-8 strings in ``buf[pos:end]`` (empty body: [])."""
    cdef const uint8_t* buf = r.buf
    cdef Py_ssize_t size = end - pos
    cdef Py_ssize_t n = 0, i, k
    cdef const uint8_t* q
    cdef const uint8_t* stop
    cdef uint64_t w, z, high = 0
    cdef uint64_t LOW7 = 0x7F7F7F7F7F7F7F7F
    cdef PyObject* c
    cdef PyObject** slot
    if size == 0:
        return []
    if buf[end - 1] != 0:
        raise DecodeError(f"field {name!r}: string array does not end with NUL", end - 1)
    # One pass, eight bytes at a time: how many NULs (strings) and whether any byte is
    # >= 0x80. z has 0x80 in exactly the bytes of w that are 0; the multiply sums them.
    q = buf + pos
    stop = buf + end
    while stop - q >= 8:
        w = _load8(q)
        high |= w
        z = ~(((w & LOW7) + LOW7) | w | LOW7)
        n += <Py_ssize_t>(((z >> 7) * <uint64_t>0x0101010101010101) >> 56)
        q += 8
    while q < stop:
        high |= q[0]
        n += q[0] == 0
        q += 1
    cdef bint ascii = (high & <uint64_t>0x8080808080808080) == 0
    if n > r.budget:  # before allocating the list: its length is charged to the budget
        raise _limit_error(r, pos)
    cdef list items = PyList_New(n)
    q = buf + pos
    try:  # around the loop, not in it: entering a try block saves the exception state
        for i in range(n):
            k = <const uint8_t*>memchr(q, 0, stop - q) - q
            c = _cached(q, k, &slot)
            if c != NULL:  # the common case, in C: no reference juggling but the list's own
                Py_INCREF_P(c)
                PyList_SET_ITEM_P(items, i, c)
            else:
                s = _text_miss(q, k, ascii, slot)
                Py_INCREF(s)
                PyList_SET_ITEM(items, i, s)
            q += k + 1
    except UnicodeDecodeError as exc:
        raise DecodeError(f"field {name!r}: invalid UTF-8", (q - buf) + exc.start) from None
    r.budget -= n
    return items


cdef tuple _read_other(Reader* r, object owner, Py_ssize_t start, int tag, int ndim,
                       Py_ssize_t bpos, Py_ssize_t pos, int64_t depth, object name):
    """Decode an entry other than a 1-D numeric or string array: (value, type)."""
    cdef const uint8_t* buf = r.buf
    cdef const uint8_t* b = buf + bpos
    cdef Py_ssize_t size = pos - bpos
    cdef Py_ssize_t width, epos, sub_end, i
    cdef int64_t n
    cdef uint32_t u
    cdef uint64_t u64
    cdef double d
    cdef float f
    cdef cnp.npy_intp dims[MAX_NDIM]
    if ndim == 0 and 2 <= tag <= 7:  # numeric scalars
        width = WIDTH[tag]
        t = SCALAR_TYPES[tag]
        if size != width:
            raise DecodeError(
                f"field {name!r}: a {t.label} body is {width} bytes, not {size}", start
            )
        if tag == 2:
            return PyLong_FromLongLong(<int8_t>b[0]), t
        if tag == 3:
            return PyLong_FromLongLong(<int16_t>(b[0] | (b[1] << 8))), t
        if tag == 4:
            return PyLong_FromLongLong(<int32_t>rd_u32(b)), t
        if tag == 5:
            return PyLong_FromLongLong(<int64_t>rd_u64(b)), t
        if tag == 6:
            u = rd_u32(b)
            memcpy(&f, &u, 4)
            return PyFloat_FromDouble(f), t
        u64 = rd_u64(b)
        memcpy(&d, &u64, 8)
        return PyFloat_FromDouble(d), t
    if tag & OOB_BIT:
        return _read_out_of_band(r, start, tag & ~OOB_BIT, ndim, bpos, pos, name)
    if not 0 < tag < 10:
        raise DecodeError(f"field {name!r}: unknown type tag {tag}", start)
    if ndim == 0:
        t = SCALAR_TYPES[tag]
        if tag == TAG_BOOL:
            if size != 1 or b[0] > 1:
                raise DecodeError(f"field {name!r}: a bool body is one byte, 0 or 1", bpos)
            return PyBool_FromLong(b[0]), t
        if tag == TAG_STRING:
            try:
                value = _text(b, size, False)
            except UnicodeDecodeError as exc:
                raise DecodeError(f"field {name!r}: invalid UTF-8", bpos + exc.start) from None
            if memchr(b, 0, size) != NULL:
                raise DecodeError(f"field {name!r}: string contains NUL", bpos)
            return value, t
        sub_end = bpos
        value = _read_data(r, owner, &sub_end, pos, depth + 1)
        if sub_end != pos:
            raise DecodeError(f"field {name!r}: {pos - sub_end} stray bytes in Data", sub_end)
        return value, t
    t = ARRAY_TYPES[tag]
    if ndim > MAX_NDIM:
        raise DecodeError(f"field {name!r}: ndim {ndim} exceeds {MAX_NDIM}", start + 1)
    if tag <= 7 or tag == TAG_STRING:
        epos = bpos
        n = 1
        if ndim == 1:
            width = WIDTH[tag]  # STRING never gets here with ndim 1
            n = size // width
            dims[0] = n
        else:
            if bpos + 4 * ndim > pos:
                raise DecodeError(f"field {name!r}: body too short for {ndim} dims", bpos)
            n = _read_shape(r, b, ndim, dims, name, bpos)
            epos = bpos + 4 * ndim
        if tag == TAG_STRING:
            return _read_nd_strings(r, epos, pos, ndim, dims, n, name), t
        width = WIDTH[tag]
        if n > SATURATE // width or n * width != pos - epos:
            shape = (n,) if ndim == 1 else _dims(b, ndim)
            raise DecodeError(
                f"field {name!r}: dims {shape} need {math.prod(shape) * width} bytes, "
                f"body has {pos - epos}",
                bpos,
            )
        r.budget -= n
        if r.budget < 0:
            raise _limit_error(r, start)
        if tag == TAG_BOOL:
            for i in range(n):
                if buf[epos + i] > 1:
                    raise DecodeError(
                        f"field {name!r}: bool array holds bytes other than 0/1", epos
                    )
        try:
            return _view(owner, buf + epos, tag, ndim, dims), t
        except ValueError as exc:  # zero-size dims whose product overflows numpy's intp
            raise DecodeError(
                f"field {name!r}: cannot shape the array as {_dims(b, ndim)}: {exc}", bpos
            ) from None
    if ndim != 1:
        raise DecodeError(f"field {name!r}: Data arrays are 1-D, not {ndim}-D", start)
    return _read_data_array(r, owner, bpos, pos, depth, name), t


cdef tuple _read_out_of_band(Reader* r, Py_ssize_t start, int tag, int ndim, Py_ssize_t bpos,
                             Py_ssize_t pos, object name):
    """An entry whose elements are the next out-of-band array (as _binary_decoder._read_out_of_band,
    check for check): its body is the dims (ndim > 1) and the u32 index of that array."""
    cdef const uint8_t* b = r.buf + bpos
    cdef Py_ssize_t want, width, nbytes
    cdef int64_t n
    cdef uint32_t index
    cdef cnp.npy_intp dims[MAX_NDIM]
    if not 2 <= tag <= 7 or ndim == 0:
        raise DecodeError(
            f"field {name!r}: only numeric arrays travel out of band, not tag {tag} ndim {ndim}",
            start,
        )
    if ndim > MAX_NDIM:
        raise DecodeError(f"field {name!r}: ndim {ndim} exceeds {MAX_NDIM}", start + 1)
    want = (4 * ndim if ndim > 1 else 0) + 4
    if pos - bpos != want:
        raise DecodeError(
            f"field {name!r}: an out-of-band reference of {ndim} dims is {want} bytes, "
            f"not {pos - bpos}",
            start + 4,
        )
    index = rd_u32(r.buf + pos - 4)
    if r.ext == NULL or index != r.ext_used or index >= r.ext_n:
        raise DecodeError(
            f"field {name!r}: refers to out-of-band array {index}; "
            f"{r.ext_n} came with the Data and the next unclaimed is {r.ext_used}",
            pos - 4,
        )
    r.ext_used += 1
    array = (<tuple>r.ext)[index]
    width = WIDTH[tag]
    nbytes = len(array)
    if ndim == 1:
        if nbytes % width:
            raise DecodeError(
                f"field {name!r}: out-of-band array of {nbytes} bytes is not a whole number "
                f"of {width}-byte elements",
                pos - 4,
            )
        n = nbytes // width
    else:
        n = _read_shape(r, b, ndim, dims, name, bpos)
        if n > SATURATE // width or n * width != nbytes:
            shape = _dims(b, ndim)
            raise DecodeError(
                f"field {name!r}: dims {shape} need {math.prod(shape) * width} bytes, "
                f"the out-of-band array has {nbytes}",
                bpos,
            )
    r.budget -= n
    if r.budget < 0:
        raise _limit_error(r, start)
    value = np.frombuffer(array, DTYPES[tag], n)
    if ndim == 1:
        return value, ARRAY_TYPES[tag]
    shape = _dims(b, ndim)
    try:
        return value.reshape(shape), ARRAY_TYPES[tag]
    except ValueError as exc:
        raise DecodeError(f"field {name!r}: cannot shape the array as {shape}: {exc}", bpos) from None


cdef int64_t _read_shape(Reader* r, const uint8_t* b, int ndim, cnp.npy_intp* dims,
                         object name, Py_ssize_t bpos) except -1:
    """Read ``ndim`` u32 dims at ``b`` into ``dims``: their (saturated) element count. The
    nested lists a shape implies (products of its leading dims) count against max_elements:
    a zero-size (3774873604, 0) would make tolist() build billions."""
    cdef int64_t n = 1, nested = 0, prefix = 1
    cdef uint32_t u
    cdef int i
    for i in range(ndim):
        u = rd_u32(b + 4 * i)
        dims[i] = u
        if i < ndim - 1:
            prefix = _sat_mul(prefix, u)
            nested = min(nested + prefix, SATURATE)
        n = _sat_mul(n, u)
    if nested > r.max_elements:
        shape = _dims(b, ndim)
        raise DecodeError(
            f"field {name!r}: dims {shape} imply {nested} nested lists, more than "
            f"max_elements={r.max_elements}",
            bpos,
        )
    return n


cdef inline int64_t _sat_mul(int64_t a, int64_t b) noexcept nogil:
    if a == 0 or b == 0:
        return 0
    if a > SATURATE // b:
        return SATURATE
    return a * b


cdef tuple _dims(const uint8_t* b, int ndim):
    return tuple([rd_u32(b + 4 * i) for i in range(ndim)])


cdef object _read_nd_strings(Reader* r, Py_ssize_t pos, Py_ssize_t end, int ndim,
                             cnp.npy_intp* dims, int64_t n, object name):
    cdef Py_ssize_t i
    cdef const uint8_t* b = r.buf + pos - 4 * ndim
    items = _read_strings(r, pos, end, name)
    if r.budget < 0:
        raise _limit_error(r, pos)
    if n != PyList_GET_SIZE(items):
        shape = _dims(b, ndim)
        raise DecodeError(
            f"field {name!r}: dims {shape} need {math.prod(shape)} strings, "
            f"got {PyList_GET_SIZE(items)}",
            pos,
        )
    arr = np.empty(n, dtype=object)
    arr[:] = items
    shape = _dims(b, ndim)
    try:
        return arr.reshape(shape)
    except ValueError as exc:
        raise DecodeError(f"field {name!r}: cannot shape the array as {shape}: {exc}", pos) from None


cdef list _read_data_array(Reader* r, object owner, Py_ssize_t pos, Py_ssize_t end,
                           int64_t depth, object name):
    cdef uint32_t n, i
    if pos + 4 > end:
        raise DecodeError(f"field {name!r}: Data array needs a 4-byte count", pos)
    n = rd_u32(r.buf + pos)
    pos += 4
    if <int64_t>n * 4 > end - pos:  # every Data takes at least its 4-byte count
        raise DecodeError(
            f"field {name!r}: {n} Data declared but only {end - pos} bytes remain", pos - 4
        )
    r.budget -= n
    if r.budget < 0:
        raise _limit_error(r, pos - 4)
    cdef list items = []
    for i in range(n):
        items.append(_read_data(r, owner, &pos, end, depth + 1))
    if pos != end:
        raise DecodeError(f"field {name!r}: {end - pos} stray bytes after the Data array", pos)
    return items


# ---------------------------------------------------------------------------------- encode
#
# Two passes: _size() computes the exact length (and every too-large error) so the output is
# one bytes object written in place: a big array is copied once, straight into it. _write()
# then fills it, bounds-checked against that length, and patches each entry's size after its
# body, so it never needs the sizes again.


def encode(data, list arrays=None):
    """Encode ``data`` into its binary form (compiled; see ``rda.serialization.encode``)."""
    if type(data) is not DataClass and not isinstance(data, Data):
        raise TypeError(f"encode needs a Data, not {type(data).__name__}")
    cdef int64_t total = _size(data, 1, arrays is not None)
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* p = <uint8_t*>PyBytes_AS_STRING(out)
    cdef Py_ssize_t n = _write(data, p, 0, total, arrays)
    if n != total:  # a value changed between the passes (another thread): never ship garbage
        raise RuntimeError("Data changed while it was being encoded")
    return out


cdef inline Py_ssize_t _utf8_size(object s) except -1:
    """The UTF-8 length of str ``s`` (a compact ASCII str: its length, read inline)."""
    cdef Py_ssize_t k
    if PyUnicode_CheckExact(s) and PyUnicode_IS_COMPACT_ASCII(s):
        return PyUnicode_GET_LENGTH(s)
    PyUnicode_AsUTF8AndSize(s, &k)
    return k


cdef inline const char* _utf8_p(PyObject* s, Py_ssize_t* k) except NULL:
    """_utf8 of a borrowed reference."""
    if PyUnicode_CheckExact_P(s) and PyUnicode_IS_COMPACT_ASCII_P(s):
        k[0] = PyUnicode_GET_LENGTH_P(s)
        return <const char*>PyUnicode_DATA_P(s)
    return PyUnicode_AsUTF8AndSize(<object>s, k)


cdef inline const char* _utf8(object s, Py_ssize_t* k) except NULL:
    """The UTF-8 bytes of str ``s`` and their length (a compact ASCII str: its own data)."""
    if PyUnicode_CheckExact(s) and PyUnicode_IS_COMPACT_ASCII(s):
        k[0] = PyUnicode_GET_LENGTH(s)
        return <const char*>PyUnicode_DATA(s)
    return PyUnicode_AsUTF8AndSize(s, k)


cdef inline int64_t _u32_size(int64_t size) except -1:
    if size > 0xFFFFFFFF:
        raise ValueError(f"Data too large for the binary format: a body of {size} bytes")
    return size


cdef inline bint _out_of_band(int code, cnp.ndarray arr) noexcept:
    """As _binary_encoder._goes_out_of_band: big, read-only, C-contiguous, numeric and not bool."""
    return (
        0x12 <= code <= 0x17
        and cnp.PyArray_NBYTES(arr) >= OOB_MIN
        and not cnp.PyArray_ISWRITEABLE(arr)
        and cnp.PyArray_IS_C_CONTIGUOUS(arr)
    )


def writable_arrays(data):
    """As _binary_encoder.writable_arrays_python: the big writable arrays ``encode(data,
    arrays)`` copies only for being writable (exact ndarrays; 0 past the depth encode refuses).
    Asked for every get reply a handler completes: a scalar entry costs a few compares."""
    return _writable_arrays(data, 1)


cdef Py_ssize_t _writable_arrays(object data, int64_t depth) except -1:
    if depth > ENCODE_MAX_DEPTH:
        return 0
    cdef dict values = _values_of(data)
    cdef dict types = _types_of(data)
    cdef Py_ssize_t i = 0, n = 0
    cdef PyObject* key
    cdef PyObject* val
    cdef cnp.ndarray arr
    cdef int code
    while PyDict_Next(values, &i, &key, &val):
        cls = type(<object>val)
        if cls is float or cls is int or cls is str or cls is bool:
            continue
        if cls is NDARRAY:
            arr = <cnp.ndarray>val
            if (
                cnp.PyArray_NBYTES(arr) >= OOB_MIN
                and cnp.PyArray_ISWRITEABLE(arr)
                and cnp.PyArray_IS_C_CONTIGUOUS(arr)
            ):
                code = PyLong_AsLong(types[<object>key])
                n += 0x12 <= code <= 0x17
            continue
        t = types[<object>key]
        if t is T_DATA:
            n += _writable_arrays(<object>val, depth + 1)
        elif t is T_DATA_ARRAY:
            for item in <list>val:
                n += _writable_arrays(item, depth + 1)
    return n


cdef int64_t _entry_body_size(int tag, object t, object v, int64_t depth, bint split) except -1:
    cdef Py_ssize_t k, j
    cdef int64_t size
    cdef cnp.ndarray arr
    if t is T_STRING_ARRAY:
        if type(v) is list:
            size = 0
            for j in range(PyList_GET_SIZE(v)):  # borrowed items: no reference counting
                _utf8_p(PyList_GET_ITEM_P(v, j), &k)
                size += k + 1
            return size
        arr = <cnp.ndarray?>v
        size = 4 * arr.ndim
        for s in arr.ravel().tolist():
            PyUnicode_AsUTF8AndSize(s, &k)
            size += k + 1
        return size
    if t is T_DATA:
        return _size(v, depth + 1, split)
    if t is T_DATA_ARRAY:
        size = 4
        for item in <list?>v:
            size += _size(item, depth + 1, split)
        return size
    if tag >= 0x10:
        arr = <cnp.ndarray?>v
        if split and _out_of_band(tag, arr):
            return (4 * arr.ndim if arr.ndim > 1 else 0) + 4
        return (4 * arr.ndim if arr.ndim > 1 else 0) + cnp.PyArray_NBYTES(arr)
    if tag == TAG_STRING:
        return _utf8_size(v)
    if 1 <= tag <= 7:
        return WIDTH[tag]
    raise ValueError(f"unknown DataType {t!r}")


cdef inline object _type_of(dict types, Py_ssize_t* ti, PyObject* key):
    """The type of field ``key``, read while walking ``values``: the next entry of ``types``
    when its key is the same object (Data fills both tables together, so they share keys and
    order; a dict lookup per field was a sixth of an encode), else a lookup."""
    cdef PyObject* tkey
    cdef PyObject* tval
    if PyDict_Next(types, ti, &tkey, &tval) and tkey == key:
        return <object>tval
    return types[<object>key]


cdef int64_t _size(object data, int64_t depth, bint split) except -1:
    if depth > ENCODE_MAX_DEPTH:
        raise ValueError(f"Data nested deeper than {ENCODE_MAX_DEPTH} levels")
    if type(data) is not DataClass and not isinstance(data, Data):
        raise TypeError(f"a Data value holds a {type(data).__name__}, not a Data")
    cdef dict values = _values_of(data)
    cdef dict types = _types_of(data)
    cdef int64_t total = 4
    cdef Py_ssize_t k, i = 0, ti = 0
    cdef PyObject* key
    cdef PyObject* val
    while PyDict_Next(values, &i, &key, &val):
        t = _type_of(types, &ti, key)
        _utf8_p(key, &k)
        if k > 0xFFFF:
            raise ValueError(f"Data too large for the binary format: a {k}-byte field name")
        total += 8 + k + _u32_size(
            _entry_body_size(PyLong_AsLong(t), t, <object>val, depth, split)
        )
    return total


cdef Py_ssize_t _put(uint8_t* p, Py_ssize_t pos, Py_ssize_t cap, const void* src,
                     Py_ssize_t n) except -1:
    if n > cap - pos:
        raise RuntimeError("Data changed while it was being encoded")
    memcpy(p + pos, src, n)
    return pos + n


cdef Py_ssize_t _write(object data, uint8_t* p, Py_ssize_t pos, Py_ssize_t cap,
                       list arrays) except -1:
    cdef dict values = _values_of(data)
    cdef dict types = _types_of(data)
    cdef Py_ssize_t k, nlen, i = 0, ti = 0, hpos, bpos, j
    cdef PyObject* key
    cdef PyObject* val
    cdef uint8_t hdr[8]
    cdef uint8_t scalar[8]
    cdef const char* s
    cdef int tag, code, ndim
    cdef long long ll
    cdef double d
    cdef float f
    cdef cnp.ndarray arr
    wr_u32(scalar, <uint32_t>PyDict_Size(values))
    pos = _put(p, pos, cap, scalar, 4)
    while PyDict_Next(values, &i, &key, &val):
        t = _type_of(types, &ti, key)
        v = <object>val
        code = PyLong_AsLong(t)
        tag = code & 0x0F
        ndim = 1 if code >= 0x10 else 0
        s = _utf8_p(key, &nlen)
        hpos = pos
        pos = _put(p, pos, cap, hdr, 8)  # filled below, once the body's size is known
        pos = _put(p, pos, cap, s, nlen)
        bpos = pos
        if t is T_STRING_ARRAY:
            if type(v) is list:
                items = v
            else:
                arr = <cnp.ndarray?>v
                ndim = arr.ndim
                for j in range(ndim):
                    wr_u32(scalar, <uint32_t>arr.shape[j])
                    pos = _put(p, pos, cap, scalar, 4)
                items = arr.ravel().tolist()
            for j in range(PyList_GET_SIZE(items)):  # borrowed items: no reference counting
                s = _utf8_p(PyList_GET_ITEM_P(items, j), &k)
                if k >= cap - pos:
                    raise RuntimeError("Data changed while it was being encoded")
                memcpy(p + pos, s, k)
                p[pos + k] = 0
                pos += k + 1
        elif t is T_DATA:
            pos = _write(v, p, pos, cap, arrays)
        elif t is T_DATA_ARRAY:
            wr_u32(scalar, <uint32_t>len(v))
            pos = _put(p, pos, cap, scalar, 4)
            for item in <list?>v:
                pos = _write(item, p, pos, cap, arrays)
        elif code >= 0x10:
            arr = <cnp.ndarray?>v
            ndim = arr.ndim
            if ndim > 1:
                for j in range(ndim):
                    wr_u32(scalar, <uint32_t>arr.shape[j])
                    pos = _put(p, pos, cap, scalar, 4)
            if arrays is not None and _out_of_band(code, arr):
                # The elements travel as their own frame: the body holds their index.
                tag |= OOB_BIT
                wr_u32(scalar, <uint32_t>len(arrays))
                pos = _put(p, pos, cap, scalar, 4)
                arrays.append(memoryview(arr).cast("B"))
            elif cnp.PyArray_IS_C_CONTIGUOUS(arr):
                pos = _put(p, pos, cap, cnp.PyArray_DATA(arr), cnp.PyArray_NBYTES(arr))
            else:  # a strided view: numpy makes the C-order copy
                raw = arr.tobytes()
                pos = _put(p, pos, cap, PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw))
        elif tag == TAG_STRING:
            s = _utf8(v, &k)
            pos = _put(p, pos, cap, s, k)
        else:
            pos = _put(p, pos, cap, scalar, _pack_scalar(tag, v, scalar))
        hdr[0] = tag
        hdr[1] = ndim
        hdr[2] = nlen & 0xFF
        hdr[3] = (nlen >> 8) & 0xFF
        wr_u32(hdr + 4, <uint32_t>(pos - bpos))
        memcpy(p + hpos, hdr, 8)
    return pos


cdef Py_ssize_t _pack_scalar(int tag, object v, uint8_t* out) except -1:
    """Write scalar ``v`` of ``tag`` little-endian into ``out``: its width. Range errors as
    struct.pack gives them in _binary_encoder (ValueError)."""
    cdef long long ll
    cdef uint64_t u
    cdef double d
    cdef float f
    cdef uint32_t u32
    cdef int i, w = WIDTH[tag]
    if tag <= 5:
        ll = PyLong_AsLongLong(v)
        if tag == TAG_BOOL and not 0 <= ll <= 255:
            raise ValueError(f"Data too large for the binary format: bool value {v!r}")
        if tag > TAG_BOOL and w < 8 and not -((<long long>1) << (8 * w - 1)) <= ll < ((<long long>1) << (8 * w - 1)):
            raise ValueError(f"Data too large for the binary format: {v!r} in {w} bytes")
        u = <uint64_t>ll
        for i in range(w):
            out[i] = (u >> (8 * i)) & 0xFF
        return w
    d = PyFloat_AsDouble(v)
    if tag == 6:
        if (d > FLT_MAX or d < -FLT_MAX) and d == d and d - d == 0:
            raise OverflowError("float too large to pack with f format")
        f = <float>d
        memcpy(&u32, &f, 4)
        wr_u32(out, u32)
        return 4
    memcpy(&u, &d, 8)
    wr_u32(out, <uint32_t>(u & 0xFFFFFFFF))
    wr_u32(out + 4, <uint32_t>(u >> 32))
    return 8
