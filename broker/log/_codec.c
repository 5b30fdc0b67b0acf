/* broker.log._codec: the hot loops of the message format (broker/log/message.py) in C.
 *
 * message.py is the reference and the fallback: every function here gives what its Python
 * namesake there gives, exceptions included (tests/log/test_codec.py checks both on random and
 * corrupt input); broker.log.codec picks one of the two.
 *
 * Why C on the raw CPython API, not Cython or mypyc: building needs gcc and the Python headers
 * only (no compiler package from PyPI at install time, nothing that a fresh Debian machine
 * lacks after apt-get), XXH3 is compiled inline from Debian's libxxhash-dev header (nothing to
 * link, no call through Python per checksum), and the loops make their results the cheapest
 * way CPython allows: Message tuples from the named tuple type's own tp_alloc, bytes objects
 * made once at their final size, Arrow buffers filled in place. mypyc compiles typed Python
 * but still calls xxhash and struct through Python objects a message; Cython could do all of
 * this, at the price of a build dependency and generated code to review.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* The layout of message.py's docstring. */
#define LENGTH_SIZE 4
#define HEADER_SIZE 26
#define MIN_LENGTH (HEADER_SIZE - LENGTH_SIZE)
#define CHECKSUM_START 12
#define MAGIC 1
#define MAGIC_V2 2
#define HEADERS_MIN 6 /* format 2's headers_length and an empty block's u16 count */
#define NO_TIMESTAMP INT64_MIN
/* The attributes of a compressed set: bits 0-2 gzip (1), lz4 (3) or zstd (4), the rest zero
 * (message.SET_CODECS). */
#define SET_CODEC(attributes) ((attributes) == 1 || (attributes) == 3 || (attributes) == 4)

typedef struct {
    PyTypeObject *message_type; /* broker.log.message.Message */
    PyTypeObject *columns_type; /* broker.log.columns.Columns */
    PyObject *struct_error;     /* struct.error, what message.encode_message's packing raises */
} codec_state;

