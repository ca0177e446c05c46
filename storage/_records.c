/*
 * storage._records: what the log cleaner needs of a records section, in C.
 *
 * A pass looks at every record's key and at nothing else of most records: a
 * decoder that builds a tuple, a value and a headers object per record spends
 * most of the pass on objects thrown away. These functions walk the section
 * (storage/_records.h) and build only what is asked for:
 *
 *   scan(section, count, last_offset_delta) -> (keys, deltas, nulls)
 *   pick(section, count, indexes) -> the records at indexes, byte for byte
 *
 * storage/sections.py has the same functions in Python, used when this
 * extension is not built or refuses a section (a key stored as a string),
 * and tests/unit/test_sections.py checks the two against each other.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_records.h"

static PyObject *bad(const char *what, Py_ssize_t record) {
    PyErr_Format(PyExc_ValueError, "record %zd: %s", record, what);
    return NULL;
}

PyDoc_STRVAR(scan_doc,
"scan(section, count, last_offset_delta) -> (keys, deltas, nulls)\n\n"
"The keys of an uncompressed records section of `count` records (a list of\n"
"bytes or None), their offset deltas (None when they are 0..count-1 and\n"
"count - 1 is last_offset_delta, else a list of ints) and which values are\n"
"nil (None when none is, else bytes of one 0/1 flag per record). ValueError\n"
"unless the section is exactly `count` records whose keys and values are\n"
"bytes or nil and whose offset deltas increase from 0 or more, up to\n"
"last_offset_delta.");

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t count;
    long long last_delta;
    if (!PyArg_ParseTuple(args, "y*nL", &buf, &count, &last_delta)) return NULL;
    PyObject *keys = NULL, *deltas = NULL, *nulls = NULL, *result = NULL;
    int64_t *all = NULL;
    if (count < 0 || count > buf.len) { bad("count out of range", 0); goto done; }
    keys = PyList_New(count);
    all = PyMem_Malloc((count + 1) * sizeof(int64_t));
    if (!keys || !all) { if (keys) PyErr_NoMemory(); goto done; }
    cursor c = {(const uint8_t *)buf.buf, (const uint8_t *)buf.buf + buf.len};
    uint8_t *flags = NULL;
    int contiguous = last_delta == (long long)count - 1;
    int64_t last = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        record rec;
        const char *wrong = read_record(&c, &rec);
        if (wrong) { bad(wrong, i); goto done; }
        if (rec.offset_delta <= last || rec.offset_delta > last_delta) {
            bad("offset deltas out of order or past the batch's last offset", i);
            goto done;
        }
        last = all[i] = rec.offset_delta;
        contiguous &= rec.offset_delta == i;
        PyObject *key;
        if (rec.key_len < 0) {
            key = Py_None;
            Py_INCREF(key);
        } else if (!(key = PyBytes_FromStringAndSize((const char *)rec.key, rec.key_len))) {
            goto done;
        }
        PyList_SET_ITEM(keys, i, key);
        if (rec.value_len < 0) {
            if (!nulls) {
                if (!(nulls = PyBytes_FromStringAndSize(NULL, count))) goto done;
                flags = (uint8_t *)PyBytes_AS_STRING(nulls);
                memset(flags, 0, count);
            }
            flags[i] = 1;
        }
    }
    if (c.p != c.end) { bad("bytes after the last record", count); goto done; }
    if (contiguous) {
        deltas = Py_None;
        Py_INCREF(deltas);
    } else {
        if (!(deltas = PyList_New(count))) goto done;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *delta = PyLong_FromLongLong(all[i]);
            if (!delta) goto done;
            PyList_SET_ITEM(deltas, i, delta);
        }
    }
    if (!nulls) {
        nulls = Py_None;
        Py_INCREF(nulls);
    }
    result = PyTuple_Pack(3, keys, deltas, nulls);
done:
    Py_XDECREF(keys); Py_XDECREF(deltas); Py_XDECREF(nulls);
    PyMem_Free(all);
    PyBuffer_Release(&buf);
    return result;
}

PyDoc_STRVAR(pick_doc,
"pick(section, count, indexes) -> bytes\n\n"
"The records at `indexes` (a list of increasing ints below count) of an\n"
"uncompressed records section of `count` records, copied byte for byte: the\n"
"records section of a batch that keeps only those. ValueError if the section\n"
"does not hold `count` records or an index is out of order or range.");

static PyObject *pick(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t count;
    PyObject *indexes;
    if (!PyArg_ParseTuple(args, "y*nO!", &buf, &count, &PyList_Type, &indexes)) return NULL;
    PyObject *out = NULL, *result = NULL;
    Py_ssize_t wanted = PyList_GET_SIZE(indexes);
    /* At most the whole section: the output never outgrows it. */
    if (!(out = PyBytes_FromStringAndSize(NULL, buf.len))) goto done;
    char *o = PyBytes_AS_STRING(out);
    Py_ssize_t used = 0, j = 0, next = -1;
    cursor c = {(const uint8_t *)buf.buf, (const uint8_t *)buf.buf + buf.len};
    for (Py_ssize_t i = 0; i < count; i++) {
        if (next < i && j < wanted) {
            next = PyLong_AsSsize_t(PyList_GET_ITEM(indexes, j));
            if (next == -1 && PyErr_Occurred()) goto done;
            if (next < i || next >= count) { bad("index out of order or range", next); goto done; }
        }
        record rec;
        const char *wrong = read_record(&c, &rec);
        if (wrong) { bad(wrong, i); goto done; }
        if (i == next) {
            memcpy(o + used, rec.start, rec.end - rec.start);
            used += rec.end - rec.start;
            j++;
        }
    }
    if (j != wanted) { bad("index out of order or range", count); goto done; }
    if (c.p != c.end) { bad("bytes after the last record", count); goto done; }
    if (used == buf.len) {
        result = out;
        out = NULL;
    } else {
        result = PyBytes_FromStringAndSize(o, used);
    }
done:
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {"pick", pick, METH_VARARGS, pick_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "storage._records",
    "A records section's keys, and a subset of its records, in C (see storage/sections.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__records(void) { return PyModule_Create(&module); }
