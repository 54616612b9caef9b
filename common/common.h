/* SPDX-License-Identifier: Apache-2.0 */
/* Building blocks every kvgate module uses: errors, logging, arenas, byte buffers, JSON. */
#ifndef KVG_COMMON_H
#define KVG_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KVG_CONTAINER_OF(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))
#define KVG_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define KVG_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVG_MAX(a, b) ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#define KVG_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define KVG_UNUSED __attribute__((unused))
#else
#define KVG_PRINTF(f, a)
#define KVG_UNUSED
#endif

/* ---- errors ------------------------------------------------------------------------------ */

/* kvgate's own error codes; functions return 0, a negative errno, or one of these. */
enum {
    KVG_EFIRST = -10000,
    KVG_EPARSE = KVG_EFIRST, /* malformed input */
    KVG_ELIMIT,              /* a configured limit was exceeded */
    KVG_ETYPE,               /* a value has the wrong type */
    KVG_ENOTFOUND,           /* no such object */
    KVG_EPROTO,              /* peer violated the protocol */
    KVG_ETLS,                /* TLS library failure */
    KVG_ECONFIG,             /* invalid configuration */
    KVG_ELAST,
};

/** Name any return code of kvgate (0, -errno or KVG_E*). Never returns NULL. */
const char *kvg_strerror(int err);

/* ---- logging ----------------------------------------------------------------------------- */

typedef enum kvg_log_level {
    KVG_LOG_ERROR = 0,
    KVG_LOG_WARN,
    KVG_LOG_INFO,
    KVG_LOG_DEBUG,
    KVG_LOG_LEVEL_COUNT,
} kvg_log_level;

/** Name of a log level ("error", "warn", ...). */
const char *kvg_log_level_str(kvg_log_level level);
/** Parse a level name; returns 0 and writes *out, or KVG_EPARSE. */
int kvg_log_level_parse(const char *name, kvg_log_level *out);
/** Set the most verbose level that is printed (default INFO). Thread-safe. */
void kvg_log_set_level(kvg_log_level level);
/** True when messages of this level are printed. */
bool kvg_log_enabled(kvg_log_level level);
/** Print one line to stderr: time, level, message. One write(2) per line, so threads never
 *  interleave inside a line. */
void kvg_log(kvg_log_level level, const char *fmt, ...) KVG_PRINTF(2, 3);

#define kvg_log_error(...) kvg_log(KVG_LOG_ERROR, __VA_ARGS__)
#define kvg_log_warn(...) kvg_log(KVG_LOG_WARN, __VA_ARGS__)
#define kvg_log_info(...) kvg_log(KVG_LOG_INFO, __VA_ARGS__)
#define kvg_log_debug(...)                                                                         \
    do {                                                                                           \
        if (kvg_log_enabled(KVG_LOG_DEBUG))                                                        \
            kvg_log(KVG_LOG_DEBUG, __VA_ARGS__);                                                   \
    } while (0)

/* ---- time -------------------------------------------------------------------------------- */

/** Monotonic clock in nanoseconds. */
uint64_t kvg_now_ns(void);
/** Wall clock in nanoseconds since the epoch. */
uint64_t kvg_wall_ns(void);
/** Format a wall-clock time as RFC 3339 UTC with milliseconds into buf (>= 32 bytes). */
void kvg_format_time(uint64_t wall_ns, char *buf, size_t len);

/* ---- arena ------------------------------------------------------------------------------- */

/* Bump allocator for memory that lives exactly as long as one request or one parse. */
typedef struct kvg_arena_chunk kvg_arena_chunk;
typedef struct kvg_arena {
    kvg_arena_chunk *head;
    size_t chunk_size;
    size_t total;    /* bytes handed out, for limits */
    size_t limit;    /* 0 = unlimited; allocations past it fail */
    bool over_limit; /* an allocation failed for the limit (not for memory) */
} kvg_arena;

/** Initialise an empty arena; chunk_size 0 picks a default. Allocates nothing yet. */
void kvg_arena_init(kvg_arena *a, size_t chunk_size);
/** Keep freed chunks of the common sizes for reuse on the calling thread (up to 64 of each),
 *  until it exits: for event-loop threads, where a request's arena is made and freed each
 *  time. Without it, every chunk is malloc'd and freed. */
