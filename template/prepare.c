/* SPDX-License-Identifier: Apache-2.0 */
/* vLLM's preprocessing of a /v1/chat/completions body before the chat template renders it
 * (vllm/entrypoints/chat_utils.py: _parse_chat_message_content, _postprocess_messages; the
 * tools' model_dump; transformers' render arguments). docs/canonical.md, "Token-exact mode",
 * names the vLLM commit this follows. */
#include "tpl_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

typedef struct prep {
    kvg_arena *arena;
    char *err;
    size_t errlen;
    int rc;
    bool openai; /* the "openai" content format: parts stay a list of dicts */
} prep;

static int perr(prep *p, int rc, const char *fmt, ...) KVG_PRINTF(3, 4);
static int perr(prep *p, int rc, const char *fmt, ...)
{
    if (p->rc == 0) {
        p->rc = rc;
        if (p->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err, p->errlen, fmt, ap);
            va_end(ap);
        }
    }
    return p->rc;
}

static kvg_json *jnew(prep *p, kvg_json_type t)
{
    kvg_json *j = kvg_arena_alloc(p->arena, sizeof(*j));
    if (!j) {
        perr(p, -ENOMEM, "out of memory");
        return NULL;
    }
    memset(j, 0, sizeof(*j));
    j->type = t;
    return j;
}

static kvg_json *jstr(prep *p, const char *s, size_t n)
{
    kvg_json *j = jnew(p, KVG_JSON_STRING);
    if (!j)
        return NULL;
    j->u.str.ptr = (char *)s;
    j->u.str.len = n;
    return j;
}

/* An object under construction: at most cap members. */
static kvg_json *jobj(prep *p, size_t cap)
{
    kvg_json *j = jnew(p, KVG_JSON_OBJECT);
    if (!j)
        return NULL;
    cap = cap ? cap : 1;
    j->u.obj.keys = kvg_arena_alloc(p->arena, cap * sizeof(char *));
    j->u.obj.key_lens = kvg_arena_alloc(p->arena, cap * sizeof(size_t));
    j->u.obj.values = kvg_arena_alloc(p->arena, cap * sizeof(kvg_json *));
    if (!j->u.obj.keys || !j->u.obj.key_lens || !j->u.obj.values) {
        perr(p, -ENOMEM, "out of memory");
        return NULL;
    }
    return j;
}

static void jset(kvg_json *o, const char *key, size_t klen, kvg_json *v)
{
    size_t i = o->u.obj.count++;
    o->u.obj.keys[i] = (char *)key;
    o->u.obj.key_lens[i] = klen;
    o->u.obj.values[i] = v;
}

static void jsetc(kvg_json *o, const char *key, kvg_json *v)
{
    jset(o, key, strlen(key), v);
}

static bool key_is(const kvg_json *o, size_t i, const char *k)
{
    return o->u.obj.key_lens[i] == strlen(k) &&
           memcmp(o->u.obj.keys[i], k, o->u.obj.key_lens[i]) == 0;
}

static bool is_str(const kvg_json *j)
{
    return j && j->type == KVG_JSON_STRING;
}

static bool str_is(const kvg_json *j, const char *s)
{
    return is_str(j) && j->u.str.len == strlen(s) && memcmp(j->u.str.ptr, s, j->u.str.len) == 0;
}

/* The text of a content part as MM_PARSER_MAP reads it; NULL for a part it skips. */
static int part_text(prep *p, const kvg_json *part, const kvg_json **text)
{
    *text = NULL;
    if (is_str(part)) {
        *text = part;
        return 0;
    }
    if (!part || part->type != KVG_JSON_OBJECT)
        return perr(p, KVG_EPARSE, "a content part is neither a string nor an object");
    const kvg_json *type = kvg_json_get(part, "type");
    if (kvg_json_get(part, "uuid") || !type)
        return perr(p, KVG_EPARSE, "a content part without a type (media) is not supported");
    const char *key = NULL;
    if (str_is(type, "text") || str_is(type, "input_text") || str_is(type, "output_text"))
        key = "text";
    else if (str_is(type, "refusal"))
        key = "refusal";
    else if (str_is(type, "thinking"))
        key = "thinking";
    if (!key)
        return perr(p, KVG_EPARSE, "content part type %.*s is not supported in token-exact mode",
                    is_str(type) ? (int)KVG_MIN(type->u.str.len, 64) : 4,
                    is_str(type) ? type->u.str.ptr : "null");
    const kvg_json *t = kvg_json_get(part, key);
    if (!t || t->type == KVG_JSON_NULL)
        return 0; /* vLLM skips text and refusal parts without content */
    if (!is_str(t))
        return perr(p, KVG_EPARSE, "a content part's %s is not a string", key);
    *text = t;
    return 0;
}

