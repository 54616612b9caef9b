/* SPDX-License-Identifier: Apache-2.0 */
/* The field-table walker: decodes JSON objects and key=value text into structs and encodes
 * structs back to JSON, with one wording of errors for every entry point (fields.h). */
#include "fields.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Members of one object at most: the seen-list below is on the stack. Tables are far smaller. */
#define FIELDS_PER_OBJECT_MAX 64
/* An unknown member's name is shown up to this many bytes, printable, then "...". */
#define SHOW_NAME_MAX 32
#define PATH_MAX_LEN 160

static const char *const problem_names[KVG_FIELD_PROBLEM_COUNT] = {
    [KVG_FIELD_OK] = "ok",
    [KVG_FIELD_UNKNOWN] = "unknown",
    [KVG_FIELD_REPEATED] = "repeated",
    [KVG_FIELD_MISSING] = "missing",
    [KVG_FIELD_MISTYPED] = "mistyped",
    [KVG_FIELD_RANGE] = "range",
    [KVG_FIELD_INVALID] = "invalid",
    [KVG_FIELD_NOMEM] = "nomem",
};

const char *kvg_field_problem_str(kvg_field_problem p)
{
    return (unsigned)p < KVG_FIELD_PROBLEM_COUNT ? problem_names[p] : "?";
}

/* ---- values in the target struct ------------------------------------------------------------ */

static void *at(void *base, size_t offset)
{
    return (char *)base + offset;
}

static const void *cat(const void *base, size_t offset)
{
    return (const char *)base + offset;
}

static bool is_integer_type(kvg_field_type t)
{
    return t == KVG_FIELD_U32 || t == KVG_FIELD_U64 || t == KVG_FIELD_SIZE;
}

/* The range of an integer field as written: the table's, or the whole type (after the shift). */
static void int_range(const kvg_field *f, uint64_t *min, uint64_t *max)
{
    uint64_t top = f->type == KVG_FIELD_U32    ? UINT32_MAX
                   : f->type == KVG_FIELD_SIZE ? (uint64_t)SIZE_MAX
                                               : (uint64_t)INT64_MAX; /* what JSON integers hold */
    top >>= f->shift;
    *min = f->min;
    *max = f->min == 0 && f->max == 0 ? top : KVG_MIN(f->max, top);
}

static void store_int(const kvg_field *f, void *base, uint64_t v)
{
    v <<= f->shift;
    void *p = at(base, f->offset);
    if (f->type == KVG_FIELD_U32) {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, sizeof(x));
    } else if (f->type == KVG_FIELD_SIZE) {
        size_t x = (size_t)v;
        memcpy(p, &x, sizeof(x));
    } else {
        memcpy(p, &v, sizeof(v));
    }
}

static uint64_t load_int(const kvg_field *f, const void *base)
{
    const void *p = cat(base, f->offset);
    uint64_t v;
    if (f->type == KVG_FIELD_U32) {
        uint32_t x;
        memcpy(&x, p, sizeof(x));
        v = x;
    } else if (f->type == KVG_FIELD_SIZE) {
        size_t x;
        memcpy(&x, p, sizeof(x));
        v = x;
    } else {
        memcpy(&v, p, sizeof(v));
    }
    return v >> f->shift;
}

static void store_enum(const kvg_field *f, void *base, size_t index)
{
    if (f->flags & KVG_FIELD_AS_BOOL) {
        bool b = index != 0;
        memcpy(at(base, f->offset), &b, sizeof(b));
    } else {
        int x = (int)index;
        memcpy(at(base, f->offset), &x, sizeof(x));
    }
}

static size_t load_enum(const kvg_field *f, const void *base)
{
    if (f->flags & KVG_FIELD_AS_BOOL) {
        bool b;
        memcpy(&b, cat(base, f->offset), sizeof(b));
        return b ? 1 : 0;
    }
    int x;
    memcpy(&x, cat(base, f->offset), sizeof(x));
    return x < 0 ? SIZE_MAX : (size_t)x;
}

static void store_ptr(void *base, size_t offset, const void *p)
{
    memcpy(at(base, offset), &p, sizeof(p));
}

static const void *load_ptr(const void *base, size_t offset)
{
    const void *p;
    memcpy(&p, cat(base, offset), sizeof(p));
    return p;
}

/* ---- descriptions and messages --------------------------------------------------------------- */

/* A range bound as people write it: "100", "0.5", "1e15" (not "1e+15"). */
static const char *fmt_double(double v, char *buf, size_t len)
{
    if (v == floor(v) && fabs(v) < 1e6) {
        snprintf(buf, len, "%.0f", v + 0.0);
        return buf;
    }
    char tmp[40];
    snprintf(tmp, sizeof(tmp), "%g", v);
    size_t o = 0;
    for (const char *p = tmp; *p && o + 1 < len; p++) {
        if (*p == '+' && p > tmp && p[-1] == 'e')
            continue;
        if (*p == '0' && p > tmp && (p[-1] == 'e' || p[-1] == '-') && p[1] >= '0' && p[1] <= '9')
            continue; /* e-05 -> e-5 */
        buf[o++] = *p;
    }
    buf[o] = '\0';
    return buf;
}

static void keyword_list(const kvg_field *f, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < f->nkeywords && o < len; i++) {
        const char *sep = i == 0 ? "" : i + 1 == f->nkeywords ? " or " : ", ";
        int n = snprintf(buf + o, len - o, "%s%s", sep, f->keywords[i]);
        if (n < 0)
            break;
        o += (size_t)n;
    }
}

