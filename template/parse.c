/* SPDX-License-Identifier: Apache-2.0 */
/* Lexer and parser of the chat-template Jinja subset: Jinja2's lexing rules as transformers
 * configures them (trim_blocks, lstrip_blocks, loop controls) and its expression grammar. */
#include "tpl_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum tkind {
    K_DATA,
    K_BLOCK_BEGIN,
    K_BLOCK_END,
    K_VAR_BEGIN,
    K_VAR_END,
    K_NAME,
    K_STRING,
    K_INT,
    K_FLOAT,
    K_OP,
    K_EOF,
} tkind;

typedef struct token {
    tkind kind;
    uint32_t line, col;
    tstr s; /* DATA: text; NAME, OP: the characters; STRING: decoded */
    int64_t ival;
    double fval;
} token;

typedef struct parser {
    kvg_template *tpl;
    const char *src;
    size_t len;
    token *toks;
    size_t ntok, cap;
    size_t pos;
    size_t depth;
    int rc;
    char *err;
    size_t errlen;
    jmp_buf jb;
} parser;

/* Errors leave through longjmp: every allocation is the template's arena, freed as a whole. */
static _Noreturn void perr(parser *ps, int rc, uint32_t line, uint32_t col, const char *fmt, ...)
    KVG_PRINTF(5, 6);