/* A message's content as _parse_chat_message_content leaves it: for the "string" format the
 * texts joined with "\n" (None: ""), for "openai" a list of {"type": "text", "text": ...}. */
static kvg_json *content_of(prep *p, const kvg_json *c)
{
    size_t n = 0;
    const kvg_json *one = NULL;
    if (!c || c->type == KVG_JSON_NULL)
        n = 0;
    else if (is_str(c)) {
        n = 1;
        one = c;
    } else if (c->type == KVG_JSON_ARRAY) {
        n = c->u.arr.count;
    } else {
        perr(p, KVG_EPARSE, "message content is neither a string, a list nor null");
        return NULL;
    }
    const kvg_json **texts = kvg_arena_alloc(p->arena, (n ? n : 1) * sizeof(*texts));
    if (!texts) {
        perr(p, -ENOMEM, "out of memory");
        return NULL;
    }
    size_t k = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        const kvg_json *t;
        if (part_text(p, one ? one : c->u.arr.items[i], &t))
            return NULL;
        if (t) {
            texts[k++] = t;
            total += t->u.str.len + 1;
        }
    }
    if (p->openai) {
        kvg_json *arr = jnew(p, KVG_JSON_ARRAY);
        if (!arr)
            return NULL;
        arr->u.arr.items = kvg_arena_alloc(p->arena, (k ? k : 1) * sizeof(kvg_json *));
        if (!arr->u.arr.items) {
            perr(p, -ENOMEM, "out of memory");
            return NULL;
        }
        for (size_t i = 0; i < k; i++) {
            kvg_json *o = jobj(p, 2);
            kvg_json *ty = jstr(p, "text", 4);
            if (!o || !ty)
                return NULL;
            jsetc(o, "type", ty);
            jsetc(o, "text", (kvg_json *)texts[i]);
            arr->u.arr.items[arr->u.arr.count++] = o;
        }
        return arr;
    }
    if (k == 1)
        return (kvg_json *)texts[0];
    char *s = kvg_arena_alloc(p->arena, total + 1);
    if (!s) {
        perr(p, -ENOMEM, "out of memory");
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < k; i++) {
        if (i)
            s[o++] = '\n';
        memcpy(s + o, texts[i]->u.str.ptr, texts[i]->u.str.len);
        o += texts[i]->u.str.len;
    }
    s[o] = '\0';
    return jstr(p, s, o);
}

/* _postprocess_messages: tool-call arguments given as a JSON string are parsed (invalid JSON
 * becomes {}); anything but an object or a list becomes {}. */
static kvg_json *tool_call_of(prep *p, const kvg_json *tc)
{
    if (!tc || tc->type != KVG_JSON_OBJECT) {
        perr(p, KVG_EPARSE, "a tool call is not an object");
        return NULL;
    }
    const kvg_json *fn = kvg_json_get(tc, "function");
    if (!fn || fn->type != KVG_JSON_OBJECT) {
        perr(p, KVG_EPARSE, "a tool call without a function object");
        return NULL;
    }
    kvg_json *nfn = jobj(p, fn->u.obj.count + 1);
    kvg_json *ntc = jobj(p, tc->u.obj.count + 1);
    if (!nfn || !ntc)
        return NULL;
    bool seen_args = false;
    for (size_t i = 0; i < fn->u.obj.count; i++) {
        kvg_json *v = fn->u.obj.values[i];
        if (key_is(fn, i, "arguments")) {
            if (seen_args)
                continue;
            seen_args = true;
            v = (kvg_json *)kvg_json_get(fn, "arguments"); /* the last one, as Python's */
            if (is_str(v)) {
                kvg_json *parsed = NULL;
                kvg_json_limits lim = {.max_depth = 64, .reject_duplicate_keys = true};
                if (kvg_json_parse(v->u.str.ptr, v->u.str.len, p->arena, &lim, &parsed, NULL) != 0)
                    parsed = NULL;
                v = parsed;
            }
            if (!v || (v->type != KVG_JSON_OBJECT && v->type != KVG_JSON_ARRAY))
                v = jobj(p, 0);
            if (!v)
                return NULL;
        }
        jset(nfn, fn->u.obj.keys[i], fn->u.obj.key_lens[i], v);
    }
    if (!seen_args) {
        kvg_json *e = jobj(p, 0);
        if (!e)
            return NULL;
        jsetc(nfn, "arguments", e);
    }
    for (size_t i = 0; i < tc->u.obj.count; i++)
        jset(ntc, tc->u.obj.keys[i], tc->u.obj.key_lens[i],
             key_is(tc, i, "function") ? nfn : tc->u.obj.values[i]);
    return ntc;
}