const char *kvg_field_expect(const kvg_field *f, char *buf, size_t len)
{
    char lo[40], hi[40];
    uint64_t min, max;
    switch (f->type) {
    case KVG_FIELD_STRING:
    case KVG_FIELD_CHARS:
        snprintf(buf, len, "%s", f->flags & KVG_FIELD_NONEMPTY ? "a non-empty string" : "a string");
        break;
    case KVG_FIELD_STRINGS:
        snprintf(buf, len, "an array of strings");
        break;
    case KVG_FIELD_OBJECTS:
        snprintf(buf, len, "an array of objects");
        break;
    case KVG_FIELD_U32:
    case KVG_FIELD_U64:
    case KVG_FIELD_SIZE:
        int_range(f, &min, &max);
        snprintf(buf, len, "an integer in %" PRIu64 "..%" PRIu64, min, max);
        break;
    case KVG_FIELD_DOUBLE:
        snprintf(buf, len, "a number in %s..%s", fmt_double(f->dmin, lo, sizeof(lo)),
                 fmt_double(f->dmax, hi, sizeof(hi)));
        break;
    case KVG_FIELD_BOOL:
        snprintf(buf, len, "true or false");
        break;
    case KVG_FIELD_ENUM:
        keyword_list(f, buf, len);
        break;
    case KVG_FIELD_OBJECT:
    case KVG_FIELD_EMBED:
        snprintf(buf, len, "an object");
        break;
    default:
        snprintf(buf, len, "a valid value");
        break;
    }
    return buf;
}

const char *kvg_fields_path(char *buf, size_t len, const char *path, const char *name)
{
    if (!path || !*path)
        snprintf(buf, len, "%s", name);
    else if (name[0] == '[')
        snprintf(buf, len, "%s%s", path, name);
    else
        snprintf(buf, len, "%s.%s", path, name);
    return buf;
}

/* A member name from peer input, fit for a message: printable ASCII, bounded. */
static void show_name(const char *s, size_t len, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o < SHOW_NAME_MAX; i++) {
        unsigned char ch = (unsigned char)s[i];
        out[o++] = ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\' ? (char)ch : '?';
    }
    if (len > SHOW_NAME_MAX) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
}

/* What a template's placeholders stand for. */
typedef struct vars {
    const char *path, *expect, *shape, *type, *value, *keywords;
} vars;

static const char *var(const vars *v, const char *name, size_t len)
{
    static const struct {
        const char *name;
        size_t off;
    } names[] = {
        {"path", offsetof(vars, path)},   {"expect", offsetof(vars, expect)},
        {"shape", offsetof(vars, shape)}, {"type", offsetof(vars, type)},
        {"value", offsetof(vars, value)}, {"keywords", offsetof(vars, keywords)},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(names); i++) {
        if (strlen(names[i].name) == len && memcmp(names[i].name, name, len) == 0) {
            const char *s;
            memcpy(&s, (const char *)v + names[i].off, sizeof(s));
            return s ? s : "";
        }
    }
    return "";
}

/* Fill tmpl into c->msg. */
static int render(kvg_fields_ctx *c, kvg_field_problem problem, const char *tmpl, const vars *v)
{
    c->problem = problem;
    if (c->msg && c->msg_len) {
        size_t o = 0;
        /* A leading "{name}: " whose value is empty goes, so that a field at the top of a
         * body is named by itself. */
        const char *lead = tmpl[0] == '{' ? strchr(tmpl, '}') : NULL;
        if (lead && lead[1] == ':' && lead[2] == ' ' &&
            !*var(v, tmpl + 1, (size_t)(lead - tmpl - 1)))
            tmpl = lead + 3;
        for (const char *p = tmpl; *p && o + 1 < c->msg_len;) {
            const char *close = *p == '{' ? strchr(p, '}') : NULL;
            if (!close) {
                c->msg[o++] = *p++;
                continue;
            }
            const char *s = var(v, p + 1, (size_t)(close - p - 1));
            size_t n = KVG_MIN(strlen(s), c->msg_len - 1 - o);
            memcpy(c->msg + o, s, n);
            o += n;
            p = close + 1;
        }
        c->msg[o] = '\0';
    }
    return problem == KVG_FIELD_NOMEM ? -ENOMEM : KVG_EPARSE;
}

