/*
 * protocol._columns: a batch's records section to and from columns, in C.
 *
 * The records section (storage/batch.py) is one msgpack array per record,
 * [timestamp_delta, offset_delta, key, value, headers]. Spark's reader wants
 * Arrow columns and Spark's writer hands Arrow columns over; going through a
 * Python object per record costs more than everything else on both paths.
 * These functions walk the section (or the columns) once, in C:
 *
 *   decode(section, count)  -> the section as columns: Arrow-layout buffers
 *   encode(key_offsets, key_data, key_validity, value_offsets, value_data,
 *          value_validity, rows) -> the records section of those rows
 *   murmur2(offsets, data, validity) -> Kafka's murmur2 of every key
 *   records(cls, items, topic, partition, base_offset, base_timestamp,
 *           timestamp_type, include_headers) -> the consumer's records
 *
 * Everything here has a pure-Python equivalent in protocol/columns.py, which
 * is used when this extension is not built and is checked against it by
 * tests/unit/test_columns.py. Input is untrusted bytes: every read is bounds
 * checked and anything unexpected raises ValueError (the caller falls back
 * to the general decoder, which says what is wrong).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../storage/_records.h"

/* A validity bitmap (Arrow's: bit i of byte i/8, least significant first)
 * from per-record lengths, -1 meaning null; None if nothing is null. */
static PyObject *validity(const int64_t *lens, Py_ssize_t n, Py_ssize_t nulls) {
    if (!nulls) Py_RETURN_NONE;
    PyObject *bits = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    if (!bits) return NULL;
    uint8_t *b = (uint8_t *)PyBytes_AS_STRING(bits);
    memset(b, 0, (n + 7) / 8);
    for (Py_ssize_t i = 0; i < n; i++)
        if (lens[i] >= 0) b[i >> 3] |= (uint8_t)(1u << (i & 7));
    return bits;
}

/* The offsets (int32, count + 1) and data of one binary column. */
static int gather(const uint8_t *const *starts, const int64_t *lens, Py_ssize_t n,
                  int64_t total, PyObject **offsets_out, PyObject **data_out) {
    if (total > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a column holds more than 2 GiB");
        return -1;
    }
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * sizeof(int32_t));
    PyObject *data = PyBytes_FromStringAndSize(NULL, total);
    if (!offsets || !data) { Py_XDECREF(offsets); Py_XDECREF(data); return -1; }
    int32_t *o = (int32_t *)PyBytes_AS_STRING(offsets);
    char *d = PyBytes_AS_STRING(data);
    int32_t at = 0;
    o[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (lens[i] > 0) {
            memcpy(d + at, starts[i], (size_t)lens[i]);
            at += (int32_t)lens[i];
        }
        o[i + 1] = at;
    }
    *offsets_out = offsets;
    *data_out = data;
    return 0;
}

PyDoc_STRVAR(decode_doc,
"decode(sections) -> (timestamps, offsets, key_offsets, key_data, key_validity,\n"
"    value_offsets, value_data, value_validity, header_spans)\n\n"
"Uncompressed records sections, each given as (section, count, base_offset,\n"
"base_timestamp, last_offset_delta), as one set of columns: int64 offsets and\n"
"timestamps (base + delta), Arrow binary layouts (int32 offsets, data,\n"
"validity bitmap or None) of keys and values, and header_spans: None when no\n"
"record has headers, else int64 (section index, start, end) of each record's\n"
"headers array. ValueError unless each section is exactly `count` records\n"
"with offset deltas increasing from 0 or more, up to last_offset_delta.");

