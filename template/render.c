/* SPDX-License-Identifier: Apache-2.0 */
/* The evaluator of compiled chat templates: Python's and Jinja2's semantics for the values a
 * chat template meets (str, int, float, bool, None, list, dict, Undefined), bounded per render. */
#include "tpl_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool tpl_py_space(uint32_t c);
uint32_t tpl_utf8_dec(const char *s, size_t n, size_t *len);

/* ---- name tables ----------------------------------------------------------------------------- */

typedef struct named {
    const char *name;
    int id;
} named;

static const named filters[] = {
    {"length", F_LENGTH},
    {"count", F_LENGTH},
    {"trim", F_TRIM},
    {"tojson", F_TOJSON},
    {"selectattr", F_SELECTATTR},
    {"rejectattr", F_REJECTATTR},
    {"select", F_SELECT},
    {"reject", F_REJECT},
    {"map", F_MAP},
    {"join", F_JOIN},
    {"items", F_ITEMS},
    {"list", F_LIST},
    {"first", F_FIRST},
    {"last", F_LAST},
    {"upper", F_UPPER},
    {"lower", F_LOWER},
    {"capitalize", F_CAPITALIZE},
    {"title", F_TITLE},
    {"replace", F_REPLACE},
    {"default", F_DEFAULT},
    {"d", F_DEFAULT},
    {"string", F_STRING},
    {"int", F_INT},
    {"float", F_FLOAT},
    {"abs", F_ABS},
    {"reverse", F_REVERSE},
    {"safe", F_SAFE},
    {NULL, 0},
};

static const named tests[] = {
    {"defined", T_DEFINED},
    {"undefined", T_UNDEFINED},
    {"none", T_NONE},
    {"string", T_STRING},
    {"number", T_NUMBER},
    {"integer", T_INTEGER},
    {"float", T_FLOAT},
    {"mapping", T_MAPPING},
    {"iterable", T_ITERABLE},
    {"sequence", T_SEQUENCE},
    {"boolean", T_BOOLEAN},
    {"true", T_TRUE},
    {"false", T_FALSE},
    {"eq", T_EQ},
    {"equalto", T_EQ},
    {"==", T_EQ},
    {"ne", T_NE},
    {"!=", T_NE},
    {"lt", T_LT},
    {"lessthan", T_LT},
    {"<", T_LT},
    {"le", T_LE},
    {"<=", T_LE},
    {"gt", T_GT},
    {"greaterthan", T_GT},
    {">", T_GT},
    {"ge", T_GE},
    {">=", T_GE},
    {"in", T_IN},
    {"odd", T_ODD},
    {"even", T_EVEN},
    {"divisibleby", T_DIVISIBLEBY},
    {"sameas", T_SAMEAS},
    {"lower", T_LOWER},
    {"upper", T_UPPER},
    {NULL, 0},
};

static const named globals[] = {
    {"namespace", G_NAMESPACE},
    {"raise_exception", G_RAISE},
    {"strftime_now", G_STRFTIME},
    {"range", G_RANGE},
    {"dict", G_DICT},
    {NULL, 0},
};

/* Methods of str and dict that a template may call. */
static const char *const methods[] = {
    "startswith", "endswith",   "split",   "strip", "lstrip", "rstrip", "upper", "lower",
    "title",      "capitalize", "replace", "items", "keys",   "values", "get",   NULL,
};

static int find_named(const named *t, const char *p, size_t n)
{
    for (size_t i = 0; t[i].name; i++)
        if (strlen(t[i].name) == n && memcmp(t[i].name, p, n) == 0)
            return t[i].id;
    return 0;
}

int tpl_filter_id(const char *p, size_t n)
{
    return find_named(filters, p, n);
}

int tpl_test_id(const char *p, size_t n)
{
    return find_named(tests, p, n);
}

int tpl_global_id(const char *p, size_t n)
{
    return find_named(globals, p, n);
}

bool tpl_method_known(const char *p, size_t n)
{
    for (size_t i = 0; methods[i]; i++)
        if (strlen(methods[i]) == n && memcmp(methods[i], p, n) == 0)
            return true;
    return false;
}

/* ---- render state ---------------------------------------------------------------------------- */

typedef struct var {
    struct var *next;
    tstr name;
    tval v;
} var;

typedef struct scope {
    struct scope *parent;
    var *vars;
} scope;

typedef struct rstate {
    const kvg_template *tpl;
    kvg_arena arena;
    kvg_buf *out;
    kvg_template_limits lim;
    int64_t now_s;
    uint64_t loops, steps;
    scope *sc;
    const tdict *ctx;
    int rc;
    char *err;
    size_t errlen;
    jmp_buf jb;
} rstate;

/* Errors leave through longjmp: all scratch is the render's arena, freed as a whole. */
static _Noreturn void rerr(rstate *rs, int rc, const node *at, const char *fmt, ...)
    KVG_PRINTF(4, 5);
static _Noreturn void rerr(rstate *rs, int rc, const node *at, const char *fmt, ...)
{
    rs->rc = rc;
    if (rs->errlen) {
        int n = 0;
        if (at)
            n = snprintf(rs->err, rs->errlen, "%u:%u: ", at->line, at->col);
        if (n >= 0 && (size_t)n < rs->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(rs->err + n, rs->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    longjmp(rs->jb, 1);
}

static void *ralloc(rstate *rs, size_t n)
{
    void *p = kvg_arena_alloc(&rs->arena, n ? n : 1);
    if (!p) {
        if (rs->arena.over_limit)
            rerr(rs, KVG_ELIMIT, NULL, "render scratch memory over the limit of %zu bytes",
                 rs->lim.max_memory);
        rerr(rs, -ENOMEM, NULL, "out of memory");
    }
    return p;
}

static void step(rstate *rs, const node *at)
{
    if (++rs->steps > rs->lim.max_steps)
        rerr(rs, KVG_ELIMIT, at, "more than %llu evaluation steps",
             (unsigned long long)rs->lim.max_steps);
}

static const char *type_name(const tval *v)
{
    switch (v->t) {
    case V_UNDEF:
        return "Undefined";
    case V_NONE:
        return "NoneType";
    case V_BOOL:
        return "bool";
    case V_INT:
        return "int";
    case V_FLOAT:
        return "float";
    case V_STR:
        return "str";
    case V_LIST:
        return "list";
    case V_DICT:
        return "dict";
    case V_NS:
        return "Namespace";
    case V_LOOP:
        return "LoopContext";
    default:
        return "function";
    }
}

static tval mk_undef(tstr name)
{
    tval v = {.t = V_UNDEF};
    v.u.s = name;
    return v;
}
static tval mk_none(void)
{
    return (tval){.t = V_NONE};
}
static tval mk_bool(bool b)
{
    tval v = {.t = V_BOOL};
    v.u.b = b;
    return v;
}
static tval mk_int(int64_t i)
{
    tval v = {.t = V_INT};
    v.u.i = i;
    return v;
}
static tval mk_float(double f)
{
    tval v = {.t = V_FLOAT};
    v.u.f = f;
    return v;
}
static tval mk_str(const char *p, size_t n)
{
    tval v = {.t = V_STR};
    v.u.s = (tstr){p, n};
    return v;
}
static tval mk_list(tlist *l)
{
    tval v = {.t = V_LIST};
    v.u.l = l;
    return v;
}

static tlist *new_list(rstate *rs, size_t n)
{
    tlist *l = ralloc(rs, sizeof(*l));
    l->n = n;
    l->v = ralloc(rs, (n ? n : 1) * sizeof(tval));
    l->tuple = false;
    return l;
}

static tdict *new_dict(rstate *rs, size_t cap)
{
    tdict *d = ralloc(rs, sizeof(*d));
    d->n = 0;
    d->cap = cap ? cap : 4;
    d->k = ralloc(rs, d->cap * sizeof(tstr));
    d->v = ralloc(rs, d->cap * sizeof(tval));
    return d;
}

static tval *dict_find(const tdict *d, const char *p, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].n == n && memcmp(d->k[i].p, p, n) == 0)
            return &d->v[i];
    return NULL;
}

/* Insert or replace, keeping a key's first position (Python's dict). */
static void dict_set(rstate *rs, tdict *d, tstr k, tval v)
{
    tval *old = dict_find(d, k.p, k.n);
    if (old) {
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap * 2;
        tstr *nk = ralloc(rs, cap * sizeof(*nk));
        tval *nv = ralloc(rs, cap * sizeof(*nv));
        memcpy(nk, d->k, d->n * sizeof(*nk));
        memcpy(nv, d->v, d->n * sizeof(*nv));
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

/* Strings a render builds: bounded by max_string, from the arena. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_reserve(rstate *rs, sbuf *b, size_t more)
{
    if (b->n + more > rs->lim.max_string)
        rerr(rs, KVG_ELIMIT, NULL, "a string over the limit of %zu bytes", rs->lim.max_string);
    if (b->n + more + 1 <= b->cap)
        return;
    /* The first reservation is exact (a concatenation knows its size); later ones double. */
    size_t cap = b->cap ? b->cap * 2 : KVG_MAX((size_t)32, more + 1);
    while (cap < b->n + more + 1)
        cap *= 2;
    char *p = ralloc(rs, cap);
    if (b->n)
        memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
}

static void sb_add(rstate *rs, sbuf *b, const char *p, size_t n)
{
    sb_reserve(rs, b, n);
    if (n)
        memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void sb_puts(rstate *rs, sbuf *b, const char *s)
{
    sb_add(rs, b, s, strlen(s));
}

static void sb_putc(rstate *rs, sbuf *b, char c)
{
    sb_add(rs, b, &c, 1);
}

static tval sb_val(sbuf *b)
{
    return mk_str(b->p ? b->p : "", b->n);
}

/* ---- Python str(), repr() and json.dumps ----------------------------------------------------- */

/* Python's repr of a float (the shortest string that reads back the same). */
static size_t fmt_float(double x, char *out)
{
    if (isnan(x))
        return (size_t)sprintf(out, "nan");
    if (isinf(x))
        return (size_t)sprintf(out, x < 0 ? "-inf" : "inf");
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*e", prec - 1, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    char digits[24];
    size_t nd = 0;
    const char *p = buf;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int e = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++)
                out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)e + 1 < nd) {
                for (size_t i = (size_t)e + 1; i < nd; i++)
                    out[o++] = digits[i];
            } else {
                out[o++] = '0';
            }
        } else {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -e - 1; i++)
                out[o++] = '0';
            for (size_t i = 0; i < nd; i++)
                out[o++] = digits[i];
        }
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++)
                out[o++] = digits[i];
        }
        o += (size_t)sprintf(out + o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    out[o] = '\0';
    return o;
}

static size_t fmt_int(int64_t v, char *out)
{
    return (size_t)sprintf(out, "%lld", (long long)v);
}

/* Approximates Python's str.isprintable() for repr: controls, separators and format
 * characters are escaped (unassigned code points are not known here). */
static bool py_printable(uint32_t c)
{
    if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD)
        return false;
    if (c == 0x1680 || c == 0x180E || (c >= 0x2000 && c <= 0x200F) ||
        (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x2064) || c == 0x3000 ||
        c == 0xFEFF || (c >= 0xE000 && c <= 0xF8FF) || c >= 0xF0000)
        return false;
    return true;
}

