/*
 * The inner loop of `pstate stats`: parse, check and aggregate state records.
 *
 * Digester(by, state_id, comm_id).digest(buf, pos, end, max_line, clip)
 * walks the lines of buf[pos:end] (cut at '\n' as bytes.split cuts them) and
 * reads every line that is a plainly written state record. It stops at the
 * first line it is not sure about and returns where that line starts; the
 * caller (reader.StreamReader) hands that line to the careful Python path
 * (orjson + streamio.check_record) and calls again after it. So whatever this
 * file accepts it must read exactly as orjson would; anything unusual
 * (escapes, non-ASCII, floats, nesting, repeated keys, other record types,
 * huge numbers) is left to Python rather than handled twice. The one other
 * type read here is the context records (slice, waker) a filtered recording
 * carries, which a Digester without why-views passes over (next_context).
 *
 * The interface is public and documented (analysis.timeinstate.Aggregator.add_digested is its
 * only consumer): the Digester sums the records it reads per task and per
 * cell in its own tables, and take() hands the sums out as lists of plain
 * tuples, in the order each task and cell was first seen, and forgets them;
 * latency bucket counts are held longer, in one compact table, until
 * take(flush=True). Nothing here reads or writes a Python object's
 * attributes: state and group ids come from the two callables given at
 * construction (the Aggregator's public state_id, and comm_id or, by
 * pid_group, for --by cgroup/unit/container/title/ppid, pid_group). With
 * set_filter, only the records an event filter (stream.filters.Filter)
 * passes are summed. By pid_group and with a filter's who, the record's own
 * cgroup (its cgroup field: an int, or None when null or absent) is asked
 * about with its pid: group_id(pid, cgroup), who(pid, cgroup); what they
 * said is cached per pid (for records without a cgroup and for the last
 * cgroup one carried) until forget() (a process or cgroup record came).
 *
 * parse_states(buf, pos, end, max_line, k, n, wide), the native row reader
 * of reader.StreamReader (heat, heat --live, export), uses the same reader and
 * protocol but only returns the plain state records as tuples (sharing
 * interned strings and ints; reader.ROW_FIELDS); wide rows carry the fields a trace export
 * needs of switches and wake-ups too (WIDE_FIELDS).
 *
 * The order of records per CPU (stream.streamio.CpuOrder): the reader binds
 * its table for the duration of a bulk read (bind_order, per thread), and
 * each of these readers notes there the ts of every record it takes, as the
 * careful path does; a record whose place the careful path must note (the
 * first on a CPU before any meta record, the first out of order, one on a
 * CPU beyond the table) is left to it.
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
/* The log-linear latency buckets of latency.py (SUB_BITS): exported as
 * BUCKET_SUB_BITS, and tests/contract/test_latency.py holds the two equal. */
#define BUCKET_SUB_BITS 5

typedef __int128 i128;

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

/* The head of a slot of an acc_table (what one call did to a task, keyed by
 * tid, or to a cell, keyed by the cell key; the why-views' sums): gen tells
 * live slots from stale ones; aux is the slot's own (in what would be padding). */
typedef struct {
    long long key;
    unsigned gen;
    uint32_t aux;
} acc_head;

typedef struct {
    acc_head h;
    int head_null;                        /* its first record's dur_ns was null */
    int has_cg;                           /* its last record carried a cgroup: cg */
    long long pid, last_ts, first_ts, g_first, cg;
    i128 known;                           /* dur_ns summed, less clipped parts */
    PyObject *comm, *to;                  /* strong references while live */
} task_acc;

typedef struct {
    acc_head h;
    long long n, nnull, max, min;
    i128 sum;
    i128 steal; /* steal_irq_ns summed */
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

/* What is known of a pid (by pid_group, and a filter's who): a
 * direct-mapped cache, emptied by forget() (gen). */
#define PID_CACHE 4096 /* a power of two */

typedef struct {
    long long pid, gid;
    long long cg, cg_gid; /* the last cgroup a record of pid carried, and what was said of it */
    unsigned gen;
    signed char has_gid, who; /* who: -1 not known, 0 drop, 1 pass; of records without a cgroup */
    signed char has_cg, has_cg_gid, cg_who; /* the same for records carrying cg */
} pid_entry;

/* An event filter (set_filter): the rules of stream.filters.Filter.match_state. */
typedef struct {
    int on, include_idle;
    long long *pids, *tids, *cpus;
    Py_ssize_t npids, ntids, ncpus;
    char **strs;     /* the comms, then the states (UTF-8) */
    Py_ssize_t *lens;
    Py_ssize_t ncomms, nstates;
    long long min_dur;
    PyObject *who; /* callable: (pid, cgroup or None) -> bool (--cgroup, --title), or NULL */
} filter_spec;

/* The why-views' sums (Digester.set_why), per task as its rows said it
 * (tid, pid, cgroup, comm) and per what (a: WHY_* | from << 4 | waker << 10
 * for a blocked interval; b: the waker's tid): slots of an acc_table whose
 * key is the hash of all that (acc_probe compares the rest). */
typedef struct {
    acc_head h;
    int has_cg;
    long long tid, pid, cg, a, b;
    Py_hash_t chash;
    PyObject *comm;    /* str or None: a strong reference while live */
    long long count, min, max, wpid, wpid_seq, seq;
    i128 sum;
    PyObject *buckets; /* a blocked interval's {bucket: count}: strong, or NULL */
    Py_ssize_t idx;    /* its place in the order of first touch */
} why_entry;

/* The antagonists of a waiter (a run-queue wait entry's idx, or a group
 * number): another task's on-CPU time within its waits (other: its tid;
 * -1 the time no slice covers). */
typedef struct {
    acc_head h; /* h.aux: the waiter */
    long long other, waits;
    i128 ns;
} ov_entry;

/* The on-CPU slices of a CPU, oldest first from head, at most ring_max. */
typedef struct {
    long long s, e, tid;
} why_slice;

typedef struct {
    why_slice *v;
    Py_ssize_t cap, n, head; /* cap: a power of two */
} why_ring;

typedef struct {
    PyObject_HEAD
    PyObject *state_id; /* callable: state name -> id (ids never change) */
    PyObject *comm_id;  /* callable: comm -> group id (by comm), (pid, cgroup) -> group id (by pid_group) */
    long long events;   /* records digested since the last take() */
    int by; /* 0 pid, 1 tid, 2 comm, 3 pid_group */
    pid_entry *pids;
    unsigned pids_gen;
    filter_spec filt;
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
    /* set_why: what the why-views (analysis.causes) read, summed */
    int why, why_stacks;     /* on; lines with a stack_id or reason are the careful path's */
    int why_hist, why_wakers; /* blocked intervals: their bucket counts; by waker */
    PyObject *why_select;    /* callable: (from, to) -> the kind of a row of that pair (WHY_*) */
    signed char *why_sel;    /* [NAME_CACHE * NAME_CACHE] by state name cache entries: -1 not asked */
    acc_table wt;            /* why_entry: the sums since the last take_why */
    acc_table ov;            /* ov_entry: and the antagonists of their waits (waiter: a wt entry's idx) */
    acc_table ga;            /* ov_entry: the antagonists per group (waiter: the caller's group number), why_fold */
    int fold_due;            /* take_why handed out the sums ov refers to: why_fold comes next */
    why_ring *rings;         /* per CPU: the latest on-CPU slices */
    Py_ssize_t nrings, ring_max;
    long long why_seq;       /* rows summed so far */
    acc_table seen;          /* tid -> seen_acc: every record's, the filter's left-outs too */
    long long why_last_ts;   /* of the records the filter left out (-1: none) */
} Digester;

/* What the why-views need of a task's last record (its names) and of its
 * last one the filter kept (where the task was at the end): kept for the
 * whole input, the careful path's records noted too (why_note). */
typedef struct {
    acc_head h;
    int has_pid, has_cg, has_own;
    long long pid, cg, own_ts;
    PyObject *comm, *own_to; /* strong references while live */
} seen_acc;

/* --- a strict reader for the plain subset of JSON -------------------------- */

/* Where the line of buf that starts at pos ends: its '\n', or buf + end for
 * the last one (lines cut as bytes.split cuts buf[:end]). */
static inline const char *line_end(const char *buf, Py_ssize_t pos, Py_ssize_t end)
{
    const char *nl = memchr(buf + pos, '\n', (size_t)(end - pos));
    return nl ? nl : buf + end;
}

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
    K_COMM = 1 << 5, K_FROM = 1 << 6, K_TO = 1 << 7, K_DUR = 1 << 8, K_CGROUP = 1 << 9,
    K_STEAL = 1 << 10, /* steal_irq_ns: of dur_ns, what the kernel did not count as the task's (may be < 0) */
    K_EXTRA = 1 << 11, /* the first of N_EXTRA: K_EXTRA << i is extra field i */
};
#define K_REQUIRED (K_TYPE | K_TS | K_CPU | K_PID | K_TID | K_FROM | K_TO)

/* The fields of a wide row after ROW_FIELDS (pstate.stream.reader.WIDE_FIELDS,
 * in this order: tests/contract/test_one_reader.py holds the two equal), what the
 * trace export reads of a switch or a wake-up. */
enum { X_CAUSE, X_PRIO, X_NEXT_TID, X_PREV_TID, X_KSTATE, X_TARGET_CPU, X_WAKER, N_EXTRA };
/* After them, what the why-views read of a state record (Digester.set_why):
 * read by every reader that asks for extras, handed out by none but that. */
enum { X_WAKER_TID = N_EXTRA, X_WAKER_PID, X_STACK_ID, X_REASON, N_ALL_EXTRA };
static const char *const EXTRA_NAMES[N_ALL_EXTRA] = {"cause", "prio", "next_tid", "prev_tid", "kstate",
                                                     "target_cpu", "waker", "waker_tid", "waker_pid",
                                                     "stack_id", "reason"};

/* The values of the extra fields as orjson reads them: a plain string (kind
 * 's', s and n its contents), an int with -2^63 < v < 2^63 ('i', v), true
 * ('t'), false ('f'), null ('n'); kind 0: absent. */
typedef struct {
    char kind[N_ALL_EXTRA]; /* 0 absent, 's' string, 'i' int, 't' true, 'f' false, 'n' null */
    const char *s[N_ALL_EXTRA];
    Py_ssize_t n[N_ALL_EXTRA];
    long long v[N_ALL_EXTRA];
} extras;

typedef struct {
    long long ts, cpu, pid, tid, dur, cgroup, steal;
    int has_dur;    /* dur_ns present and not null */
    int has_cgroup; /* cgroup present and not null */
    int has_steal;  /* steal_irq_ns present and not null */
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
        if (memcmp(k, "dur_ns", 6) == 0) return K_DUR;
        if (memcmp(k, "cgroup", 6) == 0) return K_CGROUP;
        return 0;
    case 12:
        if (memcmp(k, "steal_irq_ns", 12) == 0) return K_STEAL;
        return 0;
    default:
        return 0;
    }
}

