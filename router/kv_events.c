/* SPDX-License-Identifier: Apache-2.0 */
/* The decoder of vLLM's KV-cache event batches (msgpack, as msgspec encodes KVEventBatch).
 *
 * A reader over the bytes, not msgpack-c's unpacker. msgpack_unpack_next builds a tree of
 * msgpack_object in a zone for the whole payload (one 24-byte object per token id, and a
 * BlockStored carries block_size token ids per block) and the tree is then walked again to
 * check its shape; this reader walks the bytes once, checks each element where it stands,
 * keeps only the block hashes (into one array reused from batch to batch) and counts the token
 * ids without storing them. bench/events measures both on the same payloads (docs/kv-events.md
 * has the figures). It is also one function deep per level of the format, which is what a
 * fuzzer needs to reach every branch.
 *
 * Errors name the element: a small stack of path components (a field name or an index) is
 * kept as the reader descends and turned into text only when something is refused. */
#include "router.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MAX_EVENTS 65536u
#define DEFAULT_MAX_HASHES (UINT32_C(1) << 20)
#define DEFAULT_MAX_TOTAL_HASHES (UINT32_C(1) << 22)
#define DEFAULT_MAX_DEPTH 32u
/* batch, events[i], field, element: the deepest path the decoder names. */
#define PATH_MAX_DEPTH 6
#define ERR_MAX 192

typedef struct path_comp {
    const char *name; /* a field name; NULL: an index */
    size_t index;
} path_comp;

struct kvg_kv_decoder {
    kvg_kv_limits lim;
    kvg_kv_event *events;
    size_t events_cap;
    uint64_t *hashes;
    size_t hashes_cap;
    /* while decoding */
    const uint8_t *p, *end;
    size_t nevents, nhashes;
    path_comp path[PATH_MAX_DEPTH];
    unsigned depth;
    char err[ERR_MAX];
};

const char *kvg_kv_event_kind_str(kvg_kv_event_kind k)
{
    static const char *const names[] = {"BlockStored", "BlockRemoved", "AllBlocksCleared"};
    return (unsigned)k < KVG_KV_EVENT_KIND_COUNT ? names[k] : "?";
}

const char *kvg_kv_medium_str(kvg_kv_medium m)
{
    static const char *const names[] = {"absent", "GPU", "CPU", "other"};
    return (unsigned)m < KVG_KV_MEDIUM_COUNT ? names[m] : "?";
}

int kvg_kv_decoder_new(const kvg_kv_limits *limits, kvg_kv_decoder **out)
{
    if (!out)
        return -EINVAL;
    kvg_kv_decoder *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    if (limits)
        d->lim = *limits;
    if (!d->lim.max_events)
        d->lim.max_events = DEFAULT_MAX_EVENTS;
    if (!d->lim.max_hashes)
        d->lim.max_hashes = DEFAULT_MAX_HASHES;
    if (!d->lim.max_total_hashes)
        d->lim.max_total_hashes = DEFAULT_MAX_TOTAL_HASHES;
    if (!d->lim.max_depth)
        d->lim.max_depth = DEFAULT_MAX_DEPTH;
    *out = d;
    return 0;
}

void kvg_kv_decoder_free(kvg_kv_decoder *d)
{
    if (!d)
        return;
    free(d->events);
    free(d->hashes);
    free(d);
}

const char *kvg_kv_decoder_error(const kvg_kv_decoder *d)
{
    return d->err;
}

/* ---- errors and the path ----------------------------------------------------------------------
 */

static void push_name(kvg_kv_decoder *d, const char *name)
{
    if (d->depth < PATH_MAX_DEPTH)
        d->path[d->depth] = (path_comp){.name = name};
    d->depth++;
}

static void push_index(kvg_kv_decoder *d, size_t i)
{
    if (d->depth < PATH_MAX_DEPTH)
        d->path[d->depth] = (path_comp){.index = i};
    d->depth++;
}

/* The innermost component is an index: point it at element i. */
static inline void set_index(kvg_kv_decoder *d, size_t i)
{
    if (d->depth - 1 < PATH_MAX_DEPTH)
        d->path[d->depth - 1].index = i;
}

static void pop(kvg_kv_decoder *d)
{
    d->depth--;
}

