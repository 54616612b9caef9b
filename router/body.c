/* SPDX-License-Identifier: Apache-2.0 */
/* The request-body rewriter: one validating pass over an OpenAI request body, without a tree,
 * that drops every client cache_salt, injects the scope salt and finds what routing needs. */
#include "body_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/*
 * How it works. The body is scanned once, left to right, with the grammar and error offsets of
 * common/json.c's parser (the same acceptance, which the unit tests and the fuzz target check).
 * Only the top-level object is looked at closely: its keys are decoded (they are short) so that
 * an escaped spelling ("\u0063ache_salt") is recognised like a plain one, and the values of the
 * members routing needs are inspected. Keys at every level are checked for control characters
 * while they are scanned (scan_key, bad_key). Everything below the top level is validated by an
 * iterative scanner that keeps one bit per open container (depth <= 64 fits a uint64_t).
 *
 * The output is the input minus the removed members, so it is produced as memcpy's of the runs
 * between them: `flush` is the input position up to which the output is settled. A body
 * without a cache_salt costs one memcpy at the end, plus the salt.
 *
 * Removing a member must take exactly one comma with it. A member preceded by a kept member
 * takes the separator before it (from the end of the kept value up to its own end); a member
 * with no kept member before it takes the separator after it (skipped when the next key
 * starts). Whatever the placement and however many there are, the result is valid JSON. The
 * salt goes after the last kept member, or where the first removed one was: rewriting an
 * output again gives the same bytes.
 *
 * kvg_body_scan extends this pass: for a completions, chat or responses body the values of
 * prompt, messages, tools, instructions and input get the scanners of body_canon.c, which emit the
 * canonical prefix stream (docs/canonical.md) as they go. The lexer they all share is body_lex.h
 * and body_lex.c.
 */

/* The longest top-level key we look for ("previous_response_id"). */
#define KEY_MAX 20
/* A \uXXXX escape is the longest spelling of one decoded byte: raw keys longer than this
 * cannot decode to a key we look for. */
#define KEY_RAW_MAX (6 * KEY_MAX)

/* ---- the top-level object ------------------------------------------------------------------- */

static member_kind classify(const unsigned char *k, size_t len)
{
#define IS(lit) (len == sizeof(lit) - 1 && memcmp(k, lit, sizeof(lit) - 1) == 0)
    switch (len) {
    case 5:
        return IS("model")   ? MEMBER_MODEL
               : IS("input") ? MEMBER_INPUT
               : IS("tools") ? MEMBER_TOOLS
                             : MEMBER_OTHER;
    case 6:
        return IS("stream") ? MEMBER_STREAM : IS("prompt") ? MEMBER_PROMPT : MEMBER_OTHER;
    case 8:
        return IS("messages") ? MEMBER_MESSAGES : MEMBER_OTHER;
    case 10:
        return IS("cache_salt") ? MEMBER_CACHE_SALT : MEMBER_OTHER;
    case 12:
        return IS("instructions") ? MEMBER_INSTRUCTIONS : MEMBER_OTHER;
    case 20:
        return IS("previous_response_id") ? MEMBER_PREVIOUS_RESPONSE_ID : MEMBER_OTHER;
    default:
        return MEMBER_OTHER;
    }
#undef IS
}

/* Which member a top-level key names; [s, e) are the raw contents of an accepted string. */
static member_kind classify_key(const unsigned char *s, const unsigned char *e, bool escaped)
{
    size_t len = (size_t)(e - s);
    if (!escaped)
        return classify(s, len);
    if (len > KEY_RAW_MAX)
        return MEMBER_OTHER;
    unsigned char buf[KEY_RAW_MAX];
    return classify(buf, decode_string(s, e, buf));
}

void kvg_body_type_error(rewrite *rw, const unsigned char *at, const char *fmt, ...)
{
    type_fault *f = &rw->fault;
    if (f->rc)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->message, sizeof(f->message), fmt, ap);
    va_end(ap);
    f->rc = KVG_ETYPE;
    f->offset = (size_t)(at - rw->sc.start);
}