void kvg_arena_thread_cache(void);
/** Free every chunk; the arena can be reused after kvg_arena_init. */
void kvg_arena_done(kvg_arena *a);
/** Forget every allocation but keep the first chunk for reuse (no free/malloc per request). */
void kvg_arena_reset(kvg_arena *a);
/** 16-byte aligned allocation; NULL when out of memory or over the limit. */
void *kvg_arena_alloc(kvg_arena *a, size_t size);
/** Copy len bytes and add a NUL. NULL on failure. */
char *kvg_arena_strndup(kvg_arena *a, const char *s, size_t len);
char *kvg_arena_strdup(kvg_arena *a, const char *s);

/* ---- copies ------------------------------------------------------------------------------ */

/** memcpy for the copies on the request path that may be large (bodies, prompt text): the
 * regions must not overlap. From 2 KiB on it avoids glibc's REP MOVSB, which is 20x slower on
 * AMD EPYC for half of the relative alignments (common/copy.c). */
void kvg_copy_large(void *dst, const void *src, size_t n);
static inline void kvg_copy(void *dst, const void *src, size_t n)
{
    if (n < 2048)
        __builtin_memcpy(dst, src, n);
    else
        kvg_copy_large(dst, src, n);
}

/** dst[0, n) = src[0, n) with ASCII A-Z lowered, other bytes as they are; no overlap. Eight
 *  bytes at a time: header names are lowered on every response (a byte loop cost ~5
 *  instructions a byte). */
void kvg_copy_lower(char *dst, const char *src, size_t n);

/* ---- intrusive list ------------------------------------------------------------------------ */

/* Doubly linked and circular, with the links embedded in the owner (h2o's and Linux's style):
 * no allocation per element; recover the owner with KVG_CONTAINER_OF. A head is a kvg_link
 * pointing at itself when empty. */
typedef struct kvg_link {
    struct kvg_link *prev, *next;
} kvg_link;