static int fail(kvg_kv_decoder *d, int rc, const char *what)
{
    size_t n = 0;
    unsigned depth = d->depth < PATH_MAX_DEPTH ? d->depth : PATH_MAX_DEPTH;
    for (unsigned i = 0; i < depth && n < sizeof(d->err); i++) {
        const path_comp *c = &d->path[i];
        int w = c->name ? snprintf(d->err + n, sizeof(d->err) - n, "%s%s", n ? "." : "", c->name)
                        : snprintf(d->err + n, sizeof(d->err) - n, "[%zu]", c->index);
        if (w < 0)
            break;
        n += (size_t)w;
    }
    if (n >= sizeof(d->err))
        n = sizeof(d->err) - 1;
    snprintf(d->err + n, sizeof(d->err) - n, "%s%s", n ? ": " : "", what);
    return rc;
}

#define TRUNCATED(d) fail((d), KVG_EPARSE, "truncated")

/* ---- msgpack primitives ------------------------------------------------------------------------
 */

static inline uint64_t be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Header of a container (array or map): 1 array, 2 map, 0 neither (nothing consumed), -1
 * truncated. */
static int container(kvg_kv_decoder *d, uint32_t *n)
{
    if (d->p >= d->end)
        return -1;
    uint8_t b = *d->p;
    unsigned w;
    int kind;
    if ((b & 0xf0) == 0x90) {
        *n = b & 0x0f;
        d->p++;
        return 1;
    }
    if ((b & 0xf0) == 0x80) {
        *n = b & 0x0f;
        d->p++;
        return 2;
    }
    switch (b) {
    case 0xdc:
        w = 2, kind = 1;
        break;
    case 0xdd:
        w = 4, kind = 1;
        break;
    case 0xde:
        w = 2, kind = 2;
        break;
    case 0xdf:
        w = 4, kind = 2;
        break;
    default:
        return 0;
    }
    if ((size_t)(d->end - d->p) < 1 + w)
        return -1;
    *n = (uint32_t)be(d->p + 1, w);
    d->p += 1 + w;
    return kind;
}

/* An array header, else an error. */
static int want_array(kvg_kv_decoder *d, uint32_t *n)
{
    int k = container(d, n);
    if (k == 1)
        return 0;
    return k < 0 ? TRUNCATED(d) : fail(d, KVG_EPARSE, "not an array");
}

/* An integer: 1 and *v (two's complement for negative ones, *neg set), 0 not an integer
 * (nothing consumed), -1 truncated. */
static inline int integer(kvg_kv_decoder *d, uint64_t *v, bool *neg)
{
    if (d->p >= d->end)
        return -1;
    uint8_t b = *d->p;
    if (b <= 0x7f) {
        *v = b, *neg = false;
        d->p++;
        return 1;
    }
    if (b >= 0xe0) {
        *v = (uint64_t)(int64_t)(int8_t)b, *neg = true;
        d->p++;
        return 1;
    }
    if (b < 0xcc || b > 0xd3)
        return 0;
    unsigned w = 1u << ((b - 0xcc) & 3);
    if ((size_t)(d->end - d->p) < 1 + w)
        return -1;
    uint64_t x = be(d->p + 1, w);
    d->p += 1 + w;
    if (b <= 0xcf) {
        *v = x, *neg = false;
        return 1;
    }
    /* Sign-extend the w-byte value. */
    unsigned shift = 64 - 8 * w;
    *v = (uint64_t)((int64_t)(x << shift) >> shift);
    *neg = (int64_t)*v < 0;
    return 1;
}

static inline bool is_nil(const kvg_kv_decoder *d)
{
    return d->p < d->end && *d->p == 0xc0;
}

/* Length of a str (1) or bin (2) and its bytes; 0 neither (nothing consumed), -1 truncated. */
static int bytes(kvg_kv_decoder *d, const uint8_t **s, uint32_t *len)
{
    if (d->p >= d->end)
        return -1;
    uint8_t b = *d->p;
    unsigned w;
    int kind;
    if ((b & 0xe0) == 0xa0) {
        w = 0, kind = 1;
    } else {
        switch (b) {
        case 0xd9:
            w = 1, kind = 1;
            break;
        case 0xda:
            w = 2, kind = 1;
            break;
        case 0xdb:
            w = 4, kind = 1;
            break;
        case 0xc4:
            w = 1, kind = 2;
            break;
        case 0xc5:
            w = 2, kind = 2;
            break;
        case 0xc6:
            w = 4, kind = 2;
            break;
        default:
            return 0;
        }
    }
    size_t left = (size_t)(d->end - d->p);
    if (left < 1 + w)
        return -1;
    uint64_t n = w ? be(d->p + 1, w) : (uint64_t)(b & 0x1f);
    if (n > left - 1 - w)
        return -1;
    *s = d->p + 1 + w;
    *len = (uint32_t)n;
    d->p += 1 + w + n;
    return kind;
}

