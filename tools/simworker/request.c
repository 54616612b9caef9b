/* SPDX-License-Identifier: Apache-2.0 */
/* Request bodies of the OpenAI-compatible endpoints -> prompt tokens and parameters, with the
 * 400/404/413 errors vLLM gives (each names the offending field). */
#include "simworker.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A JSON tree costs more than its text (a 2-byte "1," is a 48-byte node); this caps what one
 * body may cost to parse. Bodies are capped separately (--max-body-bytes). */
#define JSON_ARENA_LIMIT (256u << 20)
#define JSON_ARENA_PER_BYTE 32u

const char *sim_endpoint_str(sim_endpoint ep)
{
    static const char *const names[SIM_EP_COUNT] = {"completions", "chat", "embeddings",
                                                    "tokenize"};
    return ep < SIM_EP_COUNT ? names[ep] : "?";
}

static int fail(sim_error *err, int status, const char *type, const char *param, const char *fmt,
                ...) KVG_PRINTF(5, 6);

static int fail(sim_error *err, int status, const char *type, const char *param, const char *fmt,
                ...)
{
    err->status = status;
    err->type = type;
    snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return KVG_EPARSE;
}

#define bad(err, param, ...) fail(err, 400, "BadRequestError", param, __VA_ARGS__)

static bool is_null(const kvg_json *v)
{
    return !v || v->type == KVG_JSON_NULL;
}

/* An integral JSON number (pydantic also accepts 16.0 for an int field). */
static bool as_int(const kvg_json *v, int64_t *out)
{
    if (v->type != KVG_JSON_NUMBER)
        return false;
    if (v->u.num.is_int) {
        *out = v->u.num.ival;
        return true;
    }
    double d = v->u.num.value;
    if (!isfinite(d) || d != floor(d) || d < -9.2e18 || d > 9.2e18)
        return false;
    *out = (int64_t)d;
    return true;
}

static int opt_bool(const kvg_json *obj, const char *key, bool def, bool *out, sim_error *err)
{
    const kvg_json *v = kvg_json_get(obj, key);
    if (is_null(v)) {
        *out = def;
        return 0;
    }
    if (v->type != KVG_JSON_TRUE && v->type != KVG_JSON_FALSE)
        return bad(err, key, "'%s' must be a boolean, got %s", key, kvg_json_type_str(v->type));
    *out = v->type == KVG_JSON_TRUE;
    return 0;
}

/* An optional integer >= min; *present tells whether it was given. */
static int opt_int(const kvg_json *obj, const char *key, int64_t min, bool *present, int64_t *out,
                   sim_error *err)
{
    const kvg_json *v = kvg_json_get(obj, key);
    *present = false;
    if (is_null(v))
        return 0;
    int64_t x;
    if (!as_int(v, &x))
        return bad(err, key, "'%s' must be an integer, got %s", key, kvg_json_type_str(v->type));
    if (x < min)
        return bad(err, key, "'%s' must be at least %lld, got %lld", key, (long long)min,
                   (long long)x);
    *present = true;
    *out = x;
    return 0;
}

/* Moves the tokens into the request. A prompt longer than max_model_len keeps its true count
 * in n but only max_model_len ids; check_length() refuses it before anything reads them. */
static int add_prompt(sim_request *req, sim_tokens *t)
{
    sim_prompt *p = &req->prompts[req->n_prompts++];
    p->tokens = t->v;
    p->n = t->n;
    t->v = NULL; /* ownership moves to the request */
    t->n = t->cap = 0;
    return 0;
}

/* Token-exact mode: the ids as the model's tokenizer gives them, kept whole (check_length()
 * refuses an oversized prompt). */
static int exact_prompt(sim_request *req, uint32_t *ids, size_t n)
{
    sim_prompt *p = &req->prompts[req->n_prompts++];
    p->tokens = ids;
    p->n = n;
    return 0;
}

static int text_prompt(const sim_config *cfg, sim_request *req, const char *text, size_t len,
                       bool add_special, sim_tokens *t, sim_error *err)
{
    if (cfg->exact) {
        uint32_t *ids = NULL;
        size_t n = 0;
        int rc = sim_exact_encode(cfg->exact, text, len, add_special, &ids, &n);
        if (rc == KVG_EPARSE) /* the JSON parser already refuses invalid UTF-8 */
            return bad(err, NULL, "The prompt is not valid UTF-8");
        return rc < 0 ? rc : exact_prompt(req, ids, n);
    }
    sim_tokens_init(t, cfg->max_model_len);
    if (sim_tokenize(text, len, t) < 0)
        return -ENOMEM;
    return add_prompt(req, t);
}

