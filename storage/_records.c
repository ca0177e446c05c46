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
 *   OffsetMap: key -> latest offset, filled from sections (put) and asked
 *       which records of a section stay (keep), no Python object per record
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
    if (count < 0 || count > buf.len / MIN_RECORD_BYTES) {
        bad("count out of range", 0);
        goto done;
    }
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
    if (count < 0 || count > buf.len / MIN_RECORD_BYTES) {
        bad("count out of range", 0);
        goto done;
    }
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

/* -- the offset map --------------------------------------------------------------- */

/* Key -> offset of its latest record, for one cleaner pass: open addressing
 * with linear probing over 32-byte entries. Keys are held whole, so no two
 * keys ever share an entry (Kafka's map holds digests): up to 15 bytes in
 * the entry, longer ones in an arena. Each key has a kind, bytes or str (a
 * str key and the bytes of its UTF-8 are different keys, as in a dict).
 *
 * A pass's keys are spread over a table far larger than the CPU's caches,
 * so each lookup costs a cache miss; whole sections are put and looked up
 * at once, with the entries of the keys a few records ahead prefetched.
 * The hash is seeded per map with random bytes from the caller, so a log's
 * keys cannot be chosen to pile up in one probe run. */
#define INLINE_MAX 15
#define IN_ARENA 127
#define STR_KIND 0x80
#define AHEAD 8
#define FIRST_SLOTS 16
#define FIRST_ARENA_BYTES 4096

typedef struct {
    uint64_t hash;        /* 0: an empty entry */
    int64_t offset;
    uint8_t key[INLINE_MAX];  /* the key, or its arena position (8 bytes) */
    uint8_t tag;          /* STR_KIND | the key's length, or | IN_ARENA */
} entry;

typedef struct {
    PyObject_HEAD
    entry *table;
    Py_ssize_t slots;     /* a power of two */
    Py_ssize_t count;
    uint8_t *arena;       /* per long key: its length (4 bytes), its bytes */
    uint64_t arena_used, arena_size;
    uint64_t seed;
} OffsetMap;

/* One record's key as the map sees it. */
typedef struct {
    const uint8_t *key;
    int64_t len;          /* -1: no key */
    int64_t offset;
    uint64_t hash;
    uint8_t kind;         /* 0 or STR_KIND */
    uint8_t nil_value;
} item;

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 33; h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static uint64_t hash_key(uint64_t seed, uint8_t kind, const uint8_t *key, int64_t len) {
    uint64_t h = mix(seed ^ ((uint64_t)len << 8 | kind));
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t chunk;
        memcpy(&chunk, key + i, 8);
        h = mix(h ^ chunk) + 0x9e3779b97f4a7c15ULL;
    }
    uint64_t tail = 0;
    memcpy(&tail, key + i, (size_t)(len - i));
    h = mix(h ^ tail ^ ((uint64_t)(len - i) << 59));
    return h | 1ULL << 63;  /* never 0, the empty entry; the low bits index the table */
}

static inline int same_key(const OffsetMap *m, const entry *e, const item *it) {
    if ((e->tag & STR_KIND) != it->kind) return 0;
    uint8_t stored = e->tag & ~STR_KIND;
    if (it->len <= INLINE_MAX)
        return stored == it->len && memcmp(e->key, it->key, (size_t)it->len) == 0;
    if (stored != IN_ARENA) return 0;
    uint64_t at;
    uint32_t len;
    memcpy(&at, e->key, 8);
    memcpy(&len, m->arena + at, 4);
    return len == it->len && memcmp(m->arena + at + 4, it->key, (size_t)len) == 0;
}

/* The entry of the key, or the empty entry where it would go. */
static inline entry *find(const OffsetMap *m, const item *it) {
    Py_ssize_t mask = m->slots - 1, i = (Py_ssize_t)(it->hash & (uint64_t)mask);
    while (m->table[i].hash && !(m->table[i].hash == it->hash && same_key(m, &m->table[i], it)))
        i = (i + 1) & mask;
    return &m->table[i];
}

static inline void prefetch(const OffsetMap *m, const item *it) {
    if (it->len >= 0)
        __builtin_prefetch(&m->table[it->hash & (uint64_t)(m->slots - 1)]);
}