/* The top-level "model": a string (decoded into the arena) or null. */
static int scan_model(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    if (rw->seen[MEMBER_MODEL] > 1)
        kvg_body_type_error(rw, v, "model: appears more than once");
    if (*v != '"') {
        int rc = kvg_body_scan_value(&rw->sc, pp, 2);
        if (rc == 0 && *v != 'n')
            kvg_body_type_error(rw, v, "model: must be a string or null, not %s", value_type(*v));
        rw->info.model = NULL;
        rw->info.model_len = 0;
        return rc;
    }
    /* Set when the scan succeeds; initialised because, with the scan inlined here, gcc can no
     * longer see that every failure returns early. */
    bool escaped = false;
    int rc = scan_string(&rw->sc, pp, &escaped);
    if (rc < 0)
        return rc;
    const unsigned char *s = v + 1, *e = *pp - 1;
    size_t raw = (size_t)(e - s);
    char *m = kvg_arena_alloc(rw->arena, raw + 1);
    if (!m)
        return fail(&rw->sc, -ENOMEM, v, "out of memory");
    size_t n = raw;
    if (escaped) {
        n = decode_string(s, e, (unsigned char *)m);
        /* A NUL would end the name for every C string consumer (model allowlists, routing)
         * while the engine reads the whole of it. */
        if (memchr(m, '\0', n))
            kvg_body_type_error(rw, v, "model: must not contain NUL characters");
    } else {
        memcpy(m, s, raw);
    }
    m[n] = '\0';
    rw->info.model = m;
    rw->info.model_len = n;
    return 0;
}

/* The top-level "stream": true, false or null. */
static int scan_stream(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    if (rw->seen[MEMBER_STREAM] > 1)
        kvg_body_type_error(rw, v, "stream: appears more than once");
    int rc = kvg_body_scan_value(&rw->sc, pp, 2);
    if (rc < 0)
        return rc;
    if (*v != 't' && *v != 'f' && *v != 'n')
        kvg_body_type_error(rw, v, "stream: must be a boolean or null, not %s", value_type(*v));
    rw->info.stream = *v == 't';
    return 0;
}

/* The top-level "previous_response_id" of a responses body: a string (decoded into the arena,
 * for the gateway's response affinity) or null. */
static int scan_previous_response_id(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    if (rw->seen[MEMBER_PREVIOUS_RESPONSE_ID] > 1)
        kvg_body_type_error(rw, v, "previous_response_id: appears more than once");
    if (*v != '"') {
        int rc = kvg_body_scan_value(&rw->sc, pp, 2);
        if (rc == 0 && *v != 'n')
            kvg_body_type_error(rw, v, "previous_response_id: must be a string or null, not %s",
                                value_type(*v));
        return rc;
    }
    bool escaped = false; /* as in scan_model */
    int rc = scan_string(&rw->sc, pp, &escaped);
    if (rc < 0)
        return rc;
    const unsigned char *s = v + 1, *e = *pp - 1;
    char *id = kvg_arena_alloc(rw->arena, (size_t)(e - s) + 1);
    if (!id)
        return fail(&rw->sc, -ENOMEM, v, "out of memory");
    size_t n = escaped ? decode_string(s, e, (unsigned char *)id) : (size_t)(e - s);
    if (!escaped)
        memcpy(id, s, n);
    id[n] = '\0';
    if (rw->seen[MEMBER_PREVIOUS_RESPONSE_ID] == 1) {
        rw->info.previous_response_id = id;
        rw->info.previous_response_id_len = n;
    }
    return 0;
}

