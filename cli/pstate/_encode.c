/*
 * The hot loop of `pstate record`: ring-buffer records in, JSON lines out.
 *
 * Encoder().encode(view, owner) does what eventcodec.Encoder.encode_pure does
 * and returns the same (lines, consumed); encode_bytes returns the lines
 * joined and UTF-8 encoded (a read-only memoryview of a buffer reused once
 * released), with their count. This file only writes numbers
 * and fixed punctuation. Every other piece of text is asked of `owner` (the
 * Python Encoder) on a cache miss and kept here as UTF-8:
 *   owner.prefix_text(pid, tid, comm)  '"pid":..,"tid":..,"comm":"..."'
 *                                       (tgid resolution, comm escaping)
 *   owner.mid_text(from, to)           '"from":"..","to":"..","dur_ns":'
 *   owner.out_tail(kstate, voluntary)  switch_out fields up to "prio":
 *   owner.cause_name(cause)            a wake-up cause's name
 *   owner.cgroup_text(cgroup)          a state record's ',"cgroup":..' (tells
 *                                       the identities of an id met first)
 *   owner.stack_tail(stack, since)     a wake-up's ',"stack_id":..,"reason":".."'
 *                                       (record --stacks; asked every time)
 * The prefix cache is keyed by tid and checked against (comm, pid) and is
 * emptied past the same size as the Python one, so owner.pid() runs, and
 * resolve_tgid is called, for the same records on both paths. The other
 * pieces depend on their key only, so they may be cached any way.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>

/* struct event and its codes: bpf/pstate.h, shared with the BPF programs */
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
typedef int16_t s16;
typedef int32_t s32;
#include "pstate.h"

#define HDR_SIZE 8
#define STRIDE ((HDR_SIZE + sizeof(struct event) + 7) & ~(size_t)7) /* ring buffer header + struct event */
#define BUSY (1u << 31)
#define DISCARD (1u << 30)
#define PREFIX_LIMIT (1u << 18) /* eventcodec: `if len(prefixes) > 1 << 18: clear` */
#define FRAG_LIMIT (1u << 16)   /* pieces that depend on their key only */
#define FIXED_MAX 400           /* a line's punctuation and numbers, with room to spare */

/* struct event field offsets, after the 8-byte header */
enum { O_TS = offsetof(struct event, ts), O_DUR = offsetof(struct event, dur), O_PID = offsetof(struct event, pid),
       O_TID = offsetof(struct event, tid), O_OPID = offsetof(struct event, other_pid),
       O_OTID = offsetof(struct event, other_tid), O_KST = offsetof(struct event, kstate),
       O_FROM = offsetof(struct event, from), O_TO = offsetof(struct event, to), O_CPU = offsetof(struct event, cpu),
       O_TYPE = offsetof(struct event, type), O_CAUSE = offsetof(struct event, cause),
       O_PRIO = offsetof(struct event, prio), O_FLAGS = offsetof(struct event, flags),
       O_COMM = offsetof(struct event, comm), COMM_LEN = sizeof(((struct event *)0)->comm),
       O_STACK = offsetof(struct event, stack), O_CGROUP = offsetof(struct event, cgroup),
       O_RUN = offsetof(struct event, run) };
_Static_assert(sizeof(struct event) == 88, "struct event is 88 bytes");

static PyObject *struct_error;
static PyObject *s_prefix_text, *s_mid_text, *s_out_tail, *s_cause_name, *s_stack_tail, *s_cgroup_text;

/* ---------- little-endian loads ---------- */

static inline uint16_t ld16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ld32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t ld64(const unsigned char *p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }

/* The header word is written last by the kernel (busy bit cleared with a
 * release store): read it with acquire order before the record's body. */
static inline uint32_t load_header(const unsigned char *p) {
    uint32_t v;
    if (((uintptr_t)p & 3) == 0) {
        v = __atomic_load_n((const uint32_t *)(const void *)p, __ATOMIC_ACQUIRE);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap32(v);
#endif
        return v;
    }
    v = ld32(p); /* a test's unaligned copy: no one is writing it */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return v;
}

/* ---------- numbers ---------- */

static const char DIGITS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* Decimal digits of v at w; returns the end. Writes up to 24 bytes past w
 * whatever the length (one fixed-size copy, no call): callers keep that room. */