/* Room for `more` keys at most 70% full; 0 on success. */
static int reserve(OffsetMap *m, Py_ssize_t more) {
    Py_ssize_t slots = m->slots ? m->slots : FIRST_SLOTS;
    while (10 * (m->count + more) > 7 * slots) slots *= 2;
    if (slots == m->slots) return 0;
    entry *table = PyMem_Calloc(slots, sizeof(entry));
    if (!table) { PyErr_NoMemory(); return -1; }
    Py_ssize_t mask = slots - 1;
    for (Py_ssize_t j = 0; j < m->slots; j++) {
        if (!m->table[j].hash) continue;
        Py_ssize_t i = (Py_ssize_t)(m->table[j].hash & (uint64_t)mask);
        while (table[i].hash) i = (i + 1) & mask;
        table[i] = m->table[j];
    }
    PyMem_Free(m->table);
    m->table = table;
    m->slots = slots;
    return 0;
}

/* Key -> offset, keeping the later offset; 0 on success. Room reserved. */
static int put_item(OffsetMap *m, const item *it) {
    entry *e = find(m, it);
    if (e->hash) {
        if (it->offset > e->offset) e->offset = it->offset;
        return 0;
    }
    if (it->len <= INLINE_MAX) {
        memcpy(e->key, it->key, (size_t)it->len);
        e->tag = it->kind | (uint8_t)it->len;
    } else {
        uint64_t need = 4 + (uint64_t)it->len;
        if (it->len > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "a key over 4 GiB");
            return -1;
        }
        if (m->arena_used + need > m->arena_size) {
            uint64_t size = m->arena_size ? m->arena_size : FIRST_ARENA_BYTES;
            while (size < m->arena_used + need) size *= 2;
            uint8_t *arena = PyMem_Realloc(m->arena, size);
            if (!arena) { PyErr_NoMemory(); return -1; }
            m->arena = arena;
            m->arena_size = size;
        }
        uint32_t len = (uint32_t)it->len;
        memcpy(m->arena + m->arena_used, &len, 4);
        memcpy(m->arena + m->arena_used + 4, it->key, len);
        memcpy(e->key, &m->arena_used, 8);
        e->tag = it->kind | IN_ARENA;
        m->arena_used += need;
    }
    e->hash = it->hash;
    e->offset = it->offset;
    m->count++;
    return 0;
}

static inline int64_t get_item(const OffsetMap *m, const item *it) {
    if (!m->count) return -1;
    const entry *e = find(m, it);
    return e->hash ? e->offset : -1;
}

static PyObject *map_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)kwargs;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "K", &seed)) return NULL;
    OffsetMap *m = (OffsetMap *)type->tp_alloc(type, 0);
    if (!m) return NULL;
    m->seed = seed;
    if (reserve(m, 1)) { Py_DECREF(m); return NULL; }
    return (PyObject *)m;
}