static PyObject *decode(PyObject *self, PyObject *args) {
    PyObject *list;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &list)) return NULL;
    Py_ssize_t sections = PyList_GET_SIZE(list);
    PyObject *result = NULL, *ts = NULL, *od = NULL, *ko = NULL, *kd = NULL, *kv = NULL,
             *vo = NULL, *vd = NULL, *vv = NULL, *hs = NULL;
    const uint8_t **kstart = NULL, **vstart = NULL;
    int64_t *klen = NULL, *vlen = NULL, *spans = NULL;
    Py_buffer *bufs = PyMem_Calloc(sections + 1, sizeof(Py_buffer));
    Py_ssize_t *counts = PyMem_Calloc(sections + 1, sizeof(Py_ssize_t));
    int64_t *bases = PyMem_Calloc(3 * sections + 1, sizeof(int64_t));
    Py_ssize_t held = 0, total = 0;
    if (!bufs || !counts || !bases) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t s = 0; s < sections; s++) {
        PyObject *item = PyList_GET_ITEM(list, s);
        long long base_offset, base_timestamp, last_delta;
        if (!PyTuple_Check(item) ||
                !PyArg_ParseTuple(item, "y*nLLL", &bufs[s], &counts[s], &base_offset,
                                  &base_timestamp, &last_delta)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "each section is a tuple (section, count, "
                                "base_offset, base_timestamp, last_offset_delta)");
            goto done;
        }
        held = s + 1;
        if (counts[s] < 0 || counts[s] > bufs[s].len / MIN_RECORD_BYTES) {
            bad("count out of range", 0);
            goto done;
        }
        bases[3 * s] = base_offset;
        bases[3 * s + 1] = base_timestamp;
        bases[3 * s + 2] = last_delta;
        total += counts[s];
    }
    ts = PyBytes_FromStringAndSize(NULL, total * 8);
    od = PyBytes_FromStringAndSize(NULL, total * 8);
    kstart = PyMem_Malloc((total + 1) * sizeof(*kstart));
    vstart = PyMem_Malloc((total + 1) * sizeof(*vstart));
    klen = PyMem_Malloc((total + 1) * sizeof(*klen));
    vlen = PyMem_Malloc((total + 1) * sizeof(*vlen));
    spans = PyMem_Malloc((3 * total + 1) * sizeof(*spans));
    if (!ts || !od || !kstart || !vstart || !klen || !vlen || !spans) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *tsd = (int64_t *)PyBytes_AS_STRING(ts), *odd = (int64_t *)PyBytes_AS_STRING(od);
    int64_t ktotal = 0, vtotal = 0;
    Py_ssize_t knulls = 0, vnulls = 0, with_headers = 0, i = 0;
    for (Py_ssize_t s = 0; s < sections; s++) {
        cursor c = {(const uint8_t *)bufs[s].buf, (const uint8_t *)bufs[s].buf + bufs[s].len};
        const uint8_t *base = c.p;
        int64_t last = -1, delta;
        for (Py_ssize_t r = 0; r < counts[s]; r++, i++) {
            record rec;
            const char *wrong = read_record(&c, &rec);
            if (wrong) { bad(wrong, r); goto done; }
            delta = rec.offset_delta;
            if (delta <= last || delta > bases[3 * s + 2]) {
                bad("offset deltas out of order or past the batch's last offset", r);
                goto done;
            }
            last = delta;
            if (__builtin_add_overflow(bases[3 * s], delta, &odd[i])) {
                bad("offset past 2**63", r);
                goto done;
            }
            tsd[i] = (int64_t)((uint64_t)bases[3 * s + 1] + (uint64_t)rec.timestamp_delta);
            kstart[i] = rec.key; klen[i] = rec.key_len;
            vstart[i] = rec.value; vlen[i] = rec.value_len;
            if (klen[i] < 0) knulls++; else ktotal += klen[i];
            if (vlen[i] < 0) vnulls++; else vtotal += vlen[i];
            spans[3 * i] = s;
            spans[3 * i + 1] = rec.headers - base;
            with_headers += rec.has_headers;
            spans[3 * i + 2] = rec.end - base;
        }
        if (c.p != c.end) { bad("bytes after the last record", counts[s]); goto done; }
    }
    if (gather(kstart, klen, total, ktotal, &ko, &kd)) goto done;
    if (gather(vstart, vlen, total, vtotal, &vo, &vd)) goto done;
    if (!(kv = validity(klen, total, knulls)) || !(vv = validity(vlen, total, vnulls))) goto done;
    if (with_headers) {
        hs = PyBytes_FromStringAndSize((const char *)spans, 3 * total * sizeof(*spans));
        if (!hs) goto done;
    } else {
        hs = Py_None;
        Py_INCREF(hs);
    }
    result = PyTuple_Pack(9, ts, od, ko, kd, kv, vo, vd, vv, hs);