static inline char *put_u64(char *w, uint64_t v) {
    char tmp[48];
    char *t = tmp + 24;
    while (v >= 100) {
        unsigned i = (unsigned)(v % 100) * 2;
        v /= 100;
        t -= 2;
        memcpy(t, DIGITS + i, 2);
    }
    if (v >= 10) {
        t -= 2;
        memcpy(t, DIGITS + v * 2, 2);
    } else {
        *--t = (char)('0' + v);
    }
    size_t n = (size_t)(tmp + 24 - t);
    memcpy(w, t, 24); /* t >= tmp + 4: stays inside tmp */
    return w + n;
}

static inline char *put_i64(char *w, int64_t v) {
    if (v < 0) {
        *w++ = '-';
        return put_u64(w, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(w, (uint64_t)v);
}

#define PUT(w, lit) (memcpy((w), (lit), sizeof(lit) - 1), (w) += sizeof(lit) - 1)

/* ---------- text pieces ---------- */

typedef struct {
    char *s; /* UTF-8, malloc'd (never NULL once set), zero-padded to whole 16-byte blocks */
    Py_ssize_t len;
    int ascii;
} Frag;

static void frag_free(Frag *f) {
    PyMem_Free(f->s);
    f->s = NULL;
    f->len = 0;
}

/* Take the text of a str returned by owner (steals the reference). */
static int frag_from(Frag *f, PyObject *str, const char *what) {
    if (str == NULL)
        return -1;
    if (!PyUnicode_Check(str)) {
        PyErr_Format(PyExc_TypeError, "%s must return str, not %.100s", what, Py_TYPE(str)->tp_name);
        Py_DECREF(str);
        return -1;
    }
    Py_ssize_t len;
    const char *u = PyUnicode_AsUTF8AndSize(str, &len);
    if (u == NULL) {
        Py_DECREF(str);
        return -1;
    }
    size_t padded = ((size_t)len + 16) & ~(size_t)15; /* copied in 16-byte blocks */
    char *s = PyMem_Calloc(1, padded);
    if (s == NULL) {
        Py_DECREF(str);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(s, u, (size_t)len);
    f->s = s;
    f->len = len;
    f->ascii = PyUnicode_IS_ASCII(str) ? 1 : 0;
    Py_DECREF(str);
    return 0;
}

static inline uint64_t mix(uint64_t k) {
    k *= 0x9E3779B97F4A7C15ull;
    return k ^ (k >> 29);
}

/* key -> Frag, open addressing; emptied whole, never one by one */
typedef struct {
    uint64_t key;
    Frag f; /* f.s == NULL: free slot */
} FSlot;

typedef struct {
    FSlot *slots;
    size_t mask, count;
} FTable;

/* init, clear (free every slot's text, keep the slots), free and grow
 * (double the slots) of a table type T with a power-of-two mask and a count,
 * whose slots each hold a Frag f (f.s NULL: free) and their key in KEY. */
#define TABLE_BASICS(T, prefix, KEY)                                         \
    static int prefix##_init(T *t, size_t cap) {                             \
        t->slots = PyMem_Calloc(cap, sizeof(*t->slots));                     \
        if (t->slots == NULL) {                                              \
            PyErr_NoMemory();                                                \
            return -1;                                                       \
        }                                                                    \
        t->mask = cap - 1;                                                   \
        t->count = 0;                                                        \
        return 0;                                                            \
    }                                                                        \
    static void prefix##_clear(T *t) {                                       \
        if (t->slots == NULL)                                                \
            return;                                                          \
        for (size_t i = 0; i <= t->mask; i++)                                \
            frag_free(&t->slots[i].f);                                       \
        t->count = 0;                                                        \
    }                                                                        \
    static void prefix##_free(T *t) {                                        \
        prefix##_clear(t);                                                   \
        PyMem_Free(t->slots);                                                \
        t->slots = NULL;                                                     \
    }                                                                        \
    static int prefix##_grow(T *t) {                                         \
        size_t cap = (t->mask + 1) * 2;                                      \
        __typeof__(t->slots) slots = PyMem_Calloc(cap, sizeof(*slots));      \
        if (slots == NULL) {                                                 \
            PyErr_NoMemory();                                                \
            return -1;                                                       \
        }                                                                    \
        for (size_t i = 0; i <= t->mask; i++) {                              \
            if (t->slots[i].f.s == NULL)                                     \
                continue;                                                    \
            size_t j = mix(t->slots[i].KEY) & (cap - 1);                     \
            while (slots[j].f.s != NULL)                                     \
                j = (j + 1) & (cap - 1);                                     \
            slots[j] = t->slots[i];                                          \
        }                                                                    \
        PyMem_Free(t->slots);                                                \
        t->slots = slots;                                                    \
        t->mask = cap - 1;                                                   \
        return 0;                                                            \
    }