static _Noreturn void perr(parser *ps, int rc, uint32_t line, uint32_t col, const char *fmt, ...)
{
    ps->rc = rc;
    if (ps->errlen) {
        int n = snprintf(ps->err, ps->errlen, "%u:%u: ", line, col);
        if (n >= 0 && (size_t)n < ps->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    longjmp(ps->jb, 1);
}

static void *palloc(parser *ps, size_t n)
{
    void *p = kvg_arena_alloc(&ps->tpl->arena, n ? n : 1);
    if (!p)
        perr(ps, -ENOMEM, 0, 0, "out of memory");
    memset(p, 0, n);
    return p;
}

static void pos_of(parser *ps, size_t off, uint32_t *line, uint32_t *col)
{
    uint32_t l = 1, c = 1;
    for (size_t i = 0; i < off && i < ps->len; i++) {
        if (ps->src[i] == '\n') {
            l++;
            c = 1;
        } else if (((unsigned char)ps->src[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static token *push_tok(parser *ps, tkind k, size_t off)
{
    if (ps->ntok == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 256;
        token *t = palloc(ps, cap * sizeof(*t));
        if (ps->ntok)
            memcpy(t, ps->toks, ps->ntok * sizeof(*t));
        ps->toks = t;
        ps->cap = cap;
    }
    token *t = &ps->toks[ps->ntok++];
    memset(t, 0, sizeof(*t));
    t->kind = k;
    pos_of(ps, off, &t->line, &t->col);
    return t;
}

/* Python's str.isspace for one code point. */
bool tpl_py_space(uint32_t c);
bool tpl_py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

uint32_t tpl_utf8_dec(const char *s, size_t n, size_t *len);
uint32_t tpl_utf8_dec(const char *s, size_t n, size_t *len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t l = kvg_utf8_seq_len(u, n);
    if (l == 0) {
        *len = 1;
        return 0xFFFD;
    }
    *len = l;
    if (l == 1)
        return u[0];
    if (l == 2)
        return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    if (l == 3)
        return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 |
           (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
}

/* Length of [p, end) after Python's str.rstrip(). */
static size_t rstrip_len(const char *p, size_t n)
{
    while (n > 0) {
        size_t start = n - 1;
        while (start > 0 && ((unsigned char)p[start] & 0xC0) == 0x80)
            start--;
        size_t l;
        if (!tpl_py_space(tpl_utf8_dec(p + start, n - start, &l)))
            break;
        n = start;
    }
    return n;
}

/* Bytes of Python whitespace (regex \s) at the start of [p, p+n). */
static size_t lspace_len(const char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t l;
        if (!tpl_py_space(tpl_utf8_dec(p + i, n - i, &l)))
            break;
        i += l;
    }
    return i;
}

static bool is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Decode a string literal's body as Jinja2 does (Python's unicode-escape). */
static tstr decode_string(parser *ps, const char *p, size_t n, size_t off)
{
    char *o = palloc(ps, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c != '\\' || i + 1 >= n) {
            o[k++] = c;
            continue;
        }
        char e = p[++i];
        uint32_t cp = 0;
        int digits = 0;
        switch (e) {
        case '\n':
            continue;
        case '\\':
        case '\'':
        case '"':
            o[k++] = e;
            continue;
        case 'a':
            o[k++] = '\a';
            continue;
        case 'b':
            o[k++] = '\b';
            continue;
        case 'f':
            o[k++] = '\f';
            continue;
        case 'n':
            o[k++] = '\n';
            continue;
        case 'r':
            o[k++] = '\r';
            continue;
        case 't':
            o[k++] = '\t';
            continue;
        case 'v':
            o[k++] = '\v';
            continue;
        case 'x':
            digits = 2;
            break;
        case 'u':
            digits = 4;
            break;
        case 'U':
            digits = 8;
            break;
        case 'N': {
            uint32_t l, cc;
            pos_of(ps, off + i, &l, &cc);
            perr(ps, KVG_EPARSE, l, cc, "unsupported escape \\N{...} in a string");
        }
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int j = 0; j < 2 && i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '7'; j++)
                    cp = cp * 8 + (uint32_t)(p[++i] - '0');
                k += kvg_utf8_put((unsigned char *)o + k, cp);
                continue;
            }
            o[k++] = '\\';
            o[k++] = e;
            continue;
        }
        for (int j = 0; j < digits; j++) {
            int h = i + 1 < n ? kvg_hex_digit((unsigned char)p[i + 1]) : -1;
            if (h < 0) {
                uint32_t l, cc;
                pos_of(ps, off + i, &l, &cc);
                perr(ps, KVG_EPARSE, l, cc, "truncated \\%c escape in a string", e);
            }
            cp = cp << 4 | (uint32_t)h;
            i++;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            uint32_t l, cc;
            pos_of(ps, off + i, &l, &cc);
            perr(ps, KVG_EPARSE, l, cc, "escape to a surrogate or past U+10FFFF in a string");
        }
        k += kvg_utf8_put((unsigned char *)o + k, cp);
    }
    o[k] = '\0';
    return (tstr){o, k};
}

static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char ops1[] = "+-/*%~[](){}<>=.:|,;";

/* Lex the inside of a tag from i until its end marker; returns the offset after the end
 * (whitespace control and trim_blocks applied) and sets *line_start like Jinja2's lexer. */
static size_t lex_tag(parser *ps, size_t tag, size_t i, bool block, bool *line_start, bool comment)
{
    const char *s = ps->src;
    size_t n = ps->len;
    size_t open = i;
    if (comment) {
        for (; i + 1 < n; i++) {
            if (s[i] == '#' && s[i + 1] == '}') {
                bool minus = i > open && s[i - 1] == '-';
                size_t e = i + 2;
                if (minus)
                    e += lspace_len(s + e, n - e);
                else if (e < n && s[e] == '\n')
                    e++;
                *line_start = e > 0 && s[e - 1] == '\n';
                return e;
            }
        }
        uint32_t l, c;
        pos_of(ps, tag, &l, &c);
        perr(ps, KVG_EPARSE, l, c, "unterminated comment");
    }
    int depth = 0;
    for (;;) {
        while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
            i++;
        if (i >= n) {
            uint32_t l, c;
            pos_of(ps, tag, &l, &c);
            perr(ps, KVG_EPARSE, l, c, "unexpected end of template inside a tag");
        }
        /* The end marker ends the tag only outside brackets, as in Jinja2's lexer. */
        if (depth == 0) {
            char e = block ? '%' : '}';
            size_t j = i;
            bool minus = false, plus = false;
            if (s[j] == '-' && j + 2 < n + 0 && s[j + 1] == e && s[j + 2] == '}') {
                minus = true;
                j++;
            } else if (block && s[j] == '+' && j + 2 < n + 0 && s[j + 1] == e && s[j + 2] == '}') {
                plus = true;
                j++;
            }
            if (j + 1 < n && s[j] == e && s[j + 1] == '}') {
                push_tok(ps, block ? K_BLOCK_END : K_VAR_END, i);
                size_t end = j + 2;
                if (minus)
                    end += lspace_len(s + end, n - end);
                else if (block && !plus && end < n && s[end] == '\n')
                    end++;
                *line_start = s[end - 1] == '\n';
                return end;
            }
        }
        char c = s[i];
        if (is_name_start(c)) {
            size_t j = i;
            while (j < n && (is_name_start(s[j]) || is_digit(s[j])))
                j++;
            token *t = push_tok(ps, K_NAME, i);
            t->s = (tstr){s + i, j - i};
            i = j;
            continue;
        }
        if (is_digit(c)) {
            size_t j = i;
            while (j < n && (is_digit(s[j]) || (s[j] == '_' && j + 1 < n && is_digit(s[j + 1]))))
                j++;
            bool fl = false;
            if (j + 1 < n && s[j] == '.' && is_digit(s[j + 1])) {
                fl = true;
                j++;
                while (j < n &&
                       (is_digit(s[j]) || (s[j] == '_' && j + 1 < n && is_digit(s[j + 1]))))
                    j++;
            }
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < n && (s[k] == '+' || s[k] == '-'))
                    k++;
                if (k < n && is_digit(s[k])) {
                    fl = true;
                    j = k;
                    while (j < n && is_digit(s[j]))
                        j++;
                }
            }
            char buf[64];
            size_t bl = 0;
            for (size_t k = i; k < j && bl < sizeof(buf) - 1; k++)
                if (s[k] != '_')
                    buf[bl++] = s[k];
            buf[bl] = '\0';
            token *t = push_tok(ps, fl ? K_FLOAT : K_INT, i);
            if (fl) {
                t->fval = strtod(buf, NULL);
            } else {
                uint64_t v;
                if (bl >= sizeof(buf) - 1 || kvg_parse_u64(buf, bl, &v) != 0 || v > INT64_MAX)
                    perr(ps, KVG_EPARSE, t->line, t->col, "integer literal too large");
                t->ival = (int64_t)v;
            }
            i = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != c) {
                if (s[j] == '\\')
                    j++;
                j++;
            }
            if (j >= n) {
                uint32_t l, cc;
                pos_of(ps, i, &l, &cc);
                perr(ps, KVG_EPARSE, l, cc, "unterminated string");
            }
            token *t = push_tok(ps, K_STRING, i);
            t->s = decode_string(ps, s + i + 1, j - i - 1, i + 1);
            i = j + 1;
            continue;
        }
        size_t ol = 0;
        for (int k = 0; ops2[k]; k++)
            if (i + 1 < n && s[i] == ops2[k][0] && s[i + 1] == ops2[k][1])
                ol = 2;
        if (!ol && strchr(ops1, c) && c != '\0')
            ol = 1;
        if (!ol) {
            uint32_t l, cc;
            pos_of(ps, i, &l, &cc);
            perr(ps, KVG_EPARSE, l, cc, "unexpected character '%c'", c);
        }
        if (ol == 1 && (c == '(' || c == '[' || c == '{'))
            depth++;
        else if (ol == 1 && (c == ')' || c == ']' || c == '}'))
            depth--;
        token *t = push_tok(ps, K_OP, i);
        t->s = (tstr){s + i, ol};
        i += ol;
    }
}