int kvg_fields_fail(kvg_fields_ctx *c, kvg_field_problem problem, const char *path, const char *fmt,
                    ...)
{
    c->problem = problem;
    if (c->msg && c->msg_len) {
        int n = path && *path ? snprintf(c->msg, c->msg_len, "%s: ", path) : 0;
        if (n < 0 || (size_t)n >= c->msg_len)
            n = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg + n, c->msg_len - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return problem == KVG_FIELD_NOMEM ? -ENOMEM : KVG_EPARSE;
}

/* An error about field f's value at path (MISTYPED, RANGE, INVALID by its invalid template). */
static int fail_value(kvg_fields_ctx *c, kvg_field_problem problem, const kvg_field *f,
                      const char *path, const kvg_json *given)
{
    char expect[256], shape[256], value[40] = "";
    kvg_field_expect(f, expect, sizeof(expect));
    snprintf(shape, sizeof(shape), "%s", f->type == KVG_FIELD_ENUM ? "a string" : expect);
    if (given && given->type == KVG_JSON_STRING)
        show_name(given->u.str.ptr, given->u.str.len, value);
    char keywords[256] = "";
    for (size_t k = 0, o = 0; f->type == KVG_FIELD_ENUM && k < f->nkeywords && o < sizeof(keywords);
         k++) {
        int n = snprintf(keywords + o, sizeof(keywords) - o, "%s%s", k ? ", " : "", f->keywords[k]);
        if (n < 0)
            break;
        o += (size_t)n;
    }
    vars v = {.path = path,
              .expect = expect,
              .shape = shape,
              .type = given ? kvg_json_type_str(given->type) : "string",
              .value = value,
              .keywords = keywords};
    /* One wording per problem, at every entry point; only a field's own refusal (INVALID) may
     * say more, through its table's template. */
    const char *tmpl = problem == KVG_FIELD_MISTYPED ? "{path}: must be {shape}, not {type}"
                       : problem == KVG_FIELD_INVALID && f->invalid ? f->invalid
                                                                    : "{path}: must be {expect}";
    return render(c, problem, tmpl, &v);
}

static int fail_nul(kvg_fields_ctx *c, const char *path)
{
    vars v = {.path = path};
    return render(c, KVG_FIELD_MISTYPED, "{path}: must not contain NUL characters", &v);
}

static int fail_nomem(kvg_fields_ctx *c)
{
    return kvg_fields_fail(c, KVG_FIELD_NOMEM, NULL, "out of memory");
}

/* A check hook's refusal: "path: why". */
static int fail_check(kvg_fields_ctx *c, int rc, const char *path, const char *why)
{
    if (rc == -ENOMEM)
        return fail_nomem(c);
    return kvg_fields_fail(c, KVG_FIELD_INVALID, path, "%s", why);
}

/* ---- lookups --------------------------------------------------------------------------------- */

static bool name_is(const char *name, const char *key, size_t len)
{
    return name && strlen(name) == len && memcmp(name, key, len) == 0;
}

/* The field named key in t or in the tables it embeds; *offset receives where the struct that
 * holds it starts, from the start of t's struct. */
static const kvg_field *lookup(const kvg_fields *t, const char *key, size_t len, size_t *offset)
{
    for (size_t i = 0; i < t->count; i++) {
        const kvg_field *f = &t->fields[i];
        if (f->type == KVG_FIELD_EMBED) {
            size_t sub;
            const kvg_field *r = lookup(f->object, key, len, &sub);
            if (r) {
                *offset = f->offset + sub;
                return r;
            }
        } else if (name_is(f->name, key, len)) {
            *offset = 0;
            return f;
        }
    }
    return NULL;
}

const kvg_field *kvg_fields_find(const kvg_fields *t, const char *name, size_t len)
{
    size_t off;
    return lookup(t, name, len, &off);
}

/* ---- defaults -------------------------------------------------------------------------------- */

void kvg_fields_defaults(const kvg_fields *t, void *target)
{
    for (size_t i = 0; i < t->count; i++) {
        const kvg_field *f = &t->fields[i];
        void *p = at(target, f->offset);
        switch (f->type) {
        case KVG_FIELD_STRING:
            store_ptr(target, f->offset, f->def.s);
            break;
        case KVG_FIELD_CHARS:
            snprintf(p, f->max + 1, "%s", f->def.s ? f->def.s : "");
            break;
        case KVG_FIELD_STRINGS:
        case KVG_FIELD_OBJECTS: {
            size_t zero = 0;
            store_ptr(target, f->offset, NULL);
            memcpy(at(target, f->count_offset), &zero, sizeof(zero));
            break;
        }
        case KVG_FIELD_U32:
        case KVG_FIELD_U64:
        case KVG_FIELD_SIZE:
            store_int(f, target, f->def.u);
            break;
        case KVG_FIELD_DOUBLE:
            memcpy(p, &f->def.d, sizeof(double));
            break;
        case KVG_FIELD_BOOL: {
            bool b = (f->flags & KVG_FIELD_NEGATE) ? !f->def.b : f->def.b;
            memcpy(p, &b, sizeof(b));
            break;
        }
        case KVG_FIELD_ENUM:
            store_enum(f, target, (size_t)f->def.u);
            break;
        case KVG_FIELD_OBJECT:
        case KVG_FIELD_EMBED:
            kvg_fields_defaults(f->object, p);
            break;
        default:
            break;
        }
    }
}

/* ---- decoding values ------------------------------------------------------------------------- */

static char *copy_str(kvg_fields_ctx *c, const char *s, size_t len)
{
    return c->arena ? kvg_arena_strndup(c->arena, s, len) : NULL;
}

int kvg_fields_get_string(kvg_fields_ctx *c, const kvg_json *v, const char *path, const char **out)
{
    static const kvg_field str = {.type = KVG_FIELD_STRING};
    if (v->type != KVG_JSON_STRING)
        return fail_value(c, KVG_FIELD_MISTYPED, &str, path, v);
    if (memchr(v->u.str.ptr, '\0', v->u.str.len))
        return fail_nul(c, path);
    *out = v->u.str.ptr;
    return 0;
}

/* A string value of f (item: one of a STRINGS list, which has no length rules of its own):
 * type, NUL, length and the check; *out borrowed from v or copied. */
static int decode_string(const kvg_field *f, bool item, const kvg_json *v, const char *path,
                         kvg_fields_ctx *c, const char **out)
{
    char why[160];
    const char *s;
    int rc = kvg_fields_get_string(c, v, path, &s);
    if (rc < 0)
        return rc;
    size_t len = v->u.str.len;
    if (!item) {
        if ((f->flags & KVG_FIELD_NONEMPTY) && len == 0)
            return fail_value(c, KVG_FIELD_RANGE, f, path, v);
        if (f->min && len < f->min)
            return kvg_fields_fail(c, KVG_FIELD_RANGE, path,
                                   "must be at least %" PRIu64 " characters", f->min);
        if ((f->max || f->type == KVG_FIELD_CHARS) && len > f->max)
            return kvg_fields_fail(c, KVG_FIELD_RANGE, path, "longer than %" PRIu64 " bytes",
                                   f->max);
    }
    if (f->check && (rc = f->check(s, why, sizeof(why))) < 0)
        return fail_check(c, rc, path, why);
    if (c->copy_strings && f->type != KVG_FIELD_CHARS) {
        s = copy_str(c, s, len);
        if (!s)
            return fail_nomem(c);
    }
    *out = s;
    return 0;
}

/* STRINGS and OBJECTS: an array of strings, or of objects each from its defaults. The items go
 * into one arena allocation, stored with their count once all are good. */
static int decode_array(const kvg_field *f, void *base, const kvg_json *v, const char *path,
                        kvg_fields_ctx *c)
{
    char ipath[PATH_MAX_LEN], idx[24];
    if (v->type != KVG_JSON_ARRAY)
        return fail_value(c, KVG_FIELD_MISTYPED, f, path, v);
    size_t n = v->u.arr.count;
    if (f->max && n > f->max)
        return kvg_fields_fail(c, KVG_FIELD_RANGE, path, "more than %" PRIu64 " %s", f->max,
                               f->name);
    size_t size = f->type == KVG_FIELD_STRINGS ? sizeof(char *) : f->elem_size;
    char *items = c->arena ? kvg_arena_alloc(c->arena, (n ? n : 1) * size) : NULL;
    if (!items)
        return fail_nomem(c);
    for (size_t i = 0; i < n; i++) {
        void *item = items + i * size;
        int rc;
        snprintf(idx, sizeof(idx), "[%zu]", i);
        kvg_fields_path(ipath, sizeof(ipath), path, idx);
        if (f->type == KVG_FIELD_STRINGS) {
            rc = decode_string(f, true, v->u.arr.items[i], ipath, c, (const char **)item);
        } else {
            memset(item, 0, size);
            kvg_fields_defaults(f->object, item);
            rc = kvg_fields_decode(f->object, item, v->u.arr.items[i], ipath, c);
        }
        if (rc < 0)
            return rc;
    }
    store_ptr(base, f->offset, items);
    memcpy(at(base, f->count_offset), &n, sizeof(n));
    return 0;
}

static int decode_value(const kvg_field *f, void *base, const kvg_json *v, const char *path,
                        kvg_fields_ctx *c);

static int decode_int(const kvg_field *f, void *base, const kvg_json *v, const char *path,
                      kvg_fields_ctx *c)
{
    uint64_t min, max;
    if (v->type != KVG_JSON_NUMBER)
        return fail_value(c, KVG_FIELD_MISTYPED, f, path, v);
    int_range(f, &min, &max);
    if (!v->u.num.is_int || v->u.num.ival < 0 || (uint64_t)v->u.num.ival < min ||
        (uint64_t)v->u.num.ival > max)
        return fail_value(c, KVG_FIELD_RANGE, f, path, v);
    store_int(f, base, (uint64_t)v->u.num.ival);
    return 0;
}

static int decode_double(const kvg_field *f, void *base, const kvg_json *v, const char *path,
                         kvg_fields_ctx *c)
{
    if (v->type != KVG_JSON_NUMBER)
        return fail_value(c, KVG_FIELD_MISTYPED, f, path, v);
    /* The negated test also refuses NaN; a huge exponent gives an infinity, past any dmax. */
    if (!(v->u.num.value >= f->dmin && v->u.num.value <= f->dmax))
        return fail_value(c, KVG_FIELD_RANGE, f, path, v);
    double x = v->u.num.value + 0.0; /* -0 becomes 0, so it is written back as 0 */
    memcpy(at(base, f->offset), &x, sizeof(x));
    return 0;
}

static int decode_enum(const kvg_field *f, void *base, const kvg_json *v, const char *path,
                       kvg_fields_ctx *c)
{
    if (v->type != KVG_JSON_STRING)
        return fail_value(c, KVG_FIELD_MISTYPED, f, path, v);
    for (size_t k = 0; k < f->nkeywords; k++) {
        if (name_is(f->keywords[k], v->u.str.ptr, v->u.str.len)) {
            store_enum(f, base, k);
            return 0;
        }
    }
    return fail_value(c, f->invalid ? KVG_FIELD_INVALID : KVG_FIELD_RANGE, f, path, v);
}

static int decode_value(const kvg_field *f, void *base, const kvg_json *v, const char *path,
                        kvg_fields_ctx *c)
{
    const char *s = NULL;
    int rc;
    switch (f->type) {
    case KVG_FIELD_STRING:
        if (v->type == KVG_JSON_NULL && (f->flags & KVG_FIELD_NULLABLE)) {
            store_ptr(base, f->offset, NULL);
            return 0;
        }
        rc = decode_string(f, false, v, path, c, &s);
        if (rc == 0)
            store_ptr(base, f->offset, s);
        return rc;
    case KVG_FIELD_CHARS:
        rc = decode_string(f, false, v, path, c, &s);
        if (rc == 0)
            memcpy(at(base, f->offset), s, v->u.str.len + 1);
        return rc;
    case KVG_FIELD_STRINGS:
    case KVG_FIELD_OBJECTS:
        return decode_array(f, base, v, path, c);
    case KVG_FIELD_U32:
    case KVG_FIELD_U64:
    case KVG_FIELD_SIZE:
        return decode_int(f, base, v, path, c);
    case KVG_FIELD_DOUBLE:
        return decode_double(f, base, v, path, c);
    case KVG_FIELD_BOOL: {
        if (v->type != KVG_JSON_TRUE && v->type != KVG_JSON_FALSE)
            return fail_value(c, KVG_FIELD_MISTYPED, f, path, v);
        bool b = (v->type == KVG_JSON_TRUE) != ((f->flags & KVG_FIELD_NEGATE) != 0);
        memcpy(at(base, f->offset), &b, sizeof(b));
        return 0;
    }
    case KVG_FIELD_ENUM:
        return decode_enum(f, base, v, path, c);
    case KVG_FIELD_OBJECT:
        return kvg_fields_decode(f->object, at(base, f->offset), v, path, c);
    case KVG_FIELD_CUSTOM:
        return f->decode ? f->decode(base, v, path, c)
                         : fail_value(c, KVG_FIELD_INVALID, f, path, v);
    default:
        return fail_value(c, KVG_FIELD_INVALID, f, path, v);
    }
}

/* ---- objects -----------------------------------------------------------------------------------
 */

typedef struct seen_list {
    const kvg_field *f[FIELDS_PER_OBJECT_MAX];
    size_t n;
} seen_list;

static bool seen_has(const seen_list *s, const kvg_field *f)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->f[i] == f)
            return true;
    return false;
}