/* Scan the value of a top-level member of the given kind at *pp (on its first byte). */
static int scan_member(rewrite *rw, member_kind kind, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    int rc;
    switch (kind) {
    case MEMBER_MODEL:
        return scan_model(rw, pp);
    case MEMBER_STREAM:
        return scan_stream(rw, pp);
    case MEMBER_PREVIOUS_RESPONSE_ID:
        if (rw->api == KVG_BODY_API_RESPONSES)
            return scan_previous_response_id(rw, pp);
        return kvg_body_scan_value(&rw->sc, pp, 2);
    case MEMBER_PROMPT:
    case MEMBER_MESSAGES:
    case MEMBER_INPUT:
    case MEMBER_INSTRUCTIONS:
    case MEMBER_TOOLS:
        if (rw->api == KVG_BODY_API_COMPLETIONS && kind == MEMBER_PROMPT)
            rc = kvg_body_scan_prompt(rw, pp);
        else if (rw->api == KVG_BODY_API_CHAT && kind == MEMBER_MESSAGES)
            rc = kvg_body_scan_messages(rw, pp);
        else if ((rw->api == KVG_BODY_API_CHAT || rw->api == KVG_BODY_API_RESPONSES) &&
                 kind == MEMBER_TOOLS)
            rc = kvg_body_scan_tools(rw, pp);
        else if (rw->api == KVG_BODY_API_RESPONSES && kind == MEMBER_INPUT)
            rc = kvg_body_scan_input(rw, pp);
        else if (rw->api == KVG_BODY_API_RESPONSES && kind == MEMBER_INSTRUCTIONS)
            rc = kvg_body_scan_instructions(rw, pp);
        else
            rc = kvg_body_scan_value(&rw->sc, pp, 2);
        /* "instructions" is prompt only where the API reads it. */
        if (rc == 0 && (kind != MEMBER_INSTRUCTIONS || rw->api == KVG_BODY_API_RESPONSES))
            rw->info.prompt_bytes += (uint64_t)(*pp - v);
        return rc;
    default:
        return kvg_body_scan_value(&rw->sc, pp, 2);
    }
}

/* Add a piece to the output plan: a run of the body, or bytes that live as long as the arena. */
static void add_piece(rewrite *rw, const void *data, size_t len)
{
    kvg_body_plan *pl = rw->plan;
    if (!len)
        return;
    if (pl->npieces == pl->cap) {
        size_t cap = pl->cap ? 2 * pl->cap : 8;
        kvg_body_piece *ps = kvg_arena_alloc(rw->arena, cap * sizeof(*ps));
        if (!ps) {
            rw->plan_failed = true;
            return;
        }
        if (pl->npieces)
            memcpy(ps, pl->pieces, pl->npieces * sizeof(*ps));
        pl->pieces = ps;
        pl->cap = cap;
    }
    pl->pieces[pl->npieces++] = (kvg_body_piece){(const char *)data, len};
    pl->len += len;
}

static inline void emit(rewrite *rw, const unsigned char *from, const unsigned char *to)
{
    if (to > from)
        add_piece(rw, from, (size_t)(to - from));
}

/* Drop the member [key, value_end) (see the comment at the top for which comma goes). */
static void drop_member(rewrite *rw, const unsigned char *key, const unsigned char *value_end)
{
    if (rw->kept_end) {
        if (rw->flush < rw->kept_end)
            emit(rw, rw->flush, rw->kept_end);
    } else {
        emit(rw, rw->flush, key);
        rw->skip_separator = true;
    }
    rw->flush = value_end;
    rw->info.cache_salts_removed++;
}