TABLE_BASICS(FTable, ftable, key)

static inline Frag *ftable_get(FTable *t, uint64_t key) {
    size_t i = mix(key) & t->mask;
    while (t->slots[i].f.s != NULL) {
        if (t->slots[i].key == key)
            return &t->slots[i].f;
        i = (i + 1) & t->mask;
    }
    return NULL;
}

/* Store (a key not in the table); the pointer is valid until the next put. */
static Frag *ftable_put(FTable *t, uint64_t key, Frag f) {
    if (t->count >= FRAG_LIMIT)
        ftable_clear(t);
    if ((t->count + 1) * 2 > t->mask + 1 && ftable_grow(t) < 0) {
        frag_free(&f);
        return NULL;
    }
    size_t i = mix(key) & t->mask;
    while (t->slots[i].f.s != NULL)
        i = (i + 1) & t->mask;
    t->slots[i].key = key;
    t->slots[i].f = f;
    t->count++;
    return &t->slots[i].f;
}

/* tid -> (comm, pid, prefix text): eventcodec's `prefixes` */
typedef struct {
    uint32_t tid, pid;
    unsigned char comm[COMM_LEN];
    Frag f; /* f.s == NULL: free slot */
} PSlot;

typedef struct {
    PSlot *slots;
    size_t mask, count;
} PTable;

TABLE_BASICS(PTable, ptable, tid)

/* The slot of tid, or the free slot where it would go. */
static inline PSlot *ptable_slot(PTable *t, uint32_t tid) {
    size_t i = mix(tid) & t->mask;
    while (t->slots[i].f.s != NULL && t->slots[i].tid != tid)
        i = (i + 1) & t->mask;
    return &t->slots[i];
}

/* ---------- output buffers ---------- */

typedef struct {
    char *p;
    size_t cap;
} Buf;