static void lex(parser *ps)
{
    const char *s = ps->src;
    size_t n = ps->len;
    size_t i = 0;
    bool line_start = true;
    while (i < n) {
        /* Find the next tag start. */
        size_t j = i;
        while (j + 1 < n &&
               !(s[j] == '{' && (s[j + 1] == '{' || s[j + 1] == '%' || s[j + 1] == '#')))
            j++;
        if (j + 1 >= n)
            j = n;
        size_t tlen = j - i;
        if (j < n) {
            char kind = s[j + 1];
            char ctl = j + 2 < n ? s[j + 2] : 0;
            if (ctl == '-') {
                tlen = rstrip_len(s + i, tlen);
            } else if (ctl != '+' && kind != '{') {
                /* lstrip_blocks: blanks between the line's start and a block or comment tag. */
                size_t l = tlen;
                while (l > 0 && s[i + l - 1] != '\n')
                    l--;
                if (l > 0 || line_start) {
                    bool blank = true;
                    for (size_t k = i + l; k < j; k++)
                        if (s[k] != ' ' && s[k] != '\t')
                            blank = false;
                    if (blank)
                        tlen = l;
                }
            }
        }
        if (tlen > 0) {
            token *t = push_tok(ps, K_DATA, i);
            t->s = (tstr){s + i, tlen};
        }
        if (j >= n)
            break;
        char kind = s[j + 1];
        size_t k = j + 2;
        if (k < n && (s[k] == '-' || (s[k] == '+' && kind != '{')))
            k++;
        if (kind == '#') {
            i = lex_tag(ps, j, k, true, &line_start, true);
            continue;
        }
        push_tok(ps, kind == '%' ? K_BLOCK_BEGIN : K_VAR_BEGIN, j);
        i = lex_tag(ps, j, k, kind == '%', &line_start, false);
    }
    push_tok(ps, K_EOF, n);
}

/* ---- parser -------------------------------------------------------------------------------- */

static token *peek(parser *ps)
{
    return &ps->toks[ps->pos];
}

static token *peek2(parser *ps)
{
    return ps->pos + 1 < ps->ntok ? &ps->toks[ps->pos + 1] : &ps->toks[ps->ntok - 1];
}

static token *next(parser *ps)
{
    token *t = &ps->toks[ps->pos];
    if (t->kind != K_EOF)
        ps->pos++;
    return t;
}

static bool is_op(const token *t, const char *op)
{
    return t->kind == K_OP && t->s.n == strlen(op) && memcmp(t->s.p, op, t->s.n) == 0;
}

static bool is_name(const token *t, const char *name)
{
    return t->kind == K_NAME && t->s.n == strlen(name) && memcmp(t->s.p, name, t->s.n) == 0;
}

static const char *tok_desc(const token *t)
{
    switch (t->kind) {
    case K_DATA:
        return "template data";
    case K_BLOCK_BEGIN:
        return "'{%'";
    case K_BLOCK_END:
        return "end of statement block";
    case K_VAR_BEGIN:
        return "'{{'";
    case K_VAR_END:
        return "end of print statement";
    case K_NAME:
        return "name";
    case K_STRING:
        return "string";
    case K_INT:
    case K_FLOAT:
        return "number";
    case K_OP:
        return "operator";
    case K_EOF:
    default:
        return "end of template";
    }
}

static void expect_op(parser *ps, const char *op)
{
    token *t = next(ps);
    if (!is_op(t, op))
        perr(ps, KVG_EPARSE, t->line, t->col, "expected '%s', got %s", op, tok_desc(t));
}

static void expect_kind(parser *ps, tkind k, const char *what)
{
    token *t = next(ps);
    if (t->kind != k)
        perr(ps, KVG_EPARSE, t->line, t->col, "expected %s, got %s", what, tok_desc(t));
}

static node *mk(parser *ps, nkind k, const token *at)
{
    node *nd = palloc(ps, sizeof(*nd));
    nd->kind = (uint8_t)k;
    nd->line = at->line;
    nd->col = at->col;
    return nd;
}

typedef struct nvec {
    node **v;
    tstr *names;
    size_t n, cap;
} nvec;

static void nvec_push(parser *ps, nvec *nv, node *nd, tstr name)
{
    if (nv->n == nv->cap) {
        size_t cap = nv->cap ? nv->cap * 2 : 8;
        node **v = palloc(ps, cap * sizeof(*v));
        tstr *nm = palloc(ps, cap * sizeof(*nm));
        if (nv->n) {
            memcpy(v, nv->v, nv->n * sizeof(*v));
            memcpy(nm, nv->names, nv->n * sizeof(*nm));
        }
        nv->v = v;
        nv->names = nm;
        nv->cap = cap;
    }
    nv->v[nv->n] = nd;
    nv->names[nv->n] = name;
    nv->n++;
}