static int ids_prompt(const sim_config *cfg, sim_request *req, const kvg_json *arr,
                      const char *field, sim_tokens *t, sim_error *err)
{
    /* vLLM refuses ids past the tokenizer's largest; the approximation has Qwen2's vocabulary. */
    uint32_t vocab = cfg->exact ? sim_exact_vocab_size(cfg->exact) : SIM_VOCAB_SIZE;
    sim_tokens_init(t, cfg->max_model_len);
    for (size_t i = 0; i < arr->u.arr.count; i++) {
        int64_t id;
        const kvg_json *v = arr->u.arr.items[i];
        if (!as_int(v, &id))
            return bad(err, field, "'%s' token ids must be integers, got %s", field,
                       kvg_json_type_str(v->type));
        if (id < 0 || id >= vocab)
            return bad(err, field, "Token id %lld in '%s' is out of vocabulary (size %u)",
                       (long long)id, field, vocab);
        if (sim_tokens_push(t, (uint32_t)id) < 0)
            return -ENOMEM;
    }
    return add_prompt(req, t);
}

/* A prompt is a string, a list of strings, a list of token ids or a list of token-id lists
 * (the last two as for vLLM's completions and embeddings). Lists are batches. */
static int parse_prompts(const sim_config *cfg, const kvg_json *v, const char *field, bool batch,
                         bool add_special, sim_request *req, sim_error *err)
{
    static const char shapes[] =
        "must be a string, a list of strings, a list of token ids or a list of token id lists";
    sim_tokens t;
    sim_tokens_init(&t, 0);
    int rc = 0;
    if (is_null(v))
        return bad(err, field, "'%s' is required", field);
    size_t count = 1;
    const kvg_json *first = NULL;
    if (v->type == KVG_JSON_ARRAY) {
        if (v->u.arr.count == 0)
            return bad(err, field, "'%s' must not be empty", field);
        first = v->u.arr.items[0];
        if (first->type == KVG_JSON_STRING || first->type == KVG_JSON_ARRAY)
            count = v->u.arr.count;
        else if (first->type != KVG_JSON_NUMBER)
            return bad(err, field, "'%s' %s", field, shapes);
    } else if (v->type != KVG_JSON_STRING) {
        return bad(err, field, "'%s' %s", field, shapes);
    }
    if (count > 1 && !batch)
        return bad(err, field, "'%s' must hold a single prompt here", field);
    if (count > SIM_MAX_BATCH)
        return bad(err, field, "'%s' holds %zu prompts; at most %d per request", field, count,
                   SIM_MAX_BATCH);
    req->prompts = calloc(count, sizeof(*req->prompts));
    if (!req->prompts)
        return -ENOMEM;
    if (v->type == KVG_JSON_STRING) {
        rc = text_prompt(cfg, req, v->u.str.ptr, v->u.str.len, add_special, &t, err);
    } else if (first->type == KVG_JSON_NUMBER) {
        rc = ids_prompt(cfg, req, v, field, &t, err);
    } else {
        for (size_t i = 0; i < count && rc == 0; i++) {
            const kvg_json *item = v->u.arr.items[i];
            if (item->type != first->type)
                rc = bad(err, field, "'%s' %s (item %zu is a %s)", field, shapes, i,
                         kvg_json_type_str(item->type));
            else if (item->type == KVG_JSON_STRING)
                rc = text_prompt(cfg, req, item->u.str.ptr, item->u.str.len, add_special, &t, err);
            else
                rc = ids_prompt(cfg, req, item, field, &t, err);
        }
    }
    sim_tokens_done(&t);
    return rc;
}

/* ---- chat ----------------------------------------------------------------------------------- */