static void repr_str(rstate *rs, sbuf *b, tstr s)
{
    bool sq = memchr(s.p, '\'', s.n) != NULL, dq = memchr(s.p, '"', s.n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    sb_putc(rs, b, q);
    for (size_t i = 0; i < s.n;) {
        size_t l;
        uint32_t c = tpl_utf8_dec(s.p + i, s.n - i, &l);
        char e[16];
        if (c == (uint32_t)q || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            sb_add(rs, b, e, 2);
        } else if (c == '\n') {
            sb_add(rs, b, "\\n", 2);
        } else if (c == '\r') {
            sb_add(rs, b, "\\r", 2);
        } else if (c == '\t') {
            sb_add(rs, b, "\\t", 2);
        } else if (!py_printable(c)) {
            int n = c < 0x100     ? snprintf(e, sizeof(e), "\\x%02x", c)
                    : c < 0x10000 ? snprintf(e, sizeof(e), "\\u%04x", c)
                                  : snprintf(e, sizeof(e), "\\U%08x", c);
            sb_add(rs, b, e, (size_t)n);
        } else {
            sb_add(rs, b, s.p + i, l);
        }
        i += l;
    }
    sb_putc(rs, b, q);
}

static void to_str(rstate *rs, sbuf *b, const tval *v, size_t depth);

static void repr_val(rstate *rs, sbuf *b, const tval *v, size_t depth)
{
    if (v->t == V_STR)
        repr_str(rs, b, v->u.s);
    else if (v->t == V_UNDEF)
        sb_puts(rs, b, "Undefined");
    else
        to_str(rs, b, v, depth);
}

/* Python's str() of a value, as Jinja2 prints it. */
static void to_str(rstate *rs, sbuf *b, const tval *v, size_t depth)
{
    char num[40];
    if (depth > rs->lim.max_depth)
        rerr(rs, KVG_ELIMIT, NULL, "a value nested deeper than %zu", rs->lim.max_depth);
    switch (v->t) {
    case V_UNDEF:
        return;
    case V_NONE:
        sb_puts(rs, b, "None");
        return;
    case V_BOOL:
        sb_puts(rs, b, v->u.b ? "True" : "False");
        return;
    case V_INT:
        sb_add(rs, b, num, fmt_int(v->u.i, num));
        return;
    case V_FLOAT:
        sb_add(rs, b, num, fmt_float(v->u.f, num));
        return;
    case V_STR:
        sb_add(rs, b, v->u.s.p, v->u.s.n);
        return;
    case V_LIST:
        sb_putc(rs, b, v->u.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                sb_add(rs, b, ", ", 2);
            repr_val(rs, b, &v->u.l->v[i], depth + 1);
        }
        if (v->u.l->tuple && v->u.l->n == 1)
            sb_putc(rs, b, ',');
        sb_putc(rs, b, v->u.l->tuple ? ')' : ']');
        return;
    case V_DICT:
    case V_NS:
        if (v->t == V_NS)
            sb_puts(rs, b, "<Namespace ");
        sb_putc(rs, b, '{');
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i)
                sb_add(rs, b, ", ", 2);
            repr_str(rs, b, v->u.d->k[i]);
            sb_add(rs, b, ": ", 2);
            if (v->t == V_NS && v->u.d->v[i].t == V_NS)
                sb_puts(rs, b, "<Namespace>");
            else
                repr_val(rs, b, &v->u.d->v[i], depth + 1);
        }
        sb_putc(rs, b, '}');
        if (v->t == V_NS)
            sb_putc(rs, b, '>');
        return;
    case V_LOOP:
        sb_puts(rs, b, "<LoopContext>");
        return;
    default:
        sb_puts(rs, b, "<function>");
        return;
    }
}

static tstr str_of(rstate *rs, const tval *v)
{
    if (v->t == V_STR)
        return v->u.s;
    sbuf b = {0};
    to_str(rs, &b, v, 0);
    return (tstr){b.p ? b.p : "", b.n};
}

typedef struct jsonfmt {
    tstr indent;
    bool pretty;
    bool ascii;
    bool sort;
    tstr item_sep, key_sep;
} jsonfmt;

static void json_str(rstate *rs, sbuf *b, tstr s, bool ascii)
{
    sb_putc(rs, b, '"');
    size_t run = 0;
    for (size_t i = 0; i < s.n;) {
        unsigned char c = (unsigned char)s.p[i];
        char e[16];
        const char *esc = kvg_json_short_escape(c);
        size_t el = 2;
        if (esc) {
            /* two characters */
        } else if (c < 0x20) {
            el = (size_t)snprintf(e, sizeof(e), "\\u%04x", c);
            esc = e;
        } else if (c >= 0x80 && ascii) {
            size_t l;
            uint32_t cp = tpl_utf8_dec(s.p + i, s.n - i, &l);
            sb_add(rs, b, s.p + run, i - run);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                el = (size_t)snprintf(e, sizeof(e), "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                                      0xDC00 + (cp & 0x3FF));
            } else {
                el = (size_t)snprintf(e, sizeof(e), "\\u%04x", cp);
            }
            sb_add(rs, b, e, el);
            i += l;
            run = i;
            continue;
        }
        if (esc) {
            sb_add(rs, b, s.p + run, i - run);
            sb_add(rs, b, esc, el);
            run = i + 1;
        }
        i++;
    }
    sb_add(rs, b, s.p + run, s.n - run);
    sb_putc(rs, b, '"');
}

static void json_nl(rstate *rs, sbuf *b, const jsonfmt *f, size_t level)
{
    sb_putc(rs, b, '\n');
    for (size_t i = 0; i < level; i++)
        sb_add(rs, b, f->indent.p, f->indent.n);
}

static int key_cmp(const void *a, const void *b)
{
    const tstr *x = *(const tstr *const *)a, *y = *(const tstr *const *)b;
    int c = memcmp(x->p, y->p, KVG_MIN(x->n, y->n));
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* transformers' tojson: json.dumps(x, ensure_ascii=False, indent=..., separators=...,
 * sort_keys=...). */
static void to_json(rstate *rs, sbuf *b, const tval *v, const jsonfmt *f, size_t level,
                    const node *at)
{
    char num[40];
    if (level > rs->lim.max_depth)
        rerr(rs, KVG_ELIMIT, at, "a value nested deeper than %zu", rs->lim.max_depth);
    switch (v->t) {
    case V_NONE:
        sb_puts(rs, b, "null");
        return;
    case V_BOOL:
        sb_puts(rs, b, v->u.b ? "true" : "false");
        return;
    case V_INT:
        sb_add(rs, b, num, fmt_int(v->u.i, num));
        return;
    case V_FLOAT:
        if (isnan(v->u.f))
            sb_puts(rs, b, "NaN");
        else if (isinf(v->u.f))
            sb_puts(rs, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else
            sb_add(rs, b, num, fmt_float(v->u.f, num));
        return;
    case V_STR:
        json_str(rs, b, v->u.s, f->ascii);
        return;
    case V_LIST:
        if (v->u.l->n == 0) {
            sb_add(rs, b, "[]", 2);
            return;
        }
        sb_putc(rs, b, '[');
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                sb_add(rs, b, f->item_sep.p, f->item_sep.n);
            if (f->pretty)
                json_nl(rs, b, f, level + 1);
            to_json(rs, b, &v->u.l->v[i], f, level + 1, at);
        }
        if (f->pretty)
            json_nl(rs, b, f, level);
        sb_putc(rs, b, ']');
        return;
    case V_DICT: {
        const tdict *d = v->u.d;
        if (d->n == 0) {
            sb_add(rs, b, "{}", 2);
            return;
        }
        size_t *order = ralloc(rs, d->n * sizeof(*order));
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (f->sort) {
            const tstr **ks = ralloc(rs, d->n * sizeof(*ks));
            for (size_t i = 0; i < d->n; i++)
                ks[i] = &d->k[i];
            qsort(ks, d->n, sizeof(*ks), key_cmp);
            for (size_t i = 0; i < d->n; i++)
                order[i] = (size_t)(ks[i] - d->k);
        }
        sb_putc(rs, b, '{');
        for (size_t j = 0; j < d->n; j++) {
            size_t i = order[j];
            if (j)
                sb_add(rs, b, f->item_sep.p, f->item_sep.n);
            if (f->pretty)
                json_nl(rs, b, f, level + 1);
            json_str(rs, b, d->k[i], f->ascii);
            sb_add(rs, b, f->key_sep.p, f->key_sep.n);
            to_json(rs, b, &d->v[i], f, level + 1, at);
        }
        if (f->pretty)
            json_nl(rs, b, f, level);
        sb_putc(rs, b, '}');
        return;
    }
    default:
        rerr(rs, KVG_EPARSE, at, "Object of type %s is not JSON serializable", type_name(v));
    }
}

/* ---- truth, equality, order ----------------------------------------------------------------- */

static bool truthy(const tval *v)
{
    switch (v->t) {
    case V_UNDEF:
    case V_NONE:
        return false;
    case V_BOOL:
        return v->u.b;
    case V_INT:
        return v->u.i != 0;
    case V_FLOAT:
        return v->u.f != 0.0;
    case V_STR:
        return v->u.s.n != 0;
    case V_LIST:
        return v->u.l->n != 0;
    case V_DICT:
        return v->u.d->n != 0;
    default:
        return true;
    }
}

static bool is_num(const tval *v)
{
    return v->t == V_INT || v->t == V_BOOL || v->t == V_FLOAT;
}

static int64_t as_int(const tval *v)
{
    return v->t == V_BOOL ? (int64_t)v->u.b : v->u.i;
}

static double as_f(const tval *v)
{
    return v->t == V_FLOAT ? v->u.f : (double)as_int(v);
}

static bool equal(rstate *rs, const tval *a, const tval *b, size_t depth)
{
    if (depth > rs->lim.max_depth)
        rerr(rs, KVG_ELIMIT, NULL, "a value nested deeper than %zu", rs->lim.max_depth);
    if (is_num(a) && is_num(b)) {
        if (a->t == V_FLOAT || b->t == V_FLOAT)
            return as_f(a) == as_f(b);
        return as_int(a) == as_int(b);
    }
    if (a->t != b->t)
        return false;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE:
        return true;
    case V_STR:
        return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case V_LIST:
        if (a->u.l->n != b->u.l->n || a->u.l->tuple != b->u.l->tuple)
            return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!equal(rs, &a->u.l->v[i], &b->u.l->v[i], depth + 1))
                return false;
        return true;
    case V_DICT:
        if (a->u.d->n != b->u.d->n)
            return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            const tval *o = dict_find(b->u.d, a->u.d->k[i].p, a->u.d->k[i].n);
            if (!o || !equal(rs, &a->u.d->v[i], o, depth + 1))
                return false;
        }
        return true;
    default:
        return a->u.d == b->u.d;
    }
}

/* <0, 0, >0 for numbers and strings; a TypeError otherwise, as Python. */
static int order(rstate *rs, const tval *a, const tval *b, const node *at, const char *op)
{
    if (is_num(a) && is_num(b)) {
        if (a->t == V_FLOAT || b->t == V_FLOAT) {
            double x = as_f(a), y = as_f(b);
            return (x > y) - (x < y);
        }
        int64_t x = as_int(a), y = as_int(b);
        return (x > y) - (x < y);
    }
    if (a->t == V_STR && b->t == V_STR) {
        int c = memcmp(a->u.s.p, b->u.s.p, KVG_MIN(a->u.s.n, b->u.s.n));
        return c ? c : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
    }
    if (a->t == V_LIST && b->t == V_LIST && a->u.l->tuple == b->u.l->tuple) {
        /* Python's sequence order: the first items that differ decide, else the length. */
        size_t n = KVG_MIN(a->u.l->n, b->u.l->n);
        for (size_t i = 0; i < n; i++)
            if (!equal(rs, &a->u.l->v[i], &b->u.l->v[i], 0))
                return order(rs, &a->u.l->v[i], &b->u.l->v[i], at, op);
        return (a->u.l->n > b->u.l->n) - (a->u.l->n < b->u.l->n);
    }
    rerr(rs, KVG_EPARSE, at, "'%s' not supported between instances of '%s' and '%s'", op,
         type_name(a), type_name(b));
}

/* ---- strings by code point ------------------------------------------------------------------- */