static void enter(parser *ps, const token *at)
{
    if (++ps->depth > ps->tpl->limits.max_depth)
        perr(ps, KVG_ELIMIT, at->line, at->col, "nested deeper than %zu",
             ps->tpl->limits.max_depth);
}

static node *parse_expr(parser *ps);
static node *parse_unary(parser *ps, bool with_filter);
static node *parse_primary(parser *ps);

/* Call arguments after '(' up to ')': positional then keyword (name=value). */
static void parse_args(parser *ps, node *nd)
{
    nvec nv = {0};
    bool kw = false;
    while (!is_op(peek(ps), ")")) {
        if (nv.n)
            expect_op(ps, ",");
        if (is_op(peek(ps), ")"))
            break;
        tstr name = {NULL, 0};
        if (peek(ps)->kind == K_NAME && is_op(peek2(ps), "=")) {
            name = next(ps)->s;
            next(ps);
            kw = true;
        } else if (kw) {
            token *t = peek(ps);
            perr(ps, KVG_EPARSE, t->line, t->col, "positional argument after keyword argument");
        }
        nvec_push(ps, &nv, parse_expr(ps), name);
    }
    expect_op(ps, ")");
    nd->kids = nv.v;
    nd->knames = nv.names;
    nd->nkids = nv.n;
}

static node *parse_postfix(parser *ps, node *nd)
{
    for (;;) {
        token *t = peek(ps);
        if (is_op(t, ".")) {
            next(ps);
            token *nm = next(ps);
            if (nm->kind == K_INT) {
                node *ix = mk(ps, N_INDEX, t);
                ix->a = nd;
                ix->b = mk(ps, N_LIT, nm);
                ix->b->lit.t = V_INT;
                ix->b->lit.u.i = nm->ival;
                nd = ix;
                continue;
            }
            if (nm->kind != K_NAME)
                perr(ps, KVG_EPARSE, nm->line, nm->col, "expected an attribute name after '.'");
            node *at = mk(ps, N_ATTR, nm);
            at->a = nd;
            at->s = nm->s;
            nd = at;
        } else if (is_op(t, "[")) {
            next(ps);
            node *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                token *u = peek(ps);
                if (is_op(u, ":")) {
                    next(ps);
                    slice = true;
                    if (++np > 2)
                        perr(ps, KVG_EPARSE, u->line, u->col, "too many ':' in a subscript");
                    continue;
                }
                if (is_op(u, "]"))
                    break;
                if (parts[np])
                    perr(ps, KVG_EPARSE, u->line, u->col, "expected ']' or ':'");
                parts[np] = parse_expr(ps);
            }
            expect_op(ps, "]");
            node *ix = mk(ps, slice ? N_SLICE : N_INDEX, t);
            ix->a = nd;
            if (!slice && !parts[0])
                perr(ps, KVG_EPARSE, t->line, t->col, "empty subscript");
            ix->b = parts[0];
            ix->c = parts[1];
            ix->d = parts[2];
            nd = ix;
        } else if (is_op(t, "(")) {
            next(ps);
            node *call = mk(ps, N_CALL, t);
            call->a = nd;
            parse_args(ps, call);
            if (nd->kind == N_NAME) {
                call->op = tpl_global_id(nd->s.p, nd->s.n);
                if (!call->op)
                    perr(ps, KVG_EPARSE, nd->line, nd->col, "unsupported function '%.*s'",
                         (int)nd->s.n, nd->s.p);
            } else if (nd->kind == N_ATTR) {
                if (!tpl_method_known(nd->s.p, nd->s.n))
                    perr(ps, KVG_EPARSE, nd->line, nd->col, "unsupported method '%.*s'",
                         (int)nd->s.n, nd->s.p);
            } else {
                perr(ps, KVG_EPARSE, t->line, t->col, "unsupported call of an expression");
            }
            nd = call;
        } else {
            return nd;
        }
    }
}

/* Jinja2's parse_test: a test takes one argument without parentheses when a name (but else, or,
 * and), a string, a number, '[' or '{' follows; that argument is a primary with its postfix
 * (so "x is none if y" reads "if" as a name, and "x is false - 1" subtracts). */
static bool test_arg_follows(parser *ps)
{
    token *t = peek(ps);
    if (t->kind == K_STRING || t->kind == K_INT || t->kind == K_FLOAT)
        return true;
    if (is_op(t, "[") || is_op(t, "{"))
        return true;
    if (t->kind == K_NAME)
        return !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and");
    return false;
}

/* A filter or test name, dotted as Jinja2 reads it ("a.b"): the dots only name a filter no
 * chat template has, so they end up refused by name. */
static tstr dotted_name(parser *ps, const token *nm)
{
    tstr s = nm->s;
    while (is_op(peek(ps), ".") && peek2(ps)->kind == K_NAME) {
        next(ps);
        token *part = next(ps);
        s.n = (size_t)(part->s.p + part->s.n - s.p);
    }
    return s;
}

/* Filters ('|'), tests ('is') and calls after a unary expression, as Jinja2's
 * parse_filter_expr. */