static kvg_json *message_of(prep *p, const kvg_json *m)
{
    if (!m || m->type != KVG_JSON_OBJECT) {
        perr(p, KVG_EPARSE, "a message is not an object");
        return NULL;
    }
    const kvg_json *role = kvg_json_get(m, "role");
    if (!is_str(role)) {
        perr(p, KVG_EPARSE, "a message without a string role");
        return NULL;
    }
    kvg_json *o = jobj(p, 9);
    if (!o)
        return NULL;
    jsetc(o, "role", (kvg_json *)role);
    /* A tool message's text parts are joined into a string even in the "openai" format (vLLM
     * normalises tool results that clients send as parts). */
    bool openai = p->openai;
    if (str_is(role, "tool"))
        p->openai = false;
    kvg_json *content = content_of(p, kvg_json_get(m, "content"));
    p->openai = openai;
    if (!content)
        return NULL;
    jsetc(o, "content", content);
    if (str_is(role, "assistant")) {
        const kvg_json *tcs = kvg_json_get(m, "tool_calls");
        if (tcs && tcs->type == KVG_JSON_ARRAY && tcs->u.arr.count > 0) {
            kvg_json *arr = jnew(p, KVG_JSON_ARRAY);
            if (!arr)
                return NULL;
            arr->u.arr.items = kvg_arena_alloc(p->arena, tcs->u.arr.count * sizeof(kvg_json *));
            if (!arr->u.arr.items) {
                perr(p, -ENOMEM, "out of memory");
                return NULL;
            }
            for (size_t i = 0; i < tcs->u.arr.count; i++) {
                kvg_json *tc = tool_call_of(p, tcs->u.arr.items[i]);
                if (!tc)
                    return NULL;
                arr->u.arr.items[arr->u.arr.count++] = tc;
            }
            jsetc(o, "tool_calls", arr);
        } else if (tcs && tcs->type != KVG_JSON_NULL && tcs->type != KVG_JSON_ARRAY) {
            perr(p, KVG_EPARSE, "tool_calls is not a list");
            return NULL;
        }
        const kvg_json *r = kvg_json_get(m, "reasoning");
        if (r && r->type != KVG_JSON_NULL) {
            if (!is_str(r)) {
                perr(p, KVG_EPARSE, "reasoning is not a string");
                return NULL;
            }
            jsetc(o, "reasoning", (kvg_json *)r);
            jsetc(o, "reasoning_content", (kvg_json *)r);
        }
    } else if (str_is(role, "tool")) {
        const kvg_json *id = kvg_json_get(m, "tool_call_id");
        if (id)
            jsetc(o, "tool_call_id", (kvg_json *)id);
    }
    const kvg_json *name = kvg_json_get(m, "name");
    if (is_str(name))
        jsetc(o, "name", (kvg_json *)name);
    const kvg_json *task = kvg_json_get(m, "task");
    if (is_str(task))
        jsetc(o, "task", (kvg_json *)task);
    if (str_is(role, "developer")) {
        const kvg_json *tools = kvg_json_get(m, "tools");
        if (tools) {
            jsetc(o, "tools", (kvg_json *)tools);
        } else {
            kvg_json *nul = jnew(p, KVG_JSON_NULL);
            if (!nul)
                return NULL;
            jsetc(o, "tools", nul);
        }
    }
    return o;
}

/* A tool as ChatCompletionToolsParam.model_dump() writes it: type, then function with name,
 * description and parameters (null when absent), defer_loading when set, then the function's
 * other members in request order (the model allows extra fields); the tool's defer_loading
 * last when set. */
