/* SPDX-License-Identifier: Apache-2.0 */
/* Token-exact mode of the simulated worker: a request's token ids from the model's own
 * tokenizer.json and chat template, and its block keys from vLLM's block hash (vllm_hash.c). */
#include "simworker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "template.h"
#include "tokenizer.h"

/* A tokenizer_config.json or a template file: real ones are a few kB to a few hundred kB. */
#define TEXT_FILE_MAX (16u << 20)
/* Words of generated text (tokenizer.c's list of 64). */
#define OUTPUT_WORDS 64u

struct sim_exact {
    kvg_tokenizer *tok;
    kvg_template *tpl; /* NULL: the model has no chat template (chat requests get 400) */
    sim_tokcfg tc;
    bool openai_content;
    sim_vllm_algo algo;
    uint8_t none_hash[SIM_VLLM_DIGEST_MAX];
    size_t none_len;
    uint32_t out_ids[OUTPUT_WORDS];
};

static int errf(char *err, size_t errlen, int rc, const char *fmt, ...) KVG_PRINTF(4, 5);

static int errf(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* ---- tokenizer_config.json ------------------------------------------------------------------ */

static int dup_str(const kvg_json *v, char **out)
{
    char *s = malloc(v->u.str.len + 1);
    if (!s)
        return -ENOMEM;
    memcpy(s, v->u.str.ptr, v->u.str.len + 1);
    *out = s;
    return 0;
}

/* bos_token / eos_token: a string, or transformers' serialised AddedToken {"content": ...}. */
static int special_token(const kvg_json *root, const char *key, char **out, char *err,
                         size_t errlen)
{
    const kvg_json *v = kvg_json_get(root, key);
    if (!v || v->type == KVG_JSON_NULL)
        return 0;
    if (v->type == KVG_JSON_OBJECT)
        v = kvg_json_get(v, "content");
    if (!v || v->type != KVG_JSON_STRING)
        return errf(err, errlen, KVG_EPARSE,
                    "\"%s\" must be a string or an object with a string \"content\"", key);
    return dup_str(v, out);
}

/* transformers keeps a list of named templates as a dict and, with no name asked for, takes
 * "default"; a list without one cannot be used without a name. */
static int chat_template(const kvg_json *root, char **out, char *err, size_t errlen)
{
    const kvg_json *v = kvg_json_get(root, "chat_template");
    if (!v || v->type == KVG_JSON_NULL)
        return 0;
    if (v->type == KVG_JSON_STRING)
        return dup_str(v, out);
    if (v->type != KVG_JSON_ARRAY)
        return errf(err, errlen, KVG_EPARSE,
                    "\"chat_template\" must be a string or a list of {name, template}");
    const kvg_json *found = NULL;
    for (size_t i = 0; i < v->u.arr.count; i++) {
        const kvg_json *it = v->u.arr.items[i];
        const kvg_json *name = kvg_json_get(it, "name");
        const kvg_json *tpl = kvg_json_get(it, "template");
        if (!name || name->type != KVG_JSON_STRING || !tpl || tpl->type != KVG_JSON_STRING)
            return errf(err, errlen, KVG_EPARSE,
                        "\"chat_template\"[%zu] must be an object with string \"name\" and "
                        "\"template\"",
                        i);
        if (strcmp(name->u.str.ptr, "default") == 0)
            found = tpl; /* the last one wins, as in a Python dict */
    }
    if (!found)
        return errf(err, errlen, KVG_EPARSE,
                    "\"chat_template\" is a list of named templates without a \"default\" one");
    return dup_str(found, out);
}

int sim_tokcfg_parse(const char *json, size_t len, sim_tokcfg *out, char *err, size_t errlen)
{
    sim_tokcfg tc = {0};
    kvg_arena arena;
    kvg_arena_init(&arena, 64u << 10);
    kvg_json *root = NULL;
    kvg_json_error jerr = {0};
    int rc = kvg_json_parse(json, len, &arena, NULL, &root, &jerr);
    if (rc == -ENOMEM)
        goto done;
    if (rc < 0) {
        rc = errf(err, errlen, KVG_EPARSE, "not JSON (byte %zu: %s)", jerr.offset, jerr.message);
        goto done;
    }
    if (root->type != KVG_JSON_OBJECT) {
        rc = errf(err, errlen, KVG_EPARSE, "not a JSON object");
        goto done;
    }
    rc = chat_template(root, &tc.chat_template, err, errlen);
    if (rc == 0)
        rc = special_token(root, "bos_token", &tc.bos_token, err, errlen);
    if (rc == 0)
        rc = special_token(root, "eos_token", &tc.eos_token, err, errlen);
done:
    kvg_arena_done(&arena);
    if (rc < 0) {
        sim_tokcfg_done(&tc);
        return rc;
    }
    *out = tc;
    return 0;
}

void sim_tokcfg_done(sim_tokcfg *tc)
{
    free(tc->chat_template);
    free(tc->bos_token);
    free(tc->eos_token);
    memset(tc, 0, sizeof(*tc));
}

/* ---- loading -------------------------------------------------------------------------------- */

/* The whole file, NUL-terminated; -errno or KVG_ELIMIT. */
static int read_text(const char *path, char **out, size_t *len)
{
    int rc = kvg_read_file(path, TEXT_FILE_MAX, out, len);
    return rc == -EISDIR ? -EINVAL : rc;
}

/* tokenizer_config.json beside tokenizer.json, as vLLM finds both in the model's folder. */
static int sibling_config(const char *tokenizer_path, char *out, size_t outlen)
{
    const char *slash = strrchr(tokenizer_path, '/');
    int dir = slash ? (int)(slash - tokenizer_path + 1) : 0;
    int n = snprintf(out, outlen, "%.*stokenizer_config.json", dir, tokenizer_path);
    return n < 0 || (size_t)n >= outlen ? -ENAMETOOLONG : 0;
}

static int load_config(const sim_config *cfg, sim_exact *ex, char *err, size_t errlen)
{
    char sibling[4096];
    const char *path = cfg->tokenizer_config_path;
    if (!path) {
        if (sibling_config(cfg->tokenizer_path, sibling, sizeof(sibling)) < 0 ||
            access(sibling, F_OK) != 0)
            return 0; /* none: no template, no special tokens */
        path = sibling;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = read_text(path, &text, &len);
    if (rc < 0)
        return errf(err, errlen, rc, "--tokenizer-config %s: %s", path, kvg_strerror(rc));
    char why[256] = "";
    rc = sim_tokcfg_parse(text, len, &ex->tc, why, sizeof(why));
    free(text);
    if (rc < 0)
        return errf(err, errlen, rc, "--tokenizer-config %s: %s", path,
                    why[0] ? why : kvg_strerror(rc));
    return 0;
}

static int load_template(const sim_config *cfg, sim_exact *ex, char *err, size_t errlen)
{
    char *own = NULL;
    const char *src = ex->tc.chat_template;
    size_t len = src ? strlen(src) : 0;
    const char *what = "--tokenizer-config";
    const char *path = cfg->tokenizer_config_path ? cfg->tokenizer_config_path : "chat_template";
    if (cfg->chat_template_path) {
        /* vLLM's --chat-template wins over the tokenizer's own. */
        what = "--chat-template";
        path = cfg->chat_template_path;
        int rc = read_text(path, &own, &len);
        if (rc < 0)
            return errf(err, errlen, rc, "--chat-template %s: %s", path, kvg_strerror(rc));
        src = own;
    }
    if (!src)
        return 0;
    char why[256] = "";
    int rc = kvg_template_compile(src, len, NULL, &ex->tpl, why, sizeof(why));
    free(own);
    if (rc < 0)
        return errf(err, errlen, rc, "%s %s: chat template: %s", what, path,
                    why[0] ? why : kvg_strerror(rc));
    ex->openai_content = kvg_template_wants_parts(ex->tpl);
    return 0;
}

/* Generated token k is sim_output_piece(k); with a real vocabulary each of those " word"s is
 * one token, so prompt + output re-tokenizes to the prompt's ids then the output's (a next
 * turn that repeats the answer hits the blocks the answer filled, as on vLLM). */
static int load_output_ids(const sim_config *cfg, sim_exact *ex, char *err, size_t errlen)
{
    for (uint32_t k = 1; k <= OUTPUT_WORDS; k++) {
        const char *piece = sim_output_piece(k);
        uint32_t *ids = NULL;
        size_t n = 0;
        int rc = sim_exact_encode(ex, piece, strlen(piece), false, &ids, &n);
        if (rc < 0)
            return errf(err, errlen, rc, "--tokenizer %s: %s", cfg->tokenizer_path,
                        kvg_strerror(rc));
        uint32_t id = n ? ids[0] : 0;
        free(ids);
        if (n != 1)
            return errf(err, errlen, KVG_ECONFIG,
                        "--tokenizer %s: the generated word \"%s\" is %zu tokens, not one (the "
                        "simulated output needs an English BPE vocabulary)",
                        cfg->tokenizer_path, piece, n);
        ex->out_ids[k - 1] = id;
    }
    return 0;
}

int sim_exact_load(const sim_config *cfg, sim_exact **out, char *err, size_t errlen)
{
    if (!cfg->tokenizer_path)
        return errf(err, errlen, -EINVAL, "token-exact mode needs --tokenizer");
    if (!cfg->hash_seed)
        return errf(err, errlen, KVG_ECONFIG,
                    "--tokenizer %s needs --hash-seed (the engine's PYTHONHASHSEED: without a "
                    "fixed seed vLLM's block hashes are random)",
                    cfg->tokenizer_path);
    sim_exact *ex = calloc(1, sizeof(*ex));
    if (!ex)
        return errf(err, errlen, -ENOMEM, "out of memory");
    char why[512] = "";
    int rc = kvg_tokenizer_load_file(cfg->tokenizer_path, &ex->tok, why, sizeof(why));
    if (rc < 0) {
        /* A read error already names the path; a parse error names the part of the file. */
        size_t plen = strlen(cfg->tokenizer_path);
        bool named = strncmp(why, cfg->tokenizer_path, plen) == 0;
        errf(err, errlen, rc, "--tokenizer %s: %s", cfg->tokenizer_path,
             !why[0] ? kvg_strerror(rc)
             : named ? why + plen + (why[plen] == ':' ? 2 : 0)
                     : why);
        goto fail;
    }
    rc = load_config(cfg, ex, err, errlen);
    if (rc == 0)
        rc = load_template(cfg, ex, err, errlen);
    if (rc < 0)
        goto fail;
    ex->algo = (sim_vllm_algo)cfg->hash_algo;
    rc = sim_vllm_none_hash(ex->algo, cfg->hash_seed, strlen(cfg->hash_seed), ex->none_hash,
                            &ex->none_len);
    if (rc < 0) {
        errf(err, errlen, rc, "--hash-seed: %s", kvg_strerror(rc));
        goto fail;
    }
    rc = load_output_ids(cfg, ex, err, errlen);
    if (rc < 0)
        goto fail;
    *out = ex;
    return 0;

fail:
    sim_exact_free(ex);
    return rc;
}

void sim_exact_free(sim_exact *ex)
{
    if (!ex)
        return;
    kvg_template_free(ex->tpl);
    kvg_tokenizer_free(ex->tok);
    sim_tokcfg_done(&ex->tc);
    free(ex);
}

sim_vllm_algo sim_exact_algo(const sim_exact *ex)
{
    return ex->algo;
}

size_t sim_exact_digest_len(const sim_exact *ex)
{
    return ex->none_len;
}

uint32_t sim_exact_vocab_size(const sim_exact *ex)
{
    return kvg_tokenizer_vocab_size(ex->tok);
}

uint32_t sim_exact_output_token(const sim_exact *ex, uint32_t k)
{
    return ex->out_ids[(k ? k - 1 : 0) % OUTPUT_WORDS];
}

/* ---- requests ------------------------------------------------------------------------------- */

int sim_exact_encode(const sim_exact *ex, const char *text, size_t len, bool add_special,
                     uint32_t **ids, size_t *n)
{
    kvg_tokens t;
    kvg_tokens_init(&t);
    int rc = kvg_tokenizer_encode(ex->tok, text, len, add_special, &t);
    uint32_t *v = NULL;
    if (rc == 0) {
        v = malloc(KVG_MAX(t.len, (size_t)1) * sizeof(*v));
        if (!v)
            rc = -ENOMEM;
        else if (t.len)
            memcpy(v, t.ids, t.len * sizeof(*v));
    }
    if (rc == 0) {
        *ids = v;
        *n = t.len;
    }
    kvg_tokens_done(&t);
    return rc;
}

int sim_exact_chat(const sim_exact *ex, const kvg_json *body, bool add_special, uint32_t **ids,
                   size_t *n, char *err, size_t errlen)
{
    if (!ex->tpl)
        /* vLLM's words when neither the tokenizer nor --chat-template gives one. */
        return errf(err, errlen, KVG_EPARSE,
                    "As of transformers v4.44, default chat template is no longer allowed, so "
                    "you must provide a chat template if the tokenizer does not define one.");
    kvg_arena arena;
    kvg_arena_init(&arena, 64u << 10);
    kvg_buf text;
    kvg_buf_init(&text);
    kvg_json *ctx = NULL;
    kvg_template_vars vars = {.bos_token = ex->tc.bos_token,
                              .eos_token = ex->tc.eos_token,
                              .openai_content = ex->openai_content};
    kvg_template_opts opts = {.limits = NULL, .now_s = -1};
    int rc = kvg_template_prepare(body, &vars, &arena, &ctx, err, errlen);
    if (rc == 0)
        rc = kvg_template_render(ex->tpl, ctx, &opts, &text, err, errlen);
    if (rc == 0 && text.failed)
        rc = -ENOMEM;
    if (rc == 0)
        rc = sim_exact_encode(ex, text.data ? text.data : "", text.len, add_special, ids, n);
    else if (rc != -ENOMEM)
        rc = KVG_EPARSE; /* a limit or a type error of this request: its own fault, a 400 */
    /* vLLM's 400 carries the TemplateError's own text, which is raise_exception's argument. */
    static const char raised[] = "raise_exception: ";
    if (rc == KVG_EPARSE && errlen && strncmp(err, raised, sizeof(raised) - 1) == 0)
        memmove(err, err + sizeof(raised) - 1, strlen(err) - (sizeof(raised) - 1) + 1);
    kvg_buf_done(&text);
    kvg_arena_done(&arena);
    return rc;
}

int sim_exact_block_keys(const sim_exact *ex, const uint32_t *tokens, size_t n,
                         uint32_t block_tokens, const char *salt, size_t salt_len, sim_hash *out)
{
    size_t blocks = block_tokens ? n / block_tokens : 0;
    if (blocks == 0)
        return 0;
    uint8_t *packed = malloc(blocks * ex->none_len);
    if (!packed)
        return -ENOMEM;
    size_t got = 0;
    int rc = sim_vllm_block_hashes(ex->algo, ex->none_hash, ex->none_len, tokens, n, block_tokens,
                                   NULL, 0, salt, salt_len, packed, blocks, &got);
    if (rc == 0) {
        /* The cache is keyed by the whole digest, as vLLM's prefix cache is: a 16-byte
         * xxhash_cbor digest is padded with zeros (one worker uses one algorithm, so padded
         * keys never meet sha256 ones). */
        for (size_t i = 0; i < got; i++) {
            memset(out[i].b, 0, sizeof(out[i].b));
            memcpy(out[i].b, packed + i * ex->none_len, ex->none_len);
        }
    }
    free(packed);
    return rc;
}

uint64_t sim_exact_key_u64(const sim_exact *ex, const sim_hash *key)
{
    return sim_vllm_hash_u64(key->b, ex->none_len);
}

void sim_exact_hash_header(const sim_exact *ex, const sim_hash *keys, size_t n, kvg_buf *out)
{
    char hex[16];
    n = KVG_MIN(n, (size_t)SIM_BLOCK_HASH_HEADER_MAX);
    for (size_t i = 0; i < n; i++) {
        if (i)
            kvg_buf_putc(out, ',');
        kvg_fmt_hex64(hex, sim_exact_key_u64(ex, &keys[i]));
        kvg_buf_append(out, hex, sizeof(hex));
    }
}