static node *parse_filter_expr(parser *ps, node *nd)
{
    for (;;) {
        token *t = peek(ps);
        if (is_op(t, "|")) {
            next(ps);
            token *nm = next(ps);
            if (nm->kind != K_NAME)
                perr(ps, KVG_EPARSE, nm->line, nm->col, "expected a filter name after '|'");
            node *f = mk(ps, N_FILTER, nm);
            f->a = nd;
            f->s = dotted_name(ps, nm);
            f->op = tpl_filter_id(f->s.p, f->s.n);
            if (!f->op)
                perr(ps, KVG_EPARSE, nm->line, nm->col, "unsupported filter '%.*s'", (int)f->s.n,
                     f->s.p);
            if (is_op(peek(ps), "(")) {
                next(ps);
                parse_args(ps, f);
            }
            nd = f;
        } else if (is_name(t, "is")) {
            next(ps);
            node *te = mk(ps, N_TEST, t);
            if (is_name(peek(ps), "not")) {
                next(ps);
                te->neg = 1;
            }
            token *nm = next(ps);
            if (nm->kind != K_NAME && !is_op(nm, "==") && !is_op(nm, "!=") && !is_op(nm, "<") &&
                !is_op(nm, ">") && !is_op(nm, "<=") && !is_op(nm, ">="))
                perr(ps, KVG_EPARSE, nm->line, nm->col, "expected a test name after 'is'");
            te->a = nd;
            te->s = nm->kind == K_NAME ? dotted_name(ps, nm) : nm->s;
            te->op = tpl_test_id(te->s.p, te->s.n);
            if (!te->op)
                perr(ps, KVG_EPARSE, nm->line, nm->col, "unsupported test '%.*s'", (int)te->s.n,
                     te->s.p);
            if (is_op(peek(ps), "(")) {
                next(ps);
                parse_args(ps, te);
            } else if (test_arg_follows(ps)) {
                if (is_name(peek(ps), "is")) {
                    token *u = peek(ps);
                    perr(ps, KVG_EPARSE, u->line, u->col,
                         "You cannot chain multiple tests with is");
                }
                nvec nv = {0};
                node *arg = parse_postfix(ps, parse_primary(ps));
                nvec_push(ps, &nv, arg, (tstr){NULL, 0});
                te->kids = nv.v;
                te->knames = nv.names;
                te->nkids = 1;
            }
            nd = te;
            if (is_name(peek(ps), "is")) {
                token *u = peek(ps);
                perr(ps, KVG_EPARSE, u->line, u->col, "You cannot chain multiple tests with is");
            }
        } else {
            return nd;
        }
    }
}

static node *parse_unary(parser *ps, bool with_filter)
{
    token *t = peek(ps);
    enter(ps, t);
    node *nd;
    if (is_op(t, "-") || is_op(t, "+")) {
        next(ps);
        nd = mk(ps, N_UNARY, t);
        nd->op = t->s.p[0];
        nd->a = parse_unary(ps, false);
    } else {
        nd = parse_postfix(ps, parse_primary(ps));
    }
    if (with_filter)
        nd = parse_filter_expr(ps, nd);
    ps->depth--;
    return nd;
}

static node *parse_pow(parser *ps)
{
    node *l = parse_unary(ps, true);
    while (is_op(peek(ps), "**")) {
        token *t = next(ps);
        node *b = mk(ps, N_BIN, t);
        b->op = OP_POW;
        b->a = l;
        b->b = parse_unary(ps, true);
        l = b;
    }
    return l;
}

static node *parse_math2(parser *ps)
{
    node *l = parse_pow(ps);
    for (;;) {
        token *t = peek(ps);
        int op = is_op(t, "*")    ? OP_MUL
                 : is_op(t, "/")  ? OP_DIV
                 : is_op(t, "//") ? OP_FLOORDIV
                 : is_op(t, "%")  ? OP_MOD
                                  : 0;
        if (!op)
            return l;
        next(ps);
        node *b = mk(ps, N_BIN, t);
        b->op = op;
        b->a = l;
        b->b = parse_pow(ps);
        l = b;
    }
}

static node *parse_concat(parser *ps)
{
    node *l = parse_math2(ps);
    while (is_op(peek(ps), "~")) {
        token *t = next(ps);
        node *b = mk(ps, N_BIN, t);
        b->op = OP_CONCAT;
        b->a = l;
        b->b = parse_math2(ps);
        l = b;
    }
    return l;
}

static node *parse_math1(parser *ps)
{
    node *l = parse_concat(ps);
    for (;;) {
        token *t = peek(ps);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : 0;
        if (!op)
            return l;
        next(ps);
        node *b = mk(ps, N_BIN, t);
        b->op = op;
        b->a = l;
        b->b = parse_concat(ps);
        l = b;
    }
}

static int compare_op(parser *ps)
{
    token *t = peek(ps);
    if (is_op(t, "=="))
        return OP_EQ;
    if (is_op(t, "!="))
        return OP_NE;
    if (is_op(t, "<"))
        return OP_LT;
    if (is_op(t, "<="))
        return OP_LE;
    if (is_op(t, ">"))
        return OP_GT;
    if (is_op(t, ">="))
        return OP_GE;
    if (is_name(t, "in"))
        return OP_IN;
    if (is_name(t, "not") && is_name(peek2(ps), "in"))
        return OP_NOTIN;
    return 0;
}

