/* SPDX-License-Identifier: Apache-2.0 */
/* Strict RFC 8259 JSON parser into an arena-allocated tree, and its serialiser. Used for the
 * config file, the admin API and the simulated worker; peer input, so it is fuzzed. */
#include "common.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_DEFAULT_DEPTH 64

typedef struct parser {
    const unsigned char *p;
    const unsigned char *start;
    const unsigned char *end;
    kvg_arena *arena;
    size_t max_depth;
    bool reject_dups;
    kvg_json_error *err;
    int rc;
} parser;

/* A growable array of pointers that starts on the stack: most JSON containers are small, and a
 * parse should not cost a malloc per object. */
#define PTRVEC_INLINE 24
typedef struct ptrvec {
    void **v;
    size_t n, cap;
    void *inline_buf[PTRVEC_INLINE];
} ptrvec;

static void ptrvec_init(ptrvec *pv)
{
    pv->v = pv->inline_buf;
    pv->n = 0;
    pv->cap = PTRVEC_INLINE;
}

static void ptrvec_free(ptrvec *pv)
{
    if (pv->v != pv->inline_buf)
        free(pv->v);
}

static int ptrvec_push(ptrvec *pv, void *p)
{
    if (pv->n == pv->cap) {
        size_t cap = pv->cap * 2;
        void **v;
        if (pv->v == pv->inline_buf) {
            v = malloc(cap * sizeof(*v));
            if (v)
                memcpy(v, pv->inline_buf, pv->n * sizeof(*v));
        } else {
            v = realloc(pv->v, cap * sizeof(*v));
        }
        if (!v)
            return -ENOMEM;
        pv->v = v;
        pv->cap = cap;
    }
    pv->v[pv->n++] = p;
    return 0;
}

static int fail(parser *ps, int rc, const char *msg)
{
    if (ps->rc == 0) {
        ps->rc = rc;
        if (ps->err) {
            ps->err->offset = (size_t)(ps->p - ps->start);
            snprintf(ps->err->message, sizeof(ps->err->message), "%s", msg);
        }
    }
    return ps->rc;
}

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static kvg_json *new_node(parser *ps, kvg_json_type t)
{
    kvg_json *v = kvg_arena_alloc(ps->arena, sizeof(*v));
    if (!v) {
        fail(ps, -ENOMEM, "out of memory");
        return NULL;
    }
    memset(v, 0, sizeof(*v));
    v->type = t;
    return v;
}

static int read_hex4(parser *ps, unsigned *out)
{
    if (ps->end - ps->p < 4)
        return fail(ps, KVG_EPARSE, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = kvg_hex_digit(ps->p[i]);
        if (h < 0)
            return fail(ps, KVG_EPARSE, "bad hex digit in \\u escape");
        v = v << 4 | (unsigned)h;
    }
    ps->p += 4;
    *out = v;
    return 0;
}