static void map_dealloc(OffsetMap *m) {
    PyMem_Free(m->table);
    PyMem_Free(m->arena);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t map_len(OffsetMap *m) { return m->count; }

/* A key argument as an item: `*held` is a new reference to its bytes, which
 * the caller releases after use; -1 with an exception set otherwise. */
static int item_of(const OffsetMap *m, PyObject *key, int64_t offset, item *it, PyObject **held) {
    if (PyBytes_Check(key)) {
        it->kind = 0;
        Py_INCREF(key);
        *held = key;
    } else if (PyUnicode_Check(key)) {
        /* Surrogate-escaped, as sections.py reads a string that is not UTF-8. */
        it->kind = STR_KIND;
        if (!(*held = PyUnicode_AsEncodedString(key, "utf-8", "surrogateescape"))) return -1;
    } else {
        PyErr_SetString(PyExc_TypeError, "a key is bytes or str");
        return -1;
    }
    it->key = (const uint8_t *)PyBytes_AS_STRING(*held);
    it->len = PyBytes_GET_SIZE(*held);
    it->offset = offset;
    it->hash = hash_key(m->seed, it->kind, it->key, it->len);
    return 0;
}

PyDoc_STRVAR(put_key_doc, "put_key(key, offset): key (bytes or str) -> offset, if later.");

static PyObject *map_put_key(OffsetMap *m, PyObject *args) {
    PyObject *key, *held;
    long long offset;
    item it;
    if (!PyArg_ParseTuple(args, "OL", &key, &offset)) return NULL;
    if (item_of(m, key, offset, &it, &held)) return NULL;
    int failed = reserve(m, 1) || put_item(m, &it);
    Py_DECREF(held);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(get_doc, "get(key) -> the latest offset of key (bytes or str), or -1.");

static PyObject *map_get(OffsetMap *m, PyObject *key) {
    PyObject *held;
    item it;
    if (item_of(m, key, 0, &it, &held)) return NULL;
    int64_t offset = get_item(m, &it);
    Py_DECREF(held);
    return PyLong_FromLongLong(offset);
}

/* The items of an uncompressed section of `count` records whose offset
 * deltas increase up to last_delta (PyMem_Free them); NULL with ValueError
 * set if it is not that. *keyed: records with a key; *long_bytes: what
 * their keys would take of the arena, were they all new. */
static item *items_of(const OffsetMap *m, const Py_buffer *buf, Py_ssize_t count,
                      int64_t last_delta, int64_t base, uint64_t *keyed, uint64_t *long_bytes) {
    if (count < 0 || count > buf->len / MIN_RECORD_BYTES) {
        bad("count out of range", 0);
        return NULL;
    }
    item *items = PyMem_Malloc((count + 1) * sizeof(item));
    if (!items) { PyErr_NoMemory(); return NULL; }
    cursor c = {(const uint8_t *)buf->buf, (const uint8_t *)buf->buf + buf->len};
    int64_t last = -1;
    *keyed = *long_bytes = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        record rec;
        item *it = &items[i];
        const char *wrong = read_record(&c, &rec);
        if (wrong) { bad(wrong, i); goto fail; }
        if (rec.offset_delta <= last || rec.offset_delta > last_delta) {
            bad("offset deltas out of order or past the batch's last offset", i);
            goto fail;
        }
        last = rec.offset_delta;
        if (__builtin_add_overflow(base, rec.offset_delta, &it->offset)) {
            bad("offset past 2**63", i);
            goto fail;
        }
        it->key = rec.key;
        it->len = rec.key_len;
        it->kind = 0;
        it->nil_value = rec.value_len < 0;
        if (rec.key_len >= 0) {
            it->hash = hash_key(m->seed, 0, rec.key, rec.key_len);
            (*keyed)++;
            if (rec.key_len > INLINE_MAX) *long_bytes += 4 + (uint64_t)rec.key_len;
        }
    }
    if (c.p != c.end) { bad("bytes after the last record", count); goto fail; }
    return items;
fail:
    PyMem_Free(items);
    return NULL;
}

/* The memory the map would hold, at its peak, after `more` new keys with
 * `more_arena` bytes of long keys: the table as it would grow (the old one
 * is still there while the new one fills) and the arena. */
static uint64_t projected_bytes(const OffsetMap *m, uint64_t more, uint64_t more_arena) {
    uint64_t slots = (uint64_t)m->slots, table = slots * sizeof(entry);
    while (10 * ((uint64_t)m->count + more) > 7 * slots) slots *= 2;
    if (slots != (uint64_t)m->slots) table += slots * sizeof(entry);
    uint64_t arena = m->arena_size;
    if (m->arena_used + more_arena > arena) {
        if (!arena) arena = FIRST_ARENA_BYTES;
        while (arena < m->arena_used + more_arena) arena *= 2;
    }
    return table + arena;
}

PyDoc_STRVAR(put_doc,
"put(section, count, last_offset_delta, base_offset, budget_bytes) -> bool\n\n"
"Every keyed record of an uncompressed records section, key -> offset, if the\n"
"map's memory (memory_bytes) stays within budget_bytes (-1: no limit) even were\n"
"every key new; False, with nothing put, if not. ValueError as sections.scan,\n"
"with nothing put.");

static PyObject *map_put(OffsetMap *m, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t count;
    long long last_delta, base, budget;
    if (!PyArg_ParseTuple(args, "y*nLLL", &buf, &count, &last_delta, &base, &budget))
        return NULL;
    PyObject *result = NULL;
    uint64_t keyed, long_bytes;
    item *items = items_of(m, &buf, count, last_delta, base, &keyed, &long_bytes);
    if (!items) goto done;
    if (budget >= 0 && projected_bytes(m, keyed, long_bytes) > (uint64_t)budget) {
        result = Py_False;
    } else {
        if (reserve(m, (Py_ssize_t)keyed)) goto done;
        for (Py_ssize_t i = 0; i < count && i < AHEAD; i++) prefetch(m, &items[i]);
        for (Py_ssize_t i = 0; i < count; i++) {
            if (i + AHEAD < count) prefetch(m, &items[i + AHEAD]);
            if (items[i].len >= 0 && put_item(m, &items[i])) goto done;
        }
        result = Py_True;
    }
    Py_INCREF(result);
done:
    PyMem_Free(items);
    PyBuffer_Release(&buf);
    return result;
}

static int append_index(PyObject *list, Py_ssize_t i) {
    PyObject *n = PyLong_FromSsize_t(i);
    if (!n) return -1;
    int failed = PyList_Append(list, n);
    Py_DECREF(n);
    return failed;
}

PyDoc_STRVAR(keep_doc,
"keep(section, count, last_offset_delta, base_offset) -> (keep, tombstones)\n\n"
"Which records of an uncompressed records section stay: those without a key or\n"
"at their key's latest offset. keep is None when all do, else their indexes;\n"
"tombstones None, or (index, offset) of each keyed record that stays with a nil\n"
"value. ValueError as sections.scan.");

static PyObject *map_keep(OffsetMap *m, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t count;
    long long last_delta, base;
    if (!PyArg_ParseTuple(args, "y*nLL", &buf, &count, &last_delta, &base)) return NULL;
    PyObject *keep = NULL, *tombstones = NULL, *result = NULL;
    uint64_t keyed, long_bytes;
    item *items = items_of(m, &buf, count, last_delta, base, &keyed, &long_bytes);
    if (!items) goto done;
    for (Py_ssize_t i = 0; i < count && i < AHEAD; i++) prefetch(m, &items[i]);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (i + AHEAD < count) prefetch(m, &items[i + AHEAD]);
        const item *it = &items[i];
        if (it->len >= 0 && get_item(m, it) > it->offset) {  /* superseded: it goes */
            if (!keep) {  /* the first to go: the ones before it stay */
                if (!(keep = PyList_New(0))) goto done;
                for (Py_ssize_t j = 0; j < i; j++)
                    if (append_index(keep, j)) goto done;
            }
            continue;
        }
        if (keep && append_index(keep, i)) goto done;
        if (it->len >= 0 && it->nil_value) {
            if (!tombstones && !(tombstones = PyList_New(0))) goto done;
            PyObject *pair = Py_BuildValue("(nL)", i, (long long)it->offset);
            if (!pair) goto done;
            int failed = PyList_Append(tombstones, pair);
            Py_DECREF(pair);
            if (failed) goto done;
        }
    }
    result = Py_BuildValue("(OO)", keep ? keep : Py_None, tombstones ? tombstones : Py_None);
done:
    Py_XDECREF(keep);
    Py_XDECREF(tombstones);
    PyMem_Free(items);
    PyBuffer_Release(&buf);
    return result;
}