static void add_salt(rewrite *rw, const unsigned char *close, const char *salt)
{
    if (rw->kept_end) {
        if (rw->flush <= rw->kept_end) {
            emit(rw, rw->flush, rw->kept_end);
            rw->flush = rw->kept_end;
        }
        add_piece(rw, ",\"cache_salt\":", 14);
    } else {
        /* In the place of the first removed member, if any, so that rewriting an output
         * gives the same bytes again. */
        if (!rw->info.cache_salts_removed) {
            emit(rw, rw->flush, close);
            rw->flush = close;
        }
        add_piece(rw, "\"cache_salt\":", 13);
    }
    /* The salt as a JSON string, in the arena. Scope salts are 43 base64url characters, which
     * need no escape: quoted as they are (a kvg_buf and its escaper cost ~900 instructions a
     * request, callgrind 2026-12-02); any other salt goes through the escaper. */
    size_t slen = strlen(salt);
    bool plain = true;
    for (size_t i = 0; i < slen && plain; i++) {
        unsigned char c = (unsigned char)salt[i];
        plain = c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
    }
    if (plain) {
        char *q = kvg_arena_alloc(rw->arena, slen + 3);
        if (!q) {
            rw->plan_failed = true;
            return;
        }
        q[0] = '"';
        memcpy(q + 1, salt, slen);
        q[slen + 1] = '"';
        q[slen + 2] = '\0';
        add_piece(rw, q, slen + 2);
        return;
    }
    kvg_buf quoted;
    kvg_buf_init(&quoted);
    kvg_buf_json_string(&quoted, salt, strlen(salt));
    char *copy = quoted.failed ? NULL : kvg_arena_strndup(rw->arena, quoted.data, quoted.len);
    if (copy) {
        add_piece(rw, copy, quoted.len);
    } else {
        rw->plan_failed = true;
    }
    kvg_buf_done(&quoted);
}

/* The body's top-level object, from its '{' at *pp to just past its '}'. */
static int rewrite_object(rewrite *rw, const unsigned char **pp, const char *salt)
{
    const scanner *sc = &rw->sc;
    const unsigned char *p = *pp + 1, *end = sc->end;
    int rc;
    p = skip_ws(p, end);
    if (p < end && *p == '}')
        goto close;
    for (;;) {
        p = skip_ws(p, end);
        if (p == end || *p != '"')
            return fail(sc, KVG_EPARSE, p, "expected string key in object");
        const unsigned char *key = p;
        bool escaped = false; /* as in scan_model */
        rc = scan_key(sc, &p, &escaped);
        if (rc < 0)
            return rc;
        member_kind kind = classify_key(key + 1, p - 1, escaped);
        if (rw->skip_separator) {
            rw->flush = key;
            rw->skip_separator = false;
        }
        p = skip_ws(p, end);
        if (p == end || *p != ':')
            return fail(sc, KVG_EPARSE, p, "expected ':' after object key");
        p++;
        const unsigned char *v = skip_ws(p, end);
        if (v == end)
            return fail(sc, KVG_EPARSE, v, "unexpected end of input");
        rw->seen[kind]++;
        rc = scan_member(rw, kind, &v);
        if (rc < 0)
            return rc;
        p = v;
        if (kind == MEMBER_CACHE_SALT)
            drop_member(rw, key, p);
        else
            rw->kept_end = p;
        p = skip_ws(p, end);
        if (p == end)
            return fail(sc, KVG_EPARSE, p, "unterminated object");
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '}')
            break;
        return fail(sc, KVG_EPARSE, p, "expected ',' or '}' in object");
    }
close:
    if (salt)
        add_salt(rw, p, salt);
    *pp = p + 1;
    return 0;
}

const char *kvg_body_api_str(kvg_body_api api)
{
    switch (api) {
    case KVG_BODY_API_OTHER:
        return "other";
    case KVG_BODY_API_COMPLETIONS:
        return "completions";
    case KVG_BODY_API_CHAT:
        return "chat";
    case KVG_BODY_API_RESPONSES:
        return "responses";
    default:
        return "unknown";
    }
}

int kvg_body_rewrite(const char *body, size_t len, const char *salt, kvg_arena *arena, kvg_buf *out,
                     kvg_body_info *info, kvg_json_error *err)
{
    return kvg_body_scan(body, len, KVG_BODY_API_OTHER, salt, arena, out, info, err);
}