static inline codec_state *state_of(PyObject *module) {
    return (codec_state *)PyModule_GetState(module);
}

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t be64(const unsigned char *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

/* One message's header fields, as the walks read them. */
typedef struct {
    Py_ssize_t following; /* where the next message starts */
    uint64_t checksum;
    int64_t timestamp;
    int32_t key_length;
    unsigned char attributes;
    Py_ssize_t headers;  /* format 2: how many headers; -1 for format 1 */
    Py_ssize_t value_at; /* where the value starts */
} header;

/* Whether bytes [p, p + n) are UTF-8 as Python's strict decoder takes it (no overlong forms,
 * no surrogates, nothing past U+10FFFF). */
static int utf8_valid(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int more;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF)
            more = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            more = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            more = 3, cp = c & 0x07;
        else
            return 0;
        if (n - i <= more)
            return 0;
        for (int k = 1; k <= more; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if ((more == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (more == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += more + 1;
    }
    return 1;
}

/* Where the value of a format 2 message starts: after its header block at `at`, which must
 * lie within [at, end) and be whole (its length, a u16 count, each header's u16 key length,
 * UTF-8 key, i32 value length >= -1 and value, nothing left over); -1 if it is not. `count`
 * gets the number of headers. */
static Py_ssize_t header_block_end(const unsigned char *data, Py_ssize_t at, Py_ssize_t end,
                                   Py_ssize_t *count) {
    if (end - at < 4)
        return -1;
    int64_t block = be32(data + at);
    at += 4;
    if (block < 2 || block > end - at)
        return -1;
    Py_ssize_t stop = at + (Py_ssize_t)block;
    Py_ssize_t n = ((Py_ssize_t)data[at] << 8) | data[at + 1];
    at += 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (stop - at < 2)
            return -1;
        Py_ssize_t key = ((Py_ssize_t)data[at] << 8) | data[at + 1];
        at += 2;
        if (stop - at < key || !utf8_valid(data + at, key))
            return -1;
        at += key;
        if (stop - at < 4)
            return -1;
        int32_t value = (int32_t)be32(data + at);
        at += 4;
        if (value < -1 || stop - at < value)
            return -1;
        if (value > 0)
            at += value;
    }
    if (at != stop)
        return -1;
    *count = n;
    return stop;
}

/* Where the message at `pos` of `data` (`end` bytes) ends if it passes every check of
 * message.py's walks (whole header, length within [MIN_LENGTH, max_length], within the buffer,
 * magic 1, attributes 0 or, with `sets`, a compressed set's codec, key length in range,
 * checksum; in an `inner` set, the checksum field 0 instead), its fields in `h`; -1 if it
 * fails. */
static inline Py_ssize_t message_end(const unsigned char *data, Py_ssize_t pos, Py_ssize_t end,
                                     int64_t max_length, int sets, int inner, header *h) {
    if (end - pos < HEADER_SIZE)
        return -1;
    const unsigned char *p = data + pos;
    int64_t length = be32(p);
    if (length < MIN_LENGTH || length > max_length || length + LENGTH_SIZE > end - pos)
        return -1;
    int v2 = p[12] == MAGIC_V2;
    if (v2 ? p[13] != 0 : p[12] != MAGIC || (p[13] != 0 && !(sets && SET_CODEC(p[13]))))
        return -1;
    int32_t key_length = (int32_t)be32(p + 22);
    if (key_length < -1 || key_length > length - MIN_LENGTH - (v2 ? HEADERS_MIN : 0))
        return -1;
    Py_ssize_t key_end = pos + HEADER_SIZE + (key_length > 0 ? key_length : 0);
    h->headers = -1;
    h->value_at = key_end;
    if (v2) {
        h->value_at = header_block_end(data, key_end, pos + LENGTH_SIZE + length, &h->headers);
        if (h->value_at < 0)
            return -1;
    }
    uint64_t checksum = be64(p + 4);
    if (inner ? checksum != 0
              : XXH3_64bits(p + CHECKSUM_START,
                            (size_t)(length + LENGTH_SIZE - CHECKSUM_START)) != checksum)
        return -1;
    h->following = pos + LENGTH_SIZE + (Py_ssize_t)length;
    h->checksum = checksum;
    h->timestamp = (int64_t)be64(p + 14);
    h->key_length = key_length;
    h->attributes = p[13];
    return h->following;
}

/* That a METH_FASTCALL function `name` got `expected` arguments; else a TypeError. */
static int arguments(const char *name, Py_ssize_t nargs, Py_ssize_t expected) {
    if (nargs == expected)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s expected %zd arguments, got %zd", name, expected, nargs);
    return -1;
}

/* An int argument as an int64_t, saturated: the walks only compare it with buffer positions,
 * so a value past the int64 range acts as the nearest end of it does in Python. */
static int saturated(PyObject *value, int64_t *out) {
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = overflow > 0 ? INT64_MAX : overflow < 0 ? INT64_MIN : v;
    return 0;
}

/* base + pos as a Python int (base_obj is base as an int object, for sums past int64). */
static PyObject *offset_of(PyObject *base_obj, int64_t base, int base_exact, Py_ssize_t pos) {
    int64_t sum;
    if (base_exact && !__builtin_add_overflow(base, (int64_t)pos, &sum))
        return PyLong_FromLongLong(sum);
    PyObject *delta = PyLong_FromSsize_t(pos);
    if (delta == NULL)
        return NULL;
    PyObject *result = PyNumber_Add(base_obj, delta);
    Py_DECREF(delta);
    return result;
}

static int exact_int64(PyObject *value, int64_t *out, int *exact) {
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *exact = overflow == 0;
    *out = v;
    return 0;
}

/* A growable array of int64, for the scan's marks and run maxima. */
typedef struct {
    int64_t *items;
    Py_ssize_t size, capacity;
} int64_list;

static int push(int64_list *list, int64_t value) {
    if (list->size == list->capacity) {
        Py_ssize_t capacity = list->capacity ? list->capacity * 2 : 16;
        int64_t *items = PyMem_RawRealloc(list->items, (size_t)capacity * sizeof(int64_t));
        if (items == NULL)
            return -1;
        list->items = items;
        list->capacity = capacity;
    }
    list->items[list->size++] = value;
    return 0;
}

static PyObject *to_list(const int64_list *list) {
    PyObject *result = PyList_New(list->size);
    if (result == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < list->size; i++) {
        PyObject *item = PyLong_FromLongLong(list->items[i]);
        if (item == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, i, item);
    }
    return result;
}

/* scan_walk(buf, max_message_bytes, index_interval, next_mark, inner)
 *     -> (valid_bytes, message_count, marks, greatest, first_new, first_set)
 * message.scan_walk: the walk of message.scan, without the GIL (a segment's recovery walks
 * up to a GiB), whose error text message.scan_result makes. */
static PyObject *scan_walk(PyObject *Py_UNUSED(module), PyObject *const *args,
                           Py_ssize_t nargs) {
    if (arguments("scan_walk", nargs, 5) < 0)
        return NULL;
    int64_t max_message_bytes, index_interval, next_mark;
    if (saturated(args[1], &max_message_bytes) < 0 || saturated(args[2], &index_interval) < 0 ||
        saturated(args[3], &next_mark) < 0)
        return NULL;
    int inner = PyObject_IsTrue(args[4]);
    if (inner < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t end = view.len;
    int64_t max_length = max_message_bytes < INT64_MIN + LENGTH_SIZE
                             ? INT64_MIN
                             : max_message_bytes - LENGTH_SIZE;
    if (index_interval <= 0)
        next_mark = (int64_t)end + 1;
    int64_list marks = {0}, greatest = {0};
    int64_t top = NO_TIMESTAMP;
    Py_ssize_t pos = 0, count = 0, first_new = -1, first_set = -1;
    int failed = 0;
    header h;
    Py_BEGIN_ALLOW_THREADS
    while (pos < end && message_end(data, pos, end, max_length, 1, inner, &h) >= 0) {
        if ((h.attributes || h.headers >= 0) && first_new < 0)
            first_new = pos;
        if (h.attributes && first_set < 0)
            first_set = pos;
        if (pos >= next_mark) {
            if (push(&marks, pos) < 0 || push(&greatest, top) < 0) {
                failed = 1;
                break;
            }
            if (__builtin_add_overflow((int64_t)pos, index_interval, &next_mark))
                next_mark = INT64_MAX;
            top = h.timestamp;
        } else if (h.timestamp > top) {
            top = h.timestamp;
        }
        pos = h.following;
        count++;
    }
    if (!failed && push(&greatest, top) < 0)
        failed = 1;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (failed) {
        PyErr_NoMemory();
    } else {
        PyObject *marks_list = to_list(&marks);
        PyObject *greatest_list = marks_list ? to_list(&greatest) : NULL;
        if (greatest_list != NULL)
            result = Py_BuildValue("(nnNNnn)", pos, count, marks_list, greatest_list, first_new,
                                   first_set);
        else
            Py_XDECREF(marks_list);
    }
    PyMem_RawFree(marks.items);
    PyMem_RawFree(greatest.items);
    return result;
}

/* An int object for `value`, the one of the message before when it had the same value (the
 * messages of a batch mostly share their size and timestamp): a new reference. */
static PyObject *shared_int(int64_t value, int64_t *last, PyObject **last_obj) {
    if (*last_obj == NULL || value != *last) {
        PyObject *made = PyLong_FromLongLong(value);
        if (made == NULL)
            return NULL;
        Py_XSETREF(*last_obj, made);
        *last = value;
    }
    return Py_NewRef(*last_obj);
}

/* A new Message: a tuple of the named tuple's own type, made by its tp_alloc (what
 * tuple.__new__(Message, ...) makes, without the intermediate tuple: decode_set costs 224 ns
 * a message so, 350 through a call of tuple.__new__, measured here). Steals the references
 * (size_obj and timestamp_obj may be NULL: an error made them). */
static PyObject *new_message(PyTypeObject *type, PyObject *offset, PyObject *size_obj,
                             PyObject *timestamp_obj, PyObject *key, PyObject *value,
                             uint64_t checksum, PyObject *headers) {
    PyObject *checksum_obj = PyLong_FromUnsignedLongLong(checksum);
    PyObject *message = NULL;
    if (size_obj && timestamp_obj && checksum_obj && headers)
        message = type->tp_alloc(type, 9);
    if (message == NULL) {
        Py_XDECREF(size_obj);
        Py_XDECREF(timestamp_obj);
        Py_XDECREF(checksum_obj);
        Py_DECREF(offset);
        Py_XDECREF(key);
        Py_DECREF(value);
        Py_XDECREF(headers);
        return NULL;
    }
    PyTuple_SET_ITEM(message, 0, offset);
    PyTuple_SET_ITEM(message, 1, size_obj);
    PyTuple_SET_ITEM(message, 2, timestamp_obj);
    PyTuple_SET_ITEM(message, 3, key);
    PyTuple_SET_ITEM(message, 4, value);
    PyTuple_SET_ITEM(message, 5, PyLong_FromLong(0)); /* attributes: only 0 passes */
    PyTuple_SET_ITEM(message, 6, checksum_obj);
    PyTuple_SET_ITEM(message, 7, Py_NewRef(Py_True));
    PyTuple_SET_ITEM(message, 8, headers);
    /* Out of the cyclic GC's lists: it holds ints, bytes, str, None, True and tuples of them
     * only, and a tuple
     * (no __dict__: a named tuple's __slots__ is empty) never changes, so it can be in no
     * cycle. CPython untracks such plain tuples itself, never a subclass's; tracked, a
     * consumer's Messages cost each collection a visit: 225-300 ns a message decoded against
     * 150, and 1,200-1,400 against 390 with 300,000 of them held (perf/bench_codec.py's set,
     * measured here). */
    PyObject_GC_UnTrack(message);
    return message;
}

/* The headers of a format 2 message, `count` of them in its (valid) header block at `at`, as a
 * tuple of (key, value or None) tuples; the empty tuple for -1 (format 1). */
static PyObject *headers_of(const unsigned char *data, Py_ssize_t at, Py_ssize_t count) {
    if (count <= 0)
        return PyTuple_New(0);
    PyObject *headers = PyTuple_New(count);
    if (headers == NULL)
        return NULL;
    at += 4 + 2; /* headers_length, count */
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t key_length = ((Py_ssize_t)data[at] << 8) | data[at + 1];
        PyObject *key = PyUnicode_DecodeUTF8((const char *)data + at + 2, key_length, NULL);
        at += 2 + key_length;
        int32_t value_length = (int32_t)be32(data + at);
        at += 4;
        PyObject *value = value_length < 0 ? Py_NewRef(Py_None)
                                           : PyBytes_FromStringAndSize((const char *)data + at,
                                                                       value_length);
        at += value_length > 0 ? value_length : 0;
        PyObject *pair = key && value ? PyTuple_Pack(2, key, value) : NULL;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (pair == NULL) {
            Py_DECREF(headers);
            return NULL;
        }
        PyTuple_SET_ITEM(headers, i, pair);
    }
    return headers;
}

/* A new record of `target` (decode_records): a tuple of `target->type`, made by its tp_alloc as
 * new_message makes a Message, of (topic, partition, offset, timestamp_ms, key, value, headers,
 * next_offset). Steals the references but topic's and partition's (timestamp_obj and next may
 * be NULL: an error made them). */
typedef struct {
    PyTypeObject *type;
    PyObject *topic, *partition;
} record_target;

static PyObject *new_record(const record_target *target, PyObject *offset, PyObject *timestamp_obj,
                            PyObject *key, PyObject *value, PyObject *headers, PyObject *next) {
    PyObject *record = NULL;
    if (timestamp_obj && headers && next)
        record = target->type->tp_alloc(target->type, 8);
    if (record == NULL) {
        Py_DECREF(offset);
        Py_XDECREF(timestamp_obj);
        Py_XDECREF(key);
        Py_DECREF(value);
        Py_XDECREF(headers);
        Py_XDECREF(next);
        return NULL;
    }
    PyTuple_SET_ITEM(record, 0, Py_NewRef(target->topic));
    PyTuple_SET_ITEM(record, 1, Py_NewRef(target->partition));
    PyTuple_SET_ITEM(record, 2, offset);
    PyTuple_SET_ITEM(record, 3, timestamp_obj);
    PyTuple_SET_ITEM(record, 4, key);
    PyTuple_SET_ITEM(record, 5, value);
    PyTuple_SET_ITEM(record, 6, headers);
    PyTuple_SET_ITEM(record, 7, next);
    /* As a Message (new_message): its items are str, int, bytes, None and tuples of them, and
     * the type has no __dict__ (decode_records checks), so it can be in no cycle. */
    PyObject_GC_UnTrack(record);
    return record;
}

/* decode_set(buf, base_offset, start, set_size) -> (messages, bad_position or None)
 * message.decode_set: the Messages of a set from `start` up to the first that fails its checks
 * (or is a compressed set); with set_size >= 0, the inner set of a compressed set at
 * base_offset, whose size on disk is set_size. With a `target`, records of it instead
 * (decode_records). */
static PyObject *decode_into(PyObject *module, PyObject *const *args,
                              const record_target *target) {
    PyTypeObject *type = state_of(module)->message_type;
    PyObject *base_obj = args[1];
    int64_t base;
    int base_exact;
    if (exact_int64(base_obj, &base, &base_exact) < 0)
        return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t set_size = PyLong_AsSsize_t(args[3]);
    if (set_size == -1 && PyErr_Occurred())
        return NULL;
    int wrapped = set_size >= 0;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t end = view.len;
    if (pos < 0 || pos > end) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "start %zd is outside the set of %zd bytes", pos, end);
        return NULL;
    }
    PyObject *messages = PyList_New(0);
    PyObject *last_size_obj = NULL, *last_timestamp_obj = NULL;
    PyObject *set_offset = NULL;
    int64_t last_size = 0, last_timestamp = 0;
    if (messages == NULL)
        goto error;
    if (wrapped && (set_offset = offset_of(base_obj, base, base_exact, 0)) == NULL)
        goto error;
    header h;
    while (pos < end && message_end(data, pos, end, INT64_MAX, 0, wrapped, &h) >= 0) {
        PyObject *key = NULL;
        Py_ssize_t key_end = pos + HEADER_SIZE;
        if (h.key_length >= 0) {
            key = PyBytes_FromStringAndSize((const char *)data + key_end, h.key_length);
            key_end += h.key_length;
        } else {
            key = Py_NewRef(Py_None);
        }
        PyObject *value =
            PyBytes_FromStringAndSize((const char *)data + h.value_at, h.following - h.value_at);
        PyObject *offset =
            wrapped ? Py_NewRef(set_offset) : offset_of(base_obj, base, base_exact, pos);
        if (key == NULL || value == NULL || offset == NULL) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_XDECREF(offset);
            goto error;
        }
        /* In a set, each message but the last has size 0 (message.decode_set). */
        int64_t size_value = !wrapped ? h.following - pos : h.following == end ? set_size : 0;
        PyObject *size = shared_int(size_value, &last_size, &last_size_obj);
        PyObject *timestamp = shared_int(h.timestamp, &last_timestamp, &last_timestamp_obj);
        PyObject *headers = headers_of(data, key_end, h.headers);
        PyObject *message;
        if (target == NULL) {
            message = new_message(type, offset, size, timestamp, key, value, h.checksum, headers);
        } else { /* next_offset: offset + size, the size a Message would have */
            PyObject *next = size == NULL ? NULL : PyNumber_Add(offset, size);
            Py_XDECREF(size);
            message = new_record(target, offset, timestamp, key, value, headers, next);
        }
        if (message == NULL)
            goto error;
        int appended = PyList_Append(messages, message);
        Py_DECREF(message);
        if (appended < 0)
            goto error;
        pos = h.following;
    }
    PyBuffer_Release(&view);
    Py_XDECREF(last_size_obj);
    Py_XDECREF(last_timestamp_obj);
    Py_XDECREF(set_offset);
    if (pos == end)
        return Py_BuildValue("(NO)", messages, Py_None);
    return Py_BuildValue("(Nn)", messages, pos);