size_t kvg_utf8_put(unsigned char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Parse a string literal at ps->p (on the opening quote); decoded copy in the arena. */
static int parse_string(parser *ps, char **out, size_t *out_len)
{
    ps->p++; /* opening quote */
    const unsigned char *s = ps->p;
    /* First pass: find the end and check whether any escape needs decoding. */
    bool escapes = false;
    while (ps->p < ps->end && *ps->p != '"') {
        unsigned char c = *ps->p;
        if (c < 0x20)
            return fail(ps, KVG_EPARSE, "control character in string");
        if (c == '\\') {
            escapes = true;
            if (ps->end - ps->p < 2)
                return fail(ps, KVG_EPARSE, "unterminated string");
            ps->p += 2;
            continue;
        }
        if (c >= 0x80) {
            size_t n = kvg_utf8_seq_len(ps->p, (size_t)(ps->end - ps->p));
            if (!n)
                return fail(ps, KVG_EPARSE, "invalid UTF-8 in string");
            ps->p += n;
            continue;
        }
        ps->p++;
    }
    if (ps->p >= ps->end)
        return fail(ps, KVG_EPARSE, "unterminated string");
    size_t raw_len = (size_t)(ps->p - s);
    if (!escapes) {
        *out = kvg_arena_strndup(ps->arena, (const char *)s, raw_len);
        if (!*out)
            return fail(ps, -ENOMEM, "out of memory");
        *out_len = raw_len;
        ps->p++;
        return 0;
    }
    /* Decoded text is never longer than the raw text. */
    unsigned char *o = kvg_arena_alloc(ps->arena, raw_len + 1);
    if (!o)
        return fail(ps, -ENOMEM, "out of memory");
    size_t n = 0;
    const unsigned char *stop = ps->p;
    ps->p = s;
    while (ps->p < stop) {
        unsigned char c = *ps->p;
        if (c != '\\') {
            o[n++] = c;
            ps->p++;
            continue;
        }
        ps->p++;
        c = *ps->p++;
        switch (c) {
        case '"':
            o[n++] = '"';
            break;
        case '\\':
            o[n++] = '\\';
            break;
        case '/':
            o[n++] = '/';
            break;
        case 'b':
            o[n++] = '\b';
            break;
        case 'f':
            o[n++] = '\f';
            break;
        case 'n':
            o[n++] = '\n';
            break;
        case 'r':
            o[n++] = '\r';
            break;
        case 't':
            o[n++] = '\t';
            break;
        case 'u': {
            /* Set by read_hex4 on success; initialised because -O3 cannot see that fail()
             * always returns a negative code (a release build warned). */
            unsigned cp = 0;
            if (read_hex4(ps, &cp) < 0)
                return ps->rc;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo = 0;
                if (stop - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u')
                    return fail(ps, KVG_EPARSE, "unpaired surrogate in \\u escape");
                ps->p += 2;
                if (read_hex4(ps, &lo) < 0)
                    return ps->rc;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return fail(ps, KVG_EPARSE, "unpaired surrogate in \\u escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF)
                return fail(ps, KVG_EPARSE, "unpaired surrogate in \\u escape");
            n += kvg_utf8_put(o + n, cp);
            break;
        }
        default:
            ps->p--;
            return fail(ps, KVG_EPARSE, "invalid escape in string");
        }
    }
    if (ps->p != stop)
        return fail(ps, KVG_EPARSE, "truncated escape");
    o[n] = '\0';
    ps->p = stop + 1;
    *out = (char *)o;
    *out_len = n;
    return 0;
}

static int parse_number(parser *ps, kvg_json *v)
{
    const unsigned char *s = ps->p;
    bool integral = true;
    if (ps->p < ps->end && *ps->p == '-')
        ps->p++;
    if (ps->p >= ps->end)
        return fail(ps, KVG_EPARSE, "truncated number");
    if (*ps->p == '0')
        ps->p++;
    else if (*ps->p >= '1' && *ps->p <= '9')
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    else
        return fail(ps, KVG_EPARSE, "invalid number");
    if (ps->p < ps->end && *ps->p == '.') {
        integral = false;
        ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
            return fail(ps, KVG_EPARSE, "digit expected after decimal point");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        integral = false;
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
            ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
            return fail(ps, KVG_EPARSE, "digit expected in exponent");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    size_t len = (size_t)(ps->p - s);
    char small[64];
    char *tmp = small;
    if (len >= sizeof(small)) {
        tmp = kvg_arena_alloc(ps->arena, len + 1);
        if (!tmp)
            return fail(ps, -ENOMEM, "out of memory");
    }
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    v->u.num.value = strtod(tmp, NULL);
    if (integral) {
        errno = 0;
        long long ll = strtoll(tmp, NULL, 10);
        if (errno == 0) {
            v->u.num.is_int = true;
            v->u.num.ival = ll;
        }
    }
    return 0;
}

static int expect_word(parser *ps, const char *w, size_t n)
{
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, w, n) != 0)
        return fail(ps, KVG_EPARSE, "invalid literal");
    ps->p += n;
    return 0;
}

static kvg_json *parse_value(parser *ps, size_t depth);

static kvg_json *parse_array(parser *ps, size_t depth)
{
    kvg_json *v = new_node(ps, KVG_JSON_ARRAY);
    if (!v)
        return NULL;
    ps->p++; /* [ */
    ptrvec items;
    ptrvec_init(&items);
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
        return v;
    }
    for (;;) {
        kvg_json *item = parse_value(ps, depth + 1);
        if (!item)
            goto fail;
        if (ptrvec_push(&items, item) < 0) {
            fail(ps, -ENOMEM, "out of memory");
            goto fail;
        }
        skip_ws(ps);
        if (ps->p >= ps->end) {
            fail(ps, KVG_EPARSE, "unterminated array");
            goto fail;
        }
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p == ']') {
            ps->p++;
            break;
        }
        fail(ps, KVG_EPARSE, "expected ',' or ']' in array");
        goto fail;
    }
    v->u.arr.items = kvg_arena_alloc(ps->arena, items.n * sizeof(kvg_json *));
    if (!v->u.arr.items) {
        fail(ps, -ENOMEM, "out of memory");
        goto fail;
    }
    memcpy(v->u.arr.items, items.v, items.n * sizeof(kvg_json *));
    v->u.arr.count = items.n;
    ptrvec_free(&items);
    return v;
fail:
    ptrvec_free(&items);
    return NULL;
}