/* The first required field (in table order) that was not given, or NULL. */
static const kvg_field *first_missing(const kvg_fields *t, unsigned from, const seen_list *s)
{
    for (size_t i = 0; i < t->count; i++) {
        const kvg_field *f = &t->fields[i];
        if (f->type == KVG_FIELD_EMBED) {
            const kvg_field *m = first_missing(f->object, from, s);
            if (m)
                return m;
        } else if ((f->required_in & from) && !seen_has(s, f)) {
            return f;
        }
    }
    return NULL;
}

static int fail_missing(const kvg_fields *t, const kvg_field *f, const char *path,
                        kvg_fields_ctx *c)
{
    char fpath[PATH_MAX_LEN];
    vars v = {.path = kvg_fields_path(fpath, sizeof(fpath), path, f->name)};
    return render(c, KVG_FIELD_MISSING, "{path}: required", &v);
}

static int fail_unknown(const kvg_json *obj, size_t i, const char *path, kvg_fields_ctx *c)
{
    const char *key = obj->u.obj.keys[i];
    size_t len = obj->u.obj.key_lens[i];
    char shown[SHOW_NAME_MAX + 4], fpath[PATH_MAX_LEN];
    show_name(key, len, shown);
    vars v = {.path = kvg_fields_path(fpath, sizeof(fpath), path, shown)};
    return render(c, KVG_FIELD_UNKNOWN, "{path}: unknown field", &v);
}