static node *parse_compare(parser *ps)
{
    node *l = parse_math1(ps);
    int op = compare_op(ps);
    if (!op)
        return l;
    token *t = next(ps);
    if (op == OP_NOTIN)
        next(ps);
    node *b = mk(ps, N_BIN, t);
    b->op = op;
    b->a = l;
    b->b = parse_math1(ps);
    if (!compare_op(ps))
        return b;
    /* a < b < c: each comparison with the next operand, each operand evaluated once. */
    nvec nv = {0};
    int ops[64];
    size_t nops = 0;
    nvec_push(ps, &nv, l, (tstr){NULL, 0});
    nvec_push(ps, &nv, b->b, (tstr){NULL, 0});
    ops[nops++] = op;
    while ((op = compare_op(ps))) {
        token *u = next(ps);
        if (op == OP_NOTIN)
            next(ps);
        if (nops == KVG_ARRAY_LEN(ops))
            perr(ps, KVG_ELIMIT, u->line, u->col, "more than 64 chained comparisons");
        ops[nops++] = op;
        nvec_push(ps, &nv, parse_math1(ps), (tstr){NULL, 0});
    }
    node *c = mk(ps, N_CMPCHAIN, t);
    c->kids = nv.v;
    c->nkids = nv.n;
    c->ops = palloc(ps, nops * sizeof(int));
    memcpy(c->ops, ops, nops * sizeof(int));
    return c;
}

static node *parse_not(parser *ps)
{
    token *t = peek(ps);
    if (is_name(t, "not")) {
        next(ps);
        enter(ps, t);
        node *nd = mk(ps, N_UNARY, t);
        nd->op = 'n';
        nd->a = parse_not(ps);
        ps->depth--;
        return nd;
    }
    return parse_compare(ps);
}

static node *parse_and(parser *ps)
{
    node *l = parse_not(ps);
    while (is_name(peek(ps), "and")) {
        token *t = next(ps);
        node *b = mk(ps, N_AND, t);
        b->a = l;
        b->b = parse_not(ps);
        l = b;
    }
    return l;
}

static node *parse_or(parser *ps)
{
    node *l = parse_and(ps);
    while (is_name(peek(ps), "or")) {
        token *t = next(ps);
        node *b = mk(ps, N_OR, t);
        b->a = l;
        b->b = parse_and(ps);
        l = b;
    }
    return l;
}

/* Jinja2's parse_condexpr: "a if cond else b", the else part optional. */
static node *parse_expr(parser *ps)
{
    token *at = peek(ps);
    enter(ps, at);
    node *e = parse_or(ps);
    while (is_name(peek(ps), "if")) {
        token *t = next(ps);
        node *c = mk(ps, N_COND, t);
        c->b = e;
        c->a = parse_or(ps);
        if (is_name(peek(ps), "else")) {
            next(ps);
            c->c = parse_expr(ps);
        }
        e = c;
    }
    ps->depth--;
    return e;
}

/* A tuple without parentheses (for targets and "a, b" values) is not in the subset, except
 * for-loop targets, parsed by the for statement itself. */
static node *parse_primary(parser *ps)
{
    token *t = next(ps);
    switch (t->kind) {
    case K_NAME: {
        node *nd = mk(ps, N_LIT, t);
        if (is_name(t, "true") || is_name(t, "True")) {
            nd->lit.t = V_BOOL;
            nd->lit.u.b = true;
        } else if (is_name(t, "false") || is_name(t, "False")) {
            nd->lit.t = V_BOOL;
        } else if (is_name(t, "none") || is_name(t, "None")) {
            nd->lit.t = V_NONE;
        } else {
            nd->kind = N_NAME;
            nd->s = t->s;
        }
        return nd;
    }
    case K_STRING: {
        /* Adjacent string literals concatenate, as in Jinja2. */
        tstr s = t->s;
        while (peek(ps)->kind == K_STRING) {
            tstr s2 = next(ps)->s;
            char *c = palloc(ps, s.n + s2.n + 1);
            memcpy(c, s.p, s.n);
            memcpy(c + s.n, s2.p, s2.n);
            s = (tstr){c, s.n + s2.n};
        }
        node *nd = mk(ps, N_LIT, t);
        nd->lit.t = V_STR;
        nd->lit.u.s = s;
        return nd;
    }
    case K_INT: {
        node *nd = mk(ps, N_LIT, t);
        nd->lit.t = V_INT;
        nd->lit.u.i = t->ival;
        return nd;
    }
    case K_FLOAT: {
        node *nd = mk(ps, N_LIT, t);
        nd->lit.t = V_FLOAT;
        nd->lit.u.f = t->fval;
        return nd;
    }
    case K_OP:
        if (is_op(t, "(")) {
            if (is_op(peek(ps), ")")) {
                next(ps);
                node *tu = mk(ps, N_LIST, t); /* the empty tuple */
                tu->neg = 1;
                return tu;
            }
            node *e = parse_expr(ps);
            if (is_op(peek(ps), ",")) {
                nvec nv = {0};
                nvec_push(ps, &nv, e, (tstr){NULL, 0});
                while (is_op(peek(ps), ",")) {
                    next(ps);
                    if (is_op(peek(ps), ")"))
                        break;
                    nvec_push(ps, &nv, parse_expr(ps), (tstr){NULL, 0});
                }
                e = mk(ps, N_LIST, t);
                e->neg = 1;
                e->kids = nv.v;
                e->nkids = nv.n;
            }
            expect_op(ps, ")");
            return e;
        }
        if (is_op(t, "[")) {
            nvec nv = {0};
            while (!is_op(peek(ps), "]")) {
                if (nv.n)
                    expect_op(ps, ",");
                if (is_op(peek(ps), "]"))
                    break;
                nvec_push(ps, &nv, parse_expr(ps), (tstr){NULL, 0});
            }
            expect_op(ps, "]");
            node *nd = mk(ps, N_LIST, t);
            nd->kids = nv.v;
            nd->nkids = nv.n;
            return nd;
        }
        if (is_op(t, "{")) {
            nvec nv = {0};
            while (!is_op(peek(ps), "}")) {
                if (nv.n)
                    expect_op(ps, ",");
                if (is_op(peek(ps), "}"))
                    break;
                nvec_push(ps, &nv, parse_expr(ps), (tstr){NULL, 0});
                expect_op(ps, ":");
                nvec_push(ps, &nv, parse_expr(ps), (tstr){NULL, 0});
            }
            expect_op(ps, "}");
            node *nd = mk(ps, N_DICT, t);
            nd->kids = nv.v;
            nd->nkids = nv.n;
            return nd;
        }
        break;
    default:
        break;
    }
    perr(ps, KVG_EPARSE, t->line, t->col, "unexpected %s", tok_desc(t));
}