/* Well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF), as Python's and
 * msgspec's decoders require of every msgpack str. */
static bool utf8_ok(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        unsigned len;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0)
                lo = 0xa0;
            else if (c == 0xed)
                hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0)
                lo = 0x90;
            else if (c == 0xf4)
                hi = 0x8f;
        } else {
            return false;
        }
        if (n - i < len || s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (unsigned k = 2; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
        i += len;
    }
    return true;
}

/* A str, checked; else an error naming what. */
static int want_str(kvg_kv_decoder *d, const uint8_t **s, uint32_t *len)
{
    int k = bytes(d, s, len);
    if (k < 0)
        return TRUNCATED(d);
    if (k != 1)
        return fail(d, KVG_EPARSE, "not a string");
    if (!utf8_ok(*s, *len))
        return fail(d, KVG_EPARSE, "invalid UTF-8");
    return 0;
}

/* An extension value (its header at p, need bytes in all): extension type -1 is msgpack's
 * timestamp, which msgspec (and Python's msgpack) turn into a datetime and refuse when
 * malformed; so does this. Other types are opaque. */
static bool timestamp_ok(const uint8_t *p, size_t need)
{
    size_t hdr = p[0] >= 0xd4 ? 1 : 1 + ((size_t)1 << (p[0] - 0xc7));
    if ((int8_t)p[hdr] != -1)
        return true;
    const uint8_t *data = p + hdr + 1;
    size_t len = need - hdr - 1;
    if (len == 4)
        return true;
    if (len == 8)
        return (be(data, 8) >> 34) <= 999999999;
    if (len == 12)
        return be(data, 4) <= 999999999;
    return false;
}

/* Skip one value of any type (unknown fields, forward compatibility), at most max_depth
 * containers deep. Every element takes at least one byte, so a claimed count larger than
 * what is left fails on truncation before long. */