int kvg_fields_decode(const kvg_fields *t, void *target, const kvg_json *obj, const char *path,
                      kvg_fields_ctx *c)
{
    static const kvg_field object = {.type = KVG_FIELD_OBJECT};
    char fpath[PATH_MAX_LEN], why[200];
    seen_list seen = {.n = 0};
    if (!path)
        path = "";
    c->problem = KVG_FIELD_OK;
    if (!obj || obj->type != KVG_JSON_OBJECT)
        return fail_value(c, KVG_FIELD_MISTYPED, &object, path, obj);
    for (size_t i = 0; i < obj->u.obj.count; i++) {
        size_t off = 0;
        const kvg_field *f = lookup(t, obj->u.obj.keys[i], obj->u.obj.key_lens[i], &off);
        if (!f || !(f->set_in & c->from))
            return fail_unknown(obj, i, path, c);
        kvg_fields_path(fpath, sizeof(fpath), path, f->name);
        if (seen_has(&seen, f))
            return kvg_fields_fail(c, KVG_FIELD_REPEATED, fpath, "appears more than once");
        if (seen.n < FIELDS_PER_OBJECT_MAX)
            seen.f[seen.n++] = f;
        int rc = decode_value(f, at(target, off), obj->u.obj.values[i], fpath, c);
        if (rc < 0)
            return rc;
    }
    const kvg_field *missing = first_missing(t, c->from, &seen);
    if (missing)
        return fail_missing(t, missing, path, c);
    if (t->check) {
        int rc = t->check(target, why, sizeof(why));
        if (rc < 0) {
            if (rc == -ENOMEM)
                return fail_nomem(c);
            /* why starts with the field: put the object's path in front of it */
            return kvg_fields_fail(c, KVG_FIELD_INVALID, NULL, "%s%s%s", path, *path ? "." : "",
                                   why);
        }
    }
    return 0;
}

/* ---- key=value text -------------------------------------------------------------------------- */

/* The field a key=value key names: a member, "object.member", a member of a FLATTEN object, or
 * a STRINGS item name (*append set). *offset: where its holder starts in t's struct; path gets
 * the field's path. */