static kvg_json *tool_of(prep *p, const kvg_json *t)
{
    if (!t || t->type != KVG_JSON_OBJECT) {
        perr(p, KVG_EPARSE, "a tool is not an object");
        return NULL;
    }
    const kvg_json *type = kvg_json_get(t, "type");
    const kvg_json *fn = kvg_json_get(t, "function");
    if ((type && !str_is(type, "function")) || !fn || fn->type != KVG_JSON_OBJECT) {
        perr(p, KVG_EPARSE, "only function tools are supported in token-exact mode");
        return NULL;
    }
    const kvg_json *name = kvg_json_get(fn, "name");
    if (!is_str(name)) {
        perr(p, KVG_EPARSE, "a tool function without a string name");
        return NULL;
    }
    const kvg_json *tdl = kvg_json_get(t, "defer_loading");
    if (tdl && tdl->type == KVG_JSON_NULL)
        tdl = NULL;
    kvg_json *nul = jnew(p, KVG_JSON_NULL);
    kvg_json *nfn = jobj(p, fn->u.obj.count + 4);
    kvg_json *nt = jobj(p, 3);
    kvg_json *ftype = jstr(p, "function", 8);
    if (!nul || !nfn || !nt || !ftype)
        return NULL;
    jsetc(nfn, "name", (kvg_json *)name);
    const kvg_json *d = kvg_json_get(fn, "description");
    jsetc(nfn, "description", d ? (kvg_json *)d : nul);
    const kvg_json *pa = kvg_json_get(fn, "parameters");
    if (pa && pa->type != KVG_JSON_OBJECT && pa->type != KVG_JSON_NULL) {
        perr(p, KVG_EPARSE, "a tool's parameters is not an object");
        return NULL;
    }
    jsetc(nfn, "parameters", pa ? (kvg_json *)pa : nul);
    const kvg_json *fdl = kvg_json_get(fn, "defer_loading");
    if (fdl && fdl->type == KVG_JSON_NULL)
        fdl = NULL;
    if (fdl || tdl)
        jsetc(nfn, "defer_loading", (kvg_json *)(fdl ? fdl : tdl));
    for (size_t i = 0; i < fn->u.obj.count; i++) {
        if (key_is(fn, i, "name") || key_is(fn, i, "description") || key_is(fn, i, "parameters") ||
            key_is(fn, i, "defer_loading"))
            continue;
        bool dup = false;
        for (size_t k = 0; k < nfn->u.obj.count; k++)
            if (nfn->u.obj.key_lens[k] == fn->u.obj.key_lens[i] &&
                memcmp(nfn->u.obj.keys[k], fn->u.obj.keys[i], fn->u.obj.key_lens[i]) == 0)
                dup = true;
        if (dup) {
            perr(p, KVG_EPARSE, "a tool function repeats a key");
            return NULL;
        }
        if (nfn->u.obj.count >= fn->u.obj.count + 4)
            break;
        jset(nfn, fn->u.obj.keys[i], fn->u.obj.key_lens[i], fn->u.obj.values[i]);
    }
    jsetc(nt, "type", ftype);
    jsetc(nt, "function", nfn);
    if (tdl)
        jsetc(nt, "defer_loading", (kvg_json *)tdl);
    return nt;
}