static int check_messages(const kvg_json *messages, sim_error *err)
{
    if (is_null(messages))
        return bad(err, "messages", "'messages' is required");
    if (messages->type != KVG_JSON_ARRAY)
        return bad(err, "messages", "'messages' must be a list, got %s",
                   kvg_json_type_str(messages->type));
    if (messages->u.arr.count == 0)
        return bad(err, "messages", "'messages' must not be empty");
    for (size_t i = 0; i < messages->u.arr.count; i++) {
        char field[64];
        const kvg_json *m = messages->u.arr.items[i];
        snprintf(field, sizeof(field), "messages[%zu]", i);
        if (m->type != KVG_JSON_OBJECT)
            return bad(err, field, "'%s' must be an object", field);
        const kvg_json *role = kvg_json_get(m, "role");
        if (!role || role->type != KVG_JSON_STRING || role->u.str.len == 0) {
            snprintf(field, sizeof(field), "messages[%zu].role", i);
            return bad(err, field, "'%s' must be a non-empty string", field);
        }
        const kvg_json *content = kvg_json_get(m, "content");
        snprintf(field, sizeof(field), "messages[%zu].content", i);
        if (content && content->type == KVG_JSON_ARRAY) {
            for (size_t j = 0; j < content->u.arr.count; j++) {
                const kvg_json *part = content->u.arr.items[j];
                const kvg_json *type = kvg_json_get(part, "type");
                const kvg_json *text = kvg_json_get(part, "text");
                snprintf(field, sizeof(field), "messages[%zu].content[%zu]", i, j);
                if (part->type != KVG_JSON_OBJECT || !type || type->type != KVG_JSON_STRING)
                    return bad(err, field, "'%s' must be an object with a string 'type'", field);
                if (strcmp(type->u.str.ptr, "text") != 0)
                    return bad(err, field,
                               "'%s': content part type '%s' is not supported by a "
                               "text-only model",
                               field, type->u.str.ptr);
                if (!text || text->type != KVG_JSON_STRING)
                    return bad(err, field, "'%s.text' must be a string", field);
            }
        } else if (!is_null(content) && content->type != KVG_JSON_STRING) {
            return bad(err, field, "'%s' must be a string, a list of content parts or null", field);
        }
        const kvg_json *calls = kvg_json_get(m, "tool_calls");
        if (!is_null(calls) && calls->type != KVG_JSON_ARRAY) {
            snprintf(field, sizeof(field), "messages[%zu].tool_calls", i);
            return bad(err, field, "'%s' must be a list", field);
        }
    }
    return 0;
}

static int check_tools(const kvg_json *tools, sim_error *err)
{
    if (is_null(tools))
        return 0;
    if (tools->type != KVG_JSON_ARRAY)
        return bad(err, "tools", "'tools' must be a list, got %s", kvg_json_type_str(tools->type));
    for (size_t i = 0; i < tools->u.arr.count; i++)
        if (tools->u.arr.items[i]->type != KVG_JSON_OBJECT)
            return bad(err, "tools", "'tools[%zu]' must be an object", i);
    return 0;
}

/* Token-exact mode: vLLM's own preprocessing and the model's template (exact.c). A request
 * that cannot be rendered gets vLLM's answer, a 400. */
static int exact_chat_prompt(const sim_config *cfg, const kvg_json *body, bool add_special,
                             sim_request *req, sim_error *err)
{
    uint32_t *ids = NULL;
    size_t n = 0;
    char why[sizeof(err->message)] = "";
    int rc = sim_exact_chat(cfg->exact, body, add_special, &ids, &n, why, sizeof(why));
    if (rc == KVG_EPARSE)
        return bad(err, NULL, "%s", why[0] ? why : "the chat template cannot render this request");
    if (rc < 0)
        return rc;
    return exact_prompt(req, ids, n);
}

static int chat_prompt(const sim_config *cfg, const kvg_json *body, bool add_special,
                       sim_request *req, sim_error *err)
{
    const kvg_json *messages = kvg_json_get(body, "messages");
    const kvg_json *tools = kvg_json_get(body, "tools");
    bool add_gen = true;
    int rc = check_messages(messages, err);
    if (rc == 0)
        rc = check_tools(tools, err);
    if (rc == 0)
        rc = opt_bool(body, "add_generation_prompt", true, &add_gen, err);
    if (rc < 0)
        return rc;
    req->prompts = calloc(1, sizeof(*req->prompts));
    if (!req->prompts)
        return -ENOMEM;
    if (cfg->exact)
        return exact_chat_prompt(cfg, body, add_special, req, err);
    kvg_buf text;
    kvg_buf_init(&text);
    sim_tokens t;
    sim_tokens_init(&t, 0);
    rc = sim_chat_render(messages, tools, add_gen, &text);
    if (rc == 0)
        rc = text_prompt(cfg, req, text.data ? text.data : "", text.len, false, &t, err);
    sim_tokens_done(&t);
    kvg_buf_done(&text);
    return rc;
}

/* ---- the whole body ------------------------------------------------------------------------- */