static const kvg_field *lookup_key(const kvg_fields *t, const char *key, size_t len, unsigned from,
                                   size_t *offset, bool *append, char *path, size_t path_len,
                                   const char *prefix)
{
    *append = false;
    const char *dot = memchr(key, '.', len);
    if (dot) {
        size_t off;
        const kvg_field *o = lookup(t, key, (size_t)(dot - key), &off);
        if (!o || o->type != KVG_FIELD_OBJECT || !(o->set_in & from))
            return NULL;
        char sub[PATH_MAX_LEN];
        kvg_fields_path(sub, sizeof(sub), prefix, o->name);
        size_t inner;
        const kvg_field *f = lookup_key(o->object, dot + 1, len - (size_t)(dot - key) - 1, from,
                                        &inner, append, path, path_len, sub);
        *offset = off + o->offset + inner;
        return f;
    }
    for (size_t i = 0; i < t->count; i++) {
        const kvg_field *f = &t->fields[i];
        if (f->type == KVG_FIELD_OBJECT && (f->set_in & from) && name_is(f->name, key, len)) {
            *offset = 0;
            kvg_fields_path(path, path_len, prefix, f->name);
            return f; /* text for an object: refused as mistyped */
        }
        if (f->type == KVG_FIELD_EMBED ||
            (f->type == KVG_FIELD_OBJECT && (f->flags & KVG_FIELD_FLATTEN) && (f->set_in & from))) {
            char sub[PATH_MAX_LEN];
            size_t inner;
            if (f->type == KVG_FIELD_OBJECT)
                kvg_fields_path(sub, sizeof(sub), prefix, f->name);
            else
                snprintf(sub, sizeof(sub), "%s", prefix);
            const kvg_field *r =
                lookup_key(f->object, key, len, from, &inner, append, path, path_len, sub);
            if (r) {
                *offset = f->offset + inner;
                return r;
            }
            continue;
        }
        if (!(f->set_in & from))
            continue;
        bool item = f->type == KVG_FIELD_STRINGS && name_is(f->item, key, len);
        if (item || (f->type != KVG_FIELD_STRINGS && name_is(f->name, key, len))) {
            *append = item;
            *offset = 0;
            kvg_fields_path(path, path_len, prefix, f->name);
            return f;
        }
    }
    return NULL;
}

static bool number_text(const char *s, size_t len)
{
    /* JSON's number grammar is checked by the parser; this only keeps out what it would take
     * as another value or with blanks around. */
    return len > 0 && ((s[0] >= '0' && s[0] <= '9') || s[0] == '-') && s[len - 1] != ' ';
}

/* Read text as the JSON value field f takes (in the arena). Text that cannot be read as the
 * field's type is MISTYPED, a negative number RANGE: the messages a JSON value would get. */
static int lex(const kvg_field *f, const char *text, size_t len, const char *path,
               kvg_fields_ctx *c, kvg_json **out)
{
    kvg_json *node = c->arena ? kvg_arena_alloc(c->arena, sizeof(*node)) : NULL;
    if (!node)
        return fail_nomem(c);
    memset(node, 0, sizeof(*node));
    if (is_integer_type(f->type) || f->type == KVG_FIELD_DOUBLE) {
        kvg_json *num = NULL;
        int rc = number_text(text, len) ? kvg_json_parse(text, len, c->arena, NULL, &num, NULL)
                                        : KVG_EPARSE;
        if (rc == -ENOMEM)
            return fail_nomem(c);
        if (rc < 0 || num->type != KVG_JSON_NUMBER) {
            node->type = KVG_JSON_STRING; /* what the text is, for {type} */
            node->u.str.ptr = (char *)"";
            return fail_value(c, KVG_FIELD_MISTYPED, f, path, node);
        }
        *out = num;
        return 0;
    }
    if (f->type == KVG_FIELD_BOOL) {
        if ((len == 4 && memcmp(text, "true", 4) == 0) || (len == 2 && memcmp(text, "on", 2) == 0))
            node->type = KVG_JSON_TRUE;
        else if ((len == 5 && memcmp(text, "false", 5) == 0) ||
                 (len == 3 && memcmp(text, "off", 3) == 0))
            node->type = KVG_JSON_FALSE;
        else {
            node->type = KVG_JSON_STRING;
            node->u.str.ptr = (char *)"";
            return fail_value(c, KVG_FIELD_MISTYPED, f, path, node);
        }
        *out = node;
        return 0;
    }
    node->type = KVG_JSON_STRING;
    node->u.str.ptr = kvg_arena_strndup(c->arena, text, len);
    node->u.str.len = len;
    if (!node->u.str.ptr)
        return fail_nomem(c);
    *out = node;
    return 0;
}

/* A negative number where none is taken: the text is refused before it goes anywhere. */
static int refuse_sign(const kvg_field *f, const kvg_json *num, const char *path, kvg_fields_ctx *c)
{
    if ((is_integer_type(f->type) || f->type == KVG_FIELD_DOUBLE) && num->u.num.value < 0)
        return fail_value(c, KVG_FIELD_RANGE, f, path, num);
    return 0;
}

static int append_item(const kvg_field *f, void *base, const char *text, size_t len,
                       const char *path, kvg_fields_ctx *c)
{
    const char **items = (const char **)load_ptr(base, f->offset);
    size_t n;
    memcpy(&n, cat(base, f->count_offset), sizeof(n));
    if (f->max && n + 1 > f->max)
        return kvg_fields_fail(c, KVG_FIELD_RANGE, path, "more than %" PRIu64 " %s", f->max,
                               f->name);
    char ipath[PATH_MAX_LEN], idx[24];
    snprintf(idx, sizeof(idx), "[%zu]", n);
    kvg_fields_path(ipath, sizeof(ipath), path, idx);
    const char *s = copy_str(c, text, len);
    const char **next = c->arena ? kvg_arena_alloc(c->arena, (n + 1) * sizeof(char *)) : NULL;
    if (!s || !next)
        return fail_nomem(c);
    char why[160];
    int rc;
    if (f->check && (rc = f->check(s, why, sizeof(why))) < 0)
        return fail_check(c, rc, ipath, why);
    if (n)
        memcpy(next, items, n * sizeof(char *));
    next[n++] = s;
    store_ptr(base, f->offset, next);
    memcpy(at(base, f->count_offset), &n, sizeof(n));
    return 0;
}