/* The key bit of an extra field (K_EXTRA << its index), 0 for any other key:
 * asked only for wide rows, so that the other loops compare no more keys. */
static int extra_of(const char *k, Py_ssize_t n)
{
    for (int i = 0; i < N_ALL_EXTRA; i++)
        if ((size_t)n == strlen(EXTRA_NAMES[i]) && memcmp(k, EXTRA_NAMES[i], (size_t)n) == 0)
            return K_EXTRA << i;
    return 0;
}

/* A plain scalar (skip_scalar's) into slot i of x (see extras); 0: leave the line to Python. */
static inline int read_extra(cursor *c, extras *x, int i)
{
    const char *p = c->p;
    if (!skip_scalar(c))
        return 0;
    switch (*p) {
    case '"':
        x->kind[i] = 's';
        x->s[i] = p + 1;
        x->n[i] = c->p - p - 2;
        return 1;
    case 't':
    case 'f':
    case 'n':
        x->kind[i] = *p;
        return 1;
    default: { /* an int skip_scalar has read: read it again for its value */
        cursor d = {p + (*p == '-'), c->p};
        read_uint63(&d, &x->v[i]);
        if (*p == '-')
            x->v[i] = -x->v[i];
        x->kind[i] = 'i';
        return 1;
    }
    }
}

/* The value of a field the loop uses; 0: leave the line to Python. */
static inline int read_value(cursor *c, int k, state_rec *r, extras *x)
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
    case K_CGROUP:
        if (read_literal(c, "null", 4)) {
            r->has_cgroup = 0;
            return 1;
        }
        return (r->has_cgroup = read_uint63(c, &r->cgroup));
    case K_STEAL:
        if (read_literal(c, "null", 4)) {
            r->has_steal = 0;
            return 1;
        }
        if (c->p < c->e && *c->p == '-') {
            c->p++;
            if (!read_uint63(c, &r->steal))
                return 0;
            r->steal = -r->steal;
            return (r->has_steal = 1);
        }
        return (r->has_steal = read_uint63(c, &r->steal));
    default:
        if (x && k >= K_EXTRA)
            return read_extra(c, x, __builtin_ctz((unsigned)k) - __builtin_ctz(K_EXTRA));
        return skip_scalar(c);
    }
}

/* In a flat object, after its brace or a comma: the next member's key and
 * its colon (the cursor then at its value). 0: not as orjson would read it
 * plainly (the careful path decides). */
static inline __attribute__((always_inline)) int read_key(cursor *c, const char **s, Py_ssize_t *n)
{
    skip_ws(c);
    if (!read_plain_string(c, s, n))
        return 0;
    skip_ws(c);
    if (c->p >= c->e || *c->p != ':')
        return 0;
    c->p++;
    skip_ws(c);
    return 1;
}

/* After a member's value: 1 another member follows (its comma read), 0 the
 * object ended (its brace read), -1 neither. */