static size_t cp_count(tstr s)
{
    size_t n = 0;
    for (size_t i = 0; i < s.n; i++)
        if (((unsigned char)s.p[i] & 0xC0) != 0x80)
            n++;
    return n;
}

static bool is_ascii(tstr s)
{
    for (size_t i = 0; i < s.n; i++)
        if ((unsigned char)s.p[i] >= 0x80)
            return false;
    return true;
}

/* Byte offsets of each code point of s (n + 1 entries), or NULL when s is ASCII. */
static size_t *cp_offsets(rstate *rs, tstr s, size_t *count)
{
    if (is_ascii(s)) {
        *count = s.n;
        return NULL;
    }
    size_t n = cp_count(s);
    size_t *o = ralloc(rs, (n + 1) * sizeof(*o));
    size_t k = 0;
    for (size_t i = 0; i < s.n; i++)
        if (((unsigned char)s.p[i] & 0xC0) != 0x80)
            o[k++] = i;
    o[k] = s.n;
    *count = n;
    return o;
}

static bool in_chars(tstr chars, uint32_t c)
{
    for (size_t i = 0; i < chars.n;) {
        size_t l;
        if (tpl_utf8_dec(chars.p + i, chars.n - i, &l) == c)
            return true;
        i += l;
    }
    return false;
}

/* Python's str.strip/lstrip/rstrip; chars NULL strips whitespace. */
static tstr py_strip(tstr s, const tstr *chars, bool left, bool right)
{
    size_t b = 0, e = s.n;
    if (left) {
        while (b < e) {
            size_t l;
            uint32_t c = tpl_utf8_dec(s.p + b, e - b, &l);
            if (chars ? !in_chars(*chars, c) : !tpl_py_space(c))
                break;
            b += l;
        }
    }
    if (right) {
        while (e > b) {
            size_t st = e - 1;
            while (st > b && ((unsigned char)s.p[st] & 0xC0) == 0x80)
                st--;
            size_t l;
            uint32_t c = tpl_utf8_dec(s.p + st, e - st, &l);
            if (chars ? !in_chars(*chars, c) : !tpl_py_space(c))
                break;
            e = st;
        }
    }
    return (tstr){s.p + b, e - b};
}

static const char *memmem_s(tstr h, tstr n, size_t from)
{
    if (n.n == 0)
        return h.p + from;
    if (from > h.n)
        return NULL;
    return memmem(h.p + from, h.n - from, n.p, n.n);
}

static tval py_split(rstate *rs, tstr s, const tval *sep, int64_t maxsplit, const node *at)
{
    size_t cap = 8, n = 0;
    tval *items = ralloc(rs, cap * sizeof(*items));
#define PUSH(p_, n_)                                                                               \
    do {                                                                                           \
        if (n == cap) {                                                                            \
            tval *ni = ralloc(rs, cap * 2 * sizeof(*ni));                                          \
            memcpy(ni, items, n * sizeof(*ni));                                                    \
            items = ni;                                                                            \
            cap *= 2;                                                                              \
        }                                                                                          \
        items[n++] = mk_str((p_), (n_));                                                           \
    } while (0)
    if (sep && sep->t == V_STR) {
        if (sep->u.s.n == 0)
            rerr(rs, KVG_EPARSE, at, "empty separator");
        size_t from = 0;
        for (;;) {
            const char *hit =
                maxsplit < 0 || (int64_t)n < maxsplit ? memmem_s(s, sep->u.s, from) : NULL;
            if (!hit) {
                PUSH(s.p + from, s.n - from);
                break;
            }
            PUSH(s.p + from, (size_t)(hit - s.p) - from);
            from = (size_t)(hit - s.p) + sep->u.s.n;
        }
    } else if (!sep || sep->t == V_NONE) {
        size_t i = 0;
        for (;;) {
            while (i < s.n) {
                size_t l;
                if (!tpl_py_space(tpl_utf8_dec(s.p + i, s.n - i, &l)))
                    break;
                i += l;
            }
            if (i >= s.n)
                break;
            if (maxsplit >= 0 && (int64_t)n >= maxsplit) {
                tstr rest = py_strip((tstr){s.p + i, s.n - i}, NULL, false, true);
                PUSH(rest.p, rest.n);
                break;
            }
            size_t st = i;
            while (i < s.n) {
                size_t l;
                if (tpl_py_space(tpl_utf8_dec(s.p + i, s.n - i, &l)))
                    break;
                i += l;
            }
            PUSH(s.p + st, i - st);
        }
    } else {
        rerr(rs, KVG_EPARSE, at, "must be str or None, not %s", type_name(sep));
    }
#undef PUSH
    tlist *l = ralloc(rs, sizeof(*l));
    l->n = n;
    l->v = items;
    l->tuple = false;
    return mk_list(l);
}

static tval py_replace(rstate *rs, tstr s, tstr old, tstr new, int64_t count)
{
    sbuf b = {0};
    if (old.n == 0) {
        /* Python inserts new before every character and at the end. */
        int64_t done = 0;
        for (size_t i = 0; i < s.n;) {
            if (count < 0 || done < count) {
                sb_add(rs, &b, new.p, new.n);
                done++;
            }
            size_t l = kvg_utf8_seq_len((const unsigned char *)s.p + i, s.n - i);
            if (!l)
                l = 1;
            sb_add(rs, &b, s.p + i, l);
            i += l;
        }
        if (count < 0 || done < count)
            sb_add(rs, &b, new.p, new.n);
        return sb_val(&b);
    }
    size_t from = 0;
    int64_t done = 0;
    for (;;) {
        const char *hit = count < 0 || done < count ? memmem_s(s, old, from) : NULL;
        if (!hit)
            break;
        sb_add(rs, &b, s.p + from, (size_t)(hit - s.p) - from);
        sb_add(rs, &b, new.p, new.n);
        from = (size_t)(hit - s.p) + old.n;
        done++;
    }
    if (done == 0)
        return mk_str(s.p, s.n);
    sb_add(rs, &b, s.p + from, s.n - from);
    return sb_val(&b);
}

/* Simple case mapping for ASCII, Latin-1, Greek and Cyrillic (Python maps every cased letter of
 * Unicode; docs/template.md): the other code points are returned as they are, and count as
 * uncased. *cased says whether c is a cased letter here. */
static uint32_t case_map(uint32_t c, bool upper, bool *cased)
{
    *cased = true;
    if (c < 0x80) {
        if (c >= 'a' && c <= 'z')
            return upper ? c - 32 : c;
        if (c >= 'A' && c <= 'Z')
            return upper ? c : c + 32;
    } else if ((c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) ||
               (c >= 0x430 && c <= 0x44F)) {
        return upper ? c - 32 : c;
    } else if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) ||
               (c >= 0x410 && c <= 0x42F)) {
        return upper ? c : c + 32;
    } else if (c >= 0x450 && c <= 0x45F) {
        return upper ? c - 80 : c;
    } else if (c >= 0x400 && c <= 0x40F) {
        return upper ? c : c + 80;
    } else if (c == 0xFF) {
        return upper ? 0x178 : c;
    } else if (c == 0x3C2) {
        return upper ? 0x3A3 : c;
    } else if (c == 0xB5) {
        return upper ? 0x39C : c;
    } else if (c == 0xDF) {
        return c; /* the caller writes "SS" or "Ss" */
    }
    *cased = false;
    return c;
}

/* str.upper/lower/capitalize/title ('u', 'l', 'c', 't'). */
static tval py_case(rstate *rs, tstr s, int mode)
{
    sbuf b = {0};
    sb_reserve(rs, &b, s.n + 8);
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s.n;) {
        size_t l;
        uint32_t c = tpl_utf8_dec(s.p + i, s.n - i, &l);
        bool up = mode == 'u' || (mode == 'c' && first) || (mode == 't' && !prev_cased);
        bool cased;
        uint32_t m = case_map(c, up, &cased);
        if (c == 0xDF && up) {
            sb_add(rs, &b, mode == 'u' ? "SS" : "Ss", 2);
        } else if (m == c) {
            sb_add(rs, &b, s.p + i, l);
        } else {
            unsigned char e[4];
            sb_add(rs, &b, (const char *)e, kvg_utf8_put(e, m));
        }
        prev_cased = cased;
        first = false;
        i += l;
    }
    return sb_val(&b);
}

/* ---- attribute and item access --------------------------------------------------------------- */

static tval loop_attr(rstate *rs, const loopst *lp, tstr name, const node *at)
{
#define IS(s) (name.n == strlen(s) && memcmp(name.p, s, name.n) == 0)
    if (IS("index0"))
        return mk_int(lp->index0);
    if (IS("index"))
        return mk_int(lp->index0 + 1);
    if (IS("revindex"))
        return mk_int(lp->length - lp->index0);
    if (IS("revindex0"))
        return mk_int(lp->length - lp->index0 - 1);
    if (IS("first"))
        return mk_bool(lp->index0 == 0);
    if (IS("last"))
        return mk_bool(lp->index0 == lp->length - 1);
    if (IS("length"))
        return mk_int(lp->length);
    if (IS("depth"))
        return mk_int(1);
    if (IS("depth0"))
        return mk_int(0);
    if (IS("previtem"))
        return lp->index0 > 0 ? lp->items->v[lp->index0 - 1] : mk_undef(name);
    if (IS("nextitem"))
        return lp->index0 + 1 < lp->length ? lp->items->v[lp->index0 + 1] : mk_undef(name);
#undef IS
    (void)rs;
    (void)at;
    return mk_undef(name);
}

static bool is_dict_method(tstr n)
{
    static const char *const m[] = {"items", "keys",  "values",  "get",        "pop",      "update",
                                    "copy",  "clear", "popitem", "setdefault", "fromkeys", NULL};
    for (size_t i = 0; m[i]; i++)
        if (strlen(m[i]) == n.n && memcmp(m[i], n.p, n.n) == 0)
            return true;
    return false;
}

/* Jinja2's environment.getattr: a Python attribute first, then the item; the attribute of
 * Undefined is an error (the default Undefined). */
static tval get_attr(rstate *rs, const tval *obj, tstr name, const node *at)
{
    switch (obj->t) {
    case V_UNDEF:
        if (obj->u.s.n)
            rerr(rs, KVG_EPARSE, at, "'%.*s' is undefined", (int)obj->u.s.n, obj->u.s.p);
        rerr(rs, KVG_EPARSE, at, "attribute '%.*s' of an undefined value", (int)name.n, name.p);
    case V_DICT:
        if (is_dict_method(name))
            rerr(rs, KVG_EPARSE, at,
                 "'%.*s' is a dict method in Jinja2; unsupported without a call (use ['%.*s'])",
                 (int)name.n, name.p, (int)name.n, name.p);
        __attribute__((fallthrough));
    case V_NS: {
        const tval *v = dict_find(obj->u.d, name.p, name.n);
        return v ? *v : mk_undef(name);
    }
    case V_LOOP:
        return loop_attr(rs, obj->u.lp, name, at);
    case V_STR:
        if (tpl_method_known(name.p, name.n))
            rerr(rs, KVG_EPARSE, at, "str method '%.*s' unsupported without a call", (int)name.n,
                 name.p);
        return mk_undef(name);
    default:
        return mk_undef(name);
    }
}

static bool slice_bound(rstate *rs, const tval *v, int64_t *out, const node *at)
{
    if (!v || v->t == V_NONE)
        return false;
    if (v->t != V_INT && v->t != V_BOOL)
        rerr(rs, KVG_EPARSE, at, "slice indices must be integers or None");
    *out = as_int(v);
    return true;
}