int kvg_fields_set_text(const kvg_fields *t, void *target, const char *key, size_t key_len,
                        const char *text, size_t text_len, const char *path, kvg_fields_ctx *c)
{
    char fpath[PATH_MAX_LEN], kshown[SHOW_NAME_MAX + 4], upath[PATH_MAX_LEN];
    size_t off = 0;
    bool append;
    c->problem = KVG_FIELD_OK;
    const kvg_field *f =
        lookup_key(t, key, key_len, c->from, &off, &append, fpath, sizeof(fpath), path);
    if (!f) {
        show_name(key, key_len, kshown);
        kvg_fields_path(upath, sizeof(upath), path, kshown);
        vars v = {.path = upath};
        return render(c, KVG_FIELD_UNKNOWN, "{path}: unknown field", &v);
    }
    if (append)
        return append_item(f, at(target, off), text, text_len, fpath, c);
    kvg_json *node;
    int rc = lex(f, text, text_len, fpath, c, &node);
    if (rc == 0)
        rc = decode_value(f, at(target, off), node, fpath, c);
    return rc;
}

/* ---- building a JSON object (kvgate admin) --------------------------------------------------- */

kvg_json *kvg_fields_json_object(kvg_arena *arena)
{
    kvg_json *o = kvg_arena_alloc(arena, sizeof(*o));
    if (o) {
        memset(o, 0, sizeof(*o));
        o->type = KVG_JSON_OBJECT;
    }
    return o;
}

/* Append key: value to obj (arrays grow by copying: bodies have a handful of members). */
static int json_add(kvg_arena *a, kvg_json *obj, const char *key, kvg_json *value)
{
    size_t n = obj->u.obj.count;
    char **keys = kvg_arena_alloc(a, (n + 1) * sizeof(char *));
    size_t *lens = kvg_arena_alloc(a, (n + 1) * sizeof(size_t));
    kvg_json **values = kvg_arena_alloc(a, (n + 1) * sizeof(kvg_json *));
    char *k = kvg_arena_strdup(a, key);
    if (!keys || !lens || !values || !k)
        return -ENOMEM;
    if (n) {
        memcpy(keys, obj->u.obj.keys, n * sizeof(char *));
        memcpy(lens, obj->u.obj.key_lens, n * sizeof(size_t));
        memcpy(values, obj->u.obj.values, n * sizeof(kvg_json *));
    }
    keys[n] = k;
    lens[n] = strlen(k);
    values[n] = value;
    obj->u.obj.keys = keys;
    obj->u.obj.key_lens = lens;
    obj->u.obj.values = values;
    obj->u.obj.count = n + 1;
    return 0;
}

static kvg_json *json_member(kvg_json *obj, const char *key)
{
    for (size_t i = 0; i < obj->u.obj.count; i++)
        if (strcmp(obj->u.obj.keys[i], key) == 0)
            return obj->u.obj.values[i];
    return NULL;
}

/* The object in obj that holds key's field: obj itself, or nested ones made on the way. */
static int json_holder(const kvg_fields *t, kvg_json *obj, const char *key, size_t len,
                       unsigned from, kvg_arena *a, kvg_json **out)
{
    const char *dot = memchr(key, '.', len);
    for (size_t i = 0; i < t->count; i++) {
        const kvg_field *f = &t->fields[i];
        bool nested = f->type == KVG_FIELD_OBJECT && (f->set_in & from);
        if (nested && dot && name_is(f->name, key, (size_t)(dot - key))) {
            kvg_json *sub = json_member(obj, f->name);
            if (!sub) {
                if (!(sub = kvg_fields_json_object(a)) || json_add(a, obj, f->name, sub) < 0)
                    return -ENOMEM;
            }
            return json_holder(f->object, sub, dot + 1, len - (size_t)(dot - key) - 1, from, a,
                               out);
        }
        if (nested && !dot && (f->flags & KVG_FIELD_FLATTEN) &&
            kvg_fields_find(f->object, key, len)) {
            kvg_json *sub = json_member(obj, f->name);
            if (!sub) {
                if (!(sub = kvg_fields_json_object(a)) || json_add(a, obj, f->name, sub) < 0)
                    return -ENOMEM;
            }
            *out = sub;
            return 0;
        }
    }
    *out = obj;
    return 0;
}

int kvg_fields_json_set_text(const kvg_fields *t, kvg_json *obj, const char *key, size_t key_len,
                             const char *text, size_t text_len, kvg_fields_ctx *c)
{
    char fpath[PATH_MAX_LEN], kshown[SHOW_NAME_MAX + 4];
    size_t off;
    bool append;
    c->problem = KVG_FIELD_OK;
    const kvg_field *f =
        lookup_key(t, key, key_len, c->from, &off, &append, fpath, sizeof(fpath), "");
    if (!f || f->type == KVG_FIELD_CUSTOM) {
        show_name(key, key_len, kshown);
        vars v = {.path = kshown};
        return render(c, KVG_FIELD_UNKNOWN, "{path}: unknown field", &v);
    }
    kvg_json *holder;
    if (json_holder(t, obj, key, key_len, c->from, c->arena, &holder) < 0)
        return fail_nomem(c);
    kvg_json *cur = json_member(holder, f->name);
    kvg_json *node;
    int rc;
    if (append) {
        static const kvg_field item = {.type = KVG_FIELD_STRING};
        if ((rc = lex(&item, text, text_len, fpath, c, &node)) < 0)
            return rc;
        if (!cur) {
            cur = kvg_arena_alloc(c->arena, sizeof(*cur));
            if (!cur || json_add(c->arena, holder, f->name, cur) < 0)
                return fail_nomem(c);
            memset(cur, 0, sizeof(*cur));
            cur->type = KVG_JSON_ARRAY;
        }
        size_t n = cur->u.arr.count;
        if (f->max && n + 1 > f->max)
            return kvg_fields_fail(c, KVG_FIELD_RANGE, fpath, "more than %" PRIu64 " %s", f->max,
                                   f->name);
        kvg_json **items = kvg_arena_alloc(c->arena, (n + 1) * sizeof(kvg_json *));
        if (!items)
            return fail_nomem(c);
        if (n)
            memcpy(items, cur->u.arr.items, n * sizeof(kvg_json *));
        items[n] = node;
        cur->u.arr.items = items;
        cur->u.arr.count = n + 1;
        return 0;
    }
    if (cur)
        return kvg_fields_fail(c, KVG_FIELD_REPEATED, fpath, "appears more than once");
    if ((rc = lex(f, text, text_len, fpath, c, &node)) < 0 ||
        (rc = refuse_sign(f, node, fpath, c)) < 0)
        return rc;
    if (json_add(c->arena, holder, f->name, node) < 0)
        return fail_nomem(c);
    return 0;
}