done:
    Py_XDECREF(ts); Py_XDECREF(od); Py_XDECREF(ko); Py_XDECREF(kd); Py_XDECREF(kv);
    Py_XDECREF(vo); Py_XDECREF(vd); Py_XDECREF(vv); Py_XDECREF(hs);
    PyMem_Free(kstart); PyMem_Free(vstart); PyMem_Free(klen); PyMem_Free(vlen);
    PyMem_Free(spans);
    for (Py_ssize_t s = 0; s < held; s++) PyBuffer_Release(&bufs[s]);
    PyMem_Free(bufs); PyMem_Free(counts); PyMem_Free(bases);
    return result;
}

/* -- writing ------------------------------------------------------------------ */

/* One Arrow binary column: int32 offsets (already at the array's offset),
 * data, and an optional validity bitmap with its bit offset. */
typedef struct {
    Py_buffer offsets, data, valid;
    int has_valid;
    Py_ssize_t bit_offset, rows;
} column;

static void release(column *col) {
    if (col->offsets.obj) PyBuffer_Release(&col->offsets);
    if (col->data.obj) PyBuffer_Release(&col->data);
    if (col->has_valid) PyBuffer_Release(&col->valid);
}

/* Fill `col` from (offsets, data, validity-or-None, bit_offset). 0 on success. */
static int column_from(PyObject *offsets, PyObject *data, PyObject *valid, Py_ssize_t bit_offset,
                       column *col) {
    memset(col, 0, sizeof(*col));
    if (PyObject_GetBuffer(offsets, &col->offsets, PyBUF_SIMPLE) ||
            PyObject_GetBuffer(data, &col->data, PyBUF_SIMPLE))
        return -1;
    if (col->offsets.len < 4 || col->offsets.len % 4) {
        PyErr_SetString(PyExc_ValueError, "offsets must be int32, one more than the rows");
        return -1;
    }
    col->rows = col->offsets.len / 4 - 1;
    const int32_t *o = col->offsets.buf;
    for (Py_ssize_t i = 0; i < col->rows; i++)
        if (o[i] < 0 || o[i] > o[i + 1]) {
            PyErr_SetString(PyExc_ValueError, "offsets must not decrease");
            return -1;
        }
    if (o[col->rows] > col->data.len) {
        PyErr_SetString(PyExc_ValueError, "offsets run past the data");
        return -1;
    }
    if (valid != Py_None) {
        if (PyObject_GetBuffer(valid, &col->valid, PyBUF_SIMPLE)) return -1;
        col->has_valid = 1;
        col->bit_offset = bit_offset;
        if (bit_offset < 0 || (col->rows + bit_offset + 7) / 8 > col->valid.len) {
            PyErr_SetString(PyExc_ValueError, "validity bitmap too short");
            return -1;
        }
    }
    return 0;
}

static inline int is_null(const column *col, Py_ssize_t i) {
    if (!col->has_valid) return 0;
    Py_ssize_t bit = i + col->bit_offset;
    return !(((const uint8_t *)col->valid.buf)[bit >> 3] & (1u << (bit & 7)));
}

