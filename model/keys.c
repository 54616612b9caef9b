/* SPDX-License-Identifier: Apache-2.0 */
/* A request's token-exact block keys: the body rendered and tokenized as vLLM does, then named
 * with vLLM's block hash chain (docs/canonical.md, "Token-exact mode"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_int.h"

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        if (err && errlen)                                                                         \
            snprintf(err, errlen, __VA_ARGS__);                                                    \
        rc = (code);                                                                               \
        goto out;                                                                                  \
    } while (0)

/* A render is bounded by what the tenant sent, not by the defaults meant for the operator's
 * own uses: real templates write each message once or twice and walk it a few times, so
 * output and memory stay within small multiples of the body, and steps within a few hundred
 * per body byte. */
static void limits_for(size_t len, kvg_template_limits *l)
{
    kvg_template_limits_default(l);
    size_t n = len + 4096;
    l->max_output = 8 * n + (64u << 10);
    l->max_string = l->max_output;
    l->max_memory = 32 * n + (1u << 20);
    l->max_loop = n + 10000;
    l->max_steps = 256 * (uint64_t)n + 100000;
}

/* vLLM's add_special_tokens request field: a boolean; null or absent keeps the API's default. */
static int add_special(const kvg_json *body, bool def, bool *out, char *err, size_t errlen)
{
    const kvg_json *v = kvg_json_get(body, "add_special_tokens");
    *out = def;
    if (!v || v->type == KVG_JSON_NULL)
        return 0;
    if (v->type != KVG_JSON_TRUE && v->type != KVG_JSON_FALSE) {
        if (err && errlen)
            snprintf(err, errlen, "add_special_tokens: must be a boolean");
        return KVG_EPARSE;
    }
    *out = v->type == KVG_JSON_TRUE;
    return 0;
}

/* Token ids of a prompt given as ids: each an integer the vocabulary could hold. */
static int ids_of(const kvg_json *arr, kvg_tokens *t, char *err, size_t errlen)
{
    for (size_t i = 0; i < arr->u.arr.count; i++) {
        const kvg_json *v = arr->u.arr.items[i];
        if (v->type != KVG_JSON_NUMBER || !v->u.num.is_int || v->u.num.ival < 0 ||
            v->u.num.ival > UINT32_MAX) {
            if (err && errlen)
                snprintf(err, errlen, "prompt[%zu]: not a token id", i);
            return KVG_EPARSE;
        }
        if (t->len == t->cap) {
            size_t cap = t->cap ? t->cap * 2 : 256;
            uint32_t *ids = realloc(t->ids, cap * sizeof(*ids));
            if (!ids)
                return -ENOMEM;
            t->ids = ids;
            t->cap = cap;
        }
        t->ids[t->len++] = (uint32_t)v->u.num.ival;
    }
    return 0;
}

/* scope: the scope salt, the pieces cache's scope (docs/isolation.md: nothing is shared across
 * scopes, timing included). */
static int completions_tokens(const kvg_model *m, const kvg_json *body, const char *scope,
                              kvg_tokens *t, char *err, size_t errlen)
{
    int rc = 0;
    const kvg_json *p = kvg_json_get(body, "prompt");
    if (!p || p->type == KVG_JSON_NULL)
        FAIL(KVG_EPARSE, "no prompt");
    if (p->type == KVG_JSON_ARRAY && p->u.arr.count == 1 &&
        (p->u.arr.items[0]->type == KVG_JSON_STRING || p->u.arr.items[0]->type == KVG_JSON_ARRAY))
        p = p->u.arr.items[0]; /* a batch of one is that prompt */
    if (p->type == KVG_JSON_ARRAY) {
        for (size_t i = 0; i < p->u.arr.count; i++)
            if (p->u.arr.items[i]->type != KVG_JSON_NUMBER)
                FAIL(KVG_EPARSE, "a batch of prompts"); /* several requests in the engine */
        return ids_of(p, t, err, errlen);
    }
    if (p->type != KVG_JSON_STRING)
        FAIL(KVG_EPARSE, "prompt: not a string or token ids");
    bool special;
    if ((rc = add_special(body, true, &special, err, errlen)) < 0)
        goto out;
    rc = kvg_tokenizer_encode_cached(m->tokenizer, p->u.str.ptr, p->u.str.len, special,
                                     m->token_cache, scope, strlen(scope), t);
    if (rc == KVG_EPARSE)
        FAIL(KVG_EPARSE, "prompt: not valid UTF-8");
out:
    return rc;
}