static PyObject *map_memory_bytes(OffsetMap *m, void *closure) {
    (void)closure;
    return PyLong_FromUnsignedLongLong((uint64_t)m->slots * sizeof(entry) + m->arena_size);
}

static PyMethodDef map_methods[] = {
    {"put", (PyCFunction)map_put, METH_VARARGS, put_doc},
    {"put_key", (PyCFunction)map_put_key, METH_VARARGS, put_key_doc},
    {"get", (PyCFunction)map_get, METH_O, get_doc},
    {"keep", (PyCFunction)map_keep, METH_VARARGS, keep_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef map_getset[] = {
    {"memory_bytes", (getter)map_memory_bytes, NULL,
     "bytes the map holds: its table and its arena of long keys", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods map_sequence = {.sq_length = (lenfunc)map_len};

static PyTypeObject OffsetMapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "storage._records.OffsetMap",
    .tp_doc = PyDoc_STR("OffsetMap(seed): key -> latest offset, keys held whole (see "
                        "storage/cleaner.py)."),
    .tp_basicsize = sizeof(OffsetMap),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = map_new,
    .tp_dealloc = (destructor)map_dealloc,
    .tp_methods = map_methods,
    .tp_getset = map_getset,
    .tp_as_sequence = &map_sequence,
};

/* -- CRC-32C (Castagnoli), as Kafka's RecordBatch v2 checksums: slicing by 8
 * over tables made at import. */
static uint32_t crc32c_table[8][256];

static void crc32c_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc32c_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc32c_table[0][n];
        for (int t = 1; t < 8; t++) {
            c = crc32c_table[0][c & 0xFF] ^ (c >> 8);
            crc32c_table[t][n] = c;
        }
    }
}

static uint32_t crc32c_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) { crc = crc32c_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8); n--; }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = crc32c_table[7][lo & 0xFF] ^ crc32c_table[6][(lo >> 8) & 0xFF] ^
              crc32c_table[5][(lo >> 16) & 0xFF] ^ crc32c_table[4][lo >> 24] ^
              crc32c_table[3][hi & 0xFF] ^ crc32c_table[2][(hi >> 8) & 0xFF] ^
              crc32c_table[1][(hi >> 16) & 0xFF] ^ crc32c_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