static inline uint8_t *put_uint(uint8_t *p, uint64_t v) {
    if (v < 128) { *p++ = (uint8_t)v; }
    else if (v < 256) { *p++ = 0xcc; *p++ = (uint8_t)v; }
    else if (v < 65536) { *p++ = 0xcd; *p++ = (uint8_t)(v >> 8); *p++ = (uint8_t)v; }
    else {
        *p++ = 0xce;
        *p++ = (uint8_t)(v >> 24); *p++ = (uint8_t)(v >> 16);
        *p++ = (uint8_t)(v >> 8); *p++ = (uint8_t)v;
    }
    return p;
}

static inline uint8_t *put_bin(uint8_t *p, const column *col, Py_ssize_t i) {
    if (is_null(col, i)) { *p++ = 0xc0; return p; }
    const int32_t *o = col->offsets.buf;
    uint32_t len = (uint32_t)(o[i + 1] - o[i]);
    if (len < 256) { *p++ = 0xc4; *p++ = (uint8_t)len; }
    else if (len < 65536) { *p++ = 0xc5; *p++ = (uint8_t)(len >> 8); *p++ = (uint8_t)len; }
    else {
        *p++ = 0xc6;
        *p++ = (uint8_t)(len >> 24); *p++ = (uint8_t)(len >> 16);
        *p++ = (uint8_t)(len >> 8); *p++ = (uint8_t)len;
    }
    memcpy(p, (const uint8_t *)col->data.buf + o[i], len);
    return p + len;
}

PyDoc_STRVAR(encode_doc,
"encode(key_offsets, key_data, key_validity, key_bit_offset, value_offsets,\n"
"       value_data, value_validity, value_bit_offset, rows[, room]) -> bytes\n\n"
"The records section of the given rows (an int64 buffer of row numbers) of\n"
"a key and a value column in Arrow's binary layout (int32 offsets of the\n"
"rows, data, validity bitmap or None): record j is\n"
"[0, j, key, value, []], the same bytes msgpack's Packer makes. With room,\n"
"a bytearray whose first `room` bytes (zeroed) are left free before the\n"
"section, for the batch header to be written in place.");

static PyObject *encode(PyObject *self, PyObject *args) {
    PyObject *ko, *kd, *kv, *vo, *vd, *vv, *rows_obj;
    Py_ssize_t kbit, vbit, room = 0;
    if (!PyArg_ParseTuple(args, "OOOnOOOnO|n", &ko, &kd, &kv, &kbit, &vo, &vd, &vv, &vbit,
                          &rows_obj, &room))
        return NULL;
    if (room < 0 || room > 4096) {
        PyErr_SetString(PyExc_ValueError, "room must be 0 to 4096 bytes");
        return NULL;
    }
    column key, value;
    Py_buffer rows = {0};
    PyObject *out = NULL;
    memset(&key, 0, sizeof(key));
    memset(&value, 0, sizeof(value));
    if (column_from(ko, kd, kv, kbit, &key) || column_from(vo, vd, vv, vbit, &value) ||
            PyObject_GetBuffer(rows_obj, &rows, PyBUF_SIMPLE))
        goto done;
    if (key.rows != value.rows || rows.len % 8) {
        PyErr_SetString(PyExc_ValueError, "key and value columns differ in length, or rows "
                        "is not int64");
        goto done;
    }
    Py_ssize_t n = rows.len / 8;
    const int64_t *r = rows.buf;
    const int32_t *kof = key.offsets.buf, *vof = value.offsets.buf;
    uint64_t size = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (r[j] < 0 || r[j] >= key.rows) {
            PyErr_SetString(PyExc_IndexError, "row number out of range");
            goto done;
        }
        /* array, ts, offset (<= 5), key and value headers (<= 5 each), headers */
        size += 1 + 1 + 5 + 5 + 5 + 1 + (uint64_t)(kof[r[j] + 1] - kof[r[j]]) +
                (uint64_t)(vof[r[j] + 1] - vof[r[j]]);
    }
    if (size > PY_SSIZE_T_MAX / 2) { PyErr_NoMemory(); goto done; }
    size += (uint64_t)room;
    out = room ? PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)size)
               : PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!out) goto done;
    uint8_t *start = room ? (uint8_t *)PyByteArray_AS_STRING(out)
                          : (uint8_t *)PyBytes_AS_STRING(out);
    memset(start, 0, (size_t)room);
    uint8_t *p = start + room;
    for (Py_ssize_t j = 0; j < n; j++) {
        *p++ = 0x95;
        *p++ = 0;
        p = put_uint(p, (uint64_t)j);
        p = put_bin(p, &key, r[j]);
        p = put_bin(p, &value, r[j]);
        *p++ = 0x90;
    }
    if (room) {
        if (PyByteArray_Resize(out, p - start)) Py_CLEAR(out);
    } else if (_PyBytes_Resize(&out, p - start)) {
        out = NULL;
    }
