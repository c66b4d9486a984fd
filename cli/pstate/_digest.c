/*
 * The inner loop of `pstate stats`: parse, check and aggregate state records.
 *
 * Digester(agg).digest(buf, pos, end, max_line) walks the lines of
 * buf[pos:end] (cut at '\n' as bytes.split cuts them) and digests every line
 * that is a plainly written state record the way tsa.LineDigester's Python
 * loop does. It stops at the first line it is not sure about and returns
 * where that line starts; the caller hands that line to the careful Python
 * path (orjson + streamio.check_record) and calls again after it. So whatever
 * this file accepts it must read exactly as orjson would; anything unusual
 * (escapes, non-ASCII, floats, nesting, repeated keys, other record types,
 * huge numbers) is left to Python rather than handled twice.
 *
 * Speed comes from touching few Python objects: during one call, tasks and
 * cells are summed in C tables and written to the Aggregator's dicts once,
 * at the end of the call, in the order they were first seen (so the dicts
 * come out as the Python loop would fill them). Latency bucket counts stay
 * here longer, in one compact table, until flush() (Aggregator.sync).
 *
 * parse_states(buf, pos, end, max_line, k, n), for `pstate heat --live`, uses
 * the same reader and protocol but only returns the plain state records as
 * tuples (sharing interned strings and ints) for live.Feeder to draw.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_INT63 0x7fffffffffffffffLL
#define GROUP_LIMIT (1LL << 47) /* g << 16 must stay a positive int64 */
#define NAME_CACHE 32
#define NAME_MAX_LEN 48
#define COMM_CACHE 1024 /* a power of two */
#define COMM_MAX_LEN 32
#define ACC_MIN_CAP 1024
#define HIST_MIN_CAP 4096
#define HIST_MAX_USED (1 << 20) /* then flushed: bounds the table at 16 MiB */

/* cell list slots, task list slots: as in tsa.py */
enum { C_N, C_NULL, C_SUM, C_MAX, C_HIST, C_MIN };
enum { T_PID, T_COMM, T_LAST_TS, T_LAST_TO, T_FIRST_TS, T_HEAD_NULL, T_FIRST_G, T_SEEN_AT, T_KNOWN };

typedef __int128 i128;

static PyObject *no_min; /* 1 << 64: above any dur_ns (tsa._NO_MIN) */

typedef struct {
    Py_ssize_t len;
    char bytes[NAME_MAX_LEN];
    PyObject *name; /* str */
    long long id;
} name_entry;

typedef struct {
    Py_ssize_t len;
    char bytes[COMM_MAX_LEN];
    PyObject *comm; /* str */
    PyObject *gid;  /* by comm: the group id (int), or NULL until known */
} comm_entry;

/* What one call did to a task (keyed by tid) and to a cell (keyed by the
 * cell key). Both start with acc_head; gen tells live slots from stale ones. */
typedef struct {
    long long key;
    unsigned gen;
} acc_head;

typedef struct {
    acc_head h;
    int head_null;                        /* its first record's dur_ns was null */
    long long pid, last_ts, first_ts, g_first;
    i128 known;                           /* dur_ns summed, less clipped parts */
    PyObject *comm, *to;                  /* strong references while live */
} task_acc;

typedef struct {
    acc_head h;
    long long n, nnull, max, min;
    i128 sum;
    uint32_t no; /* cell number, for the bucket counts */
} cell_acc;

typedef struct {
    char *slots;
    size_t size;     /* bytes per slot */
    Py_ssize_t cap;  /* a power of two */
    Py_ssize_t used; /* live slots, listed in order[] by first touch */
    Py_ssize_t *order;
    unsigned gen;
} acc_table;

/* A latency bucket of a cell: (cell number << 11 | bucket index) -> count,
 * 8 bytes a slot, so a table of 100k buckets stays in cache. Cell numbers
 * come from cell_ids, which maps cell keys to small ints. */
typedef struct {
    uint32_t key; /* HIST_EMPTY: empty slot */
    uint32_t count;
} hist_slot;

#define HIST_EMPTY UINT32_MAX
#define HIST_IDX_BITS 11           /* bucket_index < 2048 for any dur_ns < 2^63 */
#define MAX_CELL_NOS (1 << 20)     /* then the buckets are flushed and numbering restarts */
#define COUNT_FLUSH (1u << 31)     /* a count this high: flush after the call */

typedef struct {
    long long key; /* cell key */
    uint32_t no;   /* its cell number + 1; 0: empty slot */
} cell_no_slot;

typedef struct {
    PyObject_HEAD
    PyObject *agg;
    PyObject *state_ids; /* agg.state_ids: it only grows, ids never change */
    PyObject *comm_ids;
    int by; /* 0 pid, 1 tid, 2 comm */
    int n_names;
    name_entry names[NAME_CACHE];
    comm_entry *comms;
    acc_table tasks, cells;
    hist_slot *hist;
    Py_ssize_t hist_cap, hist_used;
    int hist_flush_due;
    int has_pending;
    uint32_t pending; /* a bucket to count once its slot is in cache */
    cell_no_slot *cell_nos;  /* cell key -> cell number */
    long long *cell_keys;    /* cell number -> cell key */
    Py_ssize_t nos_cap, nos_used;
} Digester;

/* --- a strict reader for the plain subset of JSON -------------------------- */

typedef struct {
    const char *p, *e;
} cursor;