/* Room for `need` more bytes at p + pos. */
static int reserve(Buf *o, size_t pos, size_t need) {
    if (pos + need <= o->cap)
        return 0;
    size_t cap = o->cap;
    while (cap < pos + need) {
        if (cap > (size_t)PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *p = PyMem_Realloc(o->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->p = p;
    o->cap = cap;
    return 0;
}

/* The lines of one encode_bytes call, handed out as a read-only buffer
 * (memoryview). The encoder writes the next batch into a chunk again only
 * when no one else holds it: fresh megabytes per batch would cost a page
 * fault per 4 KiB, and a copy into a bytes object costs more than the rest. */
typedef struct {
    PyObject_HEAD
    Buf b;
    Py_ssize_t len;
    Py_ssize_t exports;
} ChunkObject;

static int chunk_getbuffer(ChunkObject *self, Py_buffer *view, int flags) {
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->b.p, self->len, 1, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void chunk_releasebuffer(ChunkObject *self, Py_buffer *Py_UNUSED(view)) {
    self->exports--;
}

static void chunk_dealloc(ChunkObject *self) {
    PyMem_Free(self->b.p);
    PyObject_Free(self);
}

static PyBufferProcs chunk_as_buffer = {
    .bf_getbuffer = (getbufferproc)chunk_getbuffer,
    .bf_releasebuffer = (releasebufferproc)chunk_releasebuffer,
};

static PyTypeObject ChunkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pstate._encode.Chunk",
    .tp_basicsize = sizeof(ChunkObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "JSON lines written by Encoder.encode_bytes (read through a memoryview).",
    .tp_dealloc = (destructor)chunk_dealloc,
    .tp_as_buffer = &chunk_as_buffer,
};

static ChunkObject *chunk_new(size_t cap) {
    ChunkObject *c = PyObject_New(ChunkObject, &ChunkType);
    if (c == NULL)
        return NULL;
    c->len = 0;
    c->exports = 0;
    c->b.cap = cap;
    c->b.p = PyMem_Malloc(cap);
    if (c->b.p == NULL) {
        Py_DECREF(c);
        PyErr_NoMemory();
        return NULL;
    }
    return c;
}

/* ---------- the encoder ---------- */

#define NCHUNKS 2 /* the caller's last result may still be bound while it asks for the next */

typedef struct {
    PyObject_HEAD
    PTable prefixes;
    FTable mids;  /* from << 16 | to */
    FTable tails; /* kstate << 1 | voluntary */
    FTable cgroups; /* cgroup id */
    Frag causes[256];
    Buf line; /* encode: one line at a time */
    ChunkObject *chunks[NCHUNKS]; /* encode_bytes: the batch */
    int next_chunk;
    int running; /* refuse re-entry from an owner callback */
} EncoderObject;

static int enc_init(EncoderObject *self, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Encoder() takes no arguments");
        return -1;
    }
    /* __init__ called again keeps the caches; after a failed one, makes the rest */
    if ((self->prefixes.slots == NULL && ptable_init(&self->prefixes, 1024) < 0) ||
        (self->mids.slots == NULL && ftable_init(&self->mids, 64) < 0) ||
        (self->tails.slots == NULL && ftable_init(&self->tails, 64) < 0) ||
        (self->cgroups.slots == NULL && ftable_init(&self->cgroups, 64) < 0))
        return -1;
    if (self->line.p == NULL) {
        self->line.p = PyMem_Malloc(1 << 12);
        if (self->line.p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->line.cap = 1 << 12;
    }
    return 0;
}

static void enc_dealloc(EncoderObject *self) {
    ptable_free(&self->prefixes);
    ftable_free(&self->mids);
    ftable_free(&self->tails);
    ftable_free(&self->cgroups);
    for (int i = 0; i < 256; i++)
        frag_free(&self->causes[i]);
    PyMem_Free(self->line.p);
    for (int i = 0; i < NCHUNKS; i++)
        Py_XDECREF(self->chunks[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* owner.name(*args) with nargs new references (stolen; any may be NULL after
 * a failed conversion, with the error set). */
static PyObject *call_owner(PyObject *owner, PyObject *name, Py_ssize_t nargs, PyObject *a, PyObject *b,
                            PyObject *c) {
    PyObject *argv[4] = {owner, a, b, c};
    PyObject *r = NULL;
    int ok = 1;
    for (Py_ssize_t i = 1; i <= nargs; i++)
        ok &= argv[i] != NULL;
    if (ok)
        r = PyObject_VectorcallMethod(name, argv, (size_t)(nargs + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    for (Py_ssize_t i = 1; i <= nargs; i++)
        Py_XDECREF(argv[i]);
    return r;
}

static const Frag *prefix_of(EncoderObject *self, PyObject *owner, uint32_t pid, uint32_t tid,
                             const unsigned char *comm) {
    PTable *t = &self->prefixes;
    PSlot *s = ptable_slot(t, tid);
    if (s->f.s != NULL && s->pid == pid && memcmp(s->comm, comm, COMM_LEN) == 0)
        return &s->f;
    Frag f;
    PyObject *r = call_owner(owner, s_prefix_text, 3, PyLong_FromUnsignedLong(pid), PyLong_FromUnsignedLong(tid),
                             PyBytes_FromStringAndSize((const char *)comm, COMM_LEN));
    if (frag_from(&f, r, "prefix_text") < 0)
        return NULL;
    /* As in Python: empty the cache when it is over the limit, then store
     * (the slot is looked up again: clearing or growing moves it). */
    if (t->count > PREFIX_LIMIT)
        ptable_clear(t);
    s = ptable_slot(t, tid);
    if (s->f.s != NULL) {
        frag_free(&s->f);
    } else {
        if ((t->count + 1) * 2 > t->mask + 1) {
            if (ptable_grow(t) < 0) {
                frag_free(&f);
                return NULL;
            }
            s = ptable_slot(t, tid);
        }
        t->count++;
    }
    s->tid = tid;
    s->pid = pid;
    memcpy(s->comm, comm, COMM_LEN);
    s->f = f;
    return &s->f;
}

static const Frag *mid_of(EncoderObject *self, PyObject *owner, uint16_t frm, uint16_t to) {
    uint64_t key = ((uint64_t)frm << 16) | to;
    Frag *m = ftable_get(&self->mids, key);
    if (m != NULL)
        return m;
    Frag f;
    PyObject *r = call_owner(owner, s_mid_text, 2, PyLong_FromLong(frm), PyLong_FromLong(to), NULL);
    if (frag_from(&f, r, "mid_text") < 0)
        return NULL;
    return ftable_put(&self->mids, key, f); /* re-entry is refused: still absent */
}

static const Frag *tail_of(EncoderObject *self, PyObject *owner, uint32_t kst, int voluntary) {
    uint64_t key = ((uint64_t)kst << 1) | (voluntary ? 1 : 0);
    Frag *m = ftable_get(&self->tails, key);
    if (m != NULL)
        return m;
    Frag f;
    PyObject *r = call_owner(owner, s_out_tail, 2, PyLong_FromUnsignedLong(kst), PyLong_FromLong(voluntary ? 1 : 0),
                             NULL);
    if (frag_from(&f, r, "out_tail") < 0)
        return NULL;
    return ftable_put(&self->tails, key, f); /* re-entry is refused: still absent */
}

static const Frag *cgroup_of(EncoderObject *self, PyObject *owner, uint64_t cgid) {
    Frag *m = ftable_get(&self->cgroups, cgid);
    if (m != NULL)
        return m;
    Frag f;
    PyObject *r = call_owner(owner, s_cgroup_text, 1, PyLong_FromUnsignedLongLong(cgid), NULL, NULL);
    if (frag_from(&f, r, "cgroup_text") < 0)
        return NULL;
    return ftable_put(&self->cgroups, cgid, f); /* re-entry is refused: still absent */
}

static const Frag *cause_of(EncoderObject *self, PyObject *owner, unsigned cause) {
    Frag *c = &self->causes[cause & 255];
    if (c->s != NULL)
        return c;
    Frag f;
    PyObject *r = call_owner(owner, s_cause_name, 1, PyLong_FromUnsignedLong(cause), NULL, NULL);
    if (frag_from(&f, r, "cause_name") < 0)
        return NULL;
    frag_free(c);
    *c = f;
    return c;
}

/* Append a piece to the line, with FIXED_MAX to spare after it. The copy is
 * in whole 16-byte blocks: pieces are padded, and FIXED_MAX >= 16 leaves room. */
#define PIECE(fr)                                                                      \
    do {                                                                               \
        size_t at_ = (size_t)(w - out->p);                                             \
        size_t len_ = (size_t)(fr)->len;                                               \
        if (reserve(out, at_, len_ + FIXED_MAX) < 0)                                   \
            goto error;                                                                \
        w = out->p + at_;                                                              \
        for (size_t i_ = 0; i_ < len_; i_ += 16)                                       \
            memcpy(w + i_, (fr)->s + i_, 16);                                          \
        w += len_;                                                                     \
        ascii &= (fr)->ascii;                                                          \
    } while (0)

/* Shared loop, writing into out. lines != NULL: one str per line appended to
 * it (out holds one line at a time); else the lines accumulate in out, *total
 * bytes of it. */
static int run(EncoderObject *self, PyObject *view, PyObject *owner, Buf *out, PyObject *lines, size_t *total,
               Py_ssize_t *nlines, Py_ssize_t *consumed) {
    Py_buffer b;
    if (PyObject_GetBuffer(view, &b, PyBUF_SIMPLE) < 0)
        return -1;
    if (b.len % STRIDE != 0) {
        PyErr_Format(struct_error, "iterative unpacking requires a buffer of a multiple of %d bytes", STRIDE);
        PyBuffer_Release(&b);
        return -1;
    }
    if (self->running) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder.encode called again while encoding");
        PyBuffer_Release(&b);
        return -1;
    }
    self->running = 1;
    const unsigned char *p = b.buf;
    const unsigned char *end = p + b.len;
    char *w = out->p;
    Py_ssize_t n = 0, used = 0;
    for (; p < end; p += STRIDE) {
        uint32_t hdr = load_header(p);
        if (hdr & BUSY)
            break;
        used++;
        if (hdr & DISCARD)
            continue;
        const unsigned char *e = p + HDR_SIZE;
        uint32_t pid = ld32(e + O_PID), tid = ld32(e + O_TID);
        uint8_t typ = e[O_TYPE];
        /* as in Python: the prefix is looked up (and maybe made) for any type */
        const Frag *pre = prefix_of(self, owner, pid, tid, e + O_COMM);
        if (pre == NULL)
            goto error;
        if (typ < EV_STATE || typ > EV_WAKER)
            continue;
        if (lines != NULL)
            w = out->p;
        size_t start = (size_t)(w - out->p);
        int ascii = 1;
        if (reserve(out, start, FIXED_MAX) < 0)
            goto error;
        w = out->p + start;
        switch (typ) {
        case EV_STATE: PUT(w, "{\"type\":\"state\",\"ts\":"); break;
        case EV_FORK: PUT(w, "{\"type\":\"fork\",\"ts\":"); break;
        case EV_EXEC: PUT(w, "{\"type\":\"exec\",\"ts\":"); break;
        case EV_EXIT: PUT(w, "{\"type\":\"exit\",\"ts\":"); break;
        case EV_SLICE: PUT(w, "{\"type\":\"slice\",\"ts\":"); break;
        default: PUT(w, "{\"type\":\"waker\",\"ts\":"); break;
        }
        w = put_u64(w, ld64(e + O_TS));
        PUT(w, ",\"cpu\":");
        w = put_u64(w, ld16(e + O_CPU));
        *w++ = ',';
        PIECE(pre);
        uint32_t otid = ld32(e + O_OTID), opid = ld32(e + O_OPID);
        uint8_t flags = e[O_FLAGS];
        if (typ == EV_STATE) {
            uint8_t cause = e[O_CAUSE];
            uint32_t kst = ld32(e + O_KST);
            int16_t prio = (int16_t)ld16(e + O_PRIO);
            uint64_t dur = ld64(e + O_DUR);
            const Frag *mid = mid_of(self, owner, ld16(e + O_FROM), ld16(e + O_TO));
            if (mid == NULL)
                goto error;
            *w++ = ',';
            PIECE(mid);
            if (dur == NO_DUR)
                PUT(w, "null");
            else
                w = put_u64(w, dur);
            if (cause == CAUSE_SWITCH_OUT) {
                const Frag *tail = tail_of(self, owner, kst, flags & F_VOLUNTARY);
                if (tail == NULL)
                    goto error;
                PIECE(tail);
                w = put_i64(w, prio);
                PUT(w, ",\"next_tid\":");
                w = put_u64(w, otid);
                uint64_t run = ld64(e + O_RUN);
                if (run != NO_DUR && dur != NO_DUR) {
                    PUT(w, ",\"steal_irq_ns\":");
                    w = put_i64(w, (int64_t)(dur - run));
                } else if (run != NO_DUR) {
                    PUT(w, ",\"run_ns\":");
                    w = put_u64(w, run);
                }
            } else if (cause == CAUSE_SWITCH_IN) {
                PUT(w, ",\"cause\":\"switch_in\",\"prio\":");
                w = put_i64(w, prio);
                PUT(w, ",\"prev_tid\":");
                w = put_u64(w, otid);
            } else if (cause == CAUSE_REAP) {
                PUT(w, ",\"cause\":\"reap\"");
            } else {
                const Frag *c = cause_of(self, owner, cause);
                if (c == NULL)
                    goto error;
                PUT(w, ",\"cause\":\"");
                PIECE(c);
                PUT(w, "\",\"waker_tid\":");
                w = put_u64(w, otid);
                PUT(w, ",\"waker_pid\":");
                w = put_u64(w, opid);
                PUT(w, ",\"target_cpu\":");
                w = put_u64(w, kst);
                if (flags & F_WAKER_IRQ)
                    PUT(w, ",\"waker\":\"irq\"");
                else if (flags & F_WAKER_SOFTIRQ)
                    PUT(w, ",\"waker\":\"softirq\"");
                uint32_t stack = ld32(e + O_STACK);
                if (stack) {
                    Frag st;
                    // when the blocked state began (0: not known): the
                    // stack taken then, should its slot be freed since
                    uint64_t ts = ld64(e + O_TS);
                    uint64_t since = dur != NO_DUR && dur <= ts ? ts - dur : 0;
                    PyObject *r = call_owner(owner, s_stack_tail, 2, PyLong_FromUnsignedLong(stack),
                                             PyLong_FromUnsignedLongLong(since), NULL);
                    if (frag_from(&st, r, "stack_tail") < 0)
                        goto error;
                    size_t at = (size_t)(w - out->p);
                    if (reserve(out, at, (size_t)st.len + FIXED_MAX) < 0) {
                        frag_free(&st);
                        goto error;
                    }
                    w = out->p + at;
                    memcpy(w, st.s, (size_t)st.len);
                    w += st.len;
                    ascii &= st.ascii;
                    frag_free(&st);
                }
            }
            const Frag *cg = cgroup_of(self, owner, ld64(e + O_CGROUP)); /* last: after the cause's fields */
            if (cg == NULL)
                goto error;
            PIECE(cg);
        } else if (typ == EV_FORK) {
            PUT(w, ",\"child_pid\":");
            w = put_u64(w, opid);
            PUT(w, ",\"child_tid\":");
            w = put_u64(w, otid);
            if (flags & F_THREAD)
                PUT(w, ",\"thread\":true");
            else
                PUT(w, ",\"thread\":false");
        } else if (typ == EV_EXEC) {
            PUT(w, ",\"old_tid\":");
            w = put_u64(w, otid);
        } else if (typ == EV_SLICE) {
            PUT(w, ",\"dur_ns\":");
            w = put_u64(w, ld64(e + O_DUR));
            PUT(w, ",\"next_tid\":");
            w = put_u64(w, otid);
        } else if (typ == EV_EXIT) {
            if (flags & F_GROUP_DEAD)
                PUT(w, ",\"group_dead\":true");
            else
                PUT(w, ",\"group_dead\":false");
        }
        PUT(w, "}\n");
        n++;
        if (lines != NULL) {
            const char *s = out->p + start;
            Py_ssize_t len = (Py_ssize_t)(w - s);
            PyObject *line;
            if (ascii) {
                line = PyUnicode_New(len, 127);
                if (line != NULL)
                    memcpy(PyUnicode_1BYTE_DATA(line), s, (size_t)len);
            } else {
                line = PyUnicode_DecodeUTF8(s, len, "strict");
            }
            if (line == NULL)
                goto error;
            int rc = PyList_Append(lines, line);
            Py_DECREF(line);
            if (rc < 0)
                goto error;
        }
    }
    self->running = 0;
    PyBuffer_Release(&b);
    *total = (size_t)(w - out->p);
    *nlines = n;
    *consumed = used;
    return 0;
error:
    self->running = 0;
    PyBuffer_Release(&b);
    return -1;
}

static PyObject *enc_encode(EncoderObject *self, PyObject *args) {
    PyObject *view, *owner;
    if (!PyArg_ParseTuple(args, "OO:encode", &view, &owner))
        return NULL;
    if (self->line.p == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder not initialised");
        return NULL;
    }
    PyObject *lines = PyList_New(0);
    if (lines == NULL)
        return NULL;
    size_t total;
    Py_ssize_t n, consumed;
    if (run(self, view, owner, &self->line, lines, &total, &n, &consumed) < 0) {
        Py_DECREF(lines);
        return NULL;
    }
    return Py_BuildValue("(Nn)", lines, consumed);
}

static PyObject *enc_encode_bytes(EncoderObject *self, PyObject *args) {
    PyObject *view, *owner;
    if (!PyArg_ParseTuple(args, "OO:encode_bytes", &view, &owner))
        return NULL;
    if (self->line.p == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder not initialised");
        return NULL;
    }
    /* a chunk no one else holds, or a new one in place of the older */
    ChunkObject *c = NULL;
    for (int i = 0; i < NCHUNKS && c == NULL; i++) {
        ChunkObject *k = self->chunks[i];
        if (k != NULL && Py_REFCNT(k) == 1 && k->exports == 0)
            c = k;
    }
    if (c == NULL) {
        int i = self->next_chunk;
        self->next_chunk = (i + 1) % NCHUNKS;
        c = chunk_new(1 << 16);
        if (c == NULL)
            return NULL;
        Py_XSETREF(self->chunks[i], c); /* the old one lives on with its holders */
    }
    size_t total;
    Py_ssize_t n, consumed;
    c->len = 0;
    if (run(self, view, owner, &c->b, NULL, &total, &n, &consumed) < 0)
        return NULL;
    c->len = (Py_ssize_t)total;
    PyObject *data = PyMemoryView_FromObject((PyObject *)c);
    if (data == NULL)
        return NULL;
    return Py_BuildValue("(Nnn)", data, n, consumed);
}

static PyObject *enc_cache_sizes(EncoderObject *self, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{snsnsnsn}", "prefixes", (Py_ssize_t)self->prefixes.count, "mids",
                         (Py_ssize_t)self->mids.count, "tails", (Py_ssize_t)self->tails.count, "cgroups",
                         (Py_ssize_t)self->cgroups.count);
}

static PyMethodDef enc_methods[] = {
    {"encode", (PyCFunction)enc_encode, METH_VARARGS,
     "encode(view, owner) -> (lines, consumed): owner is the eventcodec.Encoder asked for text"},
    {"encode_bytes", (PyCFunction)enc_encode_bytes, METH_VARARGS,
     "encode_bytes(view, owner) -> (read-only memoryview of the UTF-8 lines, number of lines, consumed)"},
    {"cache_sizes", (PyCFunction)enc_cache_sizes, METH_NOARGS, "entries in each cache (for tests)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pstate._encode.Encoder",
    .tp_basicsize = sizeof(EncoderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ring-buffer records to JSON lines; text pieces come from a Python eventcodec.Encoder.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)enc_init,
    .tp_dealloc = (destructor)enc_dealloc,
    .tp_methods = enc_methods,
};

/* record --flight's look at a batch (the twin: pstate.snapshots.flight.scan_pure):
 * (slots before the first busy one, the longest known dur among those not
 * discarded, or -1). */
static PyObject *mod_scan(PyObject *Py_UNUSED(mod), PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t n = buf.len / (Py_ssize_t)STRIDE, i;
    long long longest = -1;
    for (i = 0; i < n; i++, p += STRIDE) {
        u32 hdr;
        memcpy(&hdr, p, 4);
        if (hdr & BUSY)
            break;
        if (hdr & DISCARD)
            continue;
        u64 dur;
        memcpy(&dur, p + HDR_SIZE + O_DUR, 8);
        if (dur != (u64)NO_DUR && (long long)dur > longest)
            longest = (long long)dur;
    }
    PyBuffer_Release(&buf);
    return Py_BuildValue("nL", i, longest);
}

static PyMethodDef mod_methods[] = {
    {"scan", mod_scan, METH_O, "(slots before the first busy one, longest known dur or -1) of a batch"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef encode_module = {
    PyModuleDef_HEAD_INIT, .m_name = "pstate._encode",
    .m_doc = "Native loop of eventcodec.Encoder.encode (pstate record).", .m_size = -1,
    .m_methods = mod_methods,
};

PyMODINIT_FUNC PyInit__encode(void) {
    PyObject *structmod = PyImport_ImportModule("struct");
    if (structmod == NULL)
        return NULL;
    struct_error = PyObject_GetAttrString(structmod, "error");
    Py_DECREF(structmod);
    if (struct_error == NULL)
        return NULL;
    s_prefix_text = PyUnicode_InternFromString("prefix_text");
    s_mid_text = PyUnicode_InternFromString("mid_text");
    s_out_tail = PyUnicode_InternFromString("out_tail");
    s_cause_name = PyUnicode_InternFromString("cause_name");
    s_stack_tail = PyUnicode_InternFromString("stack_tail");
    s_cgroup_text = PyUnicode_InternFromString("cgroup_text");
    if (!s_prefix_text || !s_mid_text || !s_out_tail || !s_cause_name || !s_stack_tail || !s_cgroup_text)
        return NULL;
    if (PyType_Ready(&EncoderType) < 0 || PyType_Ready(&ChunkType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&encode_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(m, "Encoder", (PyObject *)&EncoderType) < 0) {
        Py_DECREF(&EncoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