static tval get_item(rstate *rs, const tval *obj, const tval *key, const node *at)
{
    if (obj->t == V_UNDEF) {
        if (obj->u.s.n)
            rerr(rs, KVG_EPARSE, at, "'%.*s' is undefined", (int)obj->u.s.n, obj->u.s.p);
        rerr(rs, KVG_EPARSE, at, "subscript of an undefined value");
    }
    if ((obj->t == V_DICT || obj->t == V_NS) && key->t == V_STR) {
        const tval *v = dict_find(obj->u.d, key->u.s.p, key->u.s.n);
        if (v)
            return *v;
        if (obj->t == V_DICT && is_dict_method(key->u.s))
            rerr(rs, KVG_EPARSE, at, "'%.*s' is a dict method in Jinja2", (int)key->u.s.n,
                 key->u.s.p);
        return mk_undef(key->u.s);
    }
    if ((obj->t == V_LIST || obj->t == V_STR) && (key->t == V_INT || key->t == V_BOOL)) {
        int64_t i = as_int(key);
        size_t n;
        size_t *offs = NULL;
        if (obj->t == V_LIST)
            n = obj->u.l->n;
        else
            offs = cp_offsets(rs, obj->u.s, &n);
        if (i < 0)
            i += (int64_t)n;
        if (i < 0 || i >= (int64_t)n)
            return mk_undef((tstr){"item", 4});
        if (obj->t == V_LIST)
            return obj->u.l->v[i];
        if (!offs)
            return mk_str(obj->u.s.p + i, 1);
        return mk_str(obj->u.s.p + offs[i], offs[i + 1] - offs[i]);
    }
    if (obj->t == V_LOOP && key->t == V_STR)
        return loop_attr(rs, obj->u.lp, key->u.s, at);
    if (key->t == V_STR)
        return get_attr(rs, obj, key->u.s, at);
    return mk_undef((tstr){"item", 4});
}

static tval do_slice(rstate *rs, const tval *obj, const tval *b, const tval *c, const tval *d,
                     const node *at)
{
    if (obj->t == V_UNDEF)
        rerr(rs, KVG_EPARSE, at, "slice of an undefined value");
    /* Jinja2 compiles a slice to Python's own subscription, not to environment.getitem: what is
     * neither a list nor a string fails. */
    if (obj->t == V_DICT)
        rerr(rs, KVG_EPARSE, at, "unhashable type: 'slice'");
    if (obj->t != V_LIST && obj->t != V_STR)
        rerr(rs, KVG_EPARSE, at, "'%s' object is not subscriptable", type_name(obj));
    size_t n;
    size_t *offs = NULL;
    if (obj->t == V_LIST)
        n = obj->u.l->n;
    else
        offs = cp_offsets(rs, obj->u.s, &n);
    int64_t start = 0, stop = 0, stp = 1;
    if (slice_bound(rs, d, &stp, at) && stp == 0)
        rerr(rs, KVG_EPARSE, at, "slice step cannot be zero");
    int64_t len = (int64_t)n;
    bool hs = slice_bound(rs, b, &start, at), he = slice_bound(rs, c, &stop, at);
    /* Python's PySlice_AdjustIndices. */
    if (!hs)
        start = stp < 0 ? len - 1 : 0;
    else if (start < 0) {
        start += len;
        if (start < 0)
            start = stp < 0 ? -1 : 0;
    } else if (start >= len)
        start = stp < 0 ? len - 1 : len;
    if (!he)
        stop = stp < 0 ? -1 : len;
    else if (stop < 0) {
        stop += len;
        if (stop < 0)
            stop = stp < 0 ? -1 : 0;
    } else if (stop >= len)
        stop = stp < 0 ? len - 1 : len;
    size_t cnt = 0;
    if (stp > 0 && start < stop)
        cnt = (size_t)((stop - start - 1) / stp + 1);
    else if (stp < 0 && stop < start)
        cnt = (size_t)((start - stop - 1) / (-stp) + 1);
    if (obj->t == V_LIST) {
        if (stp == 1) {
            tlist *l = ralloc(rs, sizeof(*l));
            l->n = cnt;
            l->v = obj->u.l->v + (cnt ? start : 0);
            l->tuple = obj->u.l->tuple;
            return mk_list(l);
        }
        tlist *l = new_list(rs, cnt);
        l->tuple = obj->u.l->tuple;
        for (size_t i = 0; i < cnt; i++)
            l->v[i] = obj->u.l->v[start + (int64_t)i * stp];
        return mk_list(l);
    }
    if (stp == 1) {
        size_t bo = offs ? offs[start] : (size_t)start;
        size_t eo = offs ? offs[start + (int64_t)cnt] : (size_t)(start + (int64_t)cnt);
        return mk_str(obj->u.s.p + bo, cnt ? eo - bo : 0);
    }
    sbuf sb = {0};
    sb_reserve(rs, &sb, obj->u.s.n);
    for (size_t i = 0; i < cnt; i++) {
        int64_t k = start + (int64_t)i * stp;
        size_t bo = offs ? offs[k] : (size_t)k;
        size_t eo = offs ? offs[k + 1] : (size_t)k + 1;
        sb_add(rs, &sb, obj->u.s.p + bo, eo - bo);
    }
    return sb_val(&sb);
}

/* The items a for loop, a filter or list() walks: a list's items, a dict's keys, a string's
 * characters; Undefined is empty (Jinja2's Undefined iterates as nothing). */
static tlist *iter_items(rstate *rs, const tval *v, const node *at)
{
    switch (v->t) {
    case V_UNDEF: {
        tlist *l = new_list(rs, 0);
        return l;
    }
    case V_LIST:
        return v->u.l;
    case V_DICT: {
        tlist *l = new_list(rs, v->u.d->n);
        for (size_t i = 0; i < v->u.d->n; i++)
            l->v[i] = mk_str(v->u.d->k[i].p, v->u.d->k[i].n);
        return l;
    }
    case V_STR: {
        size_t n;
        size_t *offs = cp_offsets(rs, v->u.s, &n);
        tlist *l = new_list(rs, n);
        for (size_t i = 0; i < n; i++)
            l->v[i] =
                offs ? mk_str(v->u.s.p + offs[i], offs[i + 1] - offs[i]) : mk_str(v->u.s.p + i, 1);
        return l;
    }
    default:
        rerr(rs, KVG_EPARSE, at, "'%s' object is not iterable", type_name(v));
    }
}

static tlist *dict_items(rstate *rs, const tdict *d)
{
    tlist *l = new_list(rs, d->n);
    for (size_t i = 0; i < d->n; i++) {
        tlist *pair = new_list(rs, 2);
        pair->tuple = true;
        pair->v[0] = mk_str(d->k[i].p, d->k[i].n);
        pair->v[1] = d->v[i];
        l->v[i] = mk_list(pair);
    }
    return l;
}

/* ---- evaluation ------------------------------------------------------------------------------ */

static tval eval(rstate *rs, const node *nd);

static tval lookup(rstate *rs, tstr name)
{
    for (scope *s = rs->sc; s; s = s->parent)
        for (var *v = s->vars; v; v = v->next)
            if (v->name.n == name.n && memcmp(v->name.p, name.p, name.n) == 0)
                return v->v;
    const tval *c = rs->ctx ? dict_find(rs->ctx, name.p, name.n) : NULL;
    if (c)
        return *c;
    int g = tpl_global_id(name.p, name.n);
    if (g) {
        tval f = {.t = V_FUNC};
        f.u.fn = g;
        return f;
    }
    return mk_undef(name);
}

static void assign(rstate *rs, tstr name, tval val)
{
    for (var *v = rs->sc->vars; v; v = v->next)
        if (v->name.n == name.n && memcmp(v->name.p, name.p, name.n) == 0) {
            v->v = val;
            return;
        }
    var *v = ralloc(rs, sizeof(*v));
    v->name = name;
    v->v = val;
    v->next = rs->sc->vars;
    rs->sc->vars = v;
}

/* Arguments of a call, filter or test, evaluated: positional ones in pos, keyword ones by
 * name. */
typedef struct args {
    size_t npos;
    tval pos[8];
    size_t nkw;
    tstr kwn[8];
    tval kw[8];
} args;

static void eval_args(rstate *rs, const node *nd, args *a)
{
    a->npos = a->nkw = 0;
    if (nd->nkids > 8)
        rerr(rs, KVG_EPARSE, nd, "more than 8 arguments");
    for (size_t i = 0; i < nd->nkids; i++) {
        tval v = eval(rs, nd->kids[i]);
        if (nd->knames && nd->knames[i].p) {
            a->kwn[a->nkw] = nd->knames[i];
            a->kw[a->nkw++] = v;
        } else {
            a->pos[a->npos++] = v;
        }
    }
}

/* Argument i by position or by keyword name; NULL when absent. */
static const tval *arg(const args *a, size_t i, const char *name)
{
    if (i < a->npos)
        return &a->pos[i];
    for (size_t k = 0; k < a->nkw; k++)
        if (a->kwn[k].n == strlen(name) && memcmp(a->kwn[k].p, name, a->kwn[k].n) == 0)
            return &a->kw[k];
    return NULL;
}

static const tval *kwarg(const args *a, const char *name)
{
    for (size_t k = 0; k < a->nkw; k++)
        if (a->kwn[k].n == strlen(name) && memcmp(a->kwn[k].p, name, a->kwn[k].n) == 0)
            return &a->kw[k];
    return NULL;
}

static void check_args(rstate *rs, const node *nd, const args *a, size_t maxpos,
                       const char *const *kwnames, const char *what)
{
    if (a->npos > maxpos)
        rerr(rs, KVG_EPARSE, nd, "%s takes at most %zu positional arguments", what, maxpos);
    for (size_t k = 0; k < a->nkw; k++) {
        bool ok = false;
        for (size_t j = 0; kwnames && kwnames[j]; j++)
            if (a->kwn[k].n == strlen(kwnames[j]) &&
                memcmp(a->kwn[k].p, kwnames[j], a->kwn[k].n) == 0)
                ok = true;
        if (!ok)
            rerr(rs, KVG_EPARSE, nd, "%s got an unexpected keyword argument '%.*s'", what,
                 (int)a->kwn[k].n, a->kwn[k].p);
    }
}

static tstr need_str(rstate *rs, const tval *v, const node *at, const char *what)
{
    if (!v || v->t != V_STR)
        rerr(rs, KVG_EPARSE, at, "%s must be a string, not %s", what, v ? type_name(v) : "none");
    return v->u.s;
}

static int64_t need_int(rstate *rs, const tval *v, const node *at, const char *what)
{
    if (!v || (v->t != V_INT && v->t != V_BOOL))
        rerr(rs, KVG_EPARSE, at, "%s must be an integer", what);
    return as_int(v);
}

static bool run_test(rstate *rs, int id, const tval *v, const tval *targ, const node *at);
static tval apply_filter(rstate *rs, int id, const tval *v, const args *a, const node *at);

/* Jinja2's attrgetter for selectattr/map: dotted parts, each by getitem. */
static tval attr_path(rstate *rs, const tval *v, tstr path, const node *at)
{
    tval cur = *v;
    size_t i = 0;
    while (i <= path.n) {
        size_t j = i;
        while (j < path.n && path.p[j] != '.')
            j++;
        tstr part = {path.p + i, j - i};
        tval key = mk_str(part.p, part.n);
        bool digits = part.n > 0;
        for (size_t k = 0; k < part.n; k++)
            if (part.p[k] < '0' || part.p[k] > '9')
                digits = false;
        if (digits && part.n < 18) {
            uint64_t x;
            kvg_parse_u64(part.p, part.n, &x);
            key = mk_int((int64_t)x);
        }
        cur = get_item(rs, &cur, &key, at);
        i = j + 1;
    }
    return cur;
}