#endif
    while (n--) crc = crc32c_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

PyDoc_STRVAR(crc32c_doc, "crc32c(data, crc=0) -> int: CRC-32C of a bytes-like object.");

static PyObject *crc32c(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &view, &crc)) return NULL;
    uint32_t out;
    Py_BEGIN_ALLOW_THREADS
    out = crc32c_update(crc, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(out);
}

/* -- Whole batches walked by their headers (storage/batch.py scan_batches): a
 * batch is a 61-byte header (base offset at byte 0, batch length at 8, last
 * offset delta at 23, record count at 57). */

#define BATCH_HEADER_SIZE 61

PyDoc_STRVAR(scan_batches_doc,
    "scan_batches(data) -> (end, batches, records, next_offset): how far the whole batches "
    "at the start of data reach, how many there are, their record counts added up and the "
    "offset after the last (-1 when none is whole); a partial batch at the end is left out. "
    "ValueError for a batch length below the header's.");

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static PyObject *scan_batches(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t total = view.len, pos = 0, batches = 0;
    long long records = 0, next_offset = -1;
    while (total - pos >= BATCH_HEADER_SIZE) {
        int32_t length = (int32_t)be32(p + pos + 8);
        if (length < BATCH_HEADER_SIZE - 12) {
            PyBuffer_Release(&view);
            PyErr_Format(PyExc_ValueError, "batch length %d below minimum at position %zd",
                         (int)length, pos);
            return NULL;
        }
        Py_ssize_t end = pos + 12 + (Py_ssize_t)length;
        if (end > total) break;
        uint64_t base = ((uint64_t)be32(p + pos) << 32) | be32(p + pos + 4);
        /* In unsigned arithmetic: a corrupt header cannot overflow a signed
         * sum; the reader checks each batch before it is used. */
        next_offset = (long long)(base + (uint64_t)(int64_t)(int32_t)be32(p + pos + 23) + 1u);
        records += (int32_t)be32(p + pos + 57);
        batches++;
        pos = end;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nnLL)", pos, batches, records, next_offset);
}

static PyMethodDef methods[] = {
    {"crc32c", crc32c, METH_VARARGS, crc32c_doc},
    {"scan_batches", scan_batches, METH_O, scan_batches_doc},
    {"scan", scan, METH_VARARGS, scan_doc},
    {"pick", pick, METH_VARARGS, pick_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "storage._records",
    "A records section's keys, and a subset of its records, in C (see storage/sections.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__records(void) {
    crc32c_init();
    if (PyType_Ready(&OffsetMapType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&OffsetMapType);
    if (PyModule_AddObject(m, "OffsetMap", (PyObject *)&OffsetMapType) < 0) {
        Py_DECREF(&OffsetMapType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