static kvg_json *list_of(prep *p, const kvg_json *a, kvg_json *(*each)(prep *, const kvg_json *),
                         const char *what)
{
    if (!a || a->type != KVG_JSON_ARRAY) {
        perr(p, KVG_EPARSE, "%s is not a list", what);
        return NULL;
    }
    kvg_json *arr = jnew(p, KVG_JSON_ARRAY);
    if (!arr)
        return NULL;
    arr->u.arr.items =
        kvg_arena_alloc(p->arena, (a->u.arr.count ? a->u.arr.count : 1) * sizeof(kvg_json *));
    if (!arr->u.arr.items) {
        perr(p, -ENOMEM, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < a->u.arr.count; i++) {
        kvg_json *v = each(p, a->u.arr.items[i]);
        if (!v)
            return NULL;
        arr->u.arr.items[arr->u.arr.count++] = v;
    }
    return arr;
}

static void walk_format(const node *nd, bool *openai)
{
    if (!nd || *openai)
        return;
    if (nd->kind == N_FOR && nd->a) {
        const node *it = nd->a;
        while (it->kind == N_FILTER)
            it = it->a;
        if ((it->kind == N_ATTR && it->s.n == 7 && memcmp(it->s.p, "content", 7) == 0) ||
            (it->kind == N_INDEX && it->b && it->b->kind == N_LIT && it->b->lit.t == V_STR &&
             it->b->lit.u.s.n == 7 && memcmp(it->b->lit.u.s.p, "content", 7) == 0))
            *openai = true;
    }
    walk_format(nd->a, openai);
    walk_format(nd->b, openai);
    walk_format(nd->c, openai);
    walk_format(nd->d, openai);
    for (size_t i = 0; i < nd->nkids; i++)
        walk_format(nd->kids[i], openai);
}

bool kvg_template_wants_parts(const kvg_template *tpl)
{
    bool openai = false;
    walk_format(tpl->root, &openai);
    return openai;
}

int kvg_template_prepare(const kvg_json *body, const kvg_template_vars *vars, kvg_arena *arena,
                         kvg_json **ctx, char *err, size_t errlen)
{
    prep p = {.arena = arena, .err = err, .errlen = errlen};
    if (errlen)
        err[0] = '\0';
    p.openai = vars && vars->openai_content;
    if (!body || body->type != KVG_JSON_OBJECT)
        return perr(&p, KVG_EPARSE, "the request body is not an object");
    const kvg_json *cfm = kvg_json_get(body, "continue_final_message");
    if (cfm && cfm->type == KVG_JSON_TRUE)
        return perr(&p, KVG_EPARSE, "continue_final_message is not supported in token-exact mode");
    const kvg_json *kw = kvg_json_get(body, "chat_template_kwargs");
    if (kw && kw->type != KVG_JSON_OBJECT && kw->type != KVG_JSON_NULL)
        return perr(&p, KVG_EPARSE, "chat_template_kwargs is not an object");
    if (kvg_json_get(body, "chat_template"))
        return perr(&p, KVG_EPARSE, "a request's own chat_template is not supported");
    size_t nkw = kw && kw->type == KVG_JSON_OBJECT ? kw->u.obj.count : 0;
    /* vLLM's resolve_chat_template_kwargs refuses these two. */
    if (nkw && (kvg_json_get(kw, "chat_template") || kvg_json_get(kw, "tokenize")))
        return perr(&p, KVG_EPARSE, "chat_template_kwargs names chat_template or tokenize");
    kvg_json *o = jobj(&p, nkw + 8);
    if (!o)
        return p.rc;
    kvg_json *msgs = list_of(&p, kvg_json_get(body, "messages"), message_of, "messages");
    if (!msgs)
        return p.rc;
    jsetc(o, "messages", msgs);
    const kvg_json *tools = kvg_json_get(body, "tools");
    kvg_json *ntools;
    if (tools && tools->type != KVG_JSON_NULL)
        ntools = list_of(&p, tools, tool_of, "tools");
    else
        ntools = jnew(&p, KVG_JSON_NULL);
    if (!ntools)
        return p.rc;
    jsetc(o, "tools", ntools);
    const kvg_json *docs = kvg_json_get(body, "documents");
    kvg_json *ndocs = docs ? (kvg_json *)docs : jnew(&p, KVG_JSON_NULL);
    if (!ndocs)
        return p.rc;
    jsetc(o, "documents", ndocs);
    const kvg_json *agp = kvg_json_get(body, "add_generation_prompt");
    if (agp && agp->type != KVG_JSON_TRUE && agp->type != KVG_JSON_FALSE)
        return perr(&p, KVG_EPARSE, "add_generation_prompt is not a boolean");
    kvg_json *nagp = agp ? (kvg_json *)agp : jnew(&p, KVG_JSON_TRUE);
    kvg_json *ncfm = jnew(&p, KVG_JSON_FALSE);
    if (!nagp || !ncfm)
        return p.rc;
    jsetc(o, "add_generation_prompt", nagp);
    jsetc(o, "continue_final_message", ncfm);
    if (vars && vars->bos_token) {
        kvg_json *s = jstr(&p, vars->bos_token, strlen(vars->bos_token));
        if (!s)
            return p.rc;
        jsetc(o, "bos_token", s);
    }
    if (vars && vars->eos_token) {
        kvg_json *s = jstr(&p, vars->eos_token, strlen(vars->eos_token));
        if (!s)
            return p.rc;
        jsetc(o, "eos_token", s);
    }
    /* chat_template_kwargs reach the template as variables; the request's own fields win. */
    for (size_t i = 0; i < nkw; i++) {
        bool taken = false;
        for (size_t k = 0; k < o->u.obj.count; k++)
            if (o->u.obj.key_lens[k] == kw->u.obj.key_lens[i] &&
                memcmp(o->u.obj.keys[k], kw->u.obj.keys[i], kw->u.obj.key_lens[i]) == 0)
                taken = true;
        if (!taken)
            jset(o, kw->u.obj.keys[i], kw->u.obj.key_lens[i], kw->u.obj.values[i]);
    }
    *ctx = o;
    return 0;
}