/* ---- statements ---------------------------------------------------------------------------- */

static node *parse_body(parser *ps, const char *const *ends, const token **end_tok);

static void end_block(parser *ps)
{
    expect_kind(ps, K_BLOCK_END, "end of statement block");
}

static node *parse_set_target(parser *ps)
{
    token *t = next(ps);
    if (t->kind != K_NAME)
        perr(ps, KVG_EPARSE, t->line, t->col, "expected a name to assign to");
    node *nd = mk(ps, N_NAME, t);
    nd->s = t->s;
    if (is_op(peek(ps), ".")) {
        next(ps);
        token *a = next(ps);
        if (a->kind != K_NAME)
            perr(ps, KVG_EPARSE, a->line, a->col, "expected an attribute name");
        node *at = mk(ps, N_ATTR, a);
        at->a = nd;
        at->s = a->s;
        nd = at;
    }
    if (is_op(peek(ps), ",") || is_op(peek(ps), ".") || is_op(peek(ps), "[")) {
        token *u = peek(ps);
        perr(ps, KVG_EPARSE, u->line, u->col, "unsupported assignment target");
    }
    return nd;
}

static node *parse_statement(parser *ps, token *begin)
{
    token *t = next(ps);
    if (t->kind != K_NAME)
        perr(ps, KVG_EPARSE, t->line, t->col, "expected a statement name, got %s", tok_desc(t));
    enter(ps, t);
    node *nd;
    if (is_name(t, "if")) {
        /* Jinja2 parses the test without conditional expressions (parse_tuple(with_condexpr=
         * False)): "{% if a if b else c %}" is a syntax error there. */
        nd = mk(ps, N_IF, t);
        nd->a = parse_or(ps);
        end_block(ps);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        const token *et;
        nd->b = parse_body(ps, ends, &et);
        node *cur = nd;
        while (is_name(et, "elif")) {
            node *el = mk(ps, N_IF, et);
            el->a = parse_or(ps);
            end_block(ps);
            el->b = parse_body(ps, ends, &et);
            cur->c = el;
            cur = el;
        }
        if (is_name(et, "else")) {
            end_block(ps);
            static const char *const ends2[] = {"endif", NULL};
            cur->c = parse_body(ps, ends2, &et);
        }
        end_block(ps);
    } else if (is_name(t, "for")) {
        nd = mk(ps, N_FOR, t);
        nvec nv = {0};
        for (;;) {
            token *nm = next(ps);
            if (nm->kind != K_NAME)
                perr(ps, KVG_EPARSE, nm->line, nm->col, "expected a loop variable name");
            node *v = mk(ps, N_NAME, nm);
            v->s = nm->s;
            nvec_push(ps, &nv, v, (tstr){NULL, 0});
            if (!is_op(peek(ps), ","))
                break;
            next(ps);
        }
        nd->kids = nv.v;
        nd->nkids = nv.n;
        token *in = next(ps);
        if (!is_name(in, "in"))
            perr(ps, KVG_EPARSE, in->line, in->col, "expected 'in' in a for loop");
        /* The iterable is parsed without conditional expressions, so that a trailing "if"
         * is the loop's filter (Jinja2's parse_tuple(with_condexpr=False)). */
        nd->a = parse_or(ps);
        if (is_name(peek(ps), "if")) {
            next(ps);
            nd->d = parse_expr(ps);
        }
        if (is_name(peek(ps), "recursive")) {
            token *r = peek(ps);
            perr(ps, KVG_EPARSE, r->line, r->col, "unsupported recursive loop");
        }
        end_block(ps);
        static const char *const ends[] = {"else", "endfor", NULL};
        const token *et;
        nd->b = parse_body(ps, ends, &et);
        if (is_name(et, "else")) {
            end_block(ps);
            static const char *const ends2[] = {"endfor", NULL};
            nd->c = parse_body(ps, ends2, &et);
        }
        end_block(ps);
    } else if (is_name(t, "set")) {
        node *target = parse_set_target(ps);
        if (is_op(peek(ps), "=")) {
            next(ps);
            nd = mk(ps, N_SET, t);
            nd->a = target;
            nd->b = parse_expr(ps);
            end_block(ps);
        } else {
            nd = mk(ps, N_SETBLOCK, t);
            nd->a = target;
            if (peek(ps)->kind != K_BLOCK_END) {
                token *u = peek(ps);
                perr(ps, KVG_EPARSE, u->line, u->col, "expected '=' or end of block in set");
            }
            end_block(ps);
            static const char *const ends[] = {"endset", NULL};
            const token *et;
            nd->b = parse_body(ps, ends, &et);
            end_block(ps);
        }
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        nd = mk(ps, is_name(t, "break") ? N_BREAK : N_CONTINUE, t);
        end_block(ps);
    } else if (is_name(t, "generation")) {
        /* transformers' AssistantTracker tag: renders its body unchanged. */
        end_block(ps);
        static const char *const ends[] = {"endgeneration", NULL};
        const token *et;
        nd = parse_body(ps, ends, &et);
        end_block(ps);
    } else {
        perr(ps, KVG_EPARSE, t->line, t->col, "unsupported statement '%.*s'", (int)t->s.n, t->s.p);
    }
    (void)begin;
    ps->depth--;
    return nd;
}