/* ---- encoding -------------------------------------------------------------------------------- */

void kvg_buf_json_double(kvg_buf *b, double v)
{
    char tmp[40];
    if (!isfinite(v)) {
        kvg_buf_puts(b, "null");
        return;
    }
    if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        kvg_buf_printf(b, "%.0f", v + 0.0); /* + 0.0: -0 is written as 0 */
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    kvg_buf_puts(b, tmp);
}

static void put_key(kvg_buf *out, const char *name, bool *first)
{
    if (!*first)
        kvg_buf_putc(out, ',');
    *first = false;
    kvg_buf_json_string(out, name, strlen(name));
    kvg_buf_putc(out, ':');
}

static void encode_value(const kvg_field *f, const void *base, unsigned in, kvg_buf *out)
{
    switch (f->type) {
    case KVG_FIELD_STRING: {
        const char *s = load_ptr(base, f->offset);
        kvg_buf_json_string(out, s, strlen(s));
        break;
    }
    case KVG_FIELD_CHARS: {
        const char *s = cat(base, f->offset);
        kvg_buf_json_string(out, s, strnlen(s, f->max));
        break;
    }
    case KVG_FIELD_STRINGS:
    case KVG_FIELD_OBJECTS: {
        const char *items = load_ptr(base, f->offset);
        size_t n, size = f->type == KVG_FIELD_STRINGS ? sizeof(char *) : f->elem_size;
        memcpy(&n, cat(base, f->count_offset), sizeof(n));
        kvg_buf_putc(out, '[');
        for (size_t i = 0; i < n; i++) {
            if (i)
                kvg_buf_putc(out, ',');
            if (f->type == KVG_FIELD_OBJECTS) {
                kvg_fields_encode(f->object, items + i * size, in, out);
                continue;
            }
            const char *s = load_ptr(items, i * size);
            kvg_buf_json_string(out, s, strlen(s));
        }
        kvg_buf_putc(out, ']');
        break;
    }
    case KVG_FIELD_U32:
    case KVG_FIELD_U64:
    case KVG_FIELD_SIZE:
        kvg_buf_printf(out, "%" PRIu64, load_int(f, base));
        break;
    case KVG_FIELD_DOUBLE: {
        double d;
        memcpy(&d, cat(base, f->offset), sizeof(d));
        kvg_buf_json_double(out, d);
        break;
    }
    case KVG_FIELD_BOOL: {
        bool b;
        memcpy(&b, cat(base, f->offset), sizeof(b));
        kvg_buf_puts(out, b != ((f->flags & KVG_FIELD_NEGATE) != 0) ? "true" : "false");
        break;
    }
    case KVG_FIELD_ENUM: {
        size_t k = load_enum(f, base);
        if (k < f->nkeywords)
            kvg_buf_json_string(out, f->keywords[k], strlen(f->keywords[k]));
        else
            kvg_buf_puts(out, "null");
        break;
    }
    case KVG_FIELD_OBJECT:
        kvg_fields_encode(f->object, cat(base, f->offset), in, out);
        break;
    default:
        break;
    }
}

void kvg_fields_encode_members(const kvg_fields *t, const void *target, unsigned in, bool *first,
                               kvg_buf *out)
{
    for (size_t i = 0; i < t->count; i++) {
        const kvg_field *f = &t->fields[i];
        if (f->type == KVG_FIELD_EMBED) {
            kvg_fields_encode_members(f->object, cat(target, f->offset), in, first, out);
            continue;
        }
        if (!(f->set_in & in))
            continue;
        if (f->type == KVG_FIELD_STRING && !load_ptr(target, f->offset))
            continue;
        if (f->type == KVG_FIELD_CUSTOM) {
            /* The hook may leave the member out: take the key back then. */
            size_t mark = out->len;
            bool was_first = *first;
            put_key(out, f->name, first);
            if (!f->encode || !f->encode(target, out)) {
                out->len = mark;
                if (out->data)
                    out->data[mark] = '\0';
                *first = was_first;
            }
            continue;
        }
        put_key(out, f->name, first);
        encode_value(f, target, in, out);
    }
}

void kvg_fields_encode(const kvg_fields *t, const void *target, unsigned in, kvg_buf *out)
{
    bool first = true;
    kvg_buf_putc(out, '{');
    kvg_fields_encode_members(t, target, in, &first, out);
    kvg_buf_putc(out, '}');
}