static int skip(kvg_kv_decoder *d, unsigned depth)
{
    if (d->p >= d->end)
        return TRUNCATED(d);
    uint8_t b = *d->p;
    uint32_t n;
    int k = container(d, &n);
    if (k < 0)
        return TRUNCATED(d);
    if (k > 0) {
        if (depth >= d->lim.max_depth)
            return fail(d, KVG_ELIMIT, "nested too deep");
        uint64_t items = (uint64_t)n * (k == 2 ? 2 : 1);
        if (items > (uint64_t)(d->end - d->p))
            return TRUNCATED(d);
        for (uint64_t i = 0; i < items; i++) {
            int rc = skip(d, depth + 1);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    uint64_t v;
    bool neg;
    k = integer(d, &v, &neg);
    if (k < 0)
        return TRUNCATED(d);
    if (k > 0)
        return 0;
    const uint8_t *s;
    k = bytes(d, &s, &n);
    if (k < 0)
        return TRUNCATED(d);
    if (k == 1 && !utf8_ok(s, n))
        return fail(d, KVG_EPARSE, "invalid UTF-8");
    if (k > 0)
        return 0;
    size_t left = (size_t)(d->end - d->p), need;
    switch (b) {
    case 0xc0: /* nil, false, true */
    case 0xc2:
    case 0xc3:
        need = 1;
        break;
    case 0xca:
        need = 5;
        break;
    case 0xcb:
        need = 9;
        break;
    case 0xd4: /* fixext 1, 2, 4, 8, 16: type byte and data */
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
        need = 2 + ((size_t)1 << (b - 0xd4));
        break;
    case 0xc7: /* ext 8, 16, 32: length, type byte, data */
    case 0xc8:
    case 0xc9: {
        unsigned w = 1u << (b - 0xc7);
        if (left < 2 + w)
            return TRUNCATED(d);
        need = 2 + w + (size_t)be(d->p + 1, w);
        break;
    }
    default: /* 0xc1: never used */
        return fail(d, KVG_EPARSE, "invalid msgpack byte");
    }
    if (left < need)
        return TRUNCATED(d);
    if (b >= 0xc7 && b <= 0xd8 && b != 0xca && b != 0xcb && !timestamp_ok(d->p, need)) {
        d->p += need;
        return fail(d, KVG_EPARSE, "invalid timestamp extension");
    }
    d->p += need;
    return 0;
}

/* ---- fields ------------------------------------------------------------------------------------
 */

/* A block hash: an integer (negative ones modulo 2^64) or a byte string (vLLM without
 * VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: int.from_bytes(b, "big") & (2^64 - 1), its last 8
 * bytes). */
static inline int hash_value(kvg_kv_decoder *d, uint64_t *h)
{
    bool neg;
    int k = integer(d, h, &neg);
    if (k > 0)
        return 0;
    if (k < 0)
        return TRUNCATED(d);
    const uint8_t *s;
    uint32_t n;
    k = bytes(d, &s, &n);
    if (k < 0)
        return TRUNCATED(d);
    if (k != 2)
        return fail(d, KVG_EPARSE, "not an integer or bytes");
    if (n == 0)
        return fail(d, KVG_EPARSE, "empty bytes");
    *h = n > 8 ? be(s + n - 8, 8) : be(s, n);
    return 0;
}

/* A list of block hashes, appended to d->hashes. */
static int hash_list(kvg_kv_decoder *d, kvg_kv_event *ev)
{
    uint32_t n;
    int rc = want_array(d, &n);
    if (rc < 0)
        return rc;
    if (n > d->lim.max_hashes)
        return fail(d, KVG_ELIMIT, "too many block hashes in one event");
    if (d->nhashes + n > d->lim.max_total_hashes)
        return fail(d, KVG_ELIMIT, "too many block hashes in one batch");
    if (n > (size_t)(d->end - d->p))
        return TRUNCATED(d);
    if (d->nhashes + n > d->hashes_cap) {
        size_t cap = d->hashes_cap ? d->hashes_cap : 256;
        while (cap < d->nhashes + n)
            cap *= 2;
        uint64_t *h = realloc(d->hashes, cap * sizeof(*h));
        if (!h)
            return fail(d, -ENOMEM, "out of memory");
        d->hashes = h;
        d->hashes_cap = cap;
    }
    uint64_t *out = d->hashes + d->nhashes;
    push_index(d, 0);
    for (uint32_t i = 0; i < n; i++) {
        /* The common case inline: a uint64 (0xcf), as vLLM's 64-bit hashes mostly are. */
        if (d->end - d->p >= 9 && *d->p == 0xcf) {
            out[i] = be(d->p + 1, 8);
            d->p += 9;
            continue;
        }
        set_index(d, i);
        rc = hash_value(d, &out[i]);
        if (rc < 0)
            return rc;
    }
    pop(d);
    ev->nhashes = n;
    d->nhashes += n;
    return 0;
}

static int optional_hash(kvg_kv_decoder *d, bool *has, uint64_t *h)
{
    if (is_nil(d)) {
        d->p++;
        *has = false;
        return 0;
    }
    *has = true;
    return hash_value(d, h);
}

/* Token ids: integers, counted. */
static int token_list(kvg_kv_decoder *d, uint64_t *count)
{
    uint32_t n;
    int rc = want_array(d, &n);
    if (rc < 0)
        return rc;
    if (n > (size_t)(d->end - d->p))
        return TRUNCATED(d);
    push_index(d, 0);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v;
        bool neg;
        int k = integer(d, &v, &neg);
        if (k > 0)
            continue;
        set_index(d, i);
        return k < 0 ? TRUNCATED(d) : fail(d, KVG_EPARSE, "not an integer");
    }
    pop(d);
    *count = n;
    return 0;
}

/* An integer in [lo, hi] (as int64; a uint64 above INT64_MAX is out of range). */
static int int_in(kvg_kv_decoder *d, int64_t lo, int64_t hi, int64_t *out)
{
    uint64_t v;
    bool neg;
    int k = integer(d, &v, &neg);
    if (k < 0)
        return TRUNCATED(d);
    if (k == 0)
        return fail(d, KVG_EPARSE, "not an integer");
    if ((!neg && v > (uint64_t)INT64_MAX) || (int64_t)v < lo || (int64_t)v > hi)
        return fail(d, KVG_EPARSE, "integer out of range");
    *out = (int64_t)v;
    return 0;
}

static int optional_int(kvg_kv_decoder *d, bool *has, int64_t *out)
{
    if (is_nil(d)) {
        d->p++;
        *has = false;
        return 0;
    }
    *has = true;
    return int_in(d, INT64_MIN, INT64_MAX, out);
}

static int medium(kvg_kv_decoder *d, kvg_kv_medium *m)
{
    if (is_nil(d)) {
        d->p++;
        *m = KVG_KV_MEDIUM_ABSENT;
        return 0;
    }
    const uint8_t *s;
    uint32_t n;
    int rc = want_str(d, &s, &n);
    if (rc < 0)
        return rc;
    if (n == 3 && !memcmp(s, "GPU", 3))
        *m = KVG_KV_MEDIUM_GPU;
    else if (n == 3 && !memcmp(s, "CPU", 3))
        *m = KVG_KV_MEDIUM_CPU;
    else
        *m = KVG_KV_MEDIUM_OTHER;
    return 0;
}

static int timestamp(kvg_kv_decoder *d, double *ts)
{
    if (d->p < d->end && (*d->p == 0xca || *d->p == 0xcb)) {
        unsigned w = *d->p == 0xca ? 4 : 8;
        if ((size_t)(d->end - d->p) < 1 + w)
            return TRUNCATED(d);
        uint64_t bits = be(d->p + 1, w);
        d->p += 1 + w;
        if (w == 4) {
            uint32_t b32 = (uint32_t)bits;
            float f;
            memcpy(&f, &b32, sizeof(f));
            *ts = f;
        } else {
            memcpy(ts, &bits, sizeof(*ts));
        }
        return 0;
    }
    /* msgspec decodes an integer into a float field. */
    uint64_t v;
    bool neg;
    int k = integer(d, &v, &neg);
    if (k < 0)
        return TRUNCATED(d);
    if (k == 0)
        return fail(d, KVG_EPARSE, "not a number");
    *ts = neg ? (double)(int64_t)v : (double)v;
    return 0;
}

/* ---- events
 * -------------------------------------------------------------------------------------- */

/* The field names of the map form (vLLM after it dropped array_like) and the positions of the
 * array form, for BlockStored and BlockRemoved. */
enum field {
    F_HASHES,
    F_PARENT,
    F_TOKENS,
    F_BLOCK_SIZE,
    F_LORA_ID,
    F_MEDIUM,
    F_UNKNOWN,
};

static const char *const field_names[] = {"block_hashes", "parent_block_hash", "token_ids",
                                          "block_size",   "lora_id",           "medium"};

static const enum field stored_order[] = {F_HASHES,     F_PARENT,  F_TOKENS,
                                          F_BLOCK_SIZE, F_LORA_ID, F_MEDIUM};
static const enum field removed_order[] = {F_HASHES, F_MEDIUM};

static int field_value(kvg_kv_decoder *d, kvg_kv_event *ev, enum field f)
{
    int64_t v = 0;
    int rc;
    switch (f) {
    case F_HASHES:
        return hash_list(d, ev);
    case F_PARENT:
        return optional_hash(d, &ev->has_parent, &ev->parent);
    case F_TOKENS:
        return token_list(d, &ev->ntokens);
    case F_BLOCK_SIZE:
        rc = int_in(d, 0, UINT32_MAX, &v);
        ev->block_size = (uint32_t)v;
        return rc;
    case F_LORA_ID:
        return optional_int(d, &ev->has_lora_id, &ev->lora_id);
    case F_MEDIUM:
        return medium(d, &ev->medium);
    default:
        return skip(d, 3);
    }
}

static int event_kind(kvg_kv_decoder *d, kvg_kv_event_kind *kind)
{
    const uint8_t *s;
    uint32_t n;
    int rc = want_str(d, &s, &n);
    if (rc < 0)
        return rc;
    for (int k = 0; k < KVG_KV_EVENT_KIND_COUNT; k++) {
        const char *name = kvg_kv_event_kind_str((kvg_kv_event_kind)k);
        if (strlen(name) == n && !memcmp(name, s, n)) {
            *kind = (kvg_kv_event_kind)k;
            return 0;
        }
    }
    return fail(d, KVG_EPARSE, "unknown event type");
}

/* [tag, fields...]: the required fields of the kind, then optional known ones (medium), then
 * anything newer, skipped. */
static int event_array(kvg_kv_decoder *d, kvg_kv_event *ev, uint32_t n)
{
    if (n == 0)
        return fail(d, KVG_EPARSE, "empty event");
    push_index(d, 0);
    int rc = event_kind(d, &ev->kind);
    if (rc < 0)
        return rc;
    const enum field *order = NULL;
    uint32_t known = 0, required = 0;
    if (ev->kind == KVG_KV_BLOCK_STORED) {
        order = stored_order, known = 6, required = 5;
    } else if (ev->kind == KVG_KV_BLOCK_REMOVED) {
        order = removed_order, known = 2, required = 1;
    }
    if (n - 1 < required) {
        pop(d);
        return fail(d, KVG_EPARSE, "missing fields");
    }
    for (uint32_t i = 1; i < n; i++) {
        set_index(d, i);
        rc = field_value(d, ev, i - 1 < known ? order[i - 1] : F_UNKNOWN);
        if (rc < 0)
            return rc;
    }
    pop(d);
    return 0;
}

static enum field field_of(const uint8_t *s, uint32_t n)
{
    for (int f = 0; f < F_UNKNOWN; f++)
        if (strlen(field_names[f]) == n && !memcmp(field_names[f], s, n))
            return (enum field)f;
    return F_UNKNOWN;
}

/* {"type": tag, field: value, ...}: the tag first (msgspec writes it first), fields in any
 * order, each known one at most once; unknown ones and those of another kind skipped. */
static int event_map(kvg_kv_decoder *d, kvg_kv_event *ev, uint32_t n)
{
    const uint8_t *s;
    uint32_t len;
    if (n == 0)
        return fail(d, KVG_EPARSE, "empty event");
    int rc = want_str(d, &s, &len);
    if (rc < 0)
        return rc;
    if (len != 4 || memcmp(s, "type", 4))
        return fail(d, KVG_EPARSE, "first key is not \"type\"");
    push_name(d, "type");
    rc = event_kind(d, &ev->kind);
    if (rc < 0)
        return rc;
    pop(d);
    unsigned want = 0, seen = 0;
    if (ev->kind == KVG_KV_BLOCK_STORED)
        want = 1u << F_HASHES | 1u << F_PARENT | 1u << F_TOKENS | 1u << F_BLOCK_SIZE |
               1u << F_LORA_ID | 1u << F_MEDIUM;
    else if (ev->kind == KVG_KV_BLOCK_REMOVED)
        want = 1u << F_HASHES | 1u << F_MEDIUM;
    for (uint32_t i = 1; i < n; i++) {
        rc = want_str(d, &s, &len);
        if (rc < 0)
            return rc;
        enum field f = field_of(s, len);
        if (f != F_UNKNOWN && !(want & (1u << f)))
            f = F_UNKNOWN;
        push_name(d, f == F_UNKNOWN ? "(unknown field)" : field_names[f]);
        if (f != F_UNKNOWN) {
            if (seen & (1u << f))
                return fail(d, KVG_EPARSE, "duplicate field");
            seen |= 1u << f;
        }
        rc = field_value(d, ev, f);
        if (rc < 0)
            return rc;
        pop(d);
    }
    /* Required: every known field but medium (vLLM before mediums has none). */
    unsigned missing = want & ~seen & ~(1u << F_MEDIUM);
    if (missing) {
        for (int f = 0; f < F_UNKNOWN; f++) {
            if (missing & (1u << f)) {
                push_name(d, field_names[f]);
                return fail(d, KVG_EPARSE, "missing");
            }
        }
    }
    return 0;
}

static int event(kvg_kv_decoder *d, kvg_kv_event *ev)
{
    *ev = (kvg_kv_event){0};
    uint32_t n;
    int k = container(d, &n);
    if (k < 0)
        return TRUNCATED(d);
    if (k == 0)
        return fail(d, KVG_EPARSE, "not an array or map");
    /* Each field takes at least a byte (two in a map). */
    if ((uint64_t)n * (uint64_t)k > (uint64_t)(d->end - d->p))
        return TRUNCATED(d);
    return k == 1 ? event_array(d, ev, n) : event_map(d, ev, n);
}

static int event_list(kvg_kv_decoder *d)
{
    uint32_t n;
    int rc = want_array(d, &n);
    if (rc < 0)
        return rc;
    if (n > d->lim.max_events)
        return fail(d, KVG_ELIMIT, "too many events");
    if (n > (size_t)(d->end - d->p))
        return TRUNCATED(d);
    if (n > d->events_cap) {
        size_t cap = d->events_cap ? d->events_cap : 16;
        while (cap < n)
            cap *= 2;
        kvg_kv_event *e = realloc(d->events, cap * sizeof(*e));
        if (!e)
            return fail(d, -ENOMEM, "out of memory");
        d->events = e;
        d->events_cap = cap;
    }
    push_index(d, 0);
    for (uint32_t i = 0; i < n; i++) {
        set_index(d, i);
        rc = event(d, &d->events[i]);
        if (rc < 0)
            return rc;
    }
    pop(d);
    d->nevents = n;
    return 0;
}

/* ---- the batch
 * ------------------------------------------------------------------------------------ */

static int batch_array(kvg_kv_decoder *d, kvg_kv_batch *b, uint32_t n)
{
    if (n < 2)
        return fail(d, KVG_EPARSE, "a batch has a timestamp and events");
    push_name(d, "ts");
    int rc = timestamp(d, &b->ts);
    if (rc < 0)
        return rc;
    pop(d);
    push_name(d, "events");
    rc = event_list(d);
    if (rc < 0)
        return rc;
    pop(d);
    if (n >= 3) {
        push_name(d, "data_parallel_rank");
        rc = optional_int(d, &b->has_dp_rank, &b->dp_rank);
        if (rc < 0)
            return rc;
        pop(d);
    }
    for (uint32_t i = 3; i < n; i++) {
        push_index(d, i);
        rc = skip(d, 1);
        if (rc < 0)
            return rc;
        pop(d);
    }
    return 0;
}

static int batch_map(kvg_kv_decoder *d, kvg_kv_batch *b, uint32_t n)
{
    bool seen_ts = false, seen_events = false, seen_rank = false;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *s;
        uint32_t len;
        int rc = want_str(d, &s, &len);
        if (rc < 0)
            return rc;
        if (len == 2 && !memcmp(s, "ts", 2)) {
            push_name(d, "ts");
            if (seen_ts)
                return fail(d, KVG_EPARSE, "duplicate field");
            seen_ts = true;
            rc = timestamp(d, &b->ts);
        } else if (len == 6 && !memcmp(s, "events", 6)) {
            push_name(d, "events");
            if (seen_events)
                return fail(d, KVG_EPARSE, "duplicate field");
            seen_events = true;
            rc = event_list(d);
        } else if (len == 18 && !memcmp(s, "data_parallel_rank", 18)) {
            push_name(d, "data_parallel_rank");
            if (seen_rank)
                return fail(d, KVG_EPARSE, "duplicate field");
            seen_rank = true;
            rc = optional_int(d, &b->has_dp_rank, &b->dp_rank);
        } else {
            push_name(d, "(unknown field)");
            rc = skip(d, 1);
        }
        if (rc < 0)
            return rc;
        pop(d);
    }
    if (!seen_ts || !seen_events)
        return fail(d, KVG_EPARSE, seen_ts ? "events missing" : "ts missing");
    return 0;
}