static inline void skip_ws(cursor *c)
{
    while (c->p < c->e && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n'))
        c->p++;
}

/* Bytes that end the plain part of a string: the quote, a backslash,
 * control characters and anything non-ASCII. */
static unsigned char str_stop[256];

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
#define HAS_ZERO(v) (((v) - ONES) & ~(v) & HIGHS)

/* A string without escapes, control characters or non-ASCII bytes.
 * On success *s, *n hold its contents and the cursor is past the quote. */
static inline int read_plain_string(cursor *c, const char **s, Py_ssize_t *n)
{
    if (c->p >= c->e || *c->p != '"')
        return 0;
    const char *q = ++c->p;
    /* eight bytes at a time while none of them is special */
    while (c->e - q >= 8) {
        uint64_t w;
        memcpy(&w, q, 8);
        if (HAS_ZERO(w ^ (ONES * '"')) | HAS_ZERO(w ^ (ONES * '\\')) |
            ((w - ONES * 0x20) & ~w & HIGHS) | (w & HIGHS))
            break;
        q += 8;
    }
    while (q < c->e && !str_stop[(unsigned char)*q])
        q++;
    if (q >= c->e || *q != '"')
        return 0;
    *s = c->p;
    *n = q - c->p;
    c->p = q + 1;
    return 1;
}

/* A non-negative JSON integer below 2^63, not followed by a fraction or an
 * exponent (those are floats: the careful path decides). */
static inline int read_uint63(cursor *c, long long *out)
{
    const char *q = c->p;
    if (q >= c->e || *q < '0' || *q > '9')
        return 0;
    if (*q == '0' && q + 1 < c->e && q[1] >= '0' && q[1] <= '9')
        return 0; /* leading zero: not JSON */
    unsigned long long v = 0;
    int digits = 0;
    while (q < c->e && *q >= '0' && *q <= '9') {
        if (++digits > 19)
            return 0;
        v = v * 10 + (unsigned long long)(*q - '0');
        q++;
    }
    if (v > (unsigned long long)MAX_INT63)
        return 0;
    if (q < c->e && (*q == '.' || *q == 'e' || *q == 'E'))
        return 0;
    *out = (long long)v;
    c->p = q;
    return 1;
}

static inline int read_literal(cursor *c, const char *lit, size_t n)
{
    if ((size_t)(c->e - c->p) >= n && memcmp(c->p, lit, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

/* The value of a field this loop does not use: plain scalars only. */
static inline int skip_scalar(cursor *c)
{
    const char *s;
    Py_ssize_t n;
    long long v;
    if (c->p >= c->e)
        return 0;
    switch (*c->p) {
    case '"':
        return read_plain_string(c, &s, &n);
    case 't':
        return read_literal(c, "true", 4);
    case 'f':
        return read_literal(c, "false", 5);
    case 'n':
        return read_literal(c, "null", 4);
    case '-':
        c->p++;
        if (!read_uint63(c, &v)) {
            c->p--;
            return 0;
        }
        return 1;
    default:
        return read_uint63(c, &v);
    }
}

enum {
    K_TYPE = 1 << 0, K_TS = 1 << 1, K_CPU = 1 << 2, K_PID = 1 << 3, K_TID = 1 << 4,
    K_COMM = 1 << 5, K_FROM = 1 << 6, K_TO = 1 << 7, K_DUR = 1 << 8,
};
#define K_REQUIRED (K_TYPE | K_TS | K_CPU | K_PID | K_TID | K_FROM | K_TO)

typedef struct {
    long long ts, cpu, pid, tid, dur;
    int has_dur; /* dur_ns present and not null */
    const char *comm, *from, *to;
    Py_ssize_t comm_n, from_n, to_n; /* comm == NULL: null or absent */
} state_rec;

static int key_of(const char *k, Py_ssize_t n)
{
    switch (n) {
    case 2:
        if (memcmp(k, "ts", 2) == 0) return K_TS;
        if (memcmp(k, "to", 2) == 0) return K_TO;
        return 0;
    case 3:
        if (memcmp(k, "cpu", 3) == 0) return K_CPU;
        if (memcmp(k, "pid", 3) == 0) return K_PID;
        if (memcmp(k, "tid", 3) == 0) return K_TID;
        return 0;
    case 4:
        if (memcmp(k, "type", 4) == 0) return K_TYPE;
        if (memcmp(k, "comm", 4) == 0) return K_COMM;
        if (memcmp(k, "from", 4) == 0) return K_FROM;
        return 0;
    case 6:
        return memcmp(k, "dur_ns", 6) == 0 ? K_DUR : 0;
    default:
        return 0;
    }
}

/* The value of a field the loop uses; 0: leave the line to Python. */
static inline int read_value(cursor *c, int k, state_rec *r)
{
    const char *s;
    Py_ssize_t n;
    switch (k) {
    case K_TYPE:
        return read_plain_string(c, &s, &n) && n == 5 && memcmp(s, "state", 5) == 0;
    case K_TS:
        return read_uint63(c, &r->ts);
    case K_CPU:
        return read_uint63(c, &r->cpu);
    case K_PID:
        return read_uint63(c, &r->pid);
    case K_TID:
        return read_uint63(c, &r->tid);
    case K_FROM:
        return read_plain_string(c, &r->from, &r->from_n);
    case K_TO:
        return read_plain_string(c, &r->to, &r->to_n);
    case K_COMM:
        if (read_literal(c, "null", 4)) {
            r->comm = NULL;
            return 1;
        }
        return read_plain_string(c, &r->comm, &r->comm_n);
    case K_DUR:
        if (read_literal(c, "null", 4)) {
            r->has_dur = 0;
            return 1;
        }
        return (r->has_dur = read_uint63(c, &r->dur));
    default:
        return skip_scalar(c);
    }
}

/* The fields as pstate writes them, in its order: matched as literal bytes
 * while they come that way, before the general loop takes over. */
static const struct {
    const char *lit;
    size_t len;
    int key;
} LAYOUT[] = {
    {",\"ts\":", 6, K_TS},       {",\"cpu\":", 7, K_CPU},   {",\"pid\":", 7, K_PID},
    {",\"tid\":", 7, K_TID},     {",\"comm\":", 8, K_COMM}, {",\"from\":", 8, K_FROM},
    {",\"to\":", 6, K_TO},       {",\"dur_ns\":", 10, K_DUR},
};
#define LAYOUT_HEAD "{\"type\":\"state\""

/* 1: a state record the fast loop may take; 0: leave the line to Python. */
static int parse_state(const char *p, const char *e, state_rec *r)
{
    cursor c = {p, e};
    unsigned seen = 0;
    const char *s;
    Py_ssize_t n;

    *r = (state_rec){0};
    if ((size_t)(e - p) > sizeof(LAYOUT_HEAD) - 1 && memcmp(p, LAYOUT_HEAD, sizeof(LAYOUT_HEAD) - 1) == 0) {
        c.p += sizeof(LAYOUT_HEAD) - 1;
        seen = K_TYPE;
        for (size_t i = 0; i < sizeof(LAYOUT) / sizeof(LAYOUT[0]); i++) {
            if ((size_t)(c.e - c.p) < LAYOUT[i].len || memcmp(c.p, LAYOUT[i].lit, LAYOUT[i].len) != 0)
                break;
            c.p += LAYOUT[i].len;
            if (!read_value(&c, LAYOUT[i].key, r))
                return 0;
            seen |= (unsigned)LAYOUT[i].key;
        }
        goto after_value;
    }
    skip_ws(&c);
    if (c.p >= c.e || *c.p != '{')
        return 0;
    c.p++;
    skip_ws(&c);
    if (c.p < c.e && *c.p == '}')
        return 0;
    for (;;) {
        skip_ws(&c);
        if (!read_plain_string(&c, &s, &n))
            return 0;
        int k = key_of(s, n);
        if (k & seen)
            return 0; /* a repeated key: orjson's rule, not ours */
        seen |= (unsigned)k;
        skip_ws(&c);
        if (c.p >= c.e || *c.p != ':')
            return 0;
        c.p++;
        skip_ws(&c);
        if (!read_value(&c, k, r))
            return 0;
after_value:
        skip_ws(&c);
        if (c.p >= c.e)
            return 0;
        if (*c.p == ',') {
            c.p++;
            continue;
        }
        if (*c.p != '}')
            return 0;
        c.p++;
        break;
    }
    skip_ws(&c);
    return c.p == c.e && (seen & K_REQUIRED) == K_REQUIRED;
}

/* --- small helpers on Python ints in lists -------------------------------- */

static PyObject *long_from_i128(i128 v)
{
    if (v >= LLONG_MIN && v <= LLONG_MAX)
        return PyLong_FromLongLong((long long)v);
    /* hi * 2^64 + lo */
    PyObject *hi = PyLong_FromLongLong((long long)(v >> 64));
    PyObject *lo = PyLong_FromUnsignedLongLong((unsigned long long)v);
    PyObject *sh = PyLong_FromLong(64);
    PyObject *shifted = (hi && sh) ? PyNumber_Lshift(hi, sh) : NULL;
    PyObject *out = (shifted && lo) ? PyNumber_Add(shifted, lo) : NULL;
    Py_XDECREF(hi);
    Py_XDECREF(lo);
    Py_XDECREF(sh);
    Py_XDECREF(shifted);
    return out;
}

/* list[i] += delta, exact for any int already there. */
static int list_add(PyObject *list, Py_ssize_t i, i128 delta)
{
    PyObject *cur = PyList_GET_ITEM(list, i);
    PyObject *now = NULL;
    int overflow = 0;
    long long v = PyLong_Check(cur) ? PyLong_AsLongLongAndOverflow(cur, &overflow) : 0;
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (PyLong_Check(cur) && !overflow) {
        now = long_from_i128((i128)v + delta);
    } else {
        PyObject *d = long_from_i128(delta);
        now = d ? PyNumber_Add(cur, d) : NULL;
        Py_XDECREF(d);
    }
    if (!now)
        return -1;
    PyList_SetItem(list, i, now); /* steals now, drops cur */
    return 0;
}

static int list_set_ll(PyObject *list, Py_ssize_t i, long long v)
{
    PyObject *o = PyLong_FromLongLong(v);
    if (!o)
        return -1;
    PyList_SetItem(list, i, o);
    return 0;
}

static void list_set_obj(PyObject *list, Py_ssize_t i, PyObject *o)
{
    Py_INCREF(o);
    PyList_SetItem(list, i, o);
}

/* Compare the int in list[i] with v: *res < 0, 0, > 0. Too big for int64: larger. */
static int list_cmp(PyObject *list, Py_ssize_t i, long long v, int *res)
{
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(list, i), &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *res = overflow ? overflow : (x < v ? -1 : (x > v ? 1 : 0));
    return 0;
}

/* --- names, comms and groups ----------------------------------------------- */

/* A new reference to the str of an ASCII name, through a small cache of
 * names[*count]; *entry: its cache entry (id -1 when new), or NULL when it
 * did not fit. Digester's state names and parse_states' share this. */
static PyObject *name_str(name_entry *names, int *count, const char *s, Py_ssize_t n, name_entry **entry)
{
    for (int i = 0; i < *count; i++) {
        name_entry *ne = &names[i];
        if (ne->len == n && memcmp(ne->bytes, s, (size_t)n) == 0) {
            Py_INCREF(ne->name);
            *entry = ne;
            return ne->name;
        }
    }
    *entry = NULL;
    PyObject *str = PyUnicode_DecodeASCII(s, n, NULL);
    if (str && *count < NAME_CACHE && n <= NAME_MAX_LEN) {
        name_entry *ne = &names[(*count)++];
        ne->len = n;
        memcpy(ne->bytes, s, (size_t)n);
        Py_INCREF(str);
        ne->name = str;
        ne->id = -1;
        *entry = ne;
    }
    return str;
}

/* The state name (a new reference) and id, through a cache in front of agg.state_id. */
static int state_of(Digester *self, const char *s, Py_ssize_t n, PyObject **name, long long *id)
{
    name_entry *ne;
    PyObject *str = name_str(self->names, &self->n_names, s, n, &ne);
    if (!str)
        return -1;
    if (ne && ne->id >= 0) {
        *name = str;
        *id = ne->id;
        return 0;
    }
    PyObject *sid = PyDict_GetItemWithError(self->state_ids, str);
    if (sid)
        Py_INCREF(sid);
    else if (PyErr_Occurred() || !(sid = PyObject_CallMethod(self->agg, "state_id", "O", str))) {
        Py_DECREF(str);
        return -1;
    }
    long long v = PyLong_AsLongLong(sid);
    Py_DECREF(sid);
    if (v == -1 && PyErr_Occurred()) {
        Py_DECREF(str);
        return -1;
    }
    if (ne)
        ne->id = v;
    *name = str;
    *id = v;
    return 0;
}

/* A cheap hash: collisions only cost a cache refill (entries are checked). */
static inline unsigned comm_hash(const char *s, Py_ssize_t n)
{
    unsigned h = (unsigned)n * 0x9E3779B1u;
    if (n) {
        h ^= (unsigned char)s[0] * 0x85EBCA77u;
        h ^= (unsigned char)s[n - 1] * 0xC2B2AE3Du;
        h ^= (unsigned char)s[n / 2] * 0x27D4EB2Fu;
    }
    return (h ^ (h >> 15)) & (COMM_CACHE - 1);
}

/* The comm as a str (a new reference), or None, through the comm cache
 * `table` (COMM_CACHE entries); *entry: its entry, NULL when not cached. */
static PyObject *comm_str(comm_entry *table, const state_rec *r, comm_entry **entry)
{
    *entry = NULL;
    if (!r->comm)
        Py_RETURN_NONE;
    if (r->comm_n > COMM_MAX_LEN)
        return PyUnicode_DecodeASCII(r->comm, r->comm_n, NULL);
    comm_entry *ce = &table[comm_hash(r->comm, r->comm_n)];
    if (!ce->comm || ce->len != r->comm_n || memcmp(ce->bytes, r->comm, (size_t)r->comm_n) != 0) {
        PyObject *str = PyUnicode_DecodeASCII(r->comm, r->comm_n, NULL);
        if (!str)
            return NULL;
        Py_XSETREF(ce->comm, str);
        Py_CLEAR(ce->gid);
        ce->len = r->comm_n;
        memcpy(ce->bytes, r->comm, (size_t)r->comm_n);
    }
    *entry = ce;
    Py_INCREF(ce->comm);
    return ce->comm;
}

/* The group of a record by comm: agg.comm_ids.get(comm) or agg.comm_id(comm). */
static int comm_group(Digester *self, PyObject *comm, comm_entry *ce, long long *g)
{
    PyObject *gid;
    if (ce && ce->gid) {
        gid = ce->gid;
        Py_INCREF(gid);
    } else {
        gid = PyDict_GetItemWithError(self->comm_ids, comm);
        if (gid)
            Py_INCREF(gid);
        else if (PyErr_Occurred() || !(gid = PyObject_CallMethod(self->agg, "comm_id", "O", comm)))
            return -1;
        if (ce) {
            Py_INCREF(gid);
            Py_XSETREF(ce->gid, gid);
        }
    }
    *g = PyLong_AsLongLong(gid);
    Py_DECREF(gid);
    return (*g == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* --- per-call tables ------------------------------------------------------- */

static inline size_t mix64(unsigned long long h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return (size_t)(h ^ (h >> 33));
}

#define SLOT(t, i) ((acc_head *)((t)->slots + (size_t)(i) * (t)->size))

static int acc_init(acc_table *t, size_t size)
{
    t->size = size;
    t->cap = ACC_MIN_CAP;
    t->used = 0;
    t->gen = 1;
    t->slots = PyMem_Calloc((size_t)t->cap, size); /* gen 0: empty */
    t->order = PyMem_Malloc((size_t)t->cap / 2 * sizeof(Py_ssize_t));
    if (!t->slots || !t->order) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void acc_free(acc_table *t)
{
    PyMem_Free(t->slots);
    PyMem_Free(t->order);
    t->slots = NULL;
    t->order = NULL;
}

/* Start a call: every slot becomes stale. */
static void acc_begin(acc_table *t)
{
    t->used = 0;
    if (++t->gen == 0) {
        memset(t->slots, 0, (size_t)t->cap * t->size);
        t->gen = 1;
    }
}

static int acc_grow(acc_table *t)
{
    Py_ssize_t cap = t->cap * 2;
    char *slots = PyMem_Calloc((size_t)cap, t->size);
    Py_ssize_t *order = PyMem_Malloc((size_t)cap / 2 * sizeof(Py_ssize_t));
    if (!slots || !order) {
        PyMem_Free(slots);
        PyMem_Free(order);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < t->used; k++) {
        acc_head *old = SLOT(t, t->order[k]);
        size_t i = mix64((unsigned long long)old->key) & (size_t)(cap - 1);
        while (((acc_head *)(slots + i * t->size))->gen == t->gen)
            i = (i + 1) & (size_t)(cap - 1);
        memcpy(slots + i * t->size, old, t->size);
        order[k] = (Py_ssize_t)i;
    }
    PyMem_Free(t->slots);
    PyMem_Free(t->order);
    t->slots = slots;
    t->order = order;
    t->cap = cap;
    return 0;
}

/* The live slot of key, claimed (zeroed, *fresh = 1) when new in this call. */
static void *acc_get(acc_table *t, long long key, int *fresh)
{
    size_t mask = (size_t)t->cap - 1, i = mix64((unsigned long long)key) & mask;
    for (;;) {
        acc_head *h = SLOT(t, i);
        if (h->gen != t->gen)
            break;
        if (h->key == key) {
            *fresh = 0;
            return h;
        }
        i = (i + 1) & mask;
    }
    if (2 * (t->used + 1) > t->cap) {
        if (acc_grow(t) < 0)
            return NULL;
        return acc_get(t, key, fresh);
    }
    acc_head *h = SLOT(t, i);
    memset(h, 0, t->size);
    h->key = key;
    h->gen = t->gen;
    t->order[t->used++] = (Py_ssize_t)i;
    *fresh = 1;
    return h;
}

/* Drop the references live task slots hold. */
static void tasks_release(acc_table *t)
{
    for (Py_ssize_t k = 0; k < t->used; k++) {
        task_acc *ta = (task_acc *)SLOT(t, t->order[k]);
        Py_CLEAR(ta->comm);
        Py_CLEAR(ta->to);
    }
}

/* --- latency bucket counts ------------------------------------------------- */

/* The number of a cell key (assigned on first sight); -1 on error. */
static long long cell_no(Digester *self, long long key)
{
    if (2 * (self->nos_used + 1) > self->nos_cap) {
        Py_ssize_t cap = self->nos_cap ? self->nos_cap * 2 : ACC_MIN_CAP;
        cell_no_slot *t = PyMem_Calloc((size_t)cap, sizeof(cell_no_slot));
        long long *keys = PyMem_Realloc(self->cell_keys, (size_t)cap / 2 * sizeof(long long));
        if (!t || !keys) {
            PyMem_Free(t);
            if (keys)
                self->cell_keys = keys;
            PyErr_NoMemory();
            return -1;
        }
        self->cell_keys = keys;
        for (Py_ssize_t k = 0; k < self->nos_used; k++) {
            size_t i = mix64((unsigned long long)keys[k]) & (size_t)(cap - 1);
            while (t[i].no)
                i = (i + 1) & (size_t)(cap - 1);
            t[i].key = keys[k];
            t[i].no = (uint32_t)k + 1;
        }
        PyMem_Free(self->cell_nos);
        self->cell_nos = t;
        self->nos_cap = cap;
    }
    size_t mask = (size_t)self->nos_cap - 1, i = mix64((unsigned long long)key) & mask;
    while (self->cell_nos[i].no) {
        if (self->cell_nos[i].key == key)
            return self->cell_nos[i].no - 1;
        i = (i + 1) & mask;
    }
    self->cell_nos[i].key = key;
    self->cell_nos[i].no = (uint32_t)++self->nos_used;
    self->cell_keys[self->nos_used - 1] = key;
    return self->nos_used - 1;
}

static int hist_resize(Digester *self, Py_ssize_t cap)
{
    hist_slot *t = PyMem_Malloc((size_t)cap * sizeof(hist_slot));
    if (!t) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < cap; k++)
        t[k].key = HIST_EMPTY;
    for (Py_ssize_t k = 0; k < self->hist_cap; k++) {
        hist_slot *e = &self->hist[k];
        if (e->key == HIST_EMPTY)
            continue;
        size_t i = mix64(e->key) & (size_t)(cap - 1);
        while (t[i].key != HIST_EMPTY)
            i = (i + 1) & (size_t)(cap - 1);
        t[i] = *e;
    }
    PyMem_Free(self->hist);
    self->hist = t;
    self->hist_cap = cap;
    return 0;
}

static inline int hist_add(Digester *self, uint32_t key)
{
    if (2 * (self->hist_used + 1) > self->hist_cap &&
        hist_resize(self, self->hist_cap ? self->hist_cap * 2 : HIST_MIN_CAP) < 0)
        return -1;
    size_t mask = (size_t)self->hist_cap - 1, i = mix64(key) & mask;
    hist_slot *t = self->hist;
    while (t[i].key != HIST_EMPTY) {
        if (t[i].key == key) {
            if (++t[i].count >= COUNT_FLUSH)
                self->hist_flush_due = 1;
            return 0;
        }
        i = (i + 1) & mask;
    }
    t[i].key = key;
    t[i].count = 1;
    if (++self->hist_used > HIST_MAX_USED)
        self->hist_flush_due = 1;
    return 0;
}

/* Count the bucket of the previous record and fetch this one's slot: the miss
 * on a large table then overlaps with parsing the next line. */
static inline int hist_defer(Digester *self, uint32_t no, long long idx)
{
    if (self->has_pending && hist_add(self, self->pending) < 0)
        return -1;
    self->pending = (no << HIST_IDX_BITS) | (uint32_t)idx;
    self->has_pending = 1;
    if (self->hist_cap)
        __builtin_prefetch(&self->hist[mix64(self->pending) & (size_t)(self->hist_cap - 1)]);
    return 0;
}

static inline int hist_settle(Digester *self)
{
    if (!self->has_pending)
        return 0;
    self->has_pending = 0;
    return hist_add(self, self->pending);
}

/* Add the waiting bucket counts to agg.cells[cell][C_HIST]; empty the table
 * and forget the cell numbers. Cells are written at the end of every call,
 * so they exist by now. */
static int hist_flush(Digester *self)
{
    self->hist_flush_due = 0;
    if (!self->hist_used)
        goto forget;
    PyObject *cells = PyObject_GetAttrString(self->agg, "cells");
    if (!cells)
        return -1;
    int rc = -1;
    if (!PyDict_Check(cells)) {
        PyErr_SetString(PyExc_TypeError, "agg.cells must be a dict");
        goto out;
    }
    for (Py_ssize_t k = 0; k < self->hist_cap; k++) {
        hist_slot *e = &self->hist[k];
        if (e->key == HIST_EMPTY)
            continue;
        PyObject *key = PyLong_FromLongLong(self->cell_keys[e->key >> HIST_IDX_BITS]);
        if (!key)
            goto out;
        PyObject *cell = PyDict_GetItemWithError(cells, key);
        Py_DECREF(key);
        if (!cell || !PyList_CheckExact(cell) || PyList_GET_SIZE(cell) < 6 ||
            !PyDict_Check(PyList_GET_ITEM(cell, C_HIST))) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "bucket counts for a cell that is gone");
            goto out;
        }
        PyObject *hist = PyList_GET_ITEM(cell, C_HIST);
        PyObject *ik = PyLong_FromLong((long)(e->key & ((1u << HIST_IDX_BITS) - 1)));
        if (!ik)
            goto out;
        PyObject *cur = PyDict_GetItemWithError(hist, ik);
        PyObject *now = NULL;
        if (cur) {
            PyObject *n = PyLong_FromUnsignedLong(e->count);
            now = n ? PyNumber_Add(cur, n) : NULL;
            Py_XDECREF(n);
        } else if (!PyErr_Occurred()) {
            now = PyLong_FromUnsignedLong(e->count);
        }
        int bad = !now || PyDict_SetItem(hist, ik, now) < 0;
        Py_XDECREF(now);
        Py_DECREF(ik);
        if (bad)
            goto out;
        e->key = HIST_EMPTY;
        self->hist_used--;
    }
    rc = 0;
out:
    Py_DECREF(cells);
    if (rc < 0)
        return rc;
forget:
    /* Numbering restarts: flushes happen between calls, when no cell_acc is live. */
    if (self->cell_nos)
        memset(self->cell_nos, 0, (size_t)self->nos_cap * sizeof(cell_no_slot));
    self->nos_used = 0;
    return 0;
}

/* --- one record, and the write-back at the end of a call ------------------ */

/* 0: digested; 1: leave the line to the careful path; -1: error. */
static int digest_one(Digester *self, const state_rec *r, PyObject *clip, long long clip_v)
{
    PyObject *frm = NULL, *to = NULL, *comm = NULL;
    long long fi, ti, g;
    int fresh, rc = -1;
    comm_entry *ce;

    if (r->pid >= GROUP_LIMIT || r->tid >= GROUP_LIMIT)
        return 1; /* the careful path does big ints */
    if (state_of(self, r->from, r->from_n, &frm, &fi) < 0 || state_of(self, r->to, r->to_n, &to, &ti) < 0)
        goto out;
    if (!(comm = comm_str(self->comms, r, &ce)))
        goto out;
    if (self->by == 0)
        g = r->pid;
    else if (self->by == 1)
        g = r->tid;
    else if (comm_group(self, comm, ce, &g) < 0)
        goto out;
    if (g < 0 || g >= GROUP_LIMIT) {
        rc = 1;
        goto out;
    }

    task_acc *ta = acc_get(&self->tasks, r->tid, &fresh);
    if (!ta)
        goto out;
    if (fresh) {
        ta->first_ts = r->ts;
        ta->head_null = !r->has_dur;
        ta->g_first = g;
    }
    ta->pid = r->pid;
    ta->last_ts = r->ts;
    Py_XSETREF(ta->comm, comm); /* the slot takes the references */
    Py_XSETREF(ta->to, to);
    comm = to = NULL;
    if (r->has_dur)
        ta->known += r->dur;

    long long key = (g << 16) | (fi << 8) | ti;
    cell_acc *ca = acc_get(&self->cells, key, &fresh);
    if (!ca)
        goto out;
    if (fresh) {
        long long no = cell_no(self, key);
        if (no < 0)
            goto out;
        ca->no = (uint32_t)no;
    }
    ca->n++;
    if (!r->has_dur) {
        ca->nnull++;
        rc = 0;
        goto out;
    }
    long long d = r->dur;
    if (ca->n - ca->nnull == 1 || d > ca->max)
        ca->max = d;
    if (ca->n - ca->nnull == 1 || d < ca->min)
        ca->min = d;
    ca->sum += d;
    /* latency.bucket_index: log-linear, 32 buckets per power of two */
    int s = (d ? 64 - __builtin_clzll((unsigned long long)d) : 0) - 6; /* bit_length - 6 */
    long long idx = s > 0 ? (((long long)s << 5) + (d >> s)) : d;
    if (hist_defer(self, ca->no, idx) < 0)
        goto out;

    if (clip && d > r->ts - clip_v) {
        /* Part of d lies before the interval: agg._clip books it, known loses it. */
        PyObject *cut = PyObject_CallMethod(self->agg, "_clip", "LOLL", g, frm, d, r->ts);
        if (!cut)
            goto out;
        long long c = PyLong_AsLongLong(cut);
        Py_DECREF(cut);
        if (c == -1 && PyErr_Occurred())
            goto out;
        ta->known -= c;
    }
    rc = 0;
out:
    Py_XDECREF(frm);
    Py_XDECREF(to);
    Py_XDECREF(comm);
    return rc;
}

static int write_tasks(Digester *self, PyObject *tasks, PyObject *clip)
{
    acc_table *t = &self->tasks;
    for (Py_ssize_t k = 0; k < t->used; k++) {
        task_acc *ta = (task_acc *)SLOT(t, t->order[k]);
        PyObject *tid = PyLong_FromLongLong(ta->h.key);
        if (!tid)
            return -1;
        PyObject *task = PyDict_GetItemWithError(tasks, tid);
        if (!task) {
            PyObject *known = PyErr_Occurred() ? NULL : long_from_i128(ta->known);
            if (known)
                task = Py_BuildValue("[LOLOLOLON]", ta->pid, ta->comm, ta->last_ts, ta->to, ta->first_ts,
                                     ta->head_null ? Py_True : Py_False, ta->g_first,
                                     clip ? clip : Py_None, known);
            int bad = !task || PyDict_SetItem(tasks, tid, task) < 0;
            Py_XDECREF(task);
            Py_DECREF(tid);
            if (bad)
                return -1;
            continue;
        }
        Py_DECREF(tid);
        if (!PyList_CheckExact(task) || PyList_GET_SIZE(task) < 9) {
            PyErr_SetString(PyExc_TypeError, "unexpected task entry");
            return -1;
        }
        int same;
        if (list_cmp(task, T_PID, ta->pid, &same) < 0 || (same && list_set_ll(task, T_PID, ta->pid) < 0))
            return -1;
        if (PyList_GET_ITEM(task, T_COMM) != ta->comm)
            list_set_obj(task, T_COMM, ta->comm);
        if (list_set_ll(task, T_LAST_TS, ta->last_ts) < 0)
            return -1;
        if (PyList_GET_ITEM(task, T_LAST_TO) != ta->to)
            list_set_obj(task, T_LAST_TO, ta->to);
        if (ta->known && list_add(task, T_KNOWN, ta->known) < 0)
            return -1;
    }
    return 0;
}

static int write_cells(Digester *self, PyObject *cells)
{
    acc_table *t = &self->cells;
    for (Py_ssize_t k = 0; k < t->used; k++) {
        cell_acc *ca = (cell_acc *)SLOT(t, t->order[k]);
        int known = ca->n > ca->nnull;
        PyObject *key = PyLong_FromLongLong(ca->h.key);
        if (!key)
            return -1;
        PyObject *cell = PyDict_GetItemWithError(cells, key);
        if (!cell) {
            PyObject *sum = PyErr_Occurred() ? NULL : long_from_i128(ca->sum);
            PyObject *vmin = sum ? (known ? PyLong_FromLongLong(ca->min) : (Py_INCREF(no_min), no_min)) : NULL;
            if (vmin)
                cell = Py_BuildValue("[LLNL{}N]", ca->n, ca->nnull, sum, known ? ca->max : 0LL, vmin);
            else
                Py_XDECREF(sum);
            int bad = !cell || PyDict_SetItem(cells, key, cell) < 0;
            Py_XDECREF(cell);
            Py_DECREF(key);
            if (bad)
                return -1;
            continue;
        }
        Py_DECREF(key);
        if (!PyList_CheckExact(cell) || PyList_GET_SIZE(cell) < 6) {
            PyErr_SetString(PyExc_TypeError, "unexpected cell entry");
            return -1;
        }
        if (list_add(cell, C_N, ca->n) < 0 || (ca->nnull && list_add(cell, C_NULL, ca->nnull) < 0))
            return -1;
        if (!known)
            continue;
        int cmp;
        if (list_add(cell, C_SUM, ca->sum) < 0 || list_cmp(cell, C_MAX, ca->max, &cmp) < 0 ||
            (cmp < 0 && list_set_ll(cell, C_MAX, ca->max) < 0) || list_cmp(cell, C_MIN, ca->min, &cmp) < 0 ||
            (cmp > 0 && list_set_ll(cell, C_MIN, ca->min) < 0))
            return -1;
    }
    return 0;
}

/* --- the Python type ------------------------------------------------------ */

static void Digester_clear_caches(Digester *self)
{
    for (int i = 0; i < self->n_names; i++)
        Py_CLEAR(self->names[i].name);
    self->n_names = 0;
    if (self->comms) {
        for (int i = 0; i < COMM_CACHE; i++) {
            Py_CLEAR(self->comms[i].comm);
            Py_CLEAR(self->comms[i].gid);
        }
    }
}

static int Digester_init(Digester *self, PyObject *args, PyObject *kw)
{
    PyObject *agg;
    if (self->agg) {
        PyErr_SetString(PyExc_RuntimeError, "Digester is bound to its Aggregator already");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O:Digester", &agg))
        return -1;
    PyObject *by = PyObject_GetAttrString(agg, "by");
    if (!by)
        return -1;
    int b = !PyUnicode_Check(by) ? -1
          : PyUnicode_CompareWithASCIIString(by, "pid") == 0 ? 0
          : PyUnicode_CompareWithASCIIString(by, "tid") == 0 ? 1
          : PyUnicode_CompareWithASCIIString(by, "comm") == 0 ? 2 : -1;
    Py_DECREF(by);
    if (b < 0) {
        PyErr_SetString(PyExc_ValueError, "agg.by must be pid, tid or comm");
        return -1;
    }
    PyObject *sids = PyObject_GetAttrString(agg, "state_ids");
    PyObject *cids = sids ? PyObject_GetAttrString(agg, "comm_ids") : NULL;
    if (!cids || !PyDict_Check(sids) || !PyDict_Check(cids)) {
        Py_XDECREF(sids);
        Py_XDECREF(cids);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "agg.state_ids and agg.comm_ids must be dicts");
        return -1;
    }
    self->comms = PyMem_Calloc(COMM_CACHE, sizeof(comm_entry));
    if (!self->comms || acc_init(&self->tasks, sizeof(task_acc)) < 0 ||
        acc_init(&self->cells, sizeof(cell_acc)) < 0) {
        Py_DECREF(sids);
        Py_DECREF(cids);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(agg);
    self->agg = agg;
    self->state_ids = sids;
    self->comm_ids = cids;
    self->by = b;
    return 0;
}

static void Digester_dealloc(Digester *self)
{
    Digester_clear_caches(self);
    PyMem_Free(self->comms);
    acc_free(&self->tasks);
    acc_free(&self->cells);
    PyMem_Free(self->hist);
    PyMem_Free(self->cell_nos);
    PyMem_Free(self->cell_keys);
    Py_XDECREF(self->agg);
    Py_XDECREF(self->state_ids);
    Py_XDECREF(self->comm_ids);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(digest_doc,
"digest(buf, pos, end, max_line) -> (stop, lines, events)\n\n"
"Digest the lines of buf[pos:end] (as buf[pos:end].split(b'\\n') cuts them)\n"
"into the Aggregator until one needs the careful path (or is longer than\n"
"max_line). stop: where that line starts, end + 1 when all were digested;\n"
"lines: lines consumed; events: records digested.");

static PyObject *Digester_digest(Digester *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, end, max_line;
    if (!self->agg) {
        PyErr_SetString(PyExc_RuntimeError, "Digester not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*nnn:digest", &view, &pos, &end, &max_line))
        return NULL;
    if (pos < 0 || end > view.len || pos > end + 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "bad range");
        return NULL;
    }
    PyObject *tasks = PyObject_GetAttrString(self->agg, "tasks");
    PyObject *cells = tasks ? PyObject_GetAttrString(self->agg, "cells") : NULL;
    PyObject *clip = cells ? PyObject_GetAttrString(self->agg, "clip_ts") : NULL;
    PyObject *result = NULL;
    Py_ssize_t lines = 0;
    long long clip_v = 0;
    acc_begin(&self->tasks);
    acc_begin(&self->cells);
    if (!clip)
        goto done;
    if (!PyDict_Check(tasks) || !PyDict_Check(cells) || (clip != Py_None && !PyLong_Check(clip))) {
        PyErr_SetString(PyExc_TypeError, "unexpected Aggregator state");
        goto done;
    }
    if (clip != Py_None) {
        int overflow = 0;
        clip_v = PyLong_AsLongLongAndOverflow(clip, &overflow);
        if (overflow || clip_v < 0) {
            /* outside the range of valid ts: the careful path for everything */
            result = Py_BuildValue("nnn", pos, (Py_ssize_t)0, (Py_ssize_t)0);
            goto done;
        }
    }
    if (self->hist_flush_due && hist_flush(self) < 0)
        goto done;
    const char *buf = view.buf;
    PyObject *clip_or_null = clip == Py_None ? NULL : clip;
    /* Segments as bytes.split(b"\n") makes them: the last one ends at end. */
    while (pos <= end) {
        const char *p = buf + pos;
        const char *nl = memchr(p, '\n', (size_t)(end - pos));
        const char *e = nl ? nl : buf + end;
        state_rec r;
        if (e - p > max_line || !parse_state(p, e, &r) || self->nos_used >= MAX_CELL_NOS)
            break; /* (too many cells in one call: the rest after a flush) */
        int rc = digest_one(self, &r, clip_or_null, clip_v);
        if (rc < 0)
            goto done;
        if (rc > 0)
            break;
        lines++;
        pos = (e - buf) + 1; /* end + 1 after the last segment */
    }
    if (hist_settle(self) < 0 || write_tasks(self, tasks, clip_or_null) < 0 || write_cells(self, cells) < 0)
        goto done;
    if (self->nos_used >= MAX_CELL_NOS / 2)
        self->hist_flush_due = 1;
    if (self->hist_flush_due && hist_flush(self) < 0)
        goto done;
    result = Py_BuildValue("nnn", pos, lines, lines);
done:
    self->has_pending = 0; /* (only left set by an error) */
    tasks_release(&self->tasks);
    PyBuffer_Release(&view);
    Py_XDECREF(tasks);
    Py_XDECREF(cells);
    Py_XDECREF(clip);
    return result;
}

static PyObject *Digester_flush(Digester *self, PyObject *unused)
{
    if (self->agg && hist_flush(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Digester_methods[] = {
    {"digest", (PyCFunction)Digester_digest, METH_VARARGS, digest_doc},
    {"flush", (PyCFunction)Digester_flush, METH_NOARGS,
     "flush()\n\nAdd the latency bucket counts held here to the Aggregator's cells."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DigesterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pstate._digest.Digester",
    .tp_basicsize = sizeof(Digester),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Digester(agg): the native loop of tsa.LineDigester for one Aggregator",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Digester_init,
    .tp_dealloc = (destructor)Digester_dealloc,
    .tp_methods = Digester_methods,
};

/* --- parse_states: plain state records as tuples (heat --live) ------------ */

/* Interned strings and ints, so the tuples of one stream share objects:
 * state names (few), comms (hashed, like Digester's) and pids/tids. */
#define LIVE_INTS 4096 /* a power of two */

static name_entry live_names[NAME_CACHE];
static int live_n_names;
static comm_entry *live_comms;
static PyObject *live_ints[LIVE_INTS];
static long long live_int_keys[LIVE_INTS];

/* A new reference to the int v (0 <= v < 2^63), shared while it stays cached. */
static PyObject *live_int(long long v)
{
    size_t h = (size_t)v & (LIVE_INTS - 1);
    PyObject *o = live_ints[h];
    if (o && live_int_keys[h] == v) {
        Py_INCREF(o);
        return o;
    }
    o = PyLong_FromLongLong(v);
    if (o) {
        Py_INCREF(o);
        Py_XSETREF(live_ints[h], o);
        live_int_keys[h] = v;
    }
    return o;
}

/* Where the first '"to":"' of [p, e) starts, or NULL (bytes.find). */
static inline const char *find_to(const char *p, const char *e)
{
    while (e - p >= 6) {
        const char *q = memchr(p, '"', (size_t)(e - p - 5));
        if (!q)
            return NULL;
        if (memcmp(q, "\"to\":\"", 6) == 0)
            return q;
        p = q + 1;
    }
    return NULL;
}

/* A transition into running, runnable, sleeping or preempted, known by its
 * bytes as live.Feeder knows it: the first '"to":"' is followed by run, sle
 * or pre. */
static inline int frequent_line(const char *p, const char *e)
{
    const char *q = find_to(p, e);
    if (!q || e - (q + 6) < 3)
        return 0;
    q += 6;
    return memcmp(q, "run", 3) == 0 || memcmp(q, "sle", 3) == 0 || memcmp(q, "pre", 3) == 0;
}

PyDoc_STRVAR(parse_states_doc,
"parse_states(buf, pos, end, max_line, k=1, n=0) -> (stop, lines, rows)\n\n"
"The plain state records among the lines of buf[pos:end] (as\n"
"buf[pos:end].split(b'\\n') cuts them) as tuples\n"
"(ts, pid, tid, comm, from, to, dur_ns, cpu, weight), comm and dur_ns None\n"
"when null or absent, until a line needs the careful path (or is longer\n"
"than max_line). n: the number of the line before pos. With k > 1, a\n"
"transition into running, runnable, sleeping or preempted (by its bytes)\n"
"on a line whose number is not a multiple of k is passed over unparsed,\n"
"and one that is kept weighs k. Empty lines are passed over.\n"
"stop: where the line that needs the careful path starts, end + 1 when\n"
"none did; lines: lines consumed (passed over ones included).");

static PyObject *parse_states(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, end, max_line;
    long long k = 1, n = 0;
    if (!PyArg_ParseTuple(args, "y*nnn|LL:parse_states", &view, &pos, &end, &max_line, &k, &n))
        return NULL;
    if (pos < 0 || end > view.len || pos > end + 1 || k < 1 || n < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "bad range");
        return NULL;
    }
    if (!live_comms && !(live_comms = PyMem_Calloc(COMM_CACHE, sizeof(comm_entry)))) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    PyObject *rows = PyList_New(0);
    PyObject *one = PyLong_FromLong(1);
    PyObject *weight_k = PyLong_FromLongLong(k);
    PyObject *result = NULL;
    Py_ssize_t lines = 0;
    if (!rows || !one || !weight_k)
        goto done;
    const char *buf = view.buf;
    while (pos <= end) {
        const char *p = buf + pos;
        const char *nl = memchr(p, '\n', (size_t)(end - pos));
        const char *e = nl ? nl : buf + end;
        if (e - p > max_line)
            break;
        long long no = n + lines + 1;
        PyObject *weight = one;
        if (k > 1 && frequent_line(p, e)) {
            if (no % k) {
                lines++;
                pos = (e - buf) + 1;
                continue;
            }
            weight = weight_k;
        }
        if (e == p) {
            lines++;
            pos = (e - buf) + 1;
            continue;
        }
        state_rec r;
        if (!parse_state(p, e, &r))
            break;
        PyObject *t = PyTuple_New(9);
        if (!t)
            goto done;
        PyObject *o;
        name_entry *ne;
        comm_entry *ce;
        /* PyTuple_SET_ITEM steals; a NULL item is fine for the tuple's dealloc */
        PyTuple_SET_ITEM(t, 0, PyLong_FromLongLong(r.ts));
        PyTuple_SET_ITEM(t, 1, live_int(r.pid));
        PyTuple_SET_ITEM(t, 2, live_int(r.tid));
        PyTuple_SET_ITEM(t, 3, comm_str(live_comms, &r, &ce));
        PyTuple_SET_ITEM(t, 4, name_str(live_names, &live_n_names, r.from, r.from_n, &ne));
        PyTuple_SET_ITEM(t, 5, name_str(live_names, &live_n_names, r.to, r.to_n, &ne));
        if (r.has_dur)
            o = PyLong_FromLongLong(r.dur);
        else {
            o = Py_None;
            Py_INCREF(o);
        }
        PyTuple_SET_ITEM(t, 6, o);
        PyTuple_SET_ITEM(t, 7, live_int(r.cpu));
        Py_INCREF(weight);
        PyTuple_SET_ITEM(t, 8, weight);
        int bad = 0;
        for (int i = 0; i < 8; i++)
            bad |= PyTuple_GET_ITEM(t, i) == NULL;
        if (bad || PyList_Append(rows, t) < 0) {
            Py_DECREF(t);
            goto done;
        }
        Py_DECREF(t);
        lines++;
        pos = (e - buf) + 1; /* end + 1 after the last segment */
    }
    result = Py_BuildValue("nnO", pos, lines, rows);
done:
    PyBuffer_Release(&view);
    Py_XDECREF(rows);
    Py_XDECREF(one);
    Py_XDECREF(weight_k);
    return result;
}

static PyMethodDef module_methods[] = {
    {"parse_states", parse_states, METH_VARARGS, parse_states_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef digest_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_digest",
    .m_doc = "Native inner loops of pstate stats (see tsa.LineDigester) and heat --live (live.Feeder).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__digest(void)
{
    if (PyType_Ready(&DigesterType) < 0)
        return NULL;
    for (int ch = 0; ch < 256; ch++)
        str_stop[ch] = ch < 0x20 || ch >= 0x80 || ch == '"' || ch == '\\';
    if (!no_min) {
        PyObject *one = PyLong_FromLong(1), *sh = PyLong_FromLong(64);
        no_min = (one && sh) ? PyNumber_Lshift(one, sh) : NULL;
        Py_XDECREF(one);
        Py_XDECREF(sh);
        if (!no_min)
            return NULL;
    }
    PyObject *m = PyModule_Create(&digest_module);
    if (!m)
        return NULL;
    Py_INCREF(&DigesterType);
    if (PyModule_AddObject(m, "Digester", (PyObject *)&DigesterType) < 0) {
        Py_DECREF(&DigesterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