static inline void kvg_list_init(kvg_link *head)
{
    head->prev = head->next = head;
}
static inline bool kvg_list_empty(const kvg_link *head)
{
    return head->next == head;
}
/** Insert n right after head (at the front). */
static inline void kvg_list_insert(kvg_link *head, kvg_link *n)
{
    n->next = head->next;
    n->prev = head;
    head->next->prev = n;
    head->next = n;
}
/** Take n out of its list; n is left pointing at itself, so a second unlink is harmless. */
static inline void kvg_list_unlink(kvg_link *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

/* ---- growable byte buffer ------------------------------------------------------------------ */

typedef struct kvg_buf {
    char *data; /* always NUL-terminated when cap > 0 */
    size_t len;
    size_t cap;
    bool failed; /* sticky: an append ran out of memory */
} kvg_buf;

void kvg_buf_init(kvg_buf *b);
void kvg_buf_done(kvg_buf *b);
void kvg_buf_reset(kvg_buf *b);
/** Make room for n more bytes; 0 or -ENOMEM (and marks the buffer failed). */
int kvg_buf_reserve(kvg_buf *b, size_t n);
/* The slow path of kvg_buf_append: grow, then copy. */
void kvg_buf_append_grow(kvg_buf *b, const void *data, size_t len);
/* Appends are inline: a request's heads are composed from some 80 small pieces, and a call plus
 * kvg_buf_reserve for each cost ~90 instructions a piece (callgrind, 2026-12-02); the inline
 * path is a compare, a copy and a store while the buffer has room. */
static inline void kvg_buf_append(kvg_buf *b, const void *data, size_t len)
{
    if (b->cap - b->len > len && !b->failed) { /* cap > len always; room for the NUL too */
        kvg_copy(b->data + b->len, data, len);
        b->len += len;
        b->data[b->len] = '\0';
        return;
    }
    kvg_buf_append_grow(b, data, len);
}
static inline void kvg_buf_puts(kvg_buf *b, const char *s)
{
    kvg_buf_append(b, s, strlen(s));
}
static inline void kvg_buf_putc(kvg_buf *b, char c)
{
    kvg_buf_append(b, &c, 1);
}
void kvg_buf_printf(kvg_buf *b, const char *fmt, ...) KVG_PRINTF(2, 3);
void kvg_buf_vprintf(kvg_buf *b, const char *fmt, va_list ap) KVG_PRINTF(2, 0);
/** Append s as a JSON string literal (quotes included), escaping as RFC 8259 requires.
 *  Invalid UTF-8 is replaced by U+FFFD so the output is always valid JSON. */
void kvg_buf_json_string(kvg_buf *b, const char *s, size_t len);
/** Take the buffer's memory; the buffer is left empty. Caller frees. */
char *kvg_buf_steal(kvg_buf *b, size_t *len);

/* ---- JSON -------------------------------------------------------------------------------- */

typedef enum kvg_json_type {
    KVG_JSON_NULL = 0,
    KVG_JSON_FALSE,
    KVG_JSON_TRUE,
    KVG_JSON_NUMBER,
    KVG_JSON_STRING,
    KVG_JSON_ARRAY,
    KVG_JSON_OBJECT,
    KVG_JSON_TYPE_COUNT,
} kvg_json_type;

typedef struct kvg_json kvg_json;
struct kvg_json {
    kvg_json_type type;
    union {
        struct {
            double value;
            bool is_int; /* written without fraction or exponent and fits in int64 */
            int64_t ival;
        } num;
        struct {
            char *ptr; /* decoded UTF-8, NUL-terminated (may contain NUL from \u0000) */
            size_t len;
        } str;
        struct {
            kvg_json **items;
            size_t count;
        } arr;
        struct {
            char **keys; /* decoded, NUL-terminated */
            size_t *key_lens;
            kvg_json **values;
            size_t count;
        } obj;
    } u;
};

typedef struct kvg_json_limits {
    size_t max_depth; /* nesting; default 64 */
    bool reject_duplicate_keys;
} kvg_json_limits;

typedef struct kvg_json_error {
    size_t offset; /* byte offset of the problem */
    char message[96];
} kvg_json_error;

/** Strict RFC 8259 parse of [text, text+len) into a tree allocated from arena.
 *  limits may be NULL for defaults. Returns 0 and *out, or KVG_EPARSE / KVG_ELIMIT / -ENOMEM
 *  with err filled (err may be NULL). Strings must be valid UTF-8; escapes are decoded. */
int kvg_json_parse(const char *text, size_t len, kvg_arena *arena, const kvg_json_limits *limits,
                   kvg_json **out, kvg_json_error *err);
/** Member of an object by key; the last one wins when keys repeat. NULL if absent or not an
 *  object. */
const kvg_json *kvg_json_get(const kvg_json *obj, const char *key);
const char *kvg_json_type_str(kvg_json_type type);
/** Serialise a tree compactly (member order kept). */
void kvg_json_write(kvg_buf *b, const kvg_json *v);

/** JSON's two-character escape of c ("\\n" for a newline, "\\\"" for a quote; the seven
 *  RFC 8259 gives), or NULL when c has none (other control characters take \\u00XX). The one
 *  ladder every JSON writer of the tree uses. */
const char *kvg_json_short_escape(unsigned char c);
/** Write the code point cp (at most 0x10FFFF, not a surrogate) to o as UTF-8 (room for 4 bytes);
 *  returns the number of bytes. */
size_t kvg_utf8_put(unsigned char *o, uint32_t cp);

/* ---- small helpers ----------------------------------------------------------------------- */

/** Split "host:port" or "[v6]:port" into host (NUL-terminated, <= host_len-1 bytes) and port.
 *  Returns 0 or KVG_EPARSE. */
int kvg_parse_hostport(const char *s, char *host, size_t host_len, uint16_t *port);
/** Parse a non-negative decimal integer that fits in *out; 0 or KVG_EPARSE. */
int kvg_parse_u64(const char *s, size_t len, uint64_t *out);
/** Constant-time comparison of two byte strings of equal length; true when equal. */
bool kvg_consttime_eq(const void *a, const void *b, size_t len);
/** Read the whole regular file at path (at most max bytes) into a malloc'd buffer, NUL-
 *  terminated (not counted in *len), which the caller frees. 0 and *data, *len; -errno from
 *  open/read (-ENOENT, -EACCES, -EISDIR for a directory or anything not a regular file),
 *  KVG_ELIMIT when it is larger than max, -ENOMEM. */
int kvg_read_file(const char *path, size_t max, char **data, size_t *len);
/** Fill buf with len random bytes from the OS; 0 or -errno. */
int kvg_random_bytes(void *buf, size_t len);
/** Write v in decimal to buf (>= 20 bytes, not NUL-terminated); returns the length. For hot
 *  paths where printf's cost shows in profiles. */
size_t kvg_fmt_u64(char *buf, uint64_t v);
/** base64url (RFC 4648 section 5) of len bytes without padding, NUL-terminated in out, which
 *  has room for 4 * ceil(len / 3) + 1 bytes; returns the length. */
size_t kvg_base64url(const uint8_t *in, size_t len, char *out);
/** Value of one hex digit (either case), or -1. */
int kvg_hex_digit(int c);
/** Write v as 16 lowercase hex digits to buf (not NUL-terminated). */
void kvg_fmt_hex64(char *buf, uint64_t v);
/** Write the len bytes of in as 2 x len lowercase hex digits to out (not NUL-terminated). */
void kvg_hex_encode(const uint8_t *in, size_t len, char *out);
/** Whether a list of model names admits model: an empty list admits every model, as does a
 *  NULL model (a request that names none); otherwise it must be one of them. The rule of a
 *  worker's "models" and of a tenant's. */
bool kvg_models_admit(const char *const *list, size_t n, const char *model);
bool kvg_strncaseeq_slow(const char *a, const char *b, size_t len);
/** Case-insensitive ASCII comparison of two counted strings. Names the gateway compares are
 *  lowercase on both sides nearly always: an exact match is settled by memcmp. */
static inline bool kvg_strncaseeq(const char *a, size_t alen, const char *b, size_t blen)
{
    return alen == blen && (memcmp(a, b, alen) == 0 || kvg_strncaseeq_slow(a, b, alen));
}
/** Case-insensitive ASCII comparison of a counted string with a C string. Inline so that the
 *  length of a literal b is a constant and unequal lengths cost a compare: header filters run
 *  some 120 of these per proxied request, nearly all of unequal length (callgrind, 2026-12-02:
 *  5,500 instructions a request as a call with strlen). */
static inline bool kvg_strcaseeq(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    return alen == blen && kvg_strncaseeq(a, alen, b, blen);
}
/** RFC 9110 5.6.2 tchar, each mapped to its lowercase form; 0 for every other byte. */
extern const unsigned char kvg_tchar_lower[256];
/** True when [s, s+len) is an RFC 9110 token (5.6.2: one or more of ALPHA, DIGIT and
 *  !#$%&'*+-.^_`|~): what a header field name must be. Whitespace, controls, ':' and
 *  non-ASCII make it false; so does an empty name. */
bool kvg_http_token_valid(const char *s, size_t len);
/** Lowercase the header field name [s, s+len) in place and check it is an RFC 9110 token (as
 *  kvg_http_token_valid), in one pass: a parser that lowercases names pays nothing more for
 *  checking them. False (s partly lowercased) when it is not a token. */
bool kvg_http_token_lower(char *s, size_t len);
/** Length (2-4) of the well-formed UTF-8 sequence at s, whose lead byte is not ASCII (RFC 3629:
 *  no overlongs, surrogates or code points past U+10FFFF), or 0 when it is not one. avail > 0
 *  bytes are readable. Inline: the body scanner's string loop calls it for every non-ASCII
 *  character, and knows the lead byte is one already. */
static inline size_t kvg_utf8_multi_len(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0];
    unsigned lo = 0x80, hi = 0xBF;
    size_t n;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F; /* no UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (avail < n || s[1] < lo || s[1] > hi)
        return 0;
    if (n > 2 && (s[2] & 0xC0) != 0x80)
        return 0;
    if (n > 3 && (s[3] & 0xC0) != 0x80)
        return 0;
    return n;
}

/** Length (1-4) of the well-formed UTF-8 sequence at s (as kvg_utf8_multi_len, and 1 for an
 *  ASCII byte), or 0 when it is not one. avail > 0 bytes are readable. */
static inline size_t kvg_utf8_seq_len(const unsigned char *s, size_t avail)
{
    return s[0] < 0x80 ? 1 : kvg_utf8_multi_len(s, avail);
}

#endif