static int check_model(const sim_config *cfg, const kvg_json *body, sim_request *req,
                       sim_error *err)
{
    const kvg_json *model = kvg_json_get(body, "model");
    req->model = cfg->models[0];
    if (is_null(model))
        return 0;
    if (model->type != KVG_JSON_STRING)
        return bad(err, "model", "'model' must be a string, got %s",
                   kvg_json_type_str(model->type));
    for (size_t i = 0; i < cfg->n_models; i++) {
        if (strlen(cfg->models[i]) == model->u.str.len &&
            memcmp(cfg->models[i], model->u.str.ptr, model->u.str.len) == 0) {
            req->model = cfg->models[i];
            return 0;
        }
    }
    return fail(err, 404, "NotFoundError", "model", "The model `%.200s` does not exist.",
                model->u.str.ptr);
}

static int check_salt(const kvg_json *body, sim_request *req, sim_error *err)
{
    const kvg_json *salt = kvg_json_get(body, "cache_salt");
    if (is_null(salt))
        return 0;
    if (salt->type != KVG_JSON_STRING || salt->u.str.len == 0)
        return bad(err, "cache_salt",
                   "Parameter 'cache_salt' must be a non-empty string if "
                   "provided.");
    req->cache_salt = malloc(salt->u.str.len + 1);
    if (!req->cache_salt)
        return -ENOMEM;
    memcpy(req->cache_salt, salt->u.str.ptr, salt->u.str.len + 1);
    req->cache_salt_len = salt->u.str.len;
    return 0;
}

static int check_stream(const kvg_json *body, sim_request *req, sim_error *err)
{
    int rc = opt_bool(body, "stream", false, &req->stream, err);
    if (rc < 0)
        return rc;
    const kvg_json *opts = kvg_json_get(body, "stream_options");
    if (is_null(opts))
        return 0;
    if (opts->type != KVG_JSON_OBJECT)
        return bad(err, "stream_options", "'stream_options' must be an object, got %s",
                   kvg_json_type_str(opts->type));
    if (!req->stream)
        return bad(err, "stream_options", "Stream options can only be defined when `stream=True`.");
    return opt_bool(opts, "include_usage", false, &req->include_usage, err);
}

/* max_tokens (and max_completion_tokens for chat, which wins). Unset: the configured default,
 * shortened to what the context has left. Set: must fit, or the request is refused. */
static int check_max_tokens(const sim_config *cfg, const kvg_json *body, sim_request *req,
                            bool *explicit_out, sim_error *err)
{
    bool present = false, present2 = false;
    int64_t v = 0, v2 = 0;
    int rc = opt_int(body, "max_tokens", 1, &present, &v, err);
    if (rc == 0 && req->ep == SIM_EP_CHAT)
        rc = opt_int(body, "max_completion_tokens", 1, &present2, &v2, err);
    if (rc < 0)
        return rc;
    if (present2) {
        v = v2;
        present = true;
    }
    *explicit_out = present;
    req->max_tokens = present ? (uint32_t)KVG_MIN(v, (int64_t)UINT32_MAX) : cfg->default_max_tokens;
    return 0;
}

static int check_length(const sim_config *cfg, sim_request *req, bool explicit_max, sim_error *err)
{
    const char *field = req->ep == SIM_EP_CHAT         ? "messages"
                        : req->ep == SIM_EP_EMBEDDINGS ? "input"
                                                       : "prompt";
    for (size_t i = 0; i < req->n_prompts; i++) {
        size_t n = req->prompts[i].n;
        if (n == 0)
            return bad(err, field, "The decoder prompt cannot be empty");
        if (req->ep == SIM_EP_EMBEDDINGS || req->ep == SIM_EP_TOKENIZE) {
            if (n > cfg->max_model_len)
                return bad(err, field,
                           "This model's maximum context length is %u tokens. However, you "
                           "requested %zu tokens in the input for embedding generation. Please "
                           "reduce the length of the input.",
                           cfg->max_model_len, n);
            continue;
        }
        if (!explicit_max && n < cfg->max_model_len && req->max_tokens > cfg->max_model_len - n)
            req->max_tokens = (uint32_t)(cfg->max_model_len - n);
        if ((uint64_t)n + req->max_tokens > cfg->max_model_len)
            return bad(err, field,
                       "This model's maximum context length is %u tokens. However, you "
                       "requested %llu tokens (%zu in the messages, %u in the completion). "
                       "Please reduce the length of the messages or completion.",
                       cfg->max_model_len, (unsigned long long)n + req->max_tokens, n,
                       req->max_tokens);
    }
    return 0;
}