error:
    Py_XDECREF(messages);
    Py_XDECREF(last_size_obj);
    Py_XDECREF(last_timestamp_obj);
    Py_XDECREF(set_offset);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *decode_set(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (arguments("decode_set", nargs, 4) < 0)
        return NULL;
    return decode_into(module, args, NULL);
}

/* decode_records(buf, base_offset, start, set_size, type, topic, partition)
 * -> (records, bad_position or None)
 * message.decode_records: decode_set's messages as records of `type`, a subtype of tuple without
 * a __dict__, each (topic, partition, offset, timestamp_ms, key, value, headers, next_offset). */
static PyObject *decode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (arguments("decode_records", nargs, 7) < 0)
        return NULL;
    PyObject *type = args[4];
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type) ||
        ((PyTypeObject *)type)->tp_dictoffset != 0 ||
        ((PyTypeObject *)type)->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "decode_records: type is a tuple type without __dict__");
        return NULL;
    }
    if (!PyUnicode_CheckExact(args[5]) || !PyLong_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError, "decode_records: topic is a str, partition an int");
        return NULL;
    }
    record_target target = {(PyTypeObject *)type, args[5], args[6]};
    return decode_into(module, args, &target);
}

#define MAX_COLUMN_SET 0x7FFFFFFF
/* The buffers of a Columns, in its order after rows and key_nulls; BAD, `bad`, is not one but
 * sits among them. */