static kvg_json *parse_object(parser *ps, size_t depth)
{
    kvg_json *v = new_node(ps, KVG_JSON_OBJECT);
    if (!v)
        return NULL;
    ps->p++;  /* { */
    ptrvec m; /* members as (key, value, key length) triples */
    ptrvec_init(&m);
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return v;
    }
    for (;;) {
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != '"') {
            fail(ps, KVG_EPARSE, "expected string key in object");
            goto fail;
        }
        const unsigned char *key_at = ps->p;
        char *key;
        size_t klen;
        if (parse_string(ps, &key, &klen) < 0)
            goto fail;
        if (ps->reject_dups) {
            for (size_t i = 0; i < m.n; i += 3) {
                if ((size_t)(uintptr_t)m.v[i + 2] == klen && memcmp(m.v[i], key, klen) == 0) {
                    ps->p = key_at;
                    fail(ps, KVG_EPARSE, "duplicate key in object");
                    goto fail;
                }
            }
        }
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != ':') {
            fail(ps, KVG_EPARSE, "expected ':' after object key");
            goto fail;
        }
        ps->p++;
        kvg_json *val = parse_value(ps, depth + 1);
        if (!val)
            goto fail;
        if (ptrvec_push(&m, key) < 0 || ptrvec_push(&m, val) < 0 ||
            ptrvec_push(&m, (void *)(uintptr_t)klen) < 0) {
            fail(ps, -ENOMEM, "out of memory");
            goto fail;
        }
        skip_ws(ps);
        if (ps->p >= ps->end) {
            fail(ps, KVG_EPARSE, "unterminated object");
            goto fail;
        }
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p == '}') {
            ps->p++;
            break;
        }
        fail(ps, KVG_EPARSE, "expected ',' or '}' in object");
        goto fail;
    }
    size_t n = m.n / 3;
    v->u.obj.keys = kvg_arena_alloc(ps->arena, n * sizeof(char *));
    v->u.obj.values = kvg_arena_alloc(ps->arena, n * sizeof(kvg_json *));
    v->u.obj.key_lens = kvg_arena_alloc(ps->arena, n * sizeof(size_t));
    if (!v->u.obj.keys || !v->u.obj.values || !v->u.obj.key_lens) {
        fail(ps, -ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        v->u.obj.keys[i] = m.v[3 * i];
        v->u.obj.values[i] = m.v[3 * i + 1];
        v->u.obj.key_lens[i] = (size_t)(uintptr_t)m.v[3 * i + 2];
    }
    v->u.obj.count = n;
    ptrvec_free(&m);
    return v;
fail:
    ptrvec_free(&m);
    return NULL;
}

static kvg_json *parse_value(parser *ps, size_t depth)
{
    if (depth > ps->max_depth) {
        fail(ps, KVG_ELIMIT, "nesting too deep");
        return NULL;
    }
    skip_ws(ps);
    if (ps->p >= ps->end) {
        fail(ps, KVG_EPARSE, "unexpected end of input");
        return NULL;
    }
    kvg_json *v;
    switch (*ps->p) {
    case '{':
        return parse_object(ps, depth);
    case '[':
        return parse_array(ps, depth);
    case '"':
        v = new_node(ps, KVG_JSON_STRING);
        if (!v || parse_string(ps, &v->u.str.ptr, &v->u.str.len) < 0)
            return NULL;
        return v;
    case 't':
        v = new_node(ps, KVG_JSON_TRUE);
        return v && expect_word(ps, "true", 4) == 0 ? v : NULL;
    case 'f':
        v = new_node(ps, KVG_JSON_FALSE);
        return v && expect_word(ps, "false", 5) == 0 ? v : NULL;
    case 'n':
        v = new_node(ps, KVG_JSON_NULL);
        return v && expect_word(ps, "null", 4) == 0 ? v : NULL;
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) {
            v = new_node(ps, KVG_JSON_NUMBER);
            if (!v || parse_number(ps, v) < 0)
                return NULL;
            return v;
        }
        fail(ps, KVG_EPARSE, "unexpected character");
        return NULL;
    }
}

