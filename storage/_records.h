/*
 * Reading the records section (storage/batch.py) in C: a bounds-checked
 * msgpack cursor and one record, [timestamp_delta, offset_delta, key, value,
 * headers]. Shared by storage/_records.c and protocol/_columns.c (which
 * includes it from here: protocol may build on storage, not the reverse).
 * Input is untrusted bytes: every read is checked, and a reader that finds
 * anything unexpected says so instead of guessing.
 */
#ifndef KRAFTLOG_RECORDS_H
#define KRAFTLOG_RECORDS_H

/* The smallest record: [0, 0, nil, nil, []], six bytes. */
#define MIN_RECORD_BYTES 6

#include <Python.h>
#include <stdint.h>

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} cursor;

static inline int need(cursor *c, Py_ssize_t n) { return c->end - c->p >= n; }

static inline uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* An integer; 0 on success. */
static int read_int(cursor *c, int64_t *out) {
    if (!need(c, 1)) return -1;
    uint8_t t = *c->p++;
    if (t <= 0x7f) { *out = t; return 0; }
    if (t >= 0xe0) { *out = (int8_t)t; return 0; }
    int n;
    switch (t) {
    case 0xcc: case 0xd0: n = 1; break;
    case 0xcd: case 0xd1: n = 2; break;
    case 0xce: case 0xd2: n = 4; break;
    case 0xcf: case 0xd3: n = 8; break;
    default: return -1;
    }
    if (!need(c, n)) return -1;
    uint64_t v = be(c->p, n);
    c->p += n;
    if (t >= 0xd0) { /* signed: sign-extend */
        if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~(uint64_t)0 << (8 * n);
        *out = (int64_t)v;
    } else {
        if (v > INT64_MAX) return -1;
        *out = (int64_t)v;
    }
    return 0;
}

/* bin or nil: *len -1 for nil, else the bytes start at *start. */
static int read_bin(cursor *c, const uint8_t **start, int64_t *len) {
    if (!need(c, 1)) return -1;
    uint8_t t = *c->p++;
    int n;
    switch (t) {
    case 0xc0: *len = -1; *start = NULL; return 0;
    case 0xc4: n = 1; break;
    case 0xc5: n = 2; break;
    case 0xc6: n = 4; break;
    default: return -1;
    }
    if (!need(c, n)) return -1;
    uint64_t l = be(c->p, n);
    c->p += n;
    if (!need(c, (Py_ssize_t)l)) return -1;
    *start = c->p;
    *len = (int64_t)l;
    c->p += l;
    return 0;
}

/* Skip any one msgpack object (headers); depth-limited. */
static int skip(cursor *c, int depth) {
    if (depth > 8 || !need(c, 1)) return -1;
    uint8_t t = *c->p++;
    uint64_t items = 0, bytes = 0;
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) return 0;
    if ((t & 0xe0) == 0xa0) bytes = t & 0x1f;
    else if ((t & 0xf0) == 0x90) items = t & 0x0f;
    else {
        int n;
        switch (t) {
        case 0xcc: case 0xd0: bytes = 1; break;
        case 0xcd: case 0xd1: bytes = 2; break;
        case 0xce: case 0xd2: case 0xca: bytes = 4; break;
        case 0xcf: case 0xd3: case 0xcb: bytes = 8; break;
        case 0xc4: case 0xd9: n = 1; goto sized;
        case 0xc5: case 0xda: n = 2; goto sized;
        case 0xc6: case 0xdb: n = 4; goto sized;
        case 0xdc: n = 2; goto counted;
        case 0xdd: n = 4; goto counted;
        /* maps and ext types: never in a records section (a header is an
         * array [key, value]); refused, as a decoder refuses a map whose
         * keys it cannot use */
        default: return -1;
        }
        goto have;
    sized:
        if (!need(c, n)) return -1;
        bytes = be(c->p, n); c->p += n; goto have;
    counted:
        if (!need(c, n)) return -1;
        items = be(c->p, n); c->p += n; goto have;
    }
have:
    if (bytes) {
        if (!need(c, (Py_ssize_t)bytes)) return -1;
        c->p += bytes;
    }
    for (uint64_t i = 0; i < items; i++)
        if (skip(c, depth + 1)) return -1;
    return 0;
}

/* A ValueError saying what is wrong with which record; NULL. */
static PyObject *bad(const char *what, Py_ssize_t record) {
    PyErr_Format(PyExc_ValueError, "record %zd: %s", record, what);
    return NULL;
}

/* One record, its fields pointing into the section. */
typedef struct {
    int64_t timestamp_delta, offset_delta;
    const uint8_t *key, *value;  /* NULL when nil */
    int64_t key_len, value_len;  /* -1 when nil */
    const uint8_t *start, *headers, *end;  /* the record; its headers array; past it */
    int has_headers;
} record;

/* Reads one record; NULL on success, else what is wrong with it. */
static const char *read_record(cursor *c, record *r) {
    r->start = c->p;
    if (!need(c, 1) || *c->p++ != 0x95) return "not a 5-element array";
    if (read_int(c, &r->timestamp_delta) || read_int(c, &r->offset_delta))
        return "bad timestamp or offset delta";
    if (read_bin(c, &r->key, &r->key_len) || read_bin(c, &r->value, &r->value_len))
        return "key or value not bytes or nil";
    r->headers = c->p;
    r->has_headers = 0;
    if (need(c, 1) && *c->p == 0x90) c->p++;
    else {
        if (!need(c, 1) || !((*c->p & 0xf0) == 0x90 || *c->p == 0xdc || *c->p == 0xdd)
                || skip(c, 0))
            return "headers not an array";
        r->has_headers = 1;
    }
    r->end = c->p;
    return NULL;
}

#endif