static int chat_tokens(const kvg_model *m, const kvg_json *body, size_t len, const char *scope,
                       kvg_arena *arena, kvg_tokens *t, char *err, size_t errlen)
{
    int rc = 0;
    kvg_buf text;
    kvg_buf_init(&text);
    if (!m->tpl)
        FAIL(KVG_EPARSE, "the model has no chat template");
    kvg_json *ctx = NULL;
    if ((rc = kvg_template_prepare(body, &m->vars, arena, &ctx, err, errlen)) < 0)
        goto out;
    kvg_template_limits limits;
    limits_for(len, &limits);
    kvg_template_opts opts = {.limits = &limits, .now_s = -1};
    if ((rc = kvg_template_render(m->tpl, ctx, &opts, &text, err, errlen)) < 0) {
        if (rc != -ENOMEM)
            rc = KVG_EPARSE; /* the template raised, or a limit: the engine would answer 400 */
        goto out;
    }
    if (text.failed)
        FAIL(-ENOMEM, "out of memory");
    bool special;
    if ((rc = add_special(body, false, &special, err, errlen)) < 0)
        goto out;
    rc = kvg_tokenizer_encode_cached(m->tokenizer, text.data ? (const char *)text.data : "",
                                     text.len, special, m->token_cache, scope, strlen(scope), t);
    if (rc == KVG_EPARSE)
        FAIL(KVG_EPARSE, "the rendered prompt is not valid UTF-8");
out:
    kvg_buf_done(&text);
    return rc;
}

int kvg_model_keys(const kvg_model *m, kvg_model_input input, const char *body, size_t len,
                   const char *salt, size_t max_blocks, kvg_arena *arena, kvg_model_keys_out *out,
                   char *err, size_t errlen)
{
    int rc = 0;
    *out = (kvg_model_keys_out){0};
    if (err && errlen)
        err[0] = '\0';
    kvg_tokens t;
    kvg_tokens_init(&t);
    kvg_json *root = NULL;
    kvg_json_error jerr;
    kvg_json_limits jl = {.max_depth = 64};
    if ((rc = kvg_json_parse(body, len, arena, &jl, &root, &jerr)) < 0) {
        if (rc != -ENOMEM)
            FAIL(KVG_EPARSE, "body: %s", jerr.message);
        goto out;
    }
    if (root->type != KVG_JSON_OBJECT)
        FAIL(KVG_EPARSE, "body: not an object");
    const kvg_json *v = kvg_json_get(root, "truncate_prompt_tokens");
    if (v && v->type != KVG_JSON_NULL)
        FAIL(KVG_EPARSE, "truncate_prompt_tokens"); /* the engine cuts the prompt's start */
    if (input == KVG_MODEL_INPUT_CHAT)
        rc = chat_tokens(m, root, len, salt ? salt : "", arena, &t, err, errlen);
    else if (input == KVG_MODEL_INPUT_COMPLETIONS)
        rc = completions_tokens(m, root, salt ? salt : "", &t, err, errlen);
    else
        FAIL(-EINVAL, "unknown input");
    if (rc < 0)
        goto out;

    out->ntokens = t.len;
    size_t n = KVG_MIN(t.len / m->block_size, max_blocks);
    if (n == 0)
        goto out;
    out->keys = kvg_arena_alloc(arena, n * sizeof(*out->keys));
    if (!out->keys)
        FAIL(-ENOMEM, "out of memory");
    /* The first blocks with their digests (for explain), then the rest of the chain from the
     * last of them, keys only. */
    size_t first = KVG_MIN(n, KVG_ARRAY_LEN(out->first_hashes)), done = 0;
    kvg_vllm_blocks in = {
        .algo = m->algo,
        .parent = &m->none_hash,
        .tokens = t.ids,
        .ntokens = first * m->block_size,
        .block_size = m->block_size,
        .cache_salt = salt,
        .cache_salt_len = salt ? strlen(salt) : 0,
    };
    if ((rc = kvg_vllm_block_hashes(&in, out->first_hashes, out->keys, first, &done)) < 0)
        FAIL(rc == -EILSEQ ? KVG_EPARSE : rc, "block hashes: %s", kvg_strerror(rc));
    if (n > first) {
        in.parent = &out->first_hashes[first - 1];
        in.tokens = t.ids + first * m->block_size;
        in.ntokens = (n - first) * m->block_size;
        in.cache_salt = NULL; /* block 0 only */
        in.cache_salt_len = 0;
        size_t more = 0;
        if ((rc = kvg_vllm_block_hashes(&in, NULL, out->keys + first, n - first, &more)) < 0)
            FAIL(rc, "block hashes: %s", kvg_strerror(rc));
        done += more;
    }
    out->nkeys = (uint32_t)done;
out:
    kvg_tokens_done(&t);
    if (rc < 0) {
        out->keys = NULL;
        out->nkeys = 0;
    }
    return rc;
}