#define BUFFERS 15
#define BAD 7

/* One piece of what decode_columns decodes: a run of messages, or a compressed set's inner
 * set (set_size >= 0: every message has the set's offset, base). */
typedef struct {
    Py_buffer view;
    PyObject *base_obj; /* borrowed from the pieces */
    int64_t base;
    int base_exact;
    Py_ssize_t set_size;
    Py_ssize_t count; /* the messages the first pass took from it */
} piece;

/* Fill `p` from item (buf, base_offset, set_size) of decode_columns's pieces. */
static int piece_of(PyObject *item, piece *p) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_columns: each piece is a tuple (buf, base_offset, set_size)");
        return -1;
    }
    p->base_obj = PyTuple_GET_ITEM(item, 1);
    if (exact_int64(p->base_obj, &p->base, &p->base_exact) < 0)
        return -1;
    p->set_size = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2));
    if (p->set_size == -1 && PyErr_Occurred())
        return -1;
    return PyObject_GetBuffer(PyTuple_GET_ITEM(item, 0), &p->view, PyBUF_SIMPLE);
}

/* decode_columns(pieces, end_offset) -> Columns
 * columns.decode_columns: the messages of pieces (buf, base_offset, set_size) at offsets below
 * end_offset, up to the first that fails its checks, as Arrow buffers (native byte order, as
 * Arrow lays them in memory). */