static bool run_test(rstate *rs, int id, const tval *v, const tval *targ, const node *at)
{
    switch (id) {
    case T_DEFINED:
        return v->t != V_UNDEF;
    case T_UNDEFINED:
        return v->t == V_UNDEF;
    case T_NONE:
        return v->t == V_NONE;
    case T_STRING:
        return v->t == V_STR;
    case T_NUMBER:
        return is_num(v);
    case T_INTEGER:
        return v->t == V_INT;
    case T_FLOAT:
        return v->t == V_FLOAT;
    case T_MAPPING:
        return v->t == V_DICT;
    case T_ITERABLE:
        return v->t == V_LIST || v->t == V_DICT || v->t == V_STR || v->t == V_UNDEF;
    case T_SEQUENCE:
        return v->t == V_LIST || v->t == V_DICT || v->t == V_STR || v->t == V_UNDEF;
    case T_BOOLEAN:
        return v->t == V_BOOL;
    case T_TRUE:
        return v->t == V_BOOL && v->u.b;
    case T_FALSE:
        return v->t == V_BOOL && !v->u.b;
    case T_ODD:
    case T_EVEN:
    case T_DIVISIBLEBY: {
        int64_t x = need_int(rs, v, at, "the tested value");
        if (id == T_ODD)
            return x % 2 != 0;
        if (id == T_EVEN)
            return x % 2 == 0;
        int64_t d = need_int(rs, targ, at, "divisibleby's argument");
        if (d == 0)
            rerr(rs, KVG_EPARSE, at, "integer division or modulo by zero");
        return x % d == 0;
    }
    case T_LOWER:
    case T_UPPER: {
        tstr s = str_of(rs, v);
        bool cased = false;
        for (size_t i = 0; i < s.n; i++) {
            char c = s.p[i];
            if ((id == T_LOWER && c >= 'A' && c <= 'Z') || (id == T_UPPER && c >= 'a' && c <= 'z'))
                return false;
            if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))
                cased = true;
        }
        return cased;
    }
    default:
        break;
    }
    if (!targ)
        rerr(rs, KVG_EPARSE, at, "the test needs an argument");
    switch (id) {
    case T_EQ:
        return equal(rs, v, targ, 0);
    case T_NE:
        return !equal(rs, v, targ, 0);
    case T_LT:
        return order(rs, v, targ, at, "<") < 0;
    case T_LE:
        return order(rs, v, targ, at, "<=") <= 0;
    case T_GT:
        return order(rs, v, targ, at, ">") > 0;
    case T_GE:
        return order(rs, v, targ, at, ">=") >= 0;
    case T_SAMEAS:
        if (v->t != targ->t)
            return false;
        if (v->t == V_NONE || v->t == V_UNDEF)
            return true;
        if (v->t == V_BOOL)
            return v->u.b == targ->u.b;
        return memcmp(&v->u, &targ->u, sizeof(v->u)) == 0;
    case T_IN: {
        tval r = *v;
        (void)r;
        break;
    }
    default:
        break;
    }
    /* T_IN */
    if (targ->t == V_STR) {
        tstr h = targ->u.s;
        tstr n = need_str(rs, v, at, "the left operand of 'in <string>'");
        return memmem_s(h, n, 0) != NULL;
    }
    if (targ->t == V_DICT || targ->t == V_NS) {
        if (v->t == V_LIST && !v->u.l->tuple)
            rerr(rs, KVG_EPARSE, at, "unhashable type: 'list'");
        if (v->t == V_DICT || v->t == V_NS)
            rerr(rs, KVG_EPARSE, at, "unhashable type: 'dict'");
        return v->t == V_STR && dict_find(targ->u.d, v->u.s.p, v->u.s.n) != NULL;
    }
    const tlist *l = iter_items(rs, targ, at);
    for (size_t i = 0; i < l->n; i++)
        if (equal(rs, v, &l->v[i], 0))
            return true;
    return false;
}

