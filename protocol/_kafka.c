/*
 * Records sections between Kafka's RecordBatch v2 and kraftlog's batches, in
 * C (protocol/kafka/records.py has the same in Python, used when this is not
 * built, and the tests hold the two to the same bytes).
 *
 *   kafka_to_msgpack(section, count, last_offset_delta) -> bytes
 *       Kafka's varint records -> [timestamp_delta, offset_delta, key, value,
 *       headers] msgpack arrays, packed as msgpack-python packs them.
 *   msgpack_to_kafka(section, count) -> bytes
 *       the other way.
 *
 * Input is untrusted: every length is checked against what is left, and
 * anything malformed raises ValueError naming the record.
 */
#define PY_SSIZE_T_CLEAN
#include "../storage/_records.h"
#include <string.h>

typedef struct {
    uint8_t *buf;
    Py_ssize_t len, cap;
} out_t;

static int reserve(out_t *o, Py_ssize_t n) {
    if (o->len + n <= o->cap) return 0;
    Py_ssize_t cap = o->cap ? o->cap : 256;
    while (cap < o->len + n) {
        if (cap > PY_SSIZE_T_MAX / 2) { PyErr_NoMemory(); return -1; }
        cap *= 2;
    }
    uint8_t *grown = PyMem_Realloc(o->buf, (size_t)cap);
    if (!grown) { PyErr_NoMemory(); return -1; }
    o->buf = grown;
    o->cap = cap;
    return 0;
}

static inline int put(out_t *o, const void *p, Py_ssize_t n) {
    if (reserve(o, n)) return -1;
    if (n) memcpy(o->buf + o->len, p, (size_t)n);
    o->len += n;
    return 0;
}

static inline int put_byte(out_t *o, uint8_t b) { return put(o, &b, 1); }

static int put_be(out_t *o, uint8_t tag, uint64_t v, int n) {
    uint8_t tmp[9];
    tmp[0] = tag;
    for (int i = 0; i < n; i++) tmp[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    return put(o, tmp, n + 1);
}

/* -- Kafka varints (zig-zag) ------------------------------------------------ */
static int put_varint(out_t *o, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    uint8_t tmp[10];
    int n = 0;
    while (z > 0x7f) { tmp[n++] = (uint8_t)((z & 0x7f) | 0x80); z >>= 7; }
    tmp[n++] = (uint8_t)z;
    return put(o, tmp, n);
}

static int varint_size(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (z > 0x7f) { z >>= 7; n++; }
    return n;
}

/* A zig-zag varint; 0 on success. */
static int read_varint(cursor *c, int64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (!need(c, 1)) return -1;
        uint8_t b = *c->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
    }
    return -1;
}

/* -- msgpack, packed as msgpack-python packs (the smallest form) ----------- */
static int pack_int(out_t *o, int64_t v) {
    if (v >= 0) {
        if (v <= 0x7f) return put_byte(o, (uint8_t)v);
        if (v <= 0xff) return put_be(o, 0xcc, (uint64_t)v, 1);
        if (v <= 0xffff) return put_be(o, 0xcd, (uint64_t)v, 2);
        if (v <= 0xffffffffLL) return put_be(o, 0xce, (uint64_t)v, 4);
        return put_be(o, 0xcf, (uint64_t)v, 8);
    }
    if (v >= -32) return put_byte(o, (uint8_t)(int8_t)v);
    if (v >= -128) return put_be(o, 0xd0, (uint64_t)v & 0xff, 1);
    if (v >= -32768) return put_be(o, 0xd1, (uint64_t)v & 0xffff, 2);
    if (v >= -2147483648LL) return put_be(o, 0xd2, (uint64_t)v & 0xffffffffULL, 4);
    return put_be(o, 0xd3, (uint64_t)v, 8);
}

static int pack_bin(out_t *o, const uint8_t *p, int64_t len) {
    if (len < 0) return put_byte(o, 0xc0);
    int r = len <= 0xff ? put_be(o, 0xc4, (uint64_t)len, 1)
          : len <= 0xffff ? put_be(o, 0xc5, (uint64_t)len, 2)
          : put_be(o, 0xc6, (uint64_t)len, 4);
    return r ? r : put(o, p, (Py_ssize_t)len);
}

static int pack_str(out_t *o, const uint8_t *p, int64_t len) {
    int r = len <= 31 ? put_byte(o, (uint8_t)(0xa0 | len))
          : len <= 0xff ? put_be(o, 0xd9, (uint64_t)len, 1)
          : len <= 0xffff ? put_be(o, 0xda, (uint64_t)len, 2)
          : put_be(o, 0xdb, (uint64_t)len, 4);
    return r ? r : put(o, p, (Py_ssize_t)len);
}