static PyObject *decode_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (arguments("decode_columns", nargs, 2) < 0)
        return NULL;
    PyTypeObject *type = state_of(module)->columns_type;
    PyObject *end_obj = args[1];
    PyObject *sequence = PySequence_Fast(args[0], "decode_columns takes a sequence of pieces");
    if (sequence == NULL)
        return NULL;
    Py_ssize_t npieces = PySequence_Fast_GET_SIZE(sequence), acquired = 0;
    piece *pieces = PyMem_Calloc((size_t)(npieces ? npieces : 1), sizeof(piece));
    PyObject *buffers[BUFFERS] = {NULL};
    PyObject *result = NULL, *bad = NULL;
    if (pieces == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0;
    for (; acquired < npieces; acquired++) {
        if (piece_of(PySequence_Fast_GET_ITEM(sequence, acquired), &pieces[acquired]) < 0)
            goto done;
        total += pieces[acquired].view.len;
        if (total > MAX_COLUMN_SET) {
            acquired++;
            PyErr_SetString(PyExc_ValueError,
                            "decode_columns takes a set of at most 2 GiB - 1 bytes (Arrow's "
                            "binary offsets are 32-bit)");
            goto done;
        }
    }
    /* Counters of what the buffers hold: rows, key bytes, value bytes, keyless rows, header
     * entries, header key bytes, header value bytes, null header values, rows without
     * headers. */
    enum { ROWS, KEYS, VALUES, KEYLESS, ENTRIES, HKEYS, HVALUES, HNULLS, HEADERLESS, COUNTERS };
    Py_ssize_t n[COUNTERS] = {0}, used = 0;
    header h;
    /* First pass: check, and size the buffers. */
    for (Py_ssize_t i = 0; i < npieces; i++) {
        piece *p = &pieces[i];
        const unsigned char *data = p->view.buf;
        Py_ssize_t end = p->view.len, pos = 0;
        int wrapped = p->set_size >= 0;
        PyObject *limit_obj = PyNumber_Subtract(end_obj, p->base_obj);
        int64_t limit; /* offsets below end_offset: positions below end_offset - base_offset */
        int failed = limit_obj == NULL || saturated(limit_obj, &limit) < 0;
        Py_XDECREF(limit_obj);
        if (failed)
            goto done;
        used = i + 1;
        if (wrapped && limit <= 0) /* the set's offset is at or past end_offset */
            break;
        Py_ssize_t before[COUNTERS];
        memcpy(before, n, sizeof n);
        int stopped = 0; /* at end_offset: a bad message is one that fails its checks first */
        while (pos < end && message_end(data, pos, end, INT64_MAX, 0, wrapped, &h) >= 0) {
            if (!wrapped && pos >= limit) {
                stopped = 1;
                break;
            }
            Py_ssize_t at = wrapped ? 0 : pos;
            int64_t offset;
            int offset_wide =
                !p->base_exact || __builtin_add_overflow(p->base, (int64_t)at, &offset);
            int timestamp_wide =
                h.timestamp > INT64_MAX / 1000 || h.timestamp < INT64_MIN / 1000;
            if (offset_wide || timestamp_wide) {
                PyObject *offset_obj = offset_of(p->base_obj, p->base, p->base_exact, at);
                if (offset_obj == NULL)
                    goto done;
                if (offset_wide)
                    PyErr_Format(PyExc_OverflowError,
                                 "the offset %S is out of the range of Arrow's int64",
                                 offset_obj);
                else
                    PyErr_Format(PyExc_OverflowError,
                                 "the timestamp of the message at offset %S, %lld ms, is out "
                                 "of the range of Arrow's timestamps in microseconds",
                                 offset_obj, (long long)h.timestamp);
                Py_DECREF(offset_obj);
                goto done;
            }
            n[KEYS] += h.key_length >= 0 ? h.key_length : 0;
            n[VALUES] += h.following - h.value_at;
            n[KEYLESS] += h.key_length < 0;
            n[HEADERLESS] += h.headers <= 0;
            if (h.headers > 0) {
                Py_ssize_t q = pos + HEADER_SIZE + (h.key_length > 0 ? h.key_length : 0) + 6;
                for (Py_ssize_t e = 0; e < h.headers; e++) {
                    Py_ssize_t key_length = ((Py_ssize_t)data[q] << 8) | data[q + 1];
                    int32_t value_length = (int32_t)be32(data + q + 2 + key_length);
                    n[HKEYS] += key_length;
                    n[HVALUES] += value_length > 0 ? value_length : 0;
                    n[HNULLS] += value_length < 0;
                    q += 2 + key_length + 4 + (value_length > 0 ? value_length : 0);
                }
                n[ENTRIES] += h.headers;
            }
            n[ROWS]++;
            pos = h.following;
        }
        if (!stopped && pos < end) {
            /* A message failed: the set it is in is damaged whole; a run keeps what came
             * before it. `bad` is its position counted from the first piece's base. */
            if (wrapped) {
                memcpy(n, before, sizeof n);
                pos = 0;
            }
            PyObject *at = offset_of(p->base_obj, p->base, p->base_exact, pos);
            if (at == NULL)
                goto done;
            bad = PyNumber_Subtract(at, pieces[0].base_obj);
            Py_DECREF(at);
            if (bad == NULL)
                goto done;
        }
        p->count = n[ROWS] - before[ROWS];
        if (stopped || bad != NULL)
            break;
    }
    Py_ssize_t count = n[ROWS], entries = n[ENTRIES];
    Py_ssize_t sizes[BUFFERS] = {
        (count + 7) / 8,   (count + 1) * 4,   n[KEYS],
        (count + 1) * 4,   n[VALUES],         count * 8,
        count * 8,         0 /* bad */,       (count + 7) / 8,
        (count + 1) * 4,   (entries + 1) * 4, n[HKEYS],
        (entries + 7) / 8, (entries + 1) * 4, n[HVALUES],
    };
    for (int j = 0; j < BUFFERS; j++)
        if (j != BAD && (buffers[j] = PyBytes_FromStringAndSize(NULL, sizes[j])) == NULL)
            goto done;
    unsigned char *validity = (unsigned char *)PyBytes_AS_STRING(buffers[0]);
    int32_t *key_offsets = (int32_t *)PyBytes_AS_STRING(buffers[1]);
    char *key_data = PyBytes_AS_STRING(buffers[2]);
    int32_t *value_offsets = (int32_t *)PyBytes_AS_STRING(buffers[3]);
    char *value_data = PyBytes_AS_STRING(buffers[4]);
    int64_t *offsets = (int64_t *)PyBytes_AS_STRING(buffers[5]);
    int64_t *micros = (int64_t *)PyBytes_AS_STRING(buffers[6]);
    unsigned char *header_validity = (unsigned char *)PyBytes_AS_STRING(buffers[8]);
    int32_t *header_offsets = (int32_t *)PyBytes_AS_STRING(buffers[9]);
    int32_t *hkey_offsets = (int32_t *)PyBytes_AS_STRING(buffers[10]);
    char *hkey_data = PyBytes_AS_STRING(buffers[11]);
    unsigned char *hvalue_validity = (unsigned char *)PyBytes_AS_STRING(buffers[12]);
    int32_t *hvalue_offsets = (int32_t *)PyBytes_AS_STRING(buffers[13]);
    char *hvalue_data = PyBytes_AS_STRING(buffers[14]);
    memset(validity, 0, (size_t)sizes[0]);
    memset(header_validity, 0, (size_t)sizes[8]);
    memset(hvalue_validity, 0, (size_t)sizes[12]);
    /* Second pass: the messages are known good; fill the buffers. */
    int32_t key_at = 0, value_at = 0, hkey_at = 0, hvalue_at = 0;
    Py_ssize_t i = 0, e = 0;
    for (Py_ssize_t k = 0; k < used; k++) {
        const piece *q = &pieces[k];
        const unsigned char *data = q->view.buf;
        int wrapped = q->set_size >= 0;
        Py_ssize_t pos = 0;
        for (Py_ssize_t m = 0; m < q->count; m++, i++) {
            const unsigned char *p = data + pos;
            Py_ssize_t following = pos + LENGTH_SIZE + be32(p);
            int32_t key_length = (int32_t)be32(p + 22);
            Py_ssize_t key_end = pos + HEADER_SIZE, value_start;
            key_offsets[i] = key_at;
            if (key_length >= 0) {
                validity[i >> 3] |= (unsigned char)(1 << (i & 7));
                memcpy(key_data + key_at, p + HEADER_SIZE, (size_t)key_length);
                key_at += key_length;
                key_end += key_length;
            }
            header_offsets[i] = (int32_t)e;
            value_start = key_end;
            if (p[12] == MAGIC_V2) {
                value_start = key_end + 4 + (Py_ssize_t)be32(data + key_end);
                Py_ssize_t headers = ((Py_ssize_t)data[key_end + 4] << 8) | data[key_end + 5];
                Py_ssize_t r = key_end + 6;
                if (headers > 0)
                    header_validity[i >> 3] |= (unsigned char)(1 << (i & 7));
                for (Py_ssize_t x = 0; x < headers; x++, e++) {
                    Py_ssize_t hkey = ((Py_ssize_t)data[r] << 8) | data[r + 1];
                    hkey_offsets[e] = hkey_at;
                    memcpy(hkey_data + hkey_at, data + r + 2, (size_t)hkey);
                    hkey_at += (int32_t)hkey;
                    r += 2 + hkey;
                    int32_t hvalue = (int32_t)be32(data + r);
                    r += 4;
                    hvalue_offsets[e] = hvalue_at;
                    if (hvalue >= 0) {
                        hvalue_validity[e >> 3] |= (unsigned char)(1 << (e & 7));
                        memcpy(hvalue_data + hvalue_at, data + r, (size_t)hvalue);
                        hvalue_at += hvalue;
                        r += hvalue;
                    }
                }
            }
            value_offsets[i] = value_at;
            memcpy(value_data + value_at, data + value_start, (size_t)(following - value_start));
            value_at += (int32_t)(following - value_start);
            /* the first pass checked that it fits */
            offsets[i] = q->base + (wrapped ? 0 : (int64_t)pos);
            micros[i] = (int64_t)be64(p + 14) * 1000;
            pos = following;
        }
    }
    key_offsets[count] = key_at;
    value_offsets[count] = value_at;
    header_offsets[count] = (int32_t)e;
    hkey_offsets[entries] = hkey_at;
    hvalue_offsets[entries] = hvalue_at;
    buffers[BAD] = bad != NULL ? bad : Py_NewRef(Py_None);
    bad = NULL;
    result = type->tp_alloc(type, 2 + BUFFERS + 3);
    if (result == NULL)
        goto done;
    PyObject *numbers[5] = {PyLong_FromSsize_t(count), PyLong_FromSsize_t(n[KEYLESS]),
                            PyLong_FromSsize_t(n[HEADERLESS]), PyLong_FromSsize_t(entries),
                            PyLong_FromSsize_t(n[HNULLS])};
    if (!numbers[0] || !numbers[1] || !numbers[2] || !numbers[3] || !numbers[4]) {
        for (int j = 0; j < 5; j++)
            Py_XDECREF(numbers[j]);
        Py_CLEAR(result);
        goto done;
    }
    PyTuple_SET_ITEM(result, 0, numbers[0]);
    PyTuple_SET_ITEM(result, 1, numbers[1]);
    for (int j = 0; j < BUFFERS; j++) {
        PyTuple_SET_ITEM(result, j + 2, buffers[j]);
        buffers[j] = NULL;
    }
    for (int j = 2; j < 5; j++)
        PyTuple_SET_ITEM(result, 2 + BUFFERS + j - 2, numbers[j]);
done:
    for (int j = 0; j < BUFFERS; j++)
        Py_XDECREF(buffers[j]);
    Py_XDECREF(bad);
    for (Py_ssize_t j = 0; j < acquired; j++)
        if (pieces[j].view.obj != NULL)
            PyBuffer_Release(&pieces[j].view);
    PyMem_Free(pieces);
    Py_DECREF(sequence);
    return result;
}