static inline __attribute__((always_inline)) int after_member(cursor *c)
{
    skip_ws(c);
    if (c->p >= c->e)
        return -1;
    if (*c->p == ',') {
        c->p++;
        return 1;
    }
    if (*c->p != '}')
        return -1;
    c->p++;
    return 0;
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

/* 1: a state record the fast loop may take; 0: leave the line to Python.
 * x: where the extra fields go (NULL: not wanted, skipped). */
static inline __attribute__((always_inline)) int parse_state(const char *p, const char *e, state_rec *r,
                                                          extras *x)
{
    cursor c = {p, e};
    unsigned seen = 0;
    const char *s;
    Py_ssize_t n;

    *r = (state_rec){0};
    if (x)
        memset(x->kind, 0, sizeof(x->kind));
    if ((size_t)(e - p) > sizeof(LAYOUT_HEAD) - 1 && memcmp(p, LAYOUT_HEAD, sizeof(LAYOUT_HEAD) - 1) == 0) {
        c.p += sizeof(LAYOUT_HEAD) - 1;
        seen = K_TYPE;
        for (size_t i = 0; i < sizeof(LAYOUT) / sizeof(LAYOUT[0]); i++) {
            if ((size_t)(c.e - c.p) < LAYOUT[i].len || memcmp(c.p, LAYOUT[i].lit, LAYOUT[i].len) != 0)
                break;
            c.p += LAYOUT[i].len;
            if (!read_value(&c, LAYOUT[i].key, r, x))
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
        if (!read_key(&c, &s, &n))
            return 0;
        int k = key_of(s, n);
        if (!k && x)
            k = extra_of(s, n);
        if (k & seen)
            return 0; /* a repeated key: orjson's rule, not ours */
        seen |= (unsigned)k;
        if (!read_value(&c, k, r, x))
            return 0;
after_value:;
        int more = after_member(&c);
        if (more < 0)
            return 0;
        if (!more)
            break;
    }
    skip_ws(&c);
    return c.p == c.e && (seen & K_REQUIRED) == K_REQUIRED;
}

/* The line of buf that starts at pos (lines cut at '\n' as bytes.split cuts
 * buf[:end]): 1 when it is a plain state record of at most max_line bytes,
 * read into *r, with *next where the line after it starts (end + 1 after the
 * last one). */
static inline int next_state(const char *buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_line, state_rec *r,
                             Py_ssize_t *next, extras *x)
{
    const char *p = buf + pos;
    const char *e = line_end(buf, pos, end);
    if (e - p > max_line || !parse_state(p, e, r, x))
        return 0;
    *next = (e - buf) + 1;
    return 1;
}

/* A line a reader that sums time in state passes over: a record of a context
 * type (pstate.stream.schema.CONTEXT_TYPES, "slice" or "waker": no time in
 * state, no place in the order per CPU, and every value passes the careful
 * path's checks), written as a flat object of plain scalars with exactly one
 * "type" key. 1, with *next where the line after it starts; 0: leave the line
 * to the careful path (which reads anything else orjson reads). */
static int next_context(const char *buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_line, Py_ssize_t *next)
{
    const char *p = buf + pos;
    const char *e = line_end(buf, pos, end);
    if (e - p > max_line)
        return 0;
    cursor c = {p, e};
    const char *s;
    Py_ssize_t n;
    int typed = 0;
    skip_ws(&c);
    if (c.p >= c.e || *c.p != '{')
        return 0;
    c.p++;
    for (;;) {
        if (!read_key(&c, &s, &n))
            return 0;
        if (n == 4 && memcmp(s, "type", 4) == 0) {
            if (typed || !read_plain_string(&c, &s, &n) || n != 5 ||
                (memcmp(s, "slice", 5) != 0 && memcmp(s, "waker", 5) != 0))
                return 0; /* (a repeated "type": orjson's rule, not ours) */
            typed = 1;
        } else if (!skip_scalar(&c))
            return 0;
        int more = after_member(&c);
        if (more < 0)
            return 0;
        if (!more)
            break;
    }
    skip_ws(&c);
    if (c.p != c.e || !typed)
        return 0;
    *next = (e - buf) + 1;
    return 1;
}

/* --- the order of records per CPU ------------------------------------------ */

/* The cells of streamio.CpuOrder.table: the records out of order, 1 once the
 * first is placed, 1 until the first meta record, then the ts of the last
 * record per CPU (-1: none). */
enum { ORDER_COUNT, ORDER_PLACED, ORDER_LEAD, ORDER_HEAD };

typedef struct {
    long long *c;   /* NULL: no table bound, nothing to note */
    Py_ssize_t ncpu;
    Py_buffer view;
} order_t;

static PyObject *order_key; /* the key of the bound table in the thread's state dict */

/* The table bound in this thread, if any, held until order_release. */
static int order_acquire(order_t *o)
{
    o->c = NULL;
    PyObject *d = PyThreadState_GetDict();
    PyObject *obj = d ? PyDict_GetItemWithError(d, order_key) : NULL;
    if (!obj)
        return PyErr_Occurred() ? -1 : 0;
    if (PyObject_GetBuffer(obj, &o->view, PyBUF_WRITABLE) < 0)
        return -1;
    if (o->view.len < (Py_ssize_t)(ORDER_HEAD * sizeof(long long)) || o->view.len % sizeof(long long) ||
        (uintptr_t)o->view.buf % sizeof(long long)) {
        PyBuffer_Release(&o->view);
        PyErr_SetString(PyExc_ValueError, "bad order table");
        return -1;
    }
    o->c = o->view.buf;
    o->ncpu = o->view.len / (Py_ssize_t)sizeof(long long) - ORDER_HEAD;
    return 0;
}

static void order_release(order_t *o)
{
    if (o->c)
        PyBuffer_Release(&o->view);
    o->c = NULL;
}

/* 1: the record may be taken here; 0: leave its line to the careful path. */
static inline int order_ok(const order_t *o, const state_rec *r)
{
    if (!o->c)
        return 1;
    if (r->cpu >= o->ncpu)
        return 0;
    long long last = o->c[ORDER_HEAD + r->cpu];
    if (last < 0)
        return !o->c[ORDER_LEAD];
    return r->ts >= last || o->c[ORDER_PLACED];
}

/* A record taken (after order_ok). */
static inline void order_note(const order_t *o, const state_rec *r)
{
    if (!o->c)
        return;
    long long *last = &o->c[ORDER_HEAD + r->cpu];
    if (r->ts < *last)
        o->c[ORDER_COUNT]++;
    *last = r->ts;
}

PyDoc_STRVAR(bind_order_doc,
"bind_order(table) -> previous\n\n"
"Bind a reader's order table (streamio.CpuOrder.table, a writable buffer of\n"
"int64 cells) in this thread, or None to unbind; previous: what was bound\n"
"(None: nothing). While it is bound, Digester.digest, parse_states and\n"
"plain_states note the ts of the records they take in it.");

static PyObject *bind_order(PyObject *module, PyObject *table)
{
    PyObject *d = PyThreadState_GetDict();
    if (!d) {
        PyErr_SetString(PyExc_RuntimeError, "no thread state dict");
        return NULL;
    }
    PyObject *prev = PyDict_GetItemWithError(d, order_key);
    if (!prev && PyErr_Occurred())
        return NULL;
    prev = prev ? prev : Py_None;
    Py_INCREF(prev);
    int rc;
    if (table == Py_None) {
        rc = PyDict_Contains(d, order_key);
        if (rc > 0)
            rc = PyDict_DelItem(d, order_key);
    } else if (!PyObject_CheckBuffer(table)) {
        PyErr_SetString(PyExc_TypeError, "bind_order takes a writable buffer or None");
        rc = -1;
    } else
        rc = PyDict_SetItem(d, order_key, table);
    if (rc < 0) {
        Py_DECREF(prev);
        return NULL;
    }
    return prev;
}

/* --- ints beyond 64 bits ------------------------------------------------------ */

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

/* The state name (a new reference) and id, through a cache in front of the state_id callable. */
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
    PyObject *sid = PyObject_CallOneArg(self->state_id, str);
    if (!sid) {
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

/* The group of a record by comm, through the comm cache in front of the comm_id callable. */
static int comm_group(Digester *self, PyObject *comm, comm_entry *ce, long long *g)
{
    PyObject *gid;
    if (ce && ce->gid) {
        gid = ce->gid;
        Py_INCREF(gid);
    } else {
        if (!(gid = PyObject_CallOneArg(self->comm_id, comm)))
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

/* The live slot of key (and, with eq, the one eq(slot, ctx) says is the
 * same: 1 yes, 0 no, -1 an error), claimed (zeroed, *fresh = 1) when new in
 * this call; NULL on an error. */
static inline __attribute__((always_inline)) void *acc_probe(acc_table *t, long long key,
                                                             int (*eq)(const acc_head *, const void *),
                                                             const void *ctx, int *fresh)
{
    for (;;) {
        size_t mask = (size_t)t->cap - 1, i = mix64((unsigned long long)key) & mask;
        for (;;) {
            acc_head *h = SLOT(t, i);
            if (h->gen != t->gen)
                break;
            if (h->key == key) {
                int same = eq ? eq(h, ctx) : 1;
                if (same < 0)
                    return NULL;
                if (same) {
                    *fresh = 0;
                    return h;
                }
            }
            i = (i + 1) & mask;
        }
        if (2 * (t->used + 1) <= t->cap) {
            acc_head *h = SLOT(t, i);
            memset(h, 0, t->size);
            h->key = key;
            h->gen = t->gen;
            t->order[t->used++] = (Py_ssize_t)i;
            *fresh = 1;
            return h;
        }
        if (acc_grow(t) < 0)
            return NULL;
    }
}

static void *acc_get(acc_table *t, long long key, int *fresh)
{
    return acc_probe(t, key, NULL, NULL, fresh);
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

/* The waiting bucket counts as [(cell key, {bucket: count})], one entry per
 * cell; the table is emptied and the cell numbers are forgotten. */
static PyObject *hist_flush(Digester *self)
{
    self->hist_flush_due = 0;
    PyObject *out = PyList_New(0);
    PyObject **per_cell = self->nos_used ? PyMem_Calloc((size_t)self->nos_used, sizeof(PyObject *)) : NULL;
    if (!out || (self->nos_used && !per_cell)) {
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; self->hist_used && k < self->hist_cap; k++) {
        hist_slot *e = &self->hist[k];
        if (e->key == HIST_EMPTY)
            continue;
        uint32_t no = e->key >> HIST_IDX_BITS;
        PyObject *d = per_cell[no];
        if (!d) {
            PyObject *key = PyLong_FromLongLong(self->cell_keys[no]);
            d = per_cell[no] = PyDict_New();
            PyObject *pair = (key && d) ? PyTuple_Pack(2, key, d) : NULL;
            Py_XDECREF(key);
            if (!pair || PyList_Append(out, pair) < 0) {
                Py_XDECREF(pair);
                goto fail;
            }
            Py_DECREF(pair);
        }
        PyObject *idx = PyLong_FromLong((long)(e->key & ((1u << HIST_IDX_BITS) - 1)));
        PyObject *n = PyLong_FromUnsignedLong(e->count);
        int bad = !idx || !n || PyDict_SetItem(d, idx, n) < 0;
        Py_XDECREF(idx);
        Py_XDECREF(n);
        if (bad)
            goto fail;
        e->key = HIST_EMPTY;
        self->hist_used--;
    }
    for (Py_ssize_t i = 0; i < self->nos_used; i++)
        Py_XDECREF(per_cell[i]); /* the list holds them */
    PyMem_Free(per_cell);
    /* Numbering restarts: the cells they numbered were handed out with them. */
    if (self->cell_nos)
        memset(self->cell_nos, 0, (size_t)self->nos_cap * sizeof(cell_no_slot));
    self->nos_used = 0;
    return out;
fail:
    for (Py_ssize_t i = 0; i < self->nos_used; i++)
        Py_XDECREF(per_cell[i]);
    PyMem_Free(per_cell);
    Py_DECREF(out);
    return NULL;
}


/* --- groups and filters by pid --------------------------------------------- */

/* The cache entry of pid, made fresh when it held another pid or an older
 * generation; for a record carrying a cgroup (r->has_cgroup), its cgroup
 * part is made fresh when it held another cgroup. */
static pid_entry *pid_entry_of(Digester *self, const state_rec *r)
{
    long long pid = r->pid;
    pid_entry *pe = &self->pids[mix64((unsigned long long)pid) & (PID_CACHE - 1)];
    if (pe->gen != self->pids_gen || pe->pid != pid) {
        pe->pid = pid;
        pe->gen = self->pids_gen;
        pe->has_gid = 0;
        pe->who = -1;
        pe->has_cg = 0;
    }
    if (r->has_cgroup && (!pe->has_cg || pe->cg != r->cgroup)) {
        pe->has_cg = 1;
        pe->cg = r->cgroup;
        pe->has_cg_gid = 0;
        pe->cg_who = -1;
    }
    return pe;
}

/* callable(pid, cgroup or None): a new reference, or NULL. */
static PyObject *ask_pid(PyObject *callable, const state_rec *r)
{
    PyObject *pid = PyLong_FromLongLong(r->pid);
    PyObject *cg = r->has_cgroup ? PyLong_FromLongLong(r->cgroup) : Py_NewRef(Py_None);
    PyObject *out = NULL;
    if (pid && cg) {
        PyObject *argv[2] = {pid, cg};
        out = PyObject_Vectorcall(callable, argv, 2, NULL);
    }
    Py_XDECREF(pid);
    Py_XDECREF(cg);
    return out;
}

/* By pid_group: the group of a record (its pid and cgroup), through the
 * cache in front of the group_id callable. */
static int pid_group(Digester *self, const state_rec *r, long long *g)
{
    pid_entry *pe = pid_entry_of(self, r);
    if (r->has_cgroup ? pe->has_cg_gid : pe->has_gid) {
        *g = r->has_cgroup ? pe->cg_gid : pe->gid;
        return 0;
    }
    PyObject *gid = ask_pid(self->comm_id, r);
    if (!gid)
        return -1;
    long long v = PyLong_AsLongLong(gid);
    Py_DECREF(gid);
    if (v == -1 && PyErr_Occurred())
        return -1;
    pe = pid_entry_of(self, r); /* (the callable may have run anything) */
    if (r->has_cgroup) {
        pe->cg_gid = v;
        pe->has_cg_gid = 1;
    } else {
        pe->gid = v;
        pe->has_gid = 1;
    }
    *g = v;
    return 0;
}

static int in_ints(const long long *v, Py_ssize_t n, long long x)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

static int in_strs(char **strs, const Py_ssize_t *lens, Py_ssize_t n, const char *s, Py_ssize_t len)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (lens[i] == len && memcmp(strs[i], s, (size_t)len) == 0)
            return 1;
    return 0;
}

/* Whether a record passes the filter, in Filter.match_state's order: 1
 * passes, 0 not, -1 error. */
static int filter_passes(Digester *self, const state_rec *r)
{
    filter_spec *f = &self->filt;
    if (!f->include_idle && r->tid == 0)
        return 0;
    if (f->npids && !in_ints(f->pids, f->npids, r->pid))
        return 0;
    if (f->ntids && !in_ints(f->tids, f->ntids, r->tid))
        return 0;
    if (f->ncomms && !(r->comm && in_strs(f->strs, f->lens, f->ncomms, r->comm, r->comm_n)))
        return 0;
    if (f->ncpus && !in_ints(f->cpus, f->ncpus, r->cpu))
        return 0;
    if (f->who) {
        pid_entry *pe = pid_entry_of(self, r);
        signed char who = r->has_cgroup ? pe->cg_who : pe->who;
        if (who < 0) {
            PyObject *ok = ask_pid(f->who, r);
            if (!ok)
                return -1;
            int t = PyObject_IsTrue(ok);
            Py_DECREF(ok);
            if (t < 0)
                return -1;
            pe = pid_entry_of(self, r);
            who = (signed char)t;
            if (r->has_cgroup)
                pe->cg_who = who;
            else
                pe->who = who;
        }
        if (!who)
            return 0;
    }
    if (f->nstates && !in_strs(f->strs + f->ncomms, f->lens + f->ncomms, f->nstates, r->from, r->from_n) &&
        !in_strs(f->strs + f->ncomms, f->lens + f->ncomms, f->nstates, r->to, r->to_n))
        return 0;
    return !f->min_dur || (r->has_dur && r->dur >= f->min_dur);
}

static void filter_free(filter_spec *f)
{
    PyMem_Free(f->pids);
    PyMem_Free(f->tids);
    PyMem_Free(f->cpus);
    for (Py_ssize_t i = 0; f->strs && i < f->ncomms + f->nstates; i++)
        PyMem_Free(f->strs[i]);
    PyMem_Free(f->strs);
    PyMem_Free(f->lens);
    Py_CLEAR(f->who);
    memset(f, 0, sizeof(*f));
}

/* The ints of a sequence into a new array; -1 on error. */
static int ints_of(PyObject *seq, long long **out, Py_ssize_t *n)
{
    PyObject *fast = PySequence_Fast(seq, "a filter's values must be a sequence");
    if (!fast)
        return -1;
    *n = PySequence_Fast_GET_SIZE(fast);
    *out = PyMem_Calloc((size_t)*n + 1, sizeof(long long));
    if (!*out) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        int overflow = 0;
        (*out)[i] = PyLong_AsLongLongAndOverflow(PySequence_Fast_GET_ITEM(fast, i), &overflow);
        if (overflow)
            (*out)[i] = -1; /* no record has such a value: it matches nothing */
        else if ((*out)[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

/* The strs of two sequences (comms, states) into f->strs; -1 on error. */
static int strs_of(filter_spec *f, PyObject *comms, PyObject *states)
{
    PyObject *a = PySequence_Fast(comms, "comms must be a sequence");
    PyObject *b = a ? PySequence_Fast(states, "states must be a sequence") : NULL;
    int rc = -1;
    if (!b)
        goto out;
    f->ncomms = PySequence_Fast_GET_SIZE(a);
    f->nstates = PySequence_Fast_GET_SIZE(b);
    Py_ssize_t n = f->ncomms + f->nstates;
    f->strs = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    f->lens = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    if (!f->strs || !f->lens) {
        f->ncomms = f->nstates = 0;
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = i < f->ncomms ? PySequence_Fast_GET_ITEM(a, i) : PySequence_Fast_GET_ITEM(b, i - f->ncomms);
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(o, &len);
        if (!s)
            goto out;
        if (!(f->strs[i] = PyMem_Malloc((size_t)len + 1))) {
            PyErr_NoMemory();
            goto out;
        }
        memcpy(f->strs[i], s, (size_t)len);
        f->lens[i] = len;
    }
    rc = 0;
out:
    Py_XDECREF(a);
    Py_XDECREF(b);
    return rc;
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
    if (clip && r->has_dur && r->dur > r->ts - clip_v)
        return 1; /* part of dur_ns lies before the interval: the careful path clips it */
    if (state_of(self, r->from, r->from_n, &frm, &fi) < 0 || state_of(self, r->to, r->to_n, &to, &ti) < 0)
        goto out;
    if (!(comm = comm_str(self->comms, r, &ce)))
        goto out;
    if (self->by == 0)
        g = r->pid;
    else if (self->by == 1)
        g = r->tid;
    else if (self->by == 3) {
        if (pid_group(self, r, &g) < 0)
            goto out;
    } else if (comm_group(self, comm, ce, &g) < 0)
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
    ta->has_cg = r->has_cgroup;
    ta->cg = r->cgroup;
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
    if (r->has_steal)
        ca->steal += r->steal; /* (as dur_ns: only where the interval's length is known) */
    long long d = r->dur;
    if (ca->n - ca->nnull == 1 || d > ca->max)
        ca->max = d;
    if (ca->n - ca->nnull == 1 || d < ca->min)
        ca->min = d;
    ca->sum += d;
    /* latency.bucket_index: log-linear, 2^BUCKET_SUB_BITS buckets per power of two */
    int s = (d ? 64 - __builtin_clzll((unsigned long long)d) : 0) - (BUCKET_SUB_BITS + 1);
    long long idx = s > 0 ? (((long long)s << BUCKET_SUB_BITS) + (d >> s)) : d;
    if (hist_defer(self, ca->no, idx) < 0)
        goto out;

    rc = 0;
out:
    Py_XDECREF(frm);
    Py_XDECREF(to);
    Py_XDECREF(comm);
    return rc;
}

/* --- the why-views' sums (set_why) ----------------------------------------- */

/* The kinds of row Causes.select names (analysis.causes: NONE, BLOCKED, ...). */
enum { WHY_NONE, WHY_BLOCKED, WHY_SLICE, WHY_WAIT_WAKEUP, WHY_WAIT_PREEMPTED };
#define WHY_MAX_CPU (1 << 16)

/* 1: the why-views' fields of a record are as the fast path reads them
 * (waker_tid, waker_pid: null or an int >= 0; waker: null or a short string;
 * with why_stacks, no stack_id or reason; its states' and waker's names in
 * the name cache; cpu < WHY_MAX_CPU); 0: leave the line to Python. *fe, *te,
 * *we: the cache entries (*we NULL: no waker). */
static int why_plain(Digester *self, const state_rec *r, const extras *x, name_entry **fe, name_entry **te,
                     name_entry **we)
{
    for (int i = X_WAKER_TID; i <= X_WAKER_PID; i++)
        if (x->kind[i] && x->kind[i] != 'n' && !(x->kind[i] == 'i' && x->v[i] >= 0))
            return 0;
    if (x->kind[X_WAKER] && x->kind[X_WAKER] != 'n' && x->kind[X_WAKER] != 's')
        return 0;
    if (self->why_stacks && ((x->kind[X_STACK_ID] && x->kind[X_STACK_ID] != 'n') ||
                             (x->kind[X_REASON] && x->kind[X_REASON] != 'n')))
        return 0;
    if (r->cpu >= WHY_MAX_CPU)
        return 0;
    PyObject *o;
    if (!(o = name_str(self->names, &self->n_names, r->from, r->from_n, fe)))
        return -1;
    Py_DECREF(o);
    if (!(o = name_str(self->names, &self->n_names, r->to, r->to_n, te)))
        return -1;
    Py_DECREF(o);
    *we = NULL;
    if (x->kind[X_WAKER] == 's' && x->n[X_WAKER] > 0) { /* ("" is no waker, as in Python) */
        if (!(o = name_str(self->names, &self->n_names, x->s[X_WAKER], x->n[X_WAKER], we)))
            return -1;
        Py_DECREF(o);
        if (!*we)
            return 0;
    }
    return *fe && *te;
}

/* The kind of row (WHY_*) from `from` to `to`, through the cache; -1 on error. */
static int why_kind(Digester *self, name_entry *fe, name_entry *te)
{
    signed char *slot = &self->why_sel[(fe - self->names) * NAME_CACHE + (te - self->names)];
    if (*slot >= 0)
        return *slot;
    PyObject *argv[2] = {fe->name, te->name};
    PyObject *res = PyObject_Vectorcall(self->why_select, argv, 2, NULL);
    if (!res)
        return -1;
    long v = PyLong_AsLong(res);
    Py_DECREF(res);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < WHY_NONE || v > WHY_WAIT_PREEMPTED) {
        PyErr_SetString(PyExc_ValueError, "select must return a kind of row (0 to 4)");
        return -1;
    }
    *slot = (signed char)v;
    return (int)v;
}

/* Forget the live entries (their references dropped). */
static void wt_clear(acc_table *t)
{
    for (Py_ssize_t k = 0; t->slots && k < t->used; k++) {
        why_entry *w = (why_entry *)SLOT(t, t->order[k]);
        Py_CLEAR(w->comm);
        Py_CLEAR(w->buckets);
    }
    acc_begin(t);
}

static inline long long wt_hash(long long tid, long long pid, long long cg, Py_hash_t ch, long long a, long long b)
{
    return (long long)((unsigned long long)tid ^ (unsigned long long)pid * 0x9E3779B97F4A7C15ULL ^
                       (unsigned long long)cg * 0xC2B2AE3D27D4EB4FULL ^ (unsigned long long)ch * 0x165667B19E3779F9ULL ^
                       (unsigned long long)a * 0x27D4EB2F165667C5ULL ^ (unsigned long long)b * 0x85EBCA77C2B2AE63ULL);
}

typedef struct {
    const state_rec *r;
    PyObject *comm;
    Py_hash_t ch;
    long long cg, a, b;
} wt_key;

static int wt_same(const acc_head *h, const void *ctx)
{
    const why_entry *w = (const why_entry *)h;
    const wt_key *k = ctx;
    if (w->tid != k->r->tid || w->a != k->a || w->b != k->b || w->pid != k->r->pid ||
        w->has_cg != k->r->has_cgroup || w->cg != k->cg || w->chash != k->ch)
        return 0;
    if (w->comm == k->comm)
        return 1;
    if (w->comm == Py_None || k->comm == Py_None)
        return 0;
    int eq = PyUnicode_Compare(w->comm, k->comm);
    return eq == -1 && PyErr_Occurred() ? -1 : eq == 0;
}

/* The entry of a task as a record gave it (r) and of what (a, b), made when new. */
static why_entry *wt_get(acc_table *t, const state_rec *r, PyObject *comm, long long a, long long b)
{
    wt_key k = {r, comm, comm == Py_None ? 0 : PyObject_Hash(comm), r->has_cgroup ? r->cgroup : -1, a, b};
    if (k.ch == -1)
        return NULL;
    int fresh;
    why_entry *w = acc_probe(t, wt_hash(r->tid, r->pid, k.cg, k.ch, a, b), wt_same, &k, &fresh);
    if (w && fresh) {
        w->tid = r->tid;
        w->pid = r->pid;
        w->has_cg = r->has_cgroup;
        w->cg = k.cg;
        w->chash = k.ch;
        w->a = a;
        w->b = b;
        Py_INCREF(comm);
        w->comm = comm;
        w->idx = t->used - 1;
    }
    return w;
}

/* Add v to an entry's sums (and, with buckets, to its bucket counts). */
static int wt_add(why_entry *w, long long v, long long seq, int buckets)
{
    if (w->count == 0 || v > w->max)
        w->max = v;
    if (w->count == 0 || v < w->min)
        w->min = v;
    w->count++;
    w->sum += v;
    w->seq = seq;
    if (!buckets)
        return 0;
    if (!w->buckets && !(w->buckets = PyDict_New()))
        return -1;
    int sh = (v ? 64 - __builtin_clzll((unsigned long long)v) : 0) - (BUCKET_SUB_BITS + 1);
    long long idx = sh > 0 ? (((long long)sh << BUCKET_SUB_BITS) + (v >> sh)) : v;
    PyObject *k = PyLong_FromLongLong(idx);
    if (!k)
        return -1;
    PyObject *old = PyDict_GetItemWithError(w->buckets, k);
    long long n = 0;
    if (old)
        n = PyLong_AsLongLong(old);
    else if (PyErr_Occurred()) {
        Py_DECREF(k);
        return -1;
    }
    PyObject *nv = PyLong_FromLongLong(n + 1);
    int rc = nv ? PyDict_SetItem(w->buckets, k, nv) : -1;
    Py_XDECREF(nv);
    Py_DECREF(k);
    return rc;
}

typedef struct {
    uint32_t waiter;
    long long other;
} ov_key;

static inline int ov_same(const acc_head *h, const void *ctx)
{
    const ov_entry *o = (const ov_entry *)h;
    const ov_key *k = ctx;
    return o->h.aux == k->waiter && o->other == k->other;
}

/* The key of an antagonist `other` of `waiter` in its table. */
static inline long long ov_hash(uint32_t waiter, long long other)
{
    return (long long)((unsigned long long)other ^ ((unsigned long long)waiter << 40) ^
                       ((unsigned long long)waiter >> 24));
}

/* Add ns (over `waits` waits) to the antagonist `other` of `waiter`. */
static int ov_add(acc_table *t, uint32_t waiter, long long other, i128 ns, long long waits)
{
    ov_key k = {waiter, other};
    int fresh;
    ov_entry *o = acc_probe(t, ov_hash(waiter, other), ov_same, &k, &fresh);
    if (!o)
        return -1;
    if (fresh) {
        o->h.aux = waiter;
        o->other = other;
    }
    o->ns += ns;
    o->waits += waits;
    return 0;
}

static why_ring *ring_of(Digester *self, long long cpu)
{
    if (cpu >= self->nrings) {
        Py_ssize_t n = self->nrings ? self->nrings : 8;
        while (n <= cpu)
            n *= 2;
        why_ring *rings = PyMem_Realloc(self->rings, (size_t)n * sizeof(why_ring));
        if (!rings) {
            PyErr_NoMemory();
            return NULL;
        }
        memset(rings + self->nrings, 0, (size_t)(n - self->nrings) * sizeof(why_ring));
        self->rings = rings;
        self->nrings = n;
    }
    return &self->rings[cpu];
}

/* An on-CPU slice of tid on cpu, the oldest forgotten beyond ring_max. */
static int why_slice_add(Digester *self, long long cpu, long long s, long long e, long long tid)
{
    why_ring *q = ring_of(self, cpu);
    if (!q)
        return -1;
    if (q->n == q->cap && q->cap < self->ring_max) { /* grow, oldest first from 0 */
        Py_ssize_t cap = q->cap ? q->cap * 2 : 256;
        why_slice *v = PyMem_Malloc((size_t)cap * sizeof(why_slice));
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < q->n; i++)
            v[i] = q->v[(q->head + i) & (q->cap - 1)];
        PyMem_Free(q->v);
        q->v = v;
        q->cap = cap;
        q->head = 0;
    }
    why_slice sl = {s, e, tid};
    if (q->n == q->cap) { /* full at ring_max: the oldest goes */
        q->v[q->head] = sl;
        q->head = (q->head + 1) & (q->cap - 1);
    } else {
        q->v[(q->head + q->n) & (q->cap - 1)] = sl;
        q->n++;
    }
    return 0;
}

/* The other tasks' slices on cpu within [start, end], newest first, as
 * Causes._wait reads its deque: fn(ctx, other tid, overlap) for each. */
typedef int (*overlap_fn)(void *ctx, long long other, long long ov);

static int why_overlaps(Digester *self, long long cpu, long long start, long long end, long long tid,
                        overlap_fn fn, void *ctx)
{
    if (cpu >= self->nrings)
        return 0;
    why_ring *q = &self->rings[cpu];
    for (Py_ssize_t i = q->n - 1; i >= 0; i--) {
        const why_slice *sl = &q->v[(q->head + i) & (q->cap - 1)];
        if (sl->e <= start)
            break;
        if (sl->tid == tid)
            continue;
        long long ov = (sl->e < end ? sl->e : end) - (sl->s > start ? sl->s : start);
        if (ov <= 0)
            continue;
        if (fn(ctx, sl->tid, ov) < 0)
            return -1;
    }
    return 0;
}

/* The overlaps of one wait, added to its antagonists' sums a batch at a
 * time: the slots of a batch are fetched from memory together (a wait meets
 * tens of slices, each another pair in a table of about a million), then
 * added in the order the wait met them. */
#define OV_BATCH 16

typedef struct {
    acc_table *t;
    uint32_t waiter;
    i128 seen;
    int n;
    long long other[OV_BATCH], ov[OV_BATCH];
} wait_ctx;

static int overlaps_flush(wait_ctx *c)
{
    acc_table *t = c->t;
    size_t mask = (size_t)t->cap - 1;
    for (int i = 0; i < c->n; i++)
        __builtin_prefetch(SLOT(t, mix64((unsigned long long)ov_hash(c->waiter, c->other[i])) & mask), 1);
    for (int i = 0; i < c->n; i++)
        if (ov_add(t, c->waiter, c->other[i], c->ov[i], 1) < 0)
            return -1;
    c->n = 0;
    return 0;
}

static int overlap_sum(void *p, long long other, long long ov)
{
    wait_ctx *c = p;
    c->seen += ov;
    c->other[c->n] = other;
    c->ov[c->n] = ov;
    return ++c->n == OV_BATCH ? overlaps_flush(c) : 0;
}

/* The wait [start, end] of waiter (a task's wait entry in t, or a group),
 * on cpu: the other tasks' slices within it, and the rest (other -1). */
static int wait_overlaps(Digester *self, acc_table *t, uint32_t waiter, long long cpu, long long start,
                         long long end, long long tid)
{
    wait_ctx c;
    c.t = t;
    c.waiter = waiter;
    c.seen = 0;
    c.n = 0;
    if (why_overlaps(self, cpu, start, end, tid, overlap_sum, &c) < 0 || overlaps_flush(&c) < 0)
        return -1;
    return end - start - c.seen > 0 ? ov_add(t, waiter, -1, end - start - c.seen, 1) : 0;
}

/* A record the fast path has read (own: one the filter keeps, summed too),
 * with its names' cache entries (why_plain): its task's names and place
 * noted, and, its dur_ns known, what its kind of row adds. 0, or -1. */
static int why_one(Digester *self, const state_rec *r, const extras *x, int own, name_entry *fe,
                   name_entry *te, name_entry *we)
{
    comm_entry *ce;
    PyObject *comm = comm_str(self->comms, r, &ce);
    int fresh, rc = -1;
    if (!comm)
        return -1;
    seen_acc *sa = acc_get(&self->seen, r->tid, &fresh);
    if (!sa)
        goto out;
    sa->pid = r->pid;
    sa->has_pid = 1;
    sa->has_cg = r->has_cgroup;
    sa->cg = r->cgroup;
    Py_INCREF(comm);
    Py_XSETREF(sa->comm, comm);
    if (own) {
        sa->has_own = 1;
        sa->own_ts = r->ts;
        Py_INCREF(te->name);
        Py_XSETREF(sa->own_to, te->name);
    } else if (r->ts > self->why_last_ts) {
        self->why_last_ts = r->ts;
    }
    rc = 0;
    if (!r->has_dur)
        goto out;
    int kind = why_kind(self, fe, te);
    if (kind <= WHY_NONE) {
        rc = kind;
        goto out;
    }
    rc = -1;
    long long d = r->dur, seq = ++self->why_seq;
    if (kind == WHY_SLICE) {
        rc = why_slice_add(self, r->cpu, r->ts - d, r->ts, r->tid);
        goto out;
    }
    if (!own) {
        rc = 0;
        goto out;
    }
    if (kind == WHY_BLOCKED) {
        long long a = WHY_BLOCKED | (long long)(fe - self->names) << 4;
        long long wtid = 0;
        if (self->why_wakers) {
            a |= (long long)(we ? we - self->names + 1 : 0) << 10;
            wtid = we || x->kind[X_WAKER_TID] != 'i' ? 0 : x->v[X_WAKER_TID];
        }
        why_entry *w = wt_get(&self->wt, r, comm, a, wtid);
        if (!w || wt_add(w, d, seq, self->why_hist) < 0)
            goto out;
        if (self->why_wakers && x->kind[X_WAKER_PID] == 'i' && x->v[X_WAKER_PID] > 0) {
            w->wpid = x->v[X_WAKER_PID];
            w->wpid_seq = seq;
        }
        rc = 0;
        goto out;
    }
    /* a run-queue wait: its kind's sums, and who held the CPU meanwhile */
    why_entry *w = wt_get(&self->wt, r, comm, kind, 0);
    if (!w)
        goto out;
    wt_add(w, d, seq, 0);
    if (d > 0) {
        if (wait_overlaps(self, &self->ov, (uint32_t)w->idx, r->cpu, r->ts - d, r->ts, r->tid) < 0)
            goto out;
    }
    rc = 0;
out:
    Py_DECREF(comm);
    return rc;
}

/* (tid, pid, comm, cgroup or None, a, b, count, sum, min, max, buckets or
 * None, waker_pid, its seq, seq): a why_entry. */
static PyObject *why_row(why_entry *w)
{
    PyObject *cg = w->has_cg ? PyLong_FromLongLong(w->cg) : Py_NewRef(Py_None);
    PyObject *sum = long_from_i128(w->sum);
    if (!cg || !sum) {
        Py_XDECREF(cg);
        Py_XDECREF(sum);
        return NULL;
    }
    return Py_BuildValue("(LLONLLLNLLOLLL)", w->tid, w->pid, w->comm, cg, w->a, w->b, w->count, sum, w->min,
                         w->max, w->buckets ? w->buckets : Py_None, w->wpid, w->wpid_seq, w->seq);
}

static void seen_release(acc_table *t)
{
    for (Py_ssize_t k = 0; k < t->used; k++) {
        seen_acc *sa = (seen_acc *)SLOT(t, t->order[k]);
        Py_CLEAR(sa->comm);
        Py_CLEAR(sa->own_to);
    }
}

/* (tid, pid or None, comm, cgroup or None, ts or None, to or None): the
 * names a task's last records gave, and ts and to of its last one the
 * filter kept. */
static PyObject *seen_row(acc_head *h)
{
    seen_acc *sa = (seen_acc *)h;
    PyObject *pid = sa->has_pid ? PyLong_FromLongLong(sa->pid) : Py_NewRef(Py_None);
    PyObject *cg = sa->has_cg ? PyLong_FromLongLong(sa->cg) : Py_NewRef(Py_None);
    PyObject *ts = sa->has_own ? PyLong_FromLongLong(sa->own_ts) : Py_NewRef(Py_None);
    return Py_BuildValue("(LNONNO)", sa->h.key, pid, sa->comm ? sa->comm : Py_None, cg, ts,
                         sa->own_to ? sa->own_to : Py_None);
}

/* The tasks since the last take: (tid, pid, comm, last_ts, to, first_ts,
 * head_null, first_group, known, the last record's cgroup or None). */
static PyObject *task_row(acc_head *h)
{
    task_acc *ta = (task_acc *)h;
    PyObject *known = long_from_i128(ta->known);
    PyObject *cg = ta->has_cg ? PyLong_FromLongLong(ta->cg) : Py_NewRef(Py_None);
    if (!known || !cg) {
        Py_XDECREF(known);
        Py_XDECREF(cg);
        return NULL;
    }
    return Py_BuildValue("(LLOLOLOLNN)", ta->h.key, ta->pid, ta->comm, ta->last_ts, ta->to, ta->first_ts,
                         ta->head_null ? Py_True : Py_False, ta->g_first, known, cg);
}

/* A cell since the last take: (key, n, n_null, sum, max, min, steal); max
 * and min are 0 when every dur_ns was null. */
static PyObject *cell_row(acc_head *h)
{
    cell_acc *ca = (cell_acc *)h;
    int known = ca->n > ca->nnull;
    PyObject *sum = long_from_i128(ca->sum);
    PyObject *steal = sum ? long_from_i128(ca->steal) : NULL;
    if (!steal) {
        Py_XDECREF(sum);
        return NULL;
    }
    return Py_BuildValue("(LLLNLLN)", ca->h.key, ca->n, ca->nnull, sum, known ? ca->max : 0LL,
                         known ? ca->min : 0LL, steal);
}

/* The rows of a table's live slots, in the order they were first touched. */
static PyObject *acc_rows(acc_table *t, PyObject *(*row)(acc_head *))
{
    PyObject *out = PyList_New(t->used);
    for (Py_ssize_t k = 0; out && k < t->used; k++) {
        PyObject *r = row(SLOT(t, t->order[k]));
        if (!r)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, k, r);
    }
    return out;
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
    const char *by;
    PyObject *state_id, *comm_id;
    if (self->state_id) {
        PyErr_SetString(PyExc_RuntimeError, "Digester is initialised already");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "sOO:Digester", &by, &state_id, &comm_id))
        return -1;
    int b = strcmp(by, "pid") == 0 ? 0 : strcmp(by, "tid") == 0 ? 1 : strcmp(by, "comm") == 0 ? 2
          : strcmp(by, "pid_group") == 0 ? 3 : -1;
    if (b < 0) {
        PyErr_SetString(PyExc_ValueError, "by must be pid, tid, comm or pid_group");
        return -1;
    }
    if (!PyCallable_Check(state_id) || !PyCallable_Check(comm_id)) {
        PyErr_SetString(PyExc_TypeError, "state_id and comm_id must be callables");
        return -1;
    }
    self->comms = PyMem_Calloc(COMM_CACHE, sizeof(comm_entry));
    self->pids = PyMem_Calloc(PID_CACHE, sizeof(pid_entry));
    self->pids_gen = 1;
    if (!self->comms || !self->pids || acc_init(&self->tasks, sizeof(task_acc)) < 0 ||
        acc_init(&self->cells, sizeof(cell_acc)) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(state_id);
    Py_INCREF(comm_id);
    self->state_id = state_id;
    self->comm_id = comm_id;
    self->by = b;
    return 0;
}

static void Digester_dealloc(Digester *self)
{
    if (self->tasks.slots)
        tasks_release(&self->tasks);
    Digester_clear_caches(self);
    PyMem_Free(self->comms);
    PyMem_Free(self->pids);
    filter_free(&self->filt);
    acc_free(&self->tasks);
    acc_free(&self->cells);
    PyMem_Free(self->hist);
    PyMem_Free(self->cell_nos);
    PyMem_Free(self->cell_keys);
    Py_XDECREF(self->state_id);
    Py_XDECREF(self->comm_id);
    if (self->seen.slots)
        seen_release(&self->seen);
    acc_free(&self->seen);
    PyMem_Free(self->why_sel);
    if (self->wt.slots)
        wt_clear(&self->wt);
    acc_free(&self->wt);
    acc_free(&self->ov);
    acc_free(&self->ga);
    for (Py_ssize_t i = 0; i < self->nrings; i++)
        PyMem_Free(self->rings[i].v);
    PyMem_Free(self->rings);
    Py_XDECREF(self->why_select);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(digest_doc,
"digest(buf, pos, end, max_line, clip=None) -> (stop, lines, due)\n\n"
"Read the lines of buf[pos:end] (as buf[pos:end].split(b'\\n') cuts them)\n"
"while each is a plainly written state record of at most max_line bytes\n"
"(and, with clip, the interval start, none has a dur_ns reaching back\n"
"before clip), and sum them up here. stop: where the first other line\n"
"starts, end + 1 when there was none; lines: the records read (those the\n"
"filter left out too, and, before set_why, the plainly written slice and\n"
"waker records passed over); due: call take(True) now (the bucket table is\n"
"full).");

static PyObject *Digester_digest(Digester *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, end, max_line;
    PyObject *clip = Py_None;
    if (!self->state_id) {
        PyErr_SetString(PyExc_RuntimeError, "Digester not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*nnn|O:digest", &view, &pos, &end, &max_line, &clip))
        return NULL;
    if (self->fold_due) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "why_fold must follow take_why");
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t lines = 0, digested = 0;
    long long clip_v = 0;
    order_t order = {0};
    if (pos < 0 || end > view.len || pos > end + 1) {
        PyErr_SetString(PyExc_ValueError, "bad range");
        goto done;
    }
    if (clip != Py_None && !PyLong_Check(clip)) {
        PyErr_SetString(PyExc_TypeError, "clip must be None or an int");
        goto done;
    }
    if (clip != Py_None) {
        int overflow = 0;
        clip_v = PyLong_AsLongLongAndOverflow(clip, &overflow);
        if (overflow || clip_v < 0) {
            /* outside the range of valid ts: the careful path for everything */
            result = Py_BuildValue("nnO", pos, (Py_ssize_t)0, Py_False);
            goto done;
        }
    }
    const char *buf = view.buf;
    PyObject *clip_or_null = clip == Py_None ? NULL : clip;
    if (order_acquire(&order) < 0)
        goto done;
    /* Segments as bytes.split(b"\n") makes them: the last one ends at end. */
    while (pos <= end && !self->hist_flush_due) {
        state_rec r;
        extras x;
        Py_ssize_t next;
        if (!next_state(buf, pos, end, max_line, &r, &next, self->why ? &x : NULL)) {
            /* without why-views, a slice or waker record is read and passed over here */
            if (self->why || !next_context(buf, pos, end, max_line, &next))
                break;
            lines++;
            pos = next;
            continue;
        }
        if (!order_ok(&order, &r))
            break;
        name_entry *fe = NULL, *te = NULL, *we = NULL;
        if (self->why) {
            int plain = why_plain(self, &r, &x, &fe, &te, &we);
            if (plain < 0)
                goto done;
            if (!plain)
                break;
        }
        if (self->filt.on) {
            int ok = filter_passes(self, &r);
            if (ok < 0)
                goto done;
            if (!ok) { /* read, and left out as the careful path leaves it out */
                if (self->why && why_one(self, &r, &x, 0, fe, te, we) < 0)
                    goto done;
                order_note(&order, &r);
                lines++;
                pos = next;
                continue;
            }
        }
        int rc = digest_one(self, &r, clip_or_null, clip_v);
        if (rc < 0)
            goto done;
        if (rc > 0)
            break;
        if (self->why && why_one(self, &r, &x, 1, fe, te, we) < 0)
            goto done;
        order_note(&order, &r);
        lines++;
        digested++;
        pos = next;
        if (self->nos_used >= MAX_CELL_NOS / 2)
            self->hist_flush_due = 1;
    }
    if (hist_settle(self) < 0)
        goto done;
    self->events += digested;
    result = Py_BuildValue("nnO", pos, lines, self->hist_flush_due ? Py_True : Py_False);
done:
    self->has_pending = 0; /* (only left set by an error) */
    order_release(&order);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(take_doc,
"take(flush=False) -> (events, tasks, cells, buckets)\n\n"
"What the records read since the last take sum up to, which is then\n"
"forgotten here: events: their number; tasks: [(tid, pid, comm, last_ts,\n"
"to, first_ts, head_null, first_group, known)] and cells: [(key, n,\n"
"n_null, sum, max, min)], per task and per cell in the order each was\n"
"first seen (key: group << 16 | from-id << 8 | to-id; max, min: 0 when\n"
"every dur_ns was null; known: the dur_ns summed). buckets: with flush\n"
"(or when due), [(key, {bucket: count})] the latency bucket counts held\n"
"back since the last flush, else [].");

static PyObject *Digester_take(Digester *self, PyObject *args)
{
    int flush = 0;
    if (!self->state_id) {
        PyErr_SetString(PyExc_RuntimeError, "Digester not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "|p:take", &flush))
        return NULL;
    PyObject *tasks = acc_rows(&self->tasks, task_row);
    PyObject *cells = tasks ? acc_rows(&self->cells, cell_row) : NULL;
    PyObject *buckets = NULL, *result = NULL;
    if (!cells)
        goto done;
    tasks_release(&self->tasks);
    acc_begin(&self->tasks);
    acc_begin(&self->cells);
    buckets = (flush || self->hist_flush_due) ? hist_flush(self) : PyList_New(0);
    if (buckets)
        result = Py_BuildValue("LOOO", self->events, tasks, cells, buckets);
    self->events = 0;
done:
    Py_XDECREF(tasks);
    Py_XDECREF(cells);
    Py_XDECREF(buckets);
    return result;
}

PyDoc_STRVAR(forget_doc,
"forget(pid=None)\n\n"
"Forget what group_id (by pid_group) and the filter's who said of a pid\n"
"(None: of every pid): call when a process record (of that pid) or a\n"
"cgroup record (of any) may have changed it.");

static PyObject *Digester_forget(Digester *self, PyObject *args)
{
    PyObject *pid = Py_None;
    if (args && !PyArg_ParseTuple(args, "|O:forget", &pid))
        return NULL;
    if (pid != Py_None) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(pid, &overflow);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (!overflow) {
            pid_entry *pe = &self->pids[mix64((unsigned long long)v) & (PID_CACHE - 1)];
            if (pe->pid == v)
                pe->gen = self->pids_gen - 1; /* stale (gen 0 is never live) */
        }
        Py_RETURN_NONE;
    }
    if (++self->pids_gen == 0) {
        memset(self->pids, 0, PID_CACHE * sizeof(pid_entry));
        self->pids_gen = 1;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(set_filter_doc,
"set_filter(pids, tids, comms, states, cpus, min_dur_ns, include_idle, who)\n\n"
"From now on, digest only the records stream.filters.Filter.match_state\n"
"passes (the others are read and left out): pids, tids, cpus: ints; comms\n"
"(at most 15 characters), states: strs; who: None, or a callable\n"
"(pid, the record's cgroup or None) -> bool\n"
"(--cgroup, --title: asked once per pid until forget()).");

static PyObject *Digester_set_filter(Digester *self, PyObject *args)
{
    PyObject *pids, *tids, *comms, *states, *cpus, *who;
    long long min_dur;
    int idle;
    if (!self->state_id) {
        PyErr_SetString(PyExc_RuntimeError, "Digester not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOOLpO:set_filter", &pids, &tids, &comms, &states, &cpus, &min_dur, &idle, &who))
        return NULL;
    if (who != Py_None && !PyCallable_Check(who)) {
        PyErr_SetString(PyExc_TypeError, "who must be None or a callable");
        return NULL;
    }
    filter_spec *f = &self->filt;
    filter_free(f);
    if (ints_of(pids, &f->pids, &f->npids) < 0 || ints_of(tids, &f->tids, &f->ntids) < 0 ||
        ints_of(cpus, &f->cpus, &f->ncpus) < 0 || strs_of(f, comms, states) < 0) {
        filter_free(f);
        return NULL;
    }
    f->min_dur = min_dur;
    f->include_idle = idle;
    if (who != Py_None) {
        Py_INCREF(who);
        f->who = who;
    }
    f->on = 1;
    Digester_forget(self, NULL);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(set_why_doc,
"set_why(select, stacks, slices_per_cpu, hist, wakers)\n\n"
"From now on, also sum what the why-views (analysis.causes.Causes) read of\n"
"each record digest() reads, the filter's left-outs too, for take_why().\n"
"select(from, to): the kind of row of a transition (0 none, 1 leaving a\n"
"blocked state, 2 leaving running: an on-CPU slice, 3 and 4 a run-queue\n"
"wait after a wake-up and after a preemption), asked once per pair; the\n"
"latest slices_per_cpu slices per CPU are kept for the waits; blocked\n"
"intervals are summed with their bucket counts (hist) and by waker\n"
"(wakers), or without. A record\n"
"whose waker fields are not plain (waker_tid, waker_pid: null or an int\n"
">= 0; waker: null or a string) is left to the careful path, and with\n"
"stacks one with a stack_id or a reason too.");

static PyObject *Digester_set_why(Digester *self, PyObject *args)
{
    PyObject *select;
    int stacks, hist, wakers;
    Py_ssize_t ring_max;
    if (!self->state_id) {
        PyErr_SetString(PyExc_RuntimeError, "Digester not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "Opnpp:set_why", &select, &stacks, &ring_max, &hist, &wakers))
        return NULL;
    if (!PyCallable_Check(select)) {
        PyErr_SetString(PyExc_TypeError, "select must be a callable");
        return NULL;
    }
    if (ring_max < 1 || (ring_max & (ring_max - 1)) || ring_max < 256) {
        PyErr_SetString(PyExc_ValueError, "slices_per_cpu must be a power of two, at least 256");
        return NULL;
    }
    if (self->why) {
        PyErr_SetString(PyExc_RuntimeError, "set_why was called already");
        return NULL;
    }
    self->why_sel = PyMem_Malloc(NAME_CACHE * NAME_CACHE);
    if (!self->why_sel || acc_init(&self->wt, sizeof(why_entry)) < 0 || acc_init(&self->ov, sizeof(ov_entry)) < 0 ||
        acc_init(&self->ga, sizeof(ov_entry)) < 0 ||
        acc_init(&self->seen, sizeof(seen_acc)) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return NULL;
    }
    memset(self->why_sel, -1, NAME_CACHE * NAME_CACHE);
    self->why_last_ts = -1;
    self->ring_max = ring_max;
    Py_INCREF(select);
    self->why_select = select;
    self->why_stacks = stacks;
    self->why_hist = hist;
    self->why_wakers = wakers;
    self->why = 1;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(take_why_doc,
"take_why() -> (sums, last_ts, names)\n\n"
"What set_why sums, since the last take_why, which is then forgotten here.\n"
"sums: [(tid, pid, comm, cgroup, a, b, count, sum, min, max, buckets,\n"
"waker_pid, waker_pid_seq, seq)], per task as its rows gave it and per\n"
"what, a: the kind of row (1 blocked: | from << 4 | waker << 10, names\n"
"indices, the waker's + 1, 0 none; b: the waker's tid; 3, 4: run-queue\n"
"waits); buckets: a blocked interval's {bucket: count}, else None; seq: the\n"
"row number (why_seq) of its last row, waker_pid_seq of the last that gave\n"
"a waker_pid (0: none did); the antagonists of their waits wait for\n"
"why_fold, which must come next. last_ts: the latest ts of a\n"
"record the filter left out (None: none); names: the names the indices\n"
"number.");

static PyObject *Digester_take_why(Digester *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->why) {
        PyErr_SetString(PyExc_RuntimeError, "set_why was not called");
        return NULL;
    }
    if (self->fold_due) { /* the last take's fold never came (an interrupted read): its antagonists go */
        acc_begin(&self->ov);
        self->fold_due = 0;
    }
    PyObject *sums = PyList_New(self->wt.used);
    for (Py_ssize_t k = 0; sums && k < self->wt.used; k++) {
        PyObject *row = why_row((why_entry *)SLOT(&self->wt, self->wt.order[k]));
        if (!row)
            Py_CLEAR(sums);
        else
            PyList_SET_ITEM(sums, k, row);
    }
    PyObject *names = sums ? PyTuple_New(self->n_names) : NULL;
    for (int i = 0; names && i < self->n_names; i++)
        PyTuple_SET_ITEM(names, i, Py_NewRef(self->names[i].name));
    PyObject *last = names ? (self->why_last_ts >= 0 ? PyLong_FromLongLong(self->why_last_ts) : Py_NewRef(Py_None))
                           : NULL;
    if (!last) {
        Py_XDECREF(sums);
        Py_XDECREF(names);
        return NULL;
    }
    wt_clear(&self->wt);
    self->fold_due = self->ov.used > 0;
    self->why_last_ts = -1;
    return Py_BuildValue("(NNN)", sums, last, names);
}

PyDoc_STRVAR(why_fold_doc,
"why_fold(groups)\n\n"
"After take_why (and before the next digest): the antagonists of the\n"
"waits of the sums it handed out, added to those of their groups: groups[i]\n"
"is the group number (an int >= 0, the caller's) of sums[i].");

static PyObject *Digester_why_fold(Digester *self, PyObject *groups)
{
    if (!self->why) {
        PyErr_SetString(PyExc_RuntimeError, "set_why was not called");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(groups, "groups must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < self->ov.used; k++) {
        if (k + 8 < self->ov.used) /* (the sums lie in the order of their hashes, not of this walk) */
            __builtin_prefetch(SLOT(&self->ov, self->ov.order[k + 8]), 0);
        ov_entry *o = (ov_entry *)SLOT(&self->ov, self->ov.order[k]);
        if ((Py_ssize_t)o->h.aux >= n) {
            PyErr_SetString(PyExc_ValueError, "groups is shorter than the sums");
            goto fail;
        }
        long long g = PyLong_AsLongLong(items[o->h.aux]);
        if (g == -1 && PyErr_Occurred())
            goto fail;
        if (g < 0 || g > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "a group number is out of range");
            goto fail;
        }
        if (ov_add(&self->ga, (uint32_t)g, o->other, o->ns, o->waits) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    acc_begin(&self->ov);
    self->fold_due = 0;
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* The order of antagonist rows: time held, longest first; the time no slice
 * covers after a task's of the same length; then by the tid as text (as
 * GroupCauses.antagonist_rows sorts). */
static void tid_text(long long v, char *buf, size_t n)
{
    snprintf(buf, n, "%lld", v);
}

static int ga_cmp(const void *pa, const void *pb)
{
    const ov_entry *a = *(const ov_entry *const *)pa, *b = *(const ov_entry *const *)pb;
    if (a->h.aux != b->h.aux)
        return a->h.aux < b->h.aux ? -1 : 1;
    if (a->ns != b->ns)
        return a->ns > b->ns ? -1 : 1;
    if ((a->other < 0) != (b->other < 0))
        return a->other < 0 ? 1 : -1;
    char x[24], y[24];
    tid_text(a->other, x, sizeof(x));
    tid_text(b->other, y, sizeof(y));
    return strcmp(x, y);
}

PyDoc_STRVAR(why_antagonists_doc,
"why_antagonists(top) -> {group: (rows, rest_tasks, rest_ns)}\n\n"
"Per group number (why_fold), its antagonists in the order stats shows\n"
"them: rows: the first top (all: -1) as [(tid, ns, waits)], tid -1 for the\n"
"time no slice covered; rest_tasks, rest_ns: how many more, and their time.");

static PyObject *Digester_why_antagonists(Digester *self, PyObject *args)
{
    Py_ssize_t top;
    if (!self->why) {
        PyErr_SetString(PyExc_RuntimeError, "set_why was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "n:why_antagonists", &top))
        return NULL;
    acc_table *t = &self->ga;
    ov_entry **all = PyMem_Malloc((size_t)(t->used ? t->used : 1) * sizeof(ov_entry *));
    PyObject *out = PyDict_New();
    if (!all || !out) {
        PyMem_Free(all);
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < t->used; k++)
        all[k] = (ov_entry *)SLOT(t, t->order[k]);
    qsort(all, (size_t)t->used, sizeof(ov_entry *), ga_cmp);
    for (Py_ssize_t k = 0; k < t->used;) {
        uint32_t g = all[k]->h.aux;
        Py_ssize_t end = k;
        while (end < t->used && all[end]->h.aux == g)
            end++;
        Py_ssize_t shown = top < 0 || end - k < top ? end - k : top;
        i128 rest_ns = 0;
        for (Py_ssize_t j = k + shown; j < end; j++)
            rest_ns += all[j]->ns;
        PyObject *rows = PyList_New(shown);
        for (Py_ssize_t j = 0; rows && j < shown; j++) {
            ov_entry *o = all[k + j];
            PyObject *ns = long_from_i128(o->ns);
            PyObject *row = ns ? Py_BuildValue("(LNL)", o->other, ns, o->waits) : NULL;
            if (!row)
                Py_CLEAR(rows);
            else
                PyList_SET_ITEM(rows, j, row);
        }
        PyObject *key = rows ? PyLong_FromUnsignedLong(g) : NULL;
        PyObject *rest = key ? long_from_i128(rest_ns) : NULL;
        PyObject *val = rest ? Py_BuildValue("(NnN)", rows, end - k - shown, rest) : NULL;
        if (!val || PyDict_SetItem(out, key, val) < 0) {
            if (!rest) /* (else Py_BuildValue took rows, done or not) */
                Py_XDECREF(rows);
            Py_XDECREF(key);
            Py_XDECREF(val);
            Py_DECREF(out);
            PyMem_Free(all);
            return NULL;
        }
        Py_DECREF(key);
        Py_DECREF(val);
        k = end;
    }
    PyMem_Free(all);
    return out;
}

PyDoc_STRVAR(why_tasks_doc,
"why_tasks() -> [(tid, pid, comm, cgroup, ts, to)]\n\n"
"Every task's names as its last records gave them, from digest() and\n"
"why_note() (pid, cgroup: None when none did), and ts and to of its last\n"
"state record the filter kept (None: none).");

static PyObject *Digester_why_tasks(Digester *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->why) {
        PyErr_SetString(PyExc_RuntimeError, "set_why was not called");
        return NULL;
    }
    return acc_rows(&self->seen, seen_row);
}

PyDoc_STRVAR(why_note_doc,
"why_note(tid, what, comm, pid, cgroup, ts, to)\n\n"
"What a record the careful path read says of a task, in its place among\n"
"those digest() reads: what is a mask of the fields it sets (1 comm,\n"
"2 pid, 4 cgroup (None: none), 8 ts and to of a state record the filter\n"
"kept).");

static PyObject *Digester_why_note(Digester *self, PyObject *args)
{
    long long tid, ts = 0;
    int what;
    PyObject *comm, *pid, *cg, *tso, *to;
    if (!self->why) {
        PyErr_SetString(PyExc_RuntimeError, "set_why was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "LiOOOOO:why_note", &tid, &what, &comm, &pid, &cg, &tso, &to))
        return NULL;
    long long pv = 0, cv = 0;
    if ((what & 2) && (pv = PyLong_AsLongLong(pid)) == -1 && PyErr_Occurred())
        return NULL;
    if ((what & 4) && cg != Py_None && (cv = PyLong_AsLongLong(cg)) == -1 && PyErr_Occurred())
        return NULL;
    if ((what & 8) && (ts = PyLong_AsLongLong(tso)) == -1 && PyErr_Occurred())
        return NULL;
    int fresh;
    seen_acc *sa = acc_get(&self->seen, tid, &fresh);
    if (!sa)
        return NULL;
    if (what & 1) {
        Py_INCREF(comm);
        Py_XSETREF(sa->comm, comm);
    }
    if (what & 2) {
        sa->pid = pv;
        sa->has_pid = 1;
    }
    if (what & 4) {
        sa->has_cg = cg != Py_None;
        sa->cg = cv;
    }
    if (what & 8) {
        sa->has_own = 1;
        sa->own_ts = ts;
        Py_INCREF(to);
        Py_XSETREF(sa->own_to, to);
    }
    Py_RETURN_NONE;
}

static PyObject *Digester_why_seq(Digester *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(self->why_seq);
}

static int why_args(Digester *self, PyObject *args, const char *fmt, long long v[4])
{
    if (!self->why) {
        PyErr_SetString(PyExc_RuntimeError, "set_why was not called");
        return -1;
    }
    if (!PyArg_ParseTuple(args, fmt, &v[0], &v[1], &v[2], &v[3]))
        return -1;
    if (v[0] < 0 || v[0] >= WHY_MAX_CPU) {
        PyErr_SetString(PyExc_ValueError, "cpu out of range");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(why_slice_doc,
"why_slice(cpu, start, end, tid)\n\n"
"An on-CPU slice the careful path read, kept with those digest() reads.");

static PyObject *Digester_why_slice(Digester *self, PyObject *args)
{
    long long v[4];
    if (why_args(self, args, "LLLL:why_slice", v) < 0 || why_slice_add(self, v[0], v[1], v[2], v[3]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(why_wait_doc,
"why_wait(group, cpu, start, end, tid)\n\n"
"A run-queue wait of tid [start, end] on cpu the careful path read: the\n"
"other tasks' on-CPU slices within it, and the rest, added to the\n"
"antagonists of the group number `group` (why_fold).");

static PyObject *Digester_why_wait(Digester *self, PyObject *args)
{
    long long g, v[4];
    if (!self->why) {
        PyErr_SetString(PyExc_RuntimeError, "set_why was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "LLLLL:why_wait", &g, &v[0], &v[1], &v[2], &v[3]))
        return NULL;
    if (v[0] < 0 || v[0] >= WHY_MAX_CPU || g < 0 || g > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "cpu or group out of range");
        return NULL;
    }
    if (wait_overlaps(self, &self->ga, (uint32_t)g, v[0], v[1], v[2], v[3]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Digester_methods[] = {
    {"set_why", (PyCFunction)Digester_set_why, METH_VARARGS, set_why_doc},
    {"take_why", (PyCFunction)Digester_take_why, METH_NOARGS, take_why_doc},
    {"why_slice", (PyCFunction)Digester_why_slice, METH_VARARGS, why_slice_doc},
    {"why_tasks", (PyCFunction)Digester_why_tasks, METH_NOARGS, why_tasks_doc},
    {"why_note", (PyCFunction)Digester_why_note, METH_VARARGS, why_note_doc},
    {"why_seq", (PyCFunction)Digester_why_seq, METH_NOARGS, "why_seq() -> the number of rows set_why has summed"},
    {"why_wait", (PyCFunction)Digester_why_wait, METH_VARARGS, why_wait_doc},
    {"why_fold", (PyCFunction)Digester_why_fold, METH_O, why_fold_doc},
    {"why_antagonists", (PyCFunction)Digester_why_antagonists, METH_VARARGS, why_antagonists_doc},
    {"digest", (PyCFunction)Digester_digest, METH_VARARGS, digest_doc},
    {"take", (PyCFunction)Digester_take, METH_VARARGS, take_doc},
    {"forget", (PyCFunction)Digester_forget, METH_VARARGS, forget_doc},
    {"set_filter", (PyCFunction)Digester_set_filter, METH_VARARGS, set_filter_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DigesterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pstate._digest.Digester",
    .tp_basicsize = sizeof(Digester),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Digester(by, state_id, group_id): the native reader and summer of plain state records\n"
              "(by pid, tid, comm: group_id(comm) by comm; by pid_group: group_id(pid, the record's cgroup or None))\n"
              "(see pstate.analysis.timeinstate.Aggregator.add_digested)",
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
static name_entry live_extra_names[NAME_CACHE]; /* causes, kernel state letters, wakers */
static int live_n_extra_names;
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

/* A new reference to the value of extra field i as orjson would make it. */
static PyObject *extra_value(const extras *x, int i)
{
    name_entry *ne;
    switch (x->kind[i]) {
    case 's':
        return name_str(live_extra_names, &live_n_extra_names, x->s[i], x->n[i], &ne);
    case 'i':
        return x->v[i] >= 0 ? live_int(x->v[i]) : PyLong_FromLongLong(x->v[i]);
    case 't':
        Py_RETURN_TRUE;
    case 'f':
        Py_RETURN_FALSE;
    default: /* null or absent */
        Py_RETURN_NONE;
    }
}

PyDoc_STRVAR(parse_states_doc,
"parse_states(buf, pos, end, max_line, k=1, n=0, wide=False) -> (stop, lines, rows)\n\n"
"The plain state records among the lines of buf[pos:end] (as\n"
"buf[pos:end].split(b'\\n') cuts them) as tuples\n"
"(ts, pid, tid, comm, from, to, dur_ns, cpu, weight, cgroup, steal_irq_ns),\n"
"comm, dur_ns, cgroup and steal_irq_ns None when null or absent, until a line\n"
"needs the careful path (or is longer\n"
"than max_line). n: the number of the line before pos. With k > 1, a\n"
"transition into running, runnable, sleeping or preempted (by its bytes)\n"
"on a line whose number is not a multiple of k is passed over unparsed,\n"
"and one that is kept weighs k. Empty lines are passed over. wide: each\n"
"tuple goes on with the fields of WIDE_FIELDS (None when null or absent).\n"
"stop: where the line that needs the careful path starts, end + 1 when\n"
"none did; lines: lines consumed (passed over ones included).");

static PyObject *parse_states(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, end, max_line;
    long long k = 1, n = 0;
    int wide = 0;
    if (!PyArg_ParseTuple(args, "y*nnn|LLp:parse_states", &view, &pos, &end, &max_line, &k, &n, &wide))
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
    order_t order = {0};
    if (!rows || !one || !weight_k || order_acquire(&order) < 0)
        goto done;
    const char *buf = view.buf;
    while (pos <= end) {
        const char *p = buf + pos;
        const char *e = line_end(buf, pos, end);
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
        extras x;
        if (!parse_state(p, e, &r, wide ? &x : NULL) || !order_ok(&order, &r))
            break;
        Py_ssize_t size = wide ? 11 + N_EXTRA : 11;
        PyObject *t = PyTuple_New(size);
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
        PyTuple_SET_ITEM(t, 9, r.has_cgroup ? live_int(r.cgroup) : Py_NewRef(Py_None));
        PyTuple_SET_ITEM(t, 10, r.has_steal ? PyLong_FromLongLong(r.steal) : Py_NewRef(Py_None));
        for (int i = 0; wide && i < N_EXTRA; i++)
            PyTuple_SET_ITEM(t, 11 + i, extra_value(&x, i));
        int bad = 0;
        for (Py_ssize_t i = 0; i < size; i++)
            bad |= PyTuple_GET_ITEM(t, i) == NULL;
        if (bad || PyList_Append(rows, t) < 0) {
            Py_DECREF(t);
            goto done;
        }
        Py_DECREF(t);
        order_note(&order, &r);
        lines++;
        pos = (e - buf) + 1; /* end + 1 after the last segment */
    }
    result = Py_BuildValue("nnO", pos, lines, rows);
done:
    order_release(&order);
    PyBuffer_Release(&view);
    Py_XDECREF(rows);
    Py_XDECREF(one);
    Py_XDECREF(weight_k);
    return result;
}

PyDoc_STRVAR(plain_states_doc,
"plain_states(buf, pos, end, max_line, context=False) -> (stop, lines, max_ts)\n\n"
"How many of the lines of buf[pos:end] (as buf[pos:end].split(b'\\n') cuts\n"
"them), from the first, are plainly written state records that the reader\n"
"accepts (what parse_states would return, without building it). stop:\n"
"where the first other line starts, end + 1 when there was none; max_ts:\n"
"the largest ts among them (-1 when none). For replay, which copies such\n"
"lines unparsed. context: plainly written slice and waker records count\n"
"among them too (their ts not in max_ts), for a reader that passes over them.");

static PyObject *plain_states(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, end, max_line;
    int context = 0;
    if (!PyArg_ParseTuple(args, "y*nnn|p:plain_states", &view, &pos, &end, &max_line, &context))
        return NULL;
    if (pos < 0 || end > view.len || pos > end + 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "bad range");
        return NULL;
    }
    const char *buf = view.buf;
    Py_ssize_t lines = 0;
    long long max_ts = -1;
    state_rec r;
    Py_ssize_t next;
    order_t order;
    if (order_acquire(&order) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    while (pos <= end) {
        if (!next_state(buf, pos, end, max_line, &r, &next, NULL)) {
            if (!context || !next_context(buf, pos, end, max_line, &next))
                break;
            lines++;
            pos = next;
            continue;
        }
        if (!order_ok(&order, &r))
            break;
        order_note(&order, &r);
        lines++;
        if (r.ts > max_ts)
            max_ts = r.ts;
        pos = next;
    }
    order_release(&order);
    PyBuffer_Release(&view);
    return Py_BuildValue("nnL", pos, lines, max_ts);
}

static PyMethodDef module_methods[] = {
    {"parse_states", parse_states, METH_VARARGS, parse_states_doc},
    {"plain_states", plain_states, METH_VARARGS, plain_states_doc},
    {"bind_order", bind_order, METH_O, bind_order_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef digest_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_digest",
    .m_doc = "Native bulk readers of the one stream reader (pstate.stream.reader): the Digester of stats "
             "(pstate.analysis.ingest.LineDigester), the row reader parse_states (heat, export, replay) and "
             "plain_states (replay); bind_order, the reader's table of the order of records per CPU.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__digest(void)
{
    if (PyType_Ready(&DigesterType) < 0)
        return NULL;
    for (int ch = 0; ch < 256; ch++)
        str_stop[ch] = ch < 0x20 || ch >= 0x80 || ch == '"' || ch == '\\';
    if (!order_key && !(order_key = PyUnicode_InternFromString("pstate._digest.order")))
        return NULL;
    PyObject *m = PyModule_Create(&digest_module);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "BUCKET_SUB_BITS", BUCKET_SUB_BITS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *wide = PyTuple_New(N_EXTRA);
    for (int i = 0; wide && i < N_EXTRA; i++) {
        PyObject *name = PyUnicode_FromString(EXTRA_NAMES[i]);
        if (!name) {
            Py_CLEAR(wide);
            break;
        }
        PyTuple_SET_ITEM(wide, i, name);
    }
    if (!wide || PyModule_AddObject(m, "WIDE_FIELDS", wide) < 0) {
        Py_XDECREF(wide);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&DigesterType);
    if (PyModule_AddObject(m, "Digester", (PyObject *)&DigesterType) < 0) {
        Py_DECREF(&DigesterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