static int check_embedding_opts(const kvg_json *body, sim_request *req, sim_error *err)
{
    const kvg_json *fmt = kvg_json_get(body, "encoding_format");
    if (!is_null(fmt)) {
        if (fmt->type == KVG_JSON_STRING && strcmp(fmt->u.str.ptr, "base64") == 0)
            req->base64 = true;
        else if (fmt->type != KVG_JSON_STRING || strcmp(fmt->u.str.ptr, "float") != 0)
            return bad(err, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    }
    bool present;
    int64_t dims = 0;
    int rc = opt_int(body, "dimensions", 1, &present, &dims, err);
    if (rc < 0)
        return rc;
    if (present && dims > SIM_MAX_EMBED_DIMS)
        return bad(err, "dimensions", "'dimensions' must be at most %d", SIM_MAX_EMBED_DIMS);
    req->dimensions = present ? (uint32_t)dims : 32;
    return 0;
}

int sim_request_parse(const sim_config *cfg, sim_endpoint ep, const char *body, size_t len,
                      sim_request *out, sim_error *err)
{
    sim_request req = {.ep = ep};
    kvg_arena arena;
    kvg_arena_init(&arena, 64u << 10);
    arena.limit = len > JSON_ARENA_LIMIT / JSON_ARENA_PER_BYTE
                      ? JSON_ARENA_LIMIT
                      : KVG_MIN((size_t)JSON_ARENA_LIMIT, len * JSON_ARENA_PER_BYTE + (1u << 20));
    kvg_json *root = NULL;
    kvg_json_error jerr = {0};
    kvg_json_limits limits = {.max_depth = 64};
    bool explicit_max = false;
    int rc = kvg_json_parse(body, len, &arena, &limits, &root, &jerr);
    if (rc == -ENOMEM) {
        rc = fail(err, 413, "BadRequestError", NULL,
                  "Request body is too large or too complex to parse");
        goto done;
    }
    if (rc < 0) {
        rc = bad(err, NULL, "Invalid JSON at byte %zu: %s", jerr.offset, jerr.message);
        goto done;
    }
    if (root->type != KVG_JSON_OBJECT) {
        rc = bad(err, NULL, "Request body must be a JSON object, got %s",
                 kvg_json_type_str(root->type));
        goto done;
    }
    /* Types first, then the model (vLLM validates the body before it looks the model up),
     * then the prompt, whose length checks need max_tokens. */
    if (ep != SIM_EP_EMBEDDINGS && ep != SIM_EP_TOKENIZE) {
        rc = check_stream(root, &req, err);
        if (rc == 0)
            rc = check_max_tokens(cfg, root, &req, &explicit_max, err);
    } else if (ep == SIM_EP_EMBEDDINGS) {
        rc = check_embedding_opts(root, &req, err);
    }
    if (rc == 0)
        rc = check_salt(root, &req, err);
    if (rc == 0) {
        const kvg_json *model = kvg_json_get(root, "model");
        if (!is_null(model) && model->type != KVG_JSON_STRING)
            rc = bad(err, "model", "'model' must be a string, got %s",
                     kvg_json_type_str(model->type));
    }
    bool chat =
        ep == SIM_EP_CHAT || (ep == SIM_EP_TOKENIZE && !is_null(kvg_json_get(root, "messages")));
    bool add_special = !chat;
    /* vLLM's add_special_tokens: false for chat (the template holds BOS), true for prompts (the
     * post-processor adds BOS where the tokenizer says). Only the real tokenizer has any. */
    if (rc == 0 && cfg->exact)
        rc = opt_bool(root, "add_special_tokens", add_special, &add_special, err);
    if (rc == 0) {
        if (chat)
            rc = chat_prompt(cfg, root, add_special, &req, err);
        else if (ep == SIM_EP_EMBEDDINGS)
            rc = parse_prompts(cfg, kvg_json_get(root, "input"), "input", true, add_special, &req,
                               err);
        else
            rc = parse_prompts(cfg, kvg_json_get(root, "prompt"), "prompt",
                               ep == SIM_EP_COMPLETIONS, add_special, &req, err);
    }
    if (rc == 0)
        rc = check_model(cfg, root, &req, err);
    if (rc == 0)
        rc = check_length(cfg, &req, explicit_max, err);
    if (ep == SIM_EP_EMBEDDINGS || ep == SIM_EP_TOKENIZE)
        req.max_tokens = 0;
done:
    kvg_arena_done(&arena);
    if (rc < 0) {
        sim_request_done(&req);
        return rc;
    }
    *out = req;
    return 0;
}

void sim_request_done(sim_request *req)
{
    for (size_t i = 0; i < req->n_prompts; i++)
        free(req->prompts[i].tokens);
    free(req->prompts);
    free(req->cache_salt);
    memset(req, 0, sizeof(*req));
}