int kvg_json_parse(const char *text, size_t len, kvg_arena *arena, const kvg_json_limits *limits,
                   kvg_json **out, kvg_json_error *err)
{
    parser ps = {
        .p = (const unsigned char *)text,
        .start = (const unsigned char *)text,
        .end = (const unsigned char *)text + len,
        .arena = arena,
        .max_depth = limits && limits->max_depth ? limits->max_depth : JSON_DEFAULT_DEPTH,
        .reject_dups = limits && limits->reject_duplicate_keys,
        .err = err,
        .rc = 0,
    };
    kvg_json *v = parse_value(&ps, 1);
    if (!v)
        return ps.rc ? ps.rc : KVG_EPARSE;
    skip_ws(&ps);
    if (ps.p != ps.end)
        return fail(&ps, KVG_EPARSE, "trailing characters after JSON value");
    *out = v;
    return 0;
}

const kvg_json *kvg_json_get(const kvg_json *obj, const char *key)
{
    if (!obj || obj->type != KVG_JSON_OBJECT)
        return NULL;
    size_t klen = strlen(key);
    for (size_t i = obj->u.obj.count; i-- > 0;)
        if (obj->u.obj.key_lens[i] == klen && memcmp(obj->u.obj.keys[i], key, klen) == 0)
            return obj->u.obj.values[i];
    return NULL;
}

const char *kvg_json_type_str(kvg_json_type type)
{
    static const char *const names[KVG_JSON_TYPE_COUNT] = {"null",   "boolean", "boolean", "number",
                                                           "string", "array",   "object"};
    return type < KVG_JSON_TYPE_COUNT ? names[type] : "?";
}

void kvg_json_write(kvg_buf *b, const kvg_json *v)
{
    switch (v->type) {
    case KVG_JSON_NULL:
        kvg_buf_puts(b, "null");
        break;
    case KVG_JSON_FALSE:
        kvg_buf_puts(b, "false");
        break;
    case KVG_JSON_TRUE:
        kvg_buf_puts(b, "true");
        break;
    case KVG_JSON_NUMBER:
        if (v->u.num.is_int)
            kvg_buf_printf(b, "%lld", (long long)v->u.num.ival);
        else if (isfinite(v->u.num.value)) {
            /* Keep a fraction mark so the number reads back as a non-integer ("-0" would turn
             * -0.0 into the integer 0). */
            char tmp[40];
            int n = snprintf(tmp, sizeof(tmp), "%.17g", v->u.num.value);
            kvg_buf_append(b, tmp, (size_t)n);
            if (!strpbrk(tmp, ".eE"))
                kvg_buf_puts(b, ".0");
        } else
            kvg_buf_puts(b, "null"); /* JSON has no infinity; an overflowing literal becomes null */
        break;
    case KVG_JSON_STRING:
        kvg_buf_json_string(b, v->u.str.ptr, v->u.str.len);
        break;
    case KVG_JSON_ARRAY:
        kvg_buf_putc(b, '[');
        for (size_t i = 0; i < v->u.arr.count; i++) {
            if (i)
                kvg_buf_putc(b, ',');
            kvg_json_write(b, v->u.arr.items[i]);
        }
        kvg_buf_putc(b, ']');
        break;
    case KVG_JSON_OBJECT:
        kvg_buf_putc(b, '{');
        for (size_t i = 0; i < v->u.obj.count; i++) {
            if (i)
                kvg_buf_putc(b, ',');
            kvg_buf_json_string(b, v->u.obj.keys[i], v->u.obj.key_lens[i]);
            kvg_buf_putc(b, ':');
            kvg_json_write(b, v->u.obj.values[i]);
        }
        kvg_buf_putc(b, '}');
        break;
    default:
        break;
    }
}