/* Statements until one of ends (a block tag whose name is in ends; NULL: end of template).
 * *end_tok is the name token that ended the body; the block's end marker is not consumed. */
static node *parse_body(parser *ps, const char *const *ends, const token **end_tok)
{
    nvec nv = {0};
    node *body = mk(ps, N_BODY, peek(ps));
    for (;;) {
        token *t = next(ps);
        if (t->kind == K_EOF) {
            if (ends) {
                size_t last = 0;
                while (ends[last + 1])
                    last++;
                perr(ps, KVG_EPARSE, t->line, t->col, "unexpected end of template, expected '%s'",
                     ends[last]);
            }
            break;
        }
        if (t->kind == K_DATA) {
            node *tx = mk(ps, N_TEXT, t);
            tx->s = t->s;
            nvec_push(ps, &nv, tx, (tstr){NULL, 0});
        } else if (t->kind == K_VAR_BEGIN) {
            node *o = mk(ps, N_OUTPUT, t);
            o->a = parse_expr(ps);
            expect_kind(ps, K_VAR_END, "end of print statement '}}'");
            nvec_push(ps, &nv, o, (tstr){NULL, 0});
        } else if (t->kind == K_BLOCK_BEGIN) {
            token *nm = peek(ps);
            if (ends && nm->kind == K_NAME) {
                bool hit = false;
                for (size_t i = 0; ends[i]; i++)
                    if (is_name(nm, ends[i]))
                        hit = true;
                if (hit) {
                    *end_tok = next(ps);
                    break;
                }
            }
            if (nm->kind == K_NAME &&
                (is_name(nm, "endif") || is_name(nm, "endfor") || is_name(nm, "elif") ||
                 is_name(nm, "else") || is_name(nm, "endset") || is_name(nm, "endgeneration")))
                perr(ps, KVG_EPARSE, nm->line, nm->col, "unexpected '%.*s'", (int)nm->s.n, nm->s.p);
            nvec_push(ps, &nv, parse_statement(ps, t), (tstr){NULL, 0});
        } else {
            perr(ps, KVG_EPARSE, t->line, t->col, "unexpected %s", tok_desc(t));
        }
    }
    body->kids = nv.v;
    body->nkids = nv.n;
    return body;
}

void kvg_template_limits_default(kvg_template_limits *l)
{
    l->max_source = 1u << 20;
    l->max_depth = 128;
    l->max_output = 64u << 20;
    l->max_string = 64u << 20;
    l->max_memory = 512u << 20;
    l->max_loop = 10000000;
    l->max_steps = 200000000;
}

int kvg_template_compile(const char *source, size_t len, const kvg_template_limits *limits,
                         kvg_template **out, char *err, size_t errlen)
{
    kvg_template_limits lim;
    kvg_template_limits_default(&lim);
    if (limits) {
        if (limits->max_source)
            lim.max_source = limits->max_source;
        if (limits->max_depth)
            lim.max_depth = limits->max_depth;
        if (limits->max_output)
            lim.max_output = limits->max_output;
        if (limits->max_string)
            lim.max_string = limits->max_string;
        if (limits->max_memory)
            lim.max_memory = limits->max_memory;
        if (limits->max_loop)
            lim.max_loop = limits->max_loop;
        if (limits->max_steps)
            lim.max_steps = limits->max_steps;
    }
    if (errlen)
        err[0] = '\0';
    if (len > lim.max_source) {
        if (errlen)
            snprintf(err, errlen, "template of %zu bytes, over the limit of %zu", len,
                     lim.max_source);
        return KVG_ELIMIT;
    }
    kvg_template *tpl = calloc(1, sizeof(*tpl));
    if (!tpl) {
        if (errlen)
            snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    kvg_arena_init(&tpl->arena, 0);
    tpl->limits = lim;
    parser ps = {.tpl = tpl, .err = err, .errlen = errlen};
    if (setjmp(ps.jb)) {
        kvg_template_free(tpl);
        return ps.rc;
    }
    /* Jinja2 reads the source with its newlines normalised to "\n" and, without
     * keep_trailing_newline, drops one trailing newline. */
    char *src = palloc(&ps, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (source[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && source[i + 1] == '\n')
                i++;
        } else {
            src[n++] = source[i];
        }
    }
    if (n > 0 && src[n - 1] == '\n')
        n--;
    src[n] = '\0';
    for (size_t i = 0; i < n;) {
        size_t l = kvg_utf8_seq_len((const unsigned char *)src + i, n - i);
        if (!l) {
            uint32_t li, co;
            ps.src = src;
            ps.len = n;
            pos_of(&ps, i, &li, &co);
            perr(&ps, KVG_EPARSE, li, co, "invalid UTF-8 in the template");
        }
        i += l;
    }
    ps.src = src;
    ps.len = n;
    lex(&ps);
    tpl->root = parse_body(&ps, NULL, NULL);
    *out = tpl;
    return 0;
}

void kvg_template_free(kvg_template *tpl)
{
    if (!tpl)
        return;
    kvg_arena_done(&tpl->arena);
    free(tpl);
}