static int pack_array(out_t *o, uint64_t n) {
    if (n <= 15) return put_byte(o, (uint8_t)(0x90 | n));
    if (n <= 0xffff) return put_be(o, 0xdc, n, 2);
    return put_be(o, 0xdd, n, 4);
}

/* Whether [p, p + n) is UTF-8 (what a header name must be to be a str). */
static int utf8_ok(const uint8_t *p, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        uint8_t b = p[i];
        int more;
        uint32_t cp;
        if (b < 0x80) { i++; continue; }
        if ((b & 0xe0) == 0xc0) { more = 1; cp = b & 0x1f; }
        else if ((b & 0xf0) == 0xe0) { more = 2; cp = b & 0x0f; }
        else if ((b & 0xf8) == 0xf0) { more = 3; cp = b & 0x07; }
        else return 0;
        if (i + more >= n) return 0;  /* its continuation bytes run past the end */
        for (int k = 1; k <= more; k++) {
            if ((p[i + k] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if ((more == 1 && cp < 0x80) || (more == 2 && cp < 0x800) ||
            (more == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += more + 1;
    }
    return 1;
}

/* A Kafka field: varint length (-1: null) then the bytes. */
static int read_field(cursor *c, const uint8_t **start, int64_t *len) {
    if (read_varint(c, len)) return -1;
    if (*len < 0) {
        if (*len != -1) return -1;
        *start = NULL;
        return 0;
    }
    if (!need(c, (Py_ssize_t)*len)) return -1;
    *start = c->p;
    c->p += *len;
    return 0;
}

static PyObject *done(out_t *o) {
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)o->buf, o->len);
    PyMem_Free(o->buf);
    return bytes;
}

static PyObject *fail(out_t *o, const char *what, Py_ssize_t record) {
    PyMem_Free(o->buf);
    if (PyErr_Occurred()) return NULL;  /* out of memory */
    return bad(what, record);
}

PyDoc_STRVAR(kafka_to_msgpack_doc,
"kafka_to_msgpack(section, count, last_offset_delta) -> bytes: Kafka's records as "
"kraftlog's.");

static PyObject *kafka_to_msgpack(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t count;
    long long last_delta;
    if (!PyArg_ParseTuple(args, "y*nL", &view, &count, &last_delta)) return NULL;
    cursor c = {view.buf, (const uint8_t *)view.buf + view.len};
    out_t o = {NULL, 0, 0};
    PyObject *result = NULL;
    if (count < 0 || count > view.len) {  /* every record takes bytes */
        result = bad("a record count the section cannot hold", count);
        goto out;
    }
    if (reserve(&o, view.len * 2 + 64)) goto out;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, ts, od, key_len, value_len, headers;
        const uint8_t *key, *value;
        if (read_varint(&c, &length) || length < 1 || !need(&c, (Py_ssize_t)length)) {
            result = fail(&o, "runs past its batch", i); goto out;
        }
        cursor r = {c.p, c.p + length};
        c.p += length;
        r.p++;  /* attributes: unused by v2 records */
        if (read_varint(&r, &ts) || read_varint(&r, &od)
                || read_field(&r, &key, &key_len) || read_field(&r, &value, &value_len)
                || read_varint(&r, &headers)) {
            result = fail(&o, "a field runs past its record", i); goto out;
        }
        if (od < 0 || od > last_delta) {
            result = fail(&o, "offset delta out of range", i); goto out;
        }
        if (headers < 0 || headers > r.end - r.p) {
            result = fail(&o, "a bad header count", i); goto out;
        }
        if (put_byte(&o, 0x95) || pack_int(&o, ts) || pack_int(&o, od)
                || pack_bin(&o, key, key_len) || pack_bin(&o, value, value_len)
                || pack_array(&o, (uint64_t)headers)) {
            result = fail(&o, "out of memory", i); goto out;
        }
        for (int64_t h = 0; h < headers; h++) {
            const uint8_t *name, *hv;
            int64_t name_len, hv_len;
            if (read_field(&r, &name, &name_len) || read_field(&r, &hv, &hv_len)) {
                result = fail(&o, "a header runs past its record", i); goto out;
            }
            if (name_len < 0 || !utf8_ok(name, name_len)) {
                result = fail(&o, "a header name that is null or not UTF-8", i); goto out;
            }
            if (put_byte(&o, 0x92) || pack_str(&o, name, name_len)
                    || pack_bin(&o, hv, hv_len)) {
                result = fail(&o, "out of memory", i); goto out;
            }
        }
        if (r.p != r.end) {
            result = fail(&o, "its length disagrees with its fields", i); goto out;
        }
    }
    if (c.p != c.end) {
        result = fail(&o, "bytes after the last record the count says", count); goto out;
    }
    result = done(&o);
out:
    PyBuffer_Release(&view);
    return result;
}

/* A header of kraftlog's: [str or bin name, bin or nil value]. */
static int read_header(cursor *c, const uint8_t **name, int64_t *name_len,
                       const uint8_t **value, int64_t *value_len) {
    if (!need(c, 1) || *c->p++ != 0x92 || !need(c, 1)) return -1;
    uint8_t t = *c->p;
    uint64_t n;
    if ((t & 0xe0) == 0xa0) { n = t & 0x1f; c->p++; }
    else if (t == 0xd9 || t == 0xda || t == 0xdb) {
        int w = t == 0xd9 ? 1 : t == 0xda ? 2 : 4;
        c->p++;
        if (!need(c, w)) return -1;
        n = be(c->p, w);
        c->p += w;
    } else {
        if (read_bin(c, name, name_len) || *name_len < 0) return -1;
        return read_bin(c, value, value_len);
    }
    if (!need(c, (Py_ssize_t)n)) return -1;
    *name = c->p;
    *name_len = (int64_t)n;
    c->p += n;
    return read_bin(c, value, value_len);
}

static int read_array_header(cursor *c, uint64_t *n) {
    if (!need(c, 1)) return -1;
    uint8_t t = *c->p++;
    if ((t & 0xf0) == 0x90) { *n = t & 0x0f; return 0; }
    int w = t == 0xdc ? 2 : t == 0xdd ? 4 : 0;
    if (!w || !need(c, w)) return -1;
    *n = be(c->p, w);
    c->p += w;
    return 0;
}

PyDoc_STRVAR(msgpack_to_kafka_doc,
"msgpack_to_kafka(section, count) -> bytes: kraftlog's records as Kafka's.");

static PyObject *msgpack_to_kafka(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n", &view, &count)) return NULL;
    cursor c = {view.buf, (const uint8_t *)view.buf + view.len};
    out_t o = {NULL, 0, 0}, body = {NULL, 0, 0};
    PyObject *result = NULL;
    if (count < 0 || count > view.len) {  /* every record takes bytes */
        result = bad("a record count the section cannot hold", count);
        goto out;
    }
    if (reserve(&o, view.len * 2 + 64)) goto out;
    for (Py_ssize_t i = 0; i < count; i++) {
        record rec;
        const char *why = read_record(&c, &rec);
        if (why) { result = fail(&o, why, i); goto out; }
        body.len = 0;
        if (put_byte(&body, 0) || put_varint(&body, rec.timestamp_delta)
                || put_varint(&body, rec.offset_delta)
                || put_varint(&body, rec.key_len)
                || (rec.key_len > 0 && put(&body, rec.key, (Py_ssize_t)rec.key_len))
                || put_varint(&body, rec.value_len)
                || (rec.value_len > 0 && put(&body, rec.value, (Py_ssize_t)rec.value_len))) {
            result = fail(&o, "out of memory", i); goto out;
        }
        cursor h = {rec.headers, rec.end};
        uint64_t headers;
        if (read_array_header(&h, &headers) || headers > (uint64_t)(h.end - h.p)
                || put_varint(&body, (int64_t)headers)) {
            result = fail(&o, "headers not an array", i); goto out;
        }
        for (uint64_t k = 0; k < headers; k++) {
            const uint8_t *name, *value;
            int64_t name_len, value_len;
            if (read_header(&h, &name, &name_len, &value, &value_len)) {
                result = fail(&o, "a header is not [name, bytes or nil]", i); goto out;
            }
            if (put_varint(&body, name_len) || put(&body, name, (Py_ssize_t)name_len)
                    || put_varint(&body, value_len)
                    || (value_len > 0 && put(&body, value, (Py_ssize_t)value_len))) {
                result = fail(&o, "out of memory", i); goto out;
            }
        }
        if (h.p != h.end) { result = fail(&o, "headers not an array", i); goto out; }
        if (reserve(&o, varint_size(body.len) + body.len) || put_varint(&o, body.len)
                || put(&o, body.buf, body.len)) {
            result = fail(&o, "out of memory", i); goto out;
        }
    }
    if (c.p != c.end) {
        result = fail(&o, "bytes after the last record the count says", count); goto out;
    }
    result = done(&o);
out:
    PyMem_Free(body.buf);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"kafka_to_msgpack", kafka_to_msgpack, METH_VARARGS, kafka_to_msgpack_doc},
    {"msgpack_to_kafka", msgpack_to_kafka, METH_VARARGS, msgpack_to_kafka_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "protocol._kafka",
    "Records sections between Kafka's RecordBatch v2 and kraftlog's (protocol/kafka/records.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__kafka(void) { return PyModule_Create(&module); }