/* The bytes-like object `obj` as a buffer; else the TypeError of `b"" + obj`. */
static int concat_buffer(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) == 0)
        return 0;
    PyErr_Format(PyExc_TypeError, "can't concat %.100s to bytes", Py_TYPE(obj)->tp_name);
    return -1;
}

/* `value` as struct's "q" packs it, else struct.error as struct raises it. */
static int pack_int64(codec_state *state, PyObject *value, int64_t *out) {
    if (!PyLong_Check(value) && !PyIndex_Check(value)) {
        PyErr_SetString(state->struct_error, "required argument is not an integer");
        return -1;
    }
    PyObject *number = PyNumber_Index(value);
    if (number == NULL)
        return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(number, &overflow);
    Py_DECREF(number);
    if (overflow) {
        PyErr_SetString(state->struct_error, "int too large to convert");
        return -1;
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

/* encode_message(value, key=None, timestamp_ms=None) -> bytes
 * message.encode_message, the producer's encode of every message. */
/* Append `n` bytes at `p` to the growable buffer `out` (its `size` used, `capacity` held). */
static int grow_append(unsigned char **out, Py_ssize_t *size, Py_ssize_t *capacity,
                       const void *p, Py_ssize_t n) {
    if (*size + n > *capacity) {
        Py_ssize_t capacity_ = (*capacity ? *capacity : 64);
        while (capacity_ < *size + n)
            capacity_ *= 2;
        unsigned char *grown = PyMem_Realloc(*out, (size_t)capacity_);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *out = grown;
        *capacity = capacity_;
    }
    if (n)
        memcpy(*out + *size, p, (size_t)n);
    *size += n;
    return 0;
}

/* headers.header_block_bytes: the header block (headers_length included) of `headers`, an
 * iterable of (key, value or None) pairs, as new bytes; NULL with message.py's error set. */
static PyObject *header_block_bytes(PyObject *headers) {
    PyObject *iterator = PyObject_GetIter(headers), *item, *result = NULL;
    if (iterator == NULL)
        return NULL;
    unsigned char *out = NULL, field[4];
    Py_ssize_t size = 0, capacity = 0, count = 0;
    if (grow_append(&out, &size, &capacity, "\0\0\0\0\0\0", 6) < 0)
        goto done;
    while ((item = PyIter_Next(iterator)) != NULL) {
        PyObject *pair = PySequence_Check(item) ? PySequence_Tuple(item) : NULL;
        if (pair == NULL || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "a header is a (key, value) pair, not %R", item);
            Py_XDECREF(pair);
            Py_DECREF(item);
            goto done;
        }
        Py_DECREF(item);
        PyObject *name = PyTuple_GET_ITEM(pair, 0), *data = PyTuple_GET_ITEM(pair, 1);
        int failed = 0;
        if (!PyUnicode_Check(name)) {
            PyErr_Format(PyExc_TypeError, "a header's key is a str, not %s",
                         Py_TYPE(name)->tp_name);
            failed = 1;
        }
        Py_ssize_t key_length = 0;
        const char *key = failed ? NULL : PyUnicode_AsUTF8AndSize(name, &key_length);
        if (!failed && key == NULL)
            failed = 1;
        if (!failed && key_length > 0xFFFF) {
            PyObject *start = PyUnicode_Substring(name, 0, 40);
            if (start != NULL)
                PyErr_Format(PyExc_ValueError, "header key %R... is over 65535 bytes of UTF-8",
                             start);
            Py_XDECREF(start);
            failed = 1;
        }
        if (!failed) {
            field[0] = (unsigned char)(key_length >> 8), field[1] = (unsigned char)key_length;
            failed = grow_append(&out, &size, &capacity, field, 2) < 0 ||
                     grow_append(&out, &size, &capacity, key, key_length) < 0;
        }
        if (!failed && data == Py_None) {
            put32(field, UINT32_MAX);
            failed = grow_append(&out, &size, &capacity, field, 4) < 0;
        } else if (!failed && (PyBytes_Check(data) || PyByteArray_Check(data) ||
                               PyMemoryView_Check(data))) {
            Py_buffer view;
            failed = PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0;
            if (!failed && view.len > INT32_MAX) {
                PyErr_Format(PyExc_ValueError, "the value of header %R is over 2 GiB", name);
                failed = 1;
            }
            if (!failed) {
                put32(field, (uint32_t)view.len);
                failed = grow_append(&out, &size, &capacity, field, 4) < 0 ||
                         grow_append(&out, &size, &capacity, view.buf, view.len) < 0;
            }
            if (view.obj != NULL)
                PyBuffer_Release(&view);
        } else if (!failed) {
            PyErr_Format(PyExc_TypeError, "the value of header %R is bytes or None, not %s",
                         name, Py_TYPE(data)->tp_name);
            failed = 1;
        }
        Py_DECREF(pair);
        if (failed)
            goto done;
        if (++count > 0xFFFF) {
            PyErr_SetString(PyExc_ValueError, "a message holds at most 65535 headers");
            goto done;
        }
    }
    if (PyErr_Occurred())
        goto done;
    put32(out, (uint32_t)(size - 4));
    out[4] = (unsigned char)(count >> 8), out[5] = (unsigned char)count;
    result = PyBytes_FromStringAndSize((const char *)out, size);
done:
    PyMem_Free(out);
    Py_DECREF(iterator);
    return result;
}

static PyObject *encode_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    static const char *const names[] = {"value", "key", "timestamp_ms", "inner", "headers"};
    PyObject *given[5] = {NULL, Py_None, Py_None, Py_False, Py_None};
    if (nargs > 5) {
        PyErr_Format(PyExc_TypeError,
                     "encode_message() takes from 1 to 5 positional arguments but %zd were given",
                     nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        given[i] = args[i];
    Py_ssize_t keywords = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < keywords; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int i = 0;
        while (i < 5 && PyUnicode_CompareWithASCIIString(name, names[i]) != 0)
            i++;
        if (i == 5) {
            PyErr_Format(PyExc_TypeError,
                         "encode_message() got an unexpected keyword argument '%U'", name);
            return NULL;
        }
        if (i < nargs) {
            PyErr_Format(PyExc_TypeError, "encode_message() got multiple values for argument '%s'",
                         names[i]);
            return NULL;
        }
        given[i] = args[nargs + k];
    }
    if (given[0] == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_message() missing 1 required positional argument: 'value'");
        return NULL;
    }
    codec_state *state = state_of(module);
    PyObject *value = given[0], *key = given[1];
    int inner = PyObject_IsTrue(given[3]);
    if (inner < 0)
        return NULL;
    PyObject *block = given[4] == Py_None ? NULL : header_block_bytes(given[4]);
    if (given[4] != Py_None && block == NULL)
        return NULL;
    Py_ssize_t block_length = block ? PyBytes_GET_SIZE(block) : 0;
    int64_t timestamp = 0;
    if (given[2] == Py_None) {
        struct timespec now; /* time.time_ns() // 1_000_000, as message.py takes it */
        clock_gettime(CLOCK_REALTIME, &now);
        timestamp = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    }
    /* In message.py's order: len(key), the header's packing, key, value, the prefix's. */
    Py_buffer key_view = {0}, value_view = {0};
    int has_key = key != Py_None;
    if (has_key && PyObject_GetBuffer(key, &key_view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        if (PyObject_Size(key) < 0) { /* the TypeError of len(key) */
            Py_XDECREF(block);
            return NULL;
        }
        has_key = 0; /* sized but no buffer: the concatenation below refuses it */
    }
    PyObject *result = NULL;
    if (given[2] != Py_None && pack_int64(state, given[2], &timestamp) < 0)
        goto done;
    if (key_view.len > INT32_MAX) {
        PyErr_SetString(state->struct_error,
                        "'i' format requires -2147483648 <= number <= 2147483647");
        goto done;
    }
    if (key != Py_None && !has_key && concat_buffer(key, &key_view) < 0)
        goto done;
    if (concat_buffer(value, &value_view) < 0)
        goto done;
    Py_ssize_t body = HEADER_SIZE - CHECKSUM_START + key_view.len + block_length + value_view.len;
    if (body + 8 > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(state->struct_error, "'I' format requires 0 <= number <= 4294967295");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, CHECKSUM_START + body);
    if (result == NULL)
        goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    put32(out, (uint32_t)(body + 8));
    out[12] = block ? MAGIC_V2 : MAGIC;
    out[13] = 0;
    put64(out + 14, (uint64_t)timestamp);
    put32(out + 22, key != Py_None ? (uint32_t)key_view.len : UINT32_MAX);
    if (key_view.len)
        memcpy(out + HEADER_SIZE, key_view.buf, (size_t)key_view.len);
    if (block_length)
        memcpy(out + HEADER_SIZE + key_view.len, PyBytes_AS_STRING(block), (size_t)block_length);
    if (value_view.len)
        memcpy(out + HEADER_SIZE + key_view.len + block_length, value_view.buf,
               (size_t)value_view.len);
    put64(out + 4, inner ? 0 : XXH3_64bits(out + CHECKSUM_START, (size_t)body));
done:
    Py_XDECREF(block);
    if (key_view.obj != NULL)
        PyBuffer_Release(&key_view);
    if (value_view.obj != NULL)
        PyBuffer_Release(&value_view);
    return result;
}

static PyMethodDef codec_methods[] = {
    {"scan_walk", (PyCFunction)(void (*)(void))scan_walk, METH_FASTCALL,
     "scan_walk(buf, max_message_bytes, index_interval, next_mark, inner): "
     "message.scan_walk."},
    {"decode_set", (PyCFunction)(void (*)(void))decode_set, METH_FASTCALL,
     "decode_set(buf, base_offset, start, set_size): message.decode_set."},
    {"decode_records", (PyCFunction)(void (*)(void))decode_records, METH_FASTCALL,
     "decode_records(buf, base_offset, start, set_size, type, topic, partition): "
     "message.decode_records."},
    {"decode_columns", (PyCFunction)(void (*)(void))decode_columns, METH_FASTCALL,
     "decode_columns(pieces, end_offset): columns.decode_columns."},
    {"encode_message", (PyCFunction)(void (*)(void))encode_message,
     METH_FASTCALL | METH_KEYWORDS,
     "encode_message(value, key=None, timestamp_ms=None, inner=False, headers=None): "
     "message.encode_message."},
    {NULL, NULL, 0, NULL},
};

static PyObject *attribute_of(const char *module_name, const char *name) {
    PyObject *module = PyImport_ImportModule(module_name);
    if (module == NULL)
        return NULL;
    PyObject *attribute = PyObject_GetAttrString(module, name);
    Py_DECREF(module);
    return attribute;
}

static int codec_exec(PyObject *module) {
    codec_state *state = state_of(module);
    state->message_type = (PyTypeObject *)attribute_of("broker.log.message", "Message");
    state->columns_type = (PyTypeObject *)attribute_of("broker.log.columns", "Columns");
    state->struct_error = attribute_of("struct", "error");
    if (!state->message_type || !state->columns_type || !state->struct_error)
        return -1;
    if (!PyType_Check(state->message_type) || !PyType_Check(state->columns_type)) {
        PyErr_SetString(PyExc_TypeError,
                        "broker.log.message.Message and broker.log.columns.Columns must be types");
        return -1;
    }
    return 0;
}

static int codec_traverse(PyObject *module, visitproc visit, void *arg) {
    codec_state *state = state_of(module);
    Py_VISIT(state->message_type);
    Py_VISIT(state->columns_type);
    Py_VISIT(state->struct_error);
    return 0;
}

static int codec_clear(PyObject *module) {
    codec_state *state = state_of(module);
    Py_CLEAR(state->message_type);
    Py_CLEAR(state->columns_type);
    Py_CLEAR(state->struct_error);
    return 0;
}

static void codec_free(void *module) { codec_clear((PyObject *)module); }

static PyModuleDef_Slot codec_slots[] = {
    {Py_mod_exec, codec_exec},
    {0, NULL},
};

static struct PyModuleDef codec_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "broker.log._codec",
    .m_doc = "The message format's hot loops in C; broker.log.message, .headers and .columns are "
             "the reference.",
    .m_size = sizeof(codec_state),
    .m_methods = codec_methods,
    .m_slots = codec_slots,
    .m_traverse = codec_traverse,
    .m_clear = codec_clear,
    .m_free = codec_free,
};

PyMODINIT_FUNC PyInit__codec(void) { return PyModuleDef_Init(&codec_module); }