static tval apply_filter(rstate *rs, int id, const tval *v, const args *a, const node *at)
{
    switch (id) {
    case F_LENGTH:
        switch (v->t) {
        case V_UNDEF:
            return mk_int(0);
        case V_STR:
            return mk_int((int64_t)cp_count(v->u.s));
        case V_LIST:
            return mk_int((int64_t)v->u.l->n);
        case V_DICT:
            return mk_int((int64_t)v->u.d->n);
        default:
            rerr(rs, KVG_EPARSE, at, "object of type '%s' has no len()", type_name(v));
        }
    case F_TRIM: {
        static const char *const kw[] = {"chars", NULL};
        check_args(rs, at, a, 1, kw, "trim");
        const tval *ch = arg(a, 0, "chars");
        tstr chars;
        if (ch && ch->t != V_NONE)
            chars = need_str(rs, ch, at, "trim's chars");
        tstr s = py_strip(str_of(rs, v), ch && ch->t != V_NONE ? &chars : NULL, true, true);
        return mk_str(s.p, s.n);
    }
    case F_TOJSON: {
        static const char *const kw[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
        check_args(rs, at, a, 4, kw, "tojson");
        jsonfmt f = {.item_sep = {", ", 2}, .key_sep = {": ", 2}};
        const tval *ea = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"),
                   *sep = arg(a, 2, "separators"), *sk = arg(a, 3, "sort_keys");
        f.ascii = ea && truthy(ea);
        f.sort = sk && truthy(sk);
        if (ind && ind->t != V_NONE) {
            f.pretty = true;
            f.item_sep = (tstr){",", 1};
            if (ind->t == V_STR) {
                f.indent = ind->u.s;
            } else {
                int64_t n = need_int(rs, ind, at, "tojson's indent");
                if (n > 64)
                    rerr(rs, KVG_ELIMIT, at, "tojson indent over 64");
                char *sp = ralloc(rs, n > 0 ? (size_t)n : 1);
                memset(sp, ' ', n > 0 ? (size_t)n : 0);
                f.indent = (tstr){sp, n > 0 ? (size_t)n : 0};
            }
        }
        if (sep && sep->t != V_NONE) {
            if (sep->t != V_LIST || sep->u.l->n != 2 || sep->u.l->v[0].t != V_STR ||
                sep->u.l->v[1].t != V_STR)
                rerr(rs, KVG_EPARSE, at, "tojson's separators must be two strings");
            f.item_sep = sep->u.l->v[0].u.s;
            f.key_sep = sep->u.l->v[1].u.s;
        }
        sbuf b = {0};
        to_json(rs, &b, v, &f, 0, at);
        return sb_val(&b);
    }
    case F_SELECTATTR:
    case F_REJECTATTR:
    case F_SELECT:
    case F_REJECT: {
        bool attr = id == F_SELECTATTR || id == F_REJECTATTR;
        bool want = id == F_SELECTATTR || id == F_SELECT;
        size_t ti = attr ? 1 : 0;
        if (a->nkw)
            rerr(rs, KVG_EPARSE, at, "keyword arguments unsupported here");
        if (attr && a->npos < 1)
            rerr(rs, KVG_EPARSE, at, "selectattr needs an attribute name");
        int test = 0;
        if (a->npos > ti) {
            tstr tn = need_str(rs, &a->pos[ti], at, "the test name");
            test = tpl_test_id(tn.p, tn.n);
            if (!test)
                rerr(rs, KVG_EPARSE, at, "unsupported test '%.*s'", (int)tn.n, tn.p);
        }
        const tval *targ = a->npos > ti + 1 ? &a->pos[ti + 1] : NULL;
        /* Jinja2's select_or_reject starts with "if seq:": a false value selects nothing. */
        const tlist *in = truthy(v) ? iter_items(rs, v, at) : new_list(rs, 0);
        tlist *out = new_list(rs, in->n);
        out->n = 0;
        for (size_t i = 0; i < in->n; i++) {
            step(rs, at);
            tval x = attr ? attr_path(rs, &in->v[i], need_str(rs, &a->pos[0], at, "attribute"), at)
                          : in->v[i];
            bool ok = test ? run_test(rs, test, &x, targ, at) : truthy(&x);
            if (ok == want)
                out->v[out->n++] = in->v[i];
        }
        return mk_list(out);
    }
    case F_MAP: {
        /* Jinja2's do_map starts with "if value:" too. */
        const tlist *in = truthy(v) ? iter_items(rs, v, at) : new_list(rs, 0);
        tlist *out = new_list(rs, in->n);
        const tval *at_name = kwarg(a, "attribute");
        if (at_name) {
            static const char *const kw[] = {"attribute", "default", NULL};
            check_args(rs, at, a, 0, kw, "map");
            tstr path = need_str(rs, at_name, at, "map's attribute");
            const tval *def = kwarg(a, "default");
            for (size_t i = 0; i < in->n; i++) {
                step(rs, at);
                out->v[i] = attr_path(rs, &in->v[i], path, at);
                if (def && out->v[i].t == V_UNDEF)
                    out->v[i] = *def;
            }
            return mk_list(out);
        }
        if (a->npos < 1)
            rerr(rs, KVG_EPARSE, at, "map needs a filter name or attribute=");
        tstr fn = need_str(rs, &a->pos[0], at, "map's filter name");
        int fid = tpl_filter_id(fn.p, fn.n);
        if (!fid)
            rerr(rs, KVG_EPARSE, at, "unsupported filter '%.*s'", (int)fn.n, fn.p);
        args sub = *a;
        sub.npos = a->npos - 1;
        memmove(sub.pos, a->pos + 1, sub.npos * sizeof(tval));
        for (size_t i = 0; i < in->n; i++) {
            step(rs, at);
            out->v[i] = apply_filter(rs, fid, &in->v[i], &sub, at);
        }
        return mk_list(out);
    }
    case F_JOIN: {
        static const char *const kw[] = {"d", "attribute", NULL};
        check_args(rs, at, a, 2, kw, "join");
        const tval *d = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
        tstr sep = d ? str_of(rs, d) : (tstr){"", 0};
        const tlist *in = iter_items(rs, v, at);
        sbuf b = {0};
        for (size_t i = 0; i < in->n; i++) {
            if (i)
                sb_add(rs, &b, sep.p, sep.n);
            tval x = attr && attr->t != V_NONE
                         ? attr_path(rs, &in->v[i], need_str(rs, attr, at, "attribute"), at)
                         : in->v[i];
            to_str(rs, &b, &x, 0);
        }
        return sb_val(&b);
    }
    case F_ITEMS:
        if (v->t == V_UNDEF)
            return mk_list(new_list(rs, 0));
        if (v->t != V_DICT)
            rerr(rs, KVG_EPARSE, at, "can only get item pairs from a mapping");
        return mk_list(dict_items(rs, v->u.d));
    case F_LIST: {
        tlist *in = iter_items(rs, v, at);
        if (!in->tuple)
            return mk_list(in);
        tlist *out = new_list(rs, in->n);
        memcpy(out->v, in->v, in->n * sizeof(tval));
        return mk_list(out);
    }
    case F_FIRST:
    case F_LAST: {
        const tlist *in = iter_items(rs, v, at);
        if (in->n == 0)
            return mk_undef((tstr){id == F_FIRST ? "first" : "last", id == F_FIRST ? 5u : 4u});
        return in->v[id == F_FIRST ? 0 : in->n - 1];
    }
    case F_UPPER:
        return py_case(rs, str_of(rs, v), 'u');
    case F_LOWER:
        return py_case(rs, str_of(rs, v), 'l');
    case F_CAPITALIZE:
        return py_case(rs, str_of(rs, v), 'c');
    case F_TITLE:
        return py_case(rs, str_of(rs, v), 't');
    case F_REPLACE: {
        static const char *const kw[] = {"old", "new", "count", NULL};
        check_args(rs, at, a, 3, kw, "replace");
        const tval *o = arg(a, 0, "old"), *n = arg(a, 1, "new"), *c = arg(a, 2, "count");
        if (!o || !n)
            rerr(rs, KVG_EPARSE, at, "replace needs old and new");
        int64_t cnt = c && c->t != V_NONE ? need_int(rs, c, at, "replace's count") : -1;
        return py_replace(rs, str_of(rs, v), str_of(rs, o), str_of(rs, n), cnt);
    }
    case F_DEFAULT: {
        static const char *const kw[] = {"default_value", "boolean", NULL};
        check_args(rs, at, a, 2, kw, "default");
        const tval *d = arg(a, 0, "default_value"), *b = arg(a, 1, "boolean");
        bool use = v->t == V_UNDEF || (b && truthy(b) && !truthy(v));
        if (!use)
            return *v;
        return d ? *d : mk_str("", 0);
    }
    case F_STRING: {
        tstr s = str_of(rs, v);
        return mk_str(s.p, s.n);
    }
    case F_INT: {
        static const char *const kw[] = {"default", "base", NULL};
        check_args(rs, at, a, 2, kw, "int");
        const tval *d = arg(a, 0, "default"), *bs = arg(a, 1, "base");
        tval def = d ? *d : mk_int(0);
        if (v->t == V_UNDEF)
            rerr(rs, KVG_EPARSE, at, "int() of an undefined value");
        int base = bs ? (int)need_int(rs, bs, at, "int's base") : 10;
        if (v->t == V_INT)
            return *v;
        if (v->t == V_BOOL)
            return mk_int(v->u.b);
        if (v->t == V_FLOAT)
            return isfinite(v->u.f) && fabs(v->u.f) < 9.2e18 ? mk_int((int64_t)v->u.f) : def;
        if (v->t == V_STR) {
            tstr s = py_strip(v->u.s, NULL, true, true);
            char buf[64];
            if (s.n == 0 || s.n >= sizeof(buf))
                return def;
            memcpy(buf, s.p, s.n);
            buf[s.n] = '\0';
            char *end;
            errno = 0;
            long long x = strtoll(buf, &end, base);
            if (*end == '\0' && errno == 0)
                return mk_int(x);
            double f = strtod(buf, &end);
            if (*end == '\0' && isfinite(f) && fabs(f) < 9.2e18)
                return mk_int((int64_t)f);
        }
        return def;
    }
    case F_FLOAT: {
        static const char *const kw[] = {"default", NULL};
        check_args(rs, at, a, 1, kw, "float");
        const tval *d = arg(a, 0, "default");
        tval def = d ? *d : mk_float(0.0);
        if (v->t == V_UNDEF)
            rerr(rs, KVG_EPARSE, at, "float() of an undefined value");
        if (is_num(v))
            return mk_float(as_f(v));
        if (v->t == V_STR) {
            tstr s = py_strip(v->u.s, NULL, true, true);
            char buf[64];
            if (s.n == 0 || s.n >= sizeof(buf))
                return def;
            memcpy(buf, s.p, s.n);
            buf[s.n] = '\0';
            char *end;
            double f = strtod(buf, &end);
            if (*end == '\0')
                return mk_float(f);
        }
        return def;
    }
    case F_ABS:
        if (v->t == V_FLOAT)
            return mk_float(fabs(v->u.f));
        if (v->t == V_INT || v->t == V_BOOL) {
            int64_t x = as_int(v);
            if (x == INT64_MIN)
                rerr(rs, KVG_ELIMIT, at, "integer overflow");
            return mk_int(x < 0 ? -x : x);
        }
        rerr(rs, KVG_EPARSE, at, "bad operand type for abs(): '%s'", type_name(v));
    case F_REVERSE: {
        if (v->t == V_STR) {
            tval m1 = mk_int(-1);
            return do_slice(rs, v, NULL, NULL, &m1, at);
        }
        const tlist *in = iter_items(rs, v, at);
        tlist *out = new_list(rs, in->n);
        for (size_t i = 0; i < in->n; i++)
            out->v[i] = in->v[in->n - 1 - i];
        return mk_list(out);
    }
    case F_SAFE:
    default:
        return *v;
    }
}

static tval call_method(rstate *rs, const tval *obj, tstr m, const args *a, const node *at)
{
#define IS(s) (m.n == strlen(s) && memcmp(m.p, s, m.n) == 0)
    if (obj->t == V_UNDEF)
        get_attr(rs, obj, m, at); /* raises */
    if (obj->t == V_STR) {
        tstr s = obj->u.s;
        if (a->nkw && !IS("split"))
            rerr(rs, KVG_EPARSE, at, "keyword arguments unsupported for str.%.*s", (int)m.n, m.p);
        if (IS("startswith") || IS("endswith")) {
            if (a->npos != 1)
                rerr(rs, KVG_EPARSE, at, "%.*s takes one argument here", (int)m.n, m.p);
            const tval *p = &a->pos[0];
            size_t np = p->t == V_LIST ? p->u.l->n : 1;
            for (size_t i = 0; i < np; i++) {
                tstr x = need_str(rs, p->t == V_LIST ? &p->u.l->v[i] : p, at, "the prefix");
                if (x.n <= s.n && memcmp(IS("startswith") ? s.p : s.p + s.n - x.n, x.p, x.n) == 0)
                    return mk_bool(true);
            }
            return mk_bool(false);
        }
        if (IS("split")) {
            static const char *const kw[] = {"sep", "maxsplit", NULL};
            check_args(rs, at, a, 2, kw, "split");
            const tval *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
            return py_split(rs, s, sep, mx ? need_int(rs, mx, at, "maxsplit") : -1, at);
        }
        if (IS("strip") || IS("lstrip") || IS("rstrip")) {
            if (a->npos > 1)
                rerr(rs, KVG_EPARSE, at, "%.*s takes at most one argument", (int)m.n, m.p);
            tstr chars;
            bool has = a->npos == 1 && a->pos[0].t != V_NONE;
            if (has)
                chars = need_str(rs, &a->pos[0], at, "the characters to strip");
            tstr r = py_strip(s, has ? &chars : NULL, !IS("rstrip"), !IS("lstrip"));
            return mk_str(r.p, r.n);
        }
        if (IS("upper") || IS("lower") || IS("title") || IS("capitalize")) {
            if (a->npos)
                rerr(rs, KVG_EPARSE, at, "%.*s takes no arguments", (int)m.n, m.p);
            return py_case(rs, s, IS("upper") ? 'u' : IS("lower") ? 'l' : IS("title") ? 't' : 'c');
        }
        if (IS("replace")) {
            if (a->npos < 2 || a->npos > 3)
                rerr(rs, KVG_EPARSE, at, "replace takes 2 or 3 arguments");
            return py_replace(rs, s, need_str(rs, &a->pos[0], at, "old"),
                              need_str(rs, &a->pos[1], at, "new"),
                              a->npos == 3 ? need_int(rs, &a->pos[2], at, "count") : -1);
        }
    } else if (obj->t == V_DICT) {
        const tdict *d = obj->u.d;
        if (IS("items") || IS("keys") || IS("values")) {
            if (a->npos || a->nkw)
                rerr(rs, KVG_EPARSE, at, "%.*s takes no arguments", (int)m.n, m.p);
            if (IS("items"))
                return mk_list(dict_items(rs, d));
            tlist *l = new_list(rs, d->n);
            for (size_t i = 0; i < d->n; i++)
                l->v[i] = IS("keys") ? mk_str(d->k[i].p, d->k[i].n) : d->v[i];
            return mk_list(l);
        }
        if (IS("get")) {
            if (a->nkw || a->npos < 1 || a->npos > 2)
                rerr(rs, KVG_EPARSE, at, "get takes 1 or 2 arguments");
            const tval *v =
                a->pos[0].t == V_STR ? dict_find(d, a->pos[0].u.s.p, a->pos[0].u.s.n) : NULL;
            return v ? *v : a->npos == 2 ? a->pos[1] : mk_none();
        }
    }
    {
        tval attr = get_attr(rs, obj, m, at);
        (void)attr;
    }
    rerr(rs, KVG_EPARSE, at, "'%s' object has no method '%.*s'", type_name(obj), (int)m.n, m.p);
#undef IS
}

static tval call_global(rstate *rs, int g, const args *a, const node *at)
{
    switch (g) {
    case G_RAISE: {
        tstr msg = a->npos ? str_of(rs, &a->pos[0]) : (tstr){"", 0};
        rerr(rs, KVG_EPARSE, NULL, "raise_exception: %.*s", (int)KVG_MIN(msg.n, 4096), msg.p);
    }
    case G_NAMESPACE:
    case G_DICT: {
        tdict *d = new_dict(rs, a->nkw + 4);
        if (a->npos > 1)
            rerr(rs, KVG_EPARSE, at, "namespace() takes at most one positional argument");
        if (a->npos == 1) {
            if (a->pos[0].t != V_DICT)
                rerr(rs, KVG_EPARSE, at, "namespace()'s argument must be a mapping");
            for (size_t i = 0; i < a->pos[0].u.d->n; i++)
                dict_set(rs, d, a->pos[0].u.d->k[i], a->pos[0].u.d->v[i]);
        }
        for (size_t i = 0; i < a->nkw; i++)
            dict_set(rs, d, a->kwn[i], a->kw[i]);
        tval v = {.t = g == G_DICT ? V_DICT : V_NS};
        v.u.d = d;
        return v;
    }
    case G_STRFTIME: {
        if (a->npos != 1 || a->nkw)
            rerr(rs, KVG_EPARSE, at, "strftime_now takes one argument");
        tstr fmt = need_str(rs, &a->pos[0], at, "strftime_now's format");
        if (fmt.n > 256)
            rerr(rs, KVG_ELIMIT, at, "strftime_now format over 256 bytes");
        char f[260], out[1024];
        memcpy(f, fmt.p, fmt.n);
        f[fmt.n] = '\0';
        time_t t = rs->now_s >= 0 ? (time_t)rs->now_s : time(NULL);
        struct tm tm;
        gmtime_r(&t, &tm);
        /* The format is the template's, as Python's strftime takes it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        size_t n = fmt.n ? strftime(out, sizeof(out), f, &tm) : 0;
#pragma GCC diagnostic pop
        char *p = ralloc(rs, n + 1);
        memcpy(p, out, n);
        p[n] = '\0';
        return mk_str(p, n);
    }
    case G_RANGE: {
        if (a->nkw || a->npos < 1 || a->npos > 3)
            rerr(rs, KVG_EPARSE, at, "range takes 1 to 3 integers");
        int64_t start = 0, stop, stp = 1;
        if (a->npos == 1) {
            stop = need_int(rs, &a->pos[0], at, "range's stop");
        } else {
            start = need_int(rs, &a->pos[0], at, "range's start");
            stop = need_int(rs, &a->pos[1], at, "range's stop");
            if (a->npos == 3)
                stp = need_int(rs, &a->pos[2], at, "range's step");
        }
        if (stp == 0)
            rerr(rs, KVG_EPARSE, at, "range() arg 3 must not be zero");
        uint64_t cnt = 0;
        if (stp > 0 && start < stop)
            cnt = ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)stp + 1;
        else if (stp < 0 && stop < start)
            cnt = ((uint64_t)start - (uint64_t)stop - 1) / (uint64_t)(-stp) + 1;
        if (cnt > rs->lim.max_loop)
            rerr(rs, KVG_ELIMIT, at, "range of %llu items, over the loop limit",
                 (unsigned long long)cnt);
        tlist *l = new_list(rs, (size_t)cnt);
        for (uint64_t i = 0; i < cnt; i++)
            l->v[i] = mk_int(start + (int64_t)i * stp);
        return mk_list(l);
    }
    default:
        rerr(rs, KVG_EPARSE, at, "unsupported function");
    }
}

static tval binop(rstate *rs, int op, const tval *a, const tval *b, const node *at)
{
    switch (op) {
    case OP_EQ:
        return mk_bool(equal(rs, a, b, 0));
    case OP_NE:
        return mk_bool(!equal(rs, a, b, 0));
    case OP_LT:
        return mk_bool(order(rs, a, b, at, "<") < 0);
    case OP_LE:
        return mk_bool(order(rs, a, b, at, "<=") <= 0);
    case OP_GT:
        return mk_bool(order(rs, a, b, at, ">") > 0);
    case OP_GE:
        return mk_bool(order(rs, a, b, at, ">=") >= 0);
    case OP_IN:
    case OP_NOTIN: {
        if (b->t != V_STR && b->t != V_LIST && b->t != V_DICT && b->t != V_UNDEF && b->t != V_NS)
            rerr(rs, KVG_EPARSE, at, "argument of type '%s' is not iterable", type_name(b));
        if (b->t == V_NS)
            rerr(rs, KVG_EPARSE, at, "argument of type 'Namespace' is not iterable");
        bool r = run_test(rs, T_IN, a, b, at);
        return mk_bool(op == OP_IN ? r : !r);
    }
    case OP_CONCAT: {
        sbuf s = {0};
        to_str(rs, &s, a, 0);
        to_str(rs, &s, b, 0);
        return sb_val(&s);
    }
    default:
        break;
    }
    if (a->t == V_UNDEF || b->t == V_UNDEF) {
        const tval *u = a->t == V_UNDEF ? a : b;
        if (u->u.s.n)
            rerr(rs, KVG_EPARSE, at, "'%.*s' is undefined", (int)u->u.s.n, u->u.s.p);
        rerr(rs, KVG_EPARSE, at, "arithmetic on an undefined value");
    }
    static const char *const opname[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (is_num(a) && is_num(b)) {
        if (a->t == V_FLOAT || b->t == V_FLOAT || op == OP_DIV) {
            double x = as_f(a), y = as_f(b);
            switch (op) {
            case OP_ADD:
                return mk_float(x + y);
            case OP_SUB:
                return mk_float(x - y);
            case OP_MUL:
                return mk_float(x * y);
            case OP_DIV:
                if (y == 0)
                    rerr(rs, KVG_EPARSE, at, "division by zero");
                return mk_float(x / y);
            case OP_FLOORDIV:
                if (y == 0)
                    rerr(rs, KVG_EPARSE, at, "float floor division by zero");
                return mk_float(floor(x / y));
            case OP_MOD: {
                if (y == 0)
                    rerr(rs, KVG_EPARSE, at, "float modulo");
                double r = fmod(x, y);
                if (r != 0 && ((r < 0) != (y < 0)))
                    r += y;
                return mk_float(r);
            }
            case OP_POW:
                return mk_float(pow(x, y));
            }
        }
        int64_t x = as_int(a), y = as_int(b), r;
        switch (op) {
        case OP_ADD:
            if (__builtin_add_overflow(x, y, &r))
                rerr(rs, KVG_ELIMIT, at, "integer overflow");
            return mk_int(r);
        case OP_SUB:
            if (__builtin_sub_overflow(x, y, &r))
                rerr(rs, KVG_ELIMIT, at, "integer overflow");
            return mk_int(r);
        case OP_MUL:
            if (__builtin_mul_overflow(x, y, &r))
                rerr(rs, KVG_ELIMIT, at, "integer overflow");
            return mk_int(r);
        case OP_FLOORDIV:
        case OP_MOD: {
            if (y == 0)
                rerr(rs, KVG_EPARSE, at, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1)
                rerr(rs, KVG_ELIMIT, at, "integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return mk_int(op == OP_MOD ? m : q);
        }
        case OP_POW: {
            if (y < 0)
                return mk_float(pow((double)x, (double)y));
            int64_t acc = 1;
            for (int64_t i = 0; i < y; i++) {
                if (__builtin_mul_overflow(acc, x, &acc))
                    rerr(rs, KVG_ELIMIT, at, "integer overflow");
                if (acc == 0 || acc == 1)
                    break;
            }
            return mk_int(acc);
        }
        }
    }
    if (op == OP_ADD && a->t == V_STR && b->t == V_STR) {
        sbuf s = {0};
        sb_reserve(rs, &s, a->u.s.n + b->u.s.n);
        sb_add(rs, &s, a->u.s.p, a->u.s.n);
        sb_add(rs, &s, b->u.s.p, b->u.s.n);
        return sb_val(&s);
    }
    if (op == OP_ADD && a->t == V_LIST && b->t == V_LIST && a->u.l->tuple == b->u.l->tuple) {
        tlist *l = new_list(rs, a->u.l->n + b->u.l->n);
        l->tuple = a->u.l->tuple;
        memcpy(l->v, a->u.l->v, a->u.l->n * sizeof(tval));
        memcpy(l->v + a->u.l->n, b->u.l->v, b->u.l->n * sizeof(tval));
        return mk_list(l);
    }
    if (op == OP_MUL && ((a->t == V_STR && (b->t == V_INT || b->t == V_BOOL)) ||
                         (b->t == V_STR && (a->t == V_INT || a->t == V_BOOL)))) {
        const tval *s = a->t == V_STR ? a : b;
        int64_t n = as_int(a->t == V_STR ? b : a);
        sbuf o = {0};
        if (n > 0 && s->u.s.n && (uint64_t)n > rs->lim.max_string / s->u.s.n)
            rerr(rs, KVG_ELIMIT, at, "a string over the limit of %zu bytes", rs->lim.max_string);
        for (int64_t i = 0; i < n; i++)
            sb_add(rs, &o, s->u.s.p, s->u.s.n);
        return sb_val(&o);
    }
    if (op == OP_MUL && ((a->t == V_LIST && (b->t == V_INT || b->t == V_BOOL)) ||
                         (b->t == V_LIST && (a->t == V_INT || a->t == V_BOOL)))) {
        const tlist *l = a->t == V_LIST ? a->u.l : b->u.l;
        int64_t k = as_int(a->t == V_LIST ? b : a);
        if (k < 0)
            k = 0;
        if (l->n && (uint64_t)k > rs->lim.max_loop / l->n)
            rerr(rs, KVG_ELIMIT, at, "a list repeated past the loop limit");
        tlist *o = new_list(rs, l->n * (size_t)k);
        o->tuple = l->tuple;
        for (int64_t i = 0; i < k; i++)
            memcpy(o->v + (size_t)i * l->n, l->v, l->n * sizeof(tval));
        return mk_list(o);
    }
    rerr(rs, KVG_EPARSE, at, "unsupported operand type(s) for %s: '%s' and '%s'", opname[op],
         type_name(a), type_name(b));
}

static tval eval(rstate *rs, const node *nd)
{
    step(rs, nd);
    switch (nd->kind) {
    case N_LIT:
        return nd->lit;
    case N_NAME:
        return lookup(rs, nd->s);
    case N_ATTR: {
        tval o = eval(rs, nd->a);
        return get_attr(rs, &o, nd->s, nd);
    }
    case N_INDEX: {
        tval o = eval(rs, nd->a);
        tval k = eval(rs, nd->b);
        return get_item(rs, &o, &k, nd);
    }
    case N_SLICE: {
        tval o = eval(rs, nd->a);
        tval b, c, d;
        if (nd->b)
            b = eval(rs, nd->b);
        if (nd->c)
            c = eval(rs, nd->c);
        if (nd->d)
            d = eval(rs, nd->d);
        return do_slice(rs, &o, nd->b ? &b : NULL, nd->c ? &c : NULL, nd->d ? &d : NULL, nd);
    }
    case N_CALL: {
        args a;
        if (nd->a->kind == N_ATTR) {
            tval o = eval(rs, nd->a->a);
            eval_args(rs, nd, &a);
            return call_method(rs, &o, nd->a->s, &a, nd);
        }
        tval f = lookup(rs, nd->a->s);
        if (f.t != V_FUNC) {
            if (f.t == V_UNDEF)
                rerr(rs, KVG_EPARSE, nd, "'%.*s' is undefined", (int)nd->a->s.n, nd->a->s.p);
            rerr(rs, KVG_EPARSE, nd, "'%s' object is not callable", type_name(&f));
        }
        eval_args(rs, nd, &a);
        return call_global(rs, f.u.fn, &a, nd);
    }
    case N_FILTER: {
        tval v = eval(rs, nd->a);
        args a;
        eval_args(rs, nd, &a);
        return apply_filter(rs, nd->op, &v, &a, nd);
    }
    case N_TEST: {
        tval v = eval(rs, nd->a);
        args a;
        eval_args(rs, nd, &a);
        if (nd->nkids && nd->op != T_EQ && nd->op != T_NE && nd->op != T_LT && nd->op != T_LE &&
            nd->op != T_GT && nd->op != T_GE && nd->op != T_IN && nd->op != T_DIVISIBLEBY &&
            nd->op != T_SAMEAS)
            rerr(rs, KVG_EPARSE, nd, "test '%.*s' takes no argument", (int)nd->s.n, nd->s.p);
        bool r = run_test(rs, nd->op, &v, a.npos ? &a.pos[0] : NULL, nd);
        return mk_bool(nd->neg ? !r : r);
    }
    case N_BIN: {
        tval a = eval(rs, nd->a);
        tval b = eval(rs, nd->b);
        return binop(rs, nd->op, &a, &b, nd);
    }
    case N_UNARY: {
        tval a = eval(rs, nd->a);
        if (nd->op == 'n')
            return mk_bool(!truthy(&a));
        if (a.t == V_FLOAT)
            return mk_float(nd->op == '-' ? -a.u.f : a.u.f);
        if (a.t == V_INT || a.t == V_BOOL) {
            int64_t x = as_int(&a);
            if (nd->op == '-' && x == INT64_MIN)
                rerr(rs, KVG_ELIMIT, nd, "integer overflow");
            return mk_int(nd->op == '-' ? -x : x);
        }
        rerr(rs, KVG_EPARSE, nd, "bad operand type for unary %c: '%s'", nd->op, type_name(&a));
    }
    case N_AND: {
        tval a = eval(rs, nd->a);
        return truthy(&a) ? eval(rs, nd->b) : a;
    }
    case N_OR: {
        tval a = eval(rs, nd->a);
        return truthy(&a) ? a : eval(rs, nd->b);
    }
    case N_COND: {
        tval c = eval(rs, nd->a);
        if (truthy(&c))
            return eval(rs, nd->b);
        return nd->c ? eval(rs, nd->c) : mk_undef((tstr){NULL, 0});
    }
    case N_LIST: {
        tlist *l = new_list(rs, nd->nkids);
        l->tuple = nd->neg;
        for (size_t i = 0; i < nd->nkids; i++)
            l->v[i] = eval(rs, nd->kids[i]);
        return mk_list(l);
    }
    case N_CMPCHAIN: {
        tval a = eval(rs, nd->kids[0]), r = mk_bool(true);
        for (size_t i = 1; i < nd->nkids; i++) {
            tval b = eval(rs, nd->kids[i]);
            r = binop(rs, nd->ops[i - 1], &a, &b, nd);
            if (!truthy(&r))
                return r;
            a = b;
        }
        return r;
    }
    case N_DICT: {
        tdict *d = new_dict(rs, nd->nkids / 2 + 1);
        for (size_t i = 0; i + 1 < nd->nkids; i += 2) {
            tval k = eval(rs, nd->kids[i]);
            if (k.t != V_STR)
                rerr(rs, KVG_EPARSE, nd->kids[i], "unsupported dict key of type %s", type_name(&k));
            dict_set(rs, d, k.u.s, eval(rs, nd->kids[i + 1]));
        }
        tval v = {.t = V_DICT};
        v.u.d = d;
        return v;
    }
    default:
        rerr(rs, KVG_EPARSE, nd, "internal: not an expression");
    }
}

/* ---- statements ------------------------------------------------------------------------------ */

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

static void emit(rstate *rs, const char *p, size_t n, const node *at)
{
    if (n == 0)
        return; /* an empty value may have no bytes at all (p NULL): memcpy must not see it */
    if (rs->out->len + n > rs->lim.max_output)
        rerr(rs, KVG_ELIMIT, at, "output over the limit of %zu bytes", rs->lim.max_output);
    kvg_buf_append(rs->out, p, n);
    if (rs->out->failed)
        rerr(rs, -ENOMEM, at, "out of memory");
}

static int exec_body(rstate *rs, const node *body);

/* {{ a + b + c }} of strings, written piece by piece instead of built first: the chat templates'
 * turns are such chains around each message's content, and building them copies every
 * message several times. The leaves are evaluated left to right, as Python does; when one is not
 * a string the chain is folded with Python's + and the result printed as usual. False: the chain
 * is too long, nothing was evaluated. */
static bool emit_concat(rstate *rs, const node *nd)
{
    const node *leaves[16];
    size_t n = 0;
    const node *c = nd;
    while (c->kind == N_BIN && c->op == OP_ADD && n < KVG_ARRAY_LEN(leaves) - 1) {
        leaves[n++] = c->b;
        c = c->a;
    }
    if (c->kind == N_BIN && c->op == OP_ADD)
        return false;
    leaves[n++] = c;
    tval v[16];
    bool all_str = true;
    for (size_t i = 0; i < n; i++) {
        step(rs, nd);
        v[i] = eval(rs, leaves[n - 1 - i]);
        all_str = all_str && v[i].t == V_STR;
    }
    if (!all_str) {
        tval r = v[0];
        for (size_t i = 1; i < n; i++)
            r = binop(rs, OP_ADD, &r, &v[i], leaves[n - 1 - i]);
        sbuf b = {0};
        to_str(rs, &b, &r, 0);
        emit(rs, b.p, b.n, nd);
        return true;
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += v[i].u.s.n;
    if (total > rs->lim.max_string)
        rerr(rs, KVG_ELIMIT, nd, "a string over the limit of %zu bytes", rs->lim.max_string);
    for (size_t i = 0; i < n; i++)
        emit(rs, v[i].u.s.p, v[i].u.s.n, nd);
    return true;
}

static void do_set(rstate *rs, const node *target, tval v, const node *at)
{
    if (target->kind == N_NAME) {
        assign(rs, target->s, v);
        return;
    }
    tval ns = lookup(rs, target->a->s);
    if (ns.t != V_NS)
        rerr(rs, KVG_EPARSE, at, "cannot assign attribute on non-namespace object");
    dict_set(rs, ns.u.d, target->s, v);
}

static int exec_for(rstate *rs, const node *nd)
{
    tval it = eval(rs, nd->a);
    tlist *items = iter_items(rs, &it, nd->a);
    scope sc = {.parent = rs->sc};
    rs->sc = &sc;
    if (nd->d) {
        /* The loop filter runs before loop.* is known, as in Jinja2. */
        tlist *kept = new_list(rs, items->n);
        kept->n = 0;
        for (size_t i = 0; i < items->n; i++) {
            sc.vars = NULL;
            if (nd->nkids == 1)
                assign(rs, nd->kids[0]->s, items->v[i]);
            else {
                const tval *x = &items->v[i];
                if (x->t != V_LIST || x->u.l->n != nd->nkids)
                    rerr(rs, KVG_EPARSE, nd, "cannot unpack a loop item into %zu names", nd->nkids);
                for (size_t k = 0; k < nd->nkids; k++)
                    assign(rs, nd->kids[k]->s, x->u.l->v[k]);
            }
            tval c = eval(rs, nd->d);
            if (truthy(&c))
                kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    loopst *lp = ralloc(rs, sizeof(*lp));
    lp->length = (int64_t)items->n;
    lp->items = items;
    tval loopv = {.t = V_LOOP};
    loopv.u.lp = lp;
    for (size_t i = 0; i < items->n; i++) {
        if (++rs->loops > rs->lim.max_loop)
            rerr(rs, KVG_ELIMIT, nd, "more than %llu loop iterations",
                 (unsigned long long)rs->lim.max_loop);
        sc.vars = NULL;
        lp->index0 = (int64_t)i;
        assign(rs, (tstr){"loop", 4}, loopv);
        if (nd->nkids == 1) {
            assign(rs, nd->kids[0]->s, items->v[i]);
        } else {
            const tval *x = &items->v[i];
            if (x->t != V_LIST || x->u.l->n != nd->nkids)
                rerr(rs, KVG_EPARSE, nd, "cannot unpack a loop item into %zu names", nd->nkids);
            for (size_t k = 0; k < nd->nkids; k++)
                assign(rs, nd->kids[k]->s, x->u.l->v[k]);
        }
        int fl = exec_body(rs, nd->b);
        if (fl == FLOW_BREAK)
            break;
    }
    rs->sc = sc.parent;
    if (items->n == 0 && nd->c)
        return exec_body(rs, nd->c);
    return FLOW_NEXT;
}

static int exec_node(rstate *rs, const node *nd)
{
    step(rs, nd);
    switch (nd->kind) {
    case N_BODY:
        return exec_body(rs, nd);
    case N_TEXT:
        emit(rs, nd->s.p, nd->s.n, nd);
        return FLOW_NEXT;
    case N_OUTPUT: {
        if (nd->a->kind == N_BIN && nd->a->op == OP_ADD && emit_concat(rs, nd->a))
            return FLOW_NEXT;
        tval v = eval(rs, nd->a);
        if (v.t == V_STR) {
            emit(rs, v.u.s.p, v.u.s.n, nd);
        } else {
            sbuf b = {0};
            to_str(rs, &b, &v, 0);
            emit(rs, b.p, b.n, nd);
        }
        return FLOW_NEXT;
    }
    case N_IF:
        for (const node *c = nd; c;) {
            if (c->kind != N_IF)
                return exec_body(rs, c);
            tval v = eval(rs, c->a);
            if (truthy(&v))
                return exec_body(rs, c->b);
            c = c->c;
        }
        return FLOW_NEXT;
    case N_FOR:
        return exec_for(rs, nd);
    case N_SET:
        do_set(rs, nd->a, eval(rs, nd->b), nd);
        return FLOW_NEXT;
    case N_SETBLOCK: {
        kvg_buf *saved = rs->out;
        kvg_buf tmp;
        kvg_buf_init(&tmp);
        rs->out = &tmp;
        /* tmp is malloc'd: copy it into the arena before anything can jump out. */
        int fl;
        {
            jmp_buf outer;
            memcpy(outer, rs->jb, sizeof(jmp_buf));
            if (setjmp(rs->jb)) {
                kvg_buf_done(&tmp);
                rs->out = saved;
                memcpy(rs->jb, outer, sizeof(jmp_buf));
                longjmp(rs->jb, 1);
            }
            fl = exec_body(rs, nd->b);
            memcpy(rs->jb, outer, sizeof(jmp_buf));
        }
        rs->out = saved;
        char *p = kvg_arena_alloc(&rs->arena, tmp.len + 1);
        if (!p) {
            kvg_buf_done(&tmp);
            ralloc(rs, (size_t)-1 / 2); /* reports the limit or ENOMEM */
        }
        if (tmp.len)
            memcpy(p, tmp.data, tmp.len);
        p[tmp.len] = '\0';
        size_t n = tmp.len;
        kvg_buf_done(&tmp);
        do_set(rs, nd->a, mk_str(p, n), nd);
        return fl;
    }
    case N_BREAK:
        return FLOW_BREAK;
    case N_CONTINUE:
        return FLOW_CONTINUE;
    default:
        rerr(rs, KVG_EPARSE, nd, "internal: not a statement");
    }
}

static int exec_body(rstate *rs, const node *body)
{
    if (body->kind != N_BODY)
        return exec_node(rs, body);
    for (size_t i = 0; i < body->nkids; i++) {
        int fl = exec_node(rs, body->kids[i]);
        if (fl != FLOW_NEXT)
            return fl;
    }
    return FLOW_NEXT;
}

/* ---- the context ----------------------------------------------------------------------------- */

static int key_ptr_cmp(const void *a, const void *b)
{
    return key_cmp(a, b);
}

static tval from_json(rstate *rs, const kvg_json *j, size_t depth)
{
    if (depth > rs->lim.max_depth)
        rerr(rs, KVG_ELIMIT, NULL, "context nested deeper than %zu", rs->lim.max_depth);
    switch (j->type) {
    case KVG_JSON_NULL:
        return mk_none();
    case KVG_JSON_FALSE:
        return mk_bool(false);
    case KVG_JSON_TRUE:
        return mk_bool(true);
    case KVG_JSON_NUMBER:
        return j->u.num.is_int ? mk_int(j->u.num.ival) : mk_float(j->u.num.value);
    case KVG_JSON_STRING:
        return mk_str(j->u.str.ptr, j->u.str.len);
    case KVG_JSON_ARRAY: {
        tlist *l = new_list(rs, j->u.arr.count);
        for (size_t i = 0; i < j->u.arr.count; i++)
            l->v[i] = from_json(rs, j->u.arr.items[i], depth + 1);
        return mk_list(l);
    }
    case KVG_JSON_OBJECT:
    default: {
        size_t n = j->u.obj.count;
        tdict *d = ralloc(rs, sizeof(*d));
        d->n = d->cap = n;
        d->k = ralloc(rs, (n ? n : 1) * sizeof(tstr));
        d->v = ralloc(rs, (n ? n : 1) * sizeof(tval));
        for (size_t i = 0; i < n; i++) {
            d->k[i] = (tstr){j->u.obj.keys[i], j->u.obj.key_lens[i]};
            d->v[i] = from_json(rs, j->u.obj.values[i], depth + 1);
        }
        if (n > 1) {
            /* Python keeps one entry per key; refuse what would diverge rather than guess. */
            const tstr **ks = ralloc(rs, n * sizeof(*ks));
            for (size_t i = 0; i < n; i++)
                ks[i] = &d->k[i];
            qsort(ks, n, sizeof(*ks), key_ptr_cmp);
            for (size_t i = 1; i < n; i++)
                if (key_cmp(&ks[i - 1], &ks[i]) == 0)
                    rerr(rs, KVG_EPARSE, NULL, "duplicate key \"%.*s\" in the context",
                         (int)KVG_MIN(ks[i]->n, 64), ks[i]->p);
        }
        tval v = {.t = V_DICT};
        v.u.d = d;
        return v;
    }
    }
}

int kvg_template_render(const kvg_template *tpl, const kvg_json *ctx, const kvg_template_opts *opts,
                        kvg_buf *out, char *err, size_t errlen)
{
    if (errlen)
        err[0] = '\0';
    if (!ctx || ctx->type != KVG_JSON_OBJECT) {
        if (errlen)
            snprintf(err, errlen, "the context must be a JSON object");
        return KVG_ETYPE;
    }
    rstate *rs = calloc(1, sizeof(*rs));
    if (!rs) {
        if (errlen)
            snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    rs->tpl = tpl;
    rs->lim = tpl->limits;
    if (opts && opts->limits) {
        const kvg_template_limits *l = opts->limits;
        if (l->max_depth)
            rs->lim.max_depth = l->max_depth;
        if (l->max_output)
            rs->lim.max_output = l->max_output;
        if (l->max_string)
            rs->lim.max_string = l->max_string;
        if (l->max_memory)
            rs->lim.max_memory = l->max_memory;
        if (l->max_loop)
            rs->lim.max_loop = l->max_loop;
        if (l->max_steps)
            rs->lim.max_steps = l->max_steps;
    }
    rs->now_s = opts ? opts->now_s : -1;
    rs->out = out;
    rs->err = err;
    rs->errlen = errlen;
    kvg_arena_init(&rs->arena, 0);
    rs->arena.limit = rs->lim.max_memory;
    size_t len0 = out->len;
    scope root = {0};
    rs->sc = &root;
    int rc = 0;
    if (setjmp(rs->jb)) {
        rc = rs->rc;
        if (out->cap) {
            out->len = len0;
            out->data[len0] = '\0';
        }
    } else {
        tval c = from_json(rs, ctx, 0);
        rs->ctx = c.u.d;
        exec_body(rs, tpl->root);
    }
    kvg_arena_done(&rs->arena);
    free(rs);
    return rc;
}