int kvg_body_plan_copy(const kvg_body_plan *plan, char *dst)
{
    char *at = dst, *end = dst + plan->len;
    for (size_t i = 0; i < plan->npieces; i++) {
        if (plan->pieces[i].len > (size_t)(end - at))
            return -EINVAL;
        kvg_copy(at, plan->pieces[i].data, plan->pieces[i].len);
        at += plan->pieces[i].len;
    }
    return at == end ? 0 : -EINVAL;
}

int kvg_body_plan_write(const kvg_body_plan *plan, kvg_buf *out)
{
    if (plan->len > SIZE_MAX / 2 || kvg_buf_reserve(out, plan->len) < 0)
        return -ENOMEM;
    if (kvg_body_plan_copy(plan, out->data + out->len) < 0)
        return -ENOMEM; /* a plan whose pieces do not add up: never written */
    out->len += plan->len;
    out->data[out->len] = '\0';
    return 0;
}

int kvg_body_scan(const char *body, size_t len, kvg_body_api api, const char *salt,
                  kvg_arena *arena, kvg_buf *out, kvg_body_info *info, kvg_json_error *err)
{
    kvg_body_plan plan;
    int rc = kvg_body_scan_plan(body, len, api, salt, arena, &plan, info, err);
    if (rc < 0)
        return rc;
    if (kvg_body_plan_write(&plan, out) < 0) {
        if (err) {
            err->offset = 0;
            snprintf(err->message, sizeof(err->message), "out of memory");
        }
        return -ENOMEM;
    }
    return 0;
}

int kvg_body_scan_plan(const char *body, size_t len, kvg_body_api api, const char *salt,
                       kvg_arena *arena, kvg_body_plan *plan, kvg_body_info *info,
                       kvg_json_error *err)
{
    *plan = (kvg_body_plan){0};
    if ((unsigned)api >= KVG_BODY_API_COUNT)
        return -EINVAL;
    if (!body) {
        if (len)
            return -EINVAL;
        body = "";
    }
    rewrite rw = {
        .sc = {(const unsigned char *)body, (const unsigned char *)body + len, err, &rw.fault},
        .arena = arena,
        .plan = plan,
        .flush = (const unsigned char *)body,
        .api = api,
    };
    const scanner *sc = &rw.sc;
    const unsigned char *p = skip_ws(sc->start, sc->end);
    int rc;

    if (p == sc->end)
        return fail(sc, KVG_EPARSE, p, "unexpected end of input");
    const unsigned char *value = p;
    if (*p == '{')
        rc = rewrite_object(&rw, &p, salt);
    else
        rc = kvg_body_scan_value(sc, &p, 1);
    if (rc < 0)
        return rc;
    p = skip_ws(p, sc->end);
    if (p != sc->end)
        return fail(sc, KVG_EPARSE, p, "trailing characters after JSON value");
    if (*value != '{')
        return fail(sc, KVG_ETYPE, value, "body: must be a JSON object");
    if (rw.fault.rc)
        return fail(sc, rw.fault.rc, sc->start + rw.fault.offset, rw.fault.message);
    emit(&rw, rw.flush, sc->end);
    if (rw.plan_failed)
        return fail(sc, -ENOMEM, sc->start, "out of memory");
    if (rw.canon.overflow) /* stream_capacity is a proven bound: never, but never write past */
        return fail(sc, KVG_ELIMIT, sc->start, "canonical stream over its bound");
    if (rw.canon.is_tokens) {
        rw.info.prefix.is_tokens = true;
        rw.info.prefix.tokens = rw.canon.tokens;
        rw.info.prefix.ntokens = rw.canon.ntokens;
    } else {
        rw.info.prefix.text = rw.canon.buf;
        rw.info.prefix.text_len = rw.canon.len;
    }
    if (info)
        *info = rw.info;
    return 0;
}