done:
    release(&key);
    release(&value);
    if (rows.obj) PyBuffer_Release(&rows);
    return out;
}

/* -- Kafka's murmur2 ------------------------------------------------------------ */

static uint32_t murmur2_one(const uint8_t *data, uint32_t length) {
    const uint32_t m = 0x5bd1e995;
    uint32_t h = 0x9747b28cu ^ length;
    uint32_t whole = length & ~3u;
    for (uint32_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 |
                     (uint32_t)data[i + 2] << 16 | (uint32_t)data[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3: h ^= (uint32_t)data[whole + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t)data[whole + 1] << 8;  /* fall through */
    case 1: h ^= data[whole]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

PyDoc_STRVAR(murmur2_doc,
"murmur2(offsets, data, validity, bit_offset) -> bytes\n\n"
"Kafka's murmur2 of every key of an Arrow binary column, made positive\n"
"(& 0x7fffffff) as the default partitioner does: int32, -1 for a null key.");

static PyObject *murmur2(PyObject *self, PyObject *args) {
    PyObject *o, *d, *v;
    Py_ssize_t bit;
    if (!PyArg_ParseTuple(args, "OOOn", &o, &d, &v, &bit)) return NULL;
    column col;
    PyObject *out = NULL;
    if (column_from(o, d, v, bit, &col)) goto done;
    out = PyBytes_FromStringAndSize(NULL, col.rows * 4);
    if (!out) goto done;
    int32_t *h = (int32_t *)PyBytes_AS_STRING(out);
    const int32_t *of = col.offsets.buf;
    for (Py_ssize_t i = 0; i < col.rows; i++)
        h[i] = is_null(&col, i) ? -1 : (int32_t)(murmur2_one(
            (const uint8_t *)col.data.buf + of[i], (uint32_t)(of[i + 1] - of[i])) & 0x7fffffffu);
done:
    release(&col);
    return out;
}


/* Untrack an exact tuple whose items the collector need never look at
 * (CPython does this for exact tuples at their first young collection; it
 * never does for a tuple subclass such as a named tuple). depth bounds the
 * look into nested tuples (a record's headers, then each header): deeper
 * ones stay tracked. True if ``t`` is (now) untracked. */
static int maybe_untrack(PyObject *t, int depth) {
    if (!PyObject_GC_IsTracked(t)) return 1;
    if (Py_TYPE(t)->tp_dictoffset != 0) return 0;  /* a subclass with a __dict__: its own */
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(t, i);
        if (!PyObject_IS_GC(item)) continue;
        /* Only an exact tuple stays as it is: an untracked dict (empty, or
         * of plain values) may be tracked again once something is put in. */
        if (PyTuple_CheckExact(item) &&
            (!PyObject_GC_IsTracked(item) || (depth > 0 && maybe_untrack(item, depth - 1))))
            continue;
        return 0;
    }
    PyObject_GC_UnTrack(t);
    return 1;
}

static const char records_doc[] =
    "records(cls, items, topic, partition, base_offset, base_timestamp, timestamp_type,\n"
    "        include_headers) -> list\n\n"
    "One cls (a tuple type of 8 fields: topic, partition, offset, timestamp, key,\n"
    "value, headers, timestamp_type) per record of items, an iterable of 5-tuples\n"
    "(timestamp_delta, offset_delta, key, value, headers) such as a msgpack\n"
    "Unpacker's with use_list=False: offset = base_offset + offset_delta, timestamp =\n"
    "base_timestamp + timestamp_delta, headers () unless include_headers. Records\n"
    "holding nothing the garbage collector tracks are untracked: a consumer's\n"
    "records are never scanned by it. ValueError for an item that is not a\n"
    "5-tuple; the errors of + for deltas that are not numbers.";

static PyObject *records(PyObject *self, PyObject *args) {
    PyTypeObject *cls;
    PyObject *items, *topic, *partition, *base_offset, *base_timestamp, *timestamp_type;
    int include_headers;
    if (!PyArg_ParseTuple(args, "O!OOOOOOp", &PyType_Type, &cls, &items, &topic, &partition,
                          &base_offset, &base_timestamp, &timestamp_type, &include_headers))
        return NULL;
    if (!PyType_IsSubtype(cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "cls must be a tuple type");
        return NULL;
    }
    PyObject *iter = PyObject_GetIter(items);
    if (!iter) return NULL;
    PyObject *out = PyList_New(0);
    if (!out) { Py_DECREF(iter); return NULL; }
    PyObject *empty = PyTuple_New(0);
    if (!empty) goto fail;
    PyObject *item;
    while ((item = PyIter_Next(iter)) != NULL) {
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 5) {
            Py_DECREF(item);
            PyErr_SetString(PyExc_ValueError, "a record is not an array of 5 fields");
            goto fail;
        }
        PyObject *offset = PyNumber_Add(base_offset, PyTuple_GET_ITEM(item, 1));
        PyObject *timestamp = offset ? PyNumber_Add(base_timestamp, PyTuple_GET_ITEM(item, 0))
                                     : NULL;
        PyObject *record = timestamp ? cls->tp_alloc(cls, 8) : NULL;
        if (!record) {
            Py_XDECREF(offset);
            Py_XDECREF(timestamp);
            Py_DECREF(item);
            goto fail;
        }
#if PY_VERSION_HEX >= 0x030E0000
        /* Tuples cache their hash from 3.14 on; -1 is "not computed yet"
         * (tp_alloc zero-fills, as tuple_subtype_new resets it too). */
        ((PyTupleObject *)record)->ob_hash = -1;
#endif
        PyObject *key = PyTuple_GET_ITEM(item, 2), *value = PyTuple_GET_ITEM(item, 3);
        PyObject *headers = include_headers ? PyTuple_GET_ITEM(item, 4) : empty;
        Py_INCREF(topic); PyTuple_SET_ITEM(record, 0, topic);
        Py_INCREF(partition); PyTuple_SET_ITEM(record, 1, partition);
        PyTuple_SET_ITEM(record, 2, offset);
        PyTuple_SET_ITEM(record, 3, timestamp);
        Py_INCREF(key); PyTuple_SET_ITEM(record, 4, key);
        Py_INCREF(value); PyTuple_SET_ITEM(record, 5, value);
        Py_INCREF(headers); PyTuple_SET_ITEM(record, 6, headers);
        Py_INCREF(timestamp_type); PyTuple_SET_ITEM(record, 7, timestamp_type);
        Py_DECREF(item);
        maybe_untrack(record, 2);
        int failed = PyList_Append(out, record);
        Py_DECREF(record);
        if (failed) goto fail;
    }
    if (PyErr_Occurred()) goto fail;
    Py_DECREF(iter);
    Py_DECREF(empty);
    return out;
fail:
    Py_DECREF(iter);
    Py_XDECREF(empty);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {"encode", encode, METH_VARARGS, encode_doc},
    {"murmur2", murmur2, METH_VARARGS, murmur2_doc},
    {"records", records, METH_VARARGS, records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "protocol._columns",
    "A records section to and from Arrow-layout columns, in C (see protocol/columns.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__columns(void) { return PyModule_Create(&module); }