int kvg_kv_decode(kvg_kv_decoder *d, const void *data, size_t len, kvg_kv_batch *out)
{
    d->p = data;
    d->end = d->p + len;
    d->nevents = 0;
    d->nhashes = 0;
    d->depth = 0;
    d->err[0] = '\0';
    if (!data && len)
        return fail(d, -EINVAL, "no data");

    kvg_kv_batch b = {0};
    uint32_t n;
    int k = container(d, &n);
    int rc;
    if (k < 0)
        rc = TRUNCATED(d);
    else if (k == 0)
        rc = fail(d, KVG_EPARSE, "a batch is not an array or map");
    else
        rc = k == 1 ? batch_array(d, &b, n) : batch_map(d, &b, n);
    if (rc < 0)
        return rc;
    if (d->p != d->end) {
        d->depth = 0;
        return fail(d, KVG_EPARSE, "bytes after the batch");
    }
    /* Hashes were appended event after event: hand each event its slice now that the array
     * no longer moves. */
    const uint64_t *h = d->hashes;
    for (size_t i = 0; i < d->nevents; i++) {
        d->events[i].hashes = h;
        h += d->events[i].nhashes;
    }
    b.events = d->events;
    b.nevents = d->nevents;
    b.nhashes = d->nhashes;
    *out = b;
    return 0;
}
