/* SPDX-License-Identifier: Apache-2.0 */
/* Loading a model: its tokenizer.json, the chat template and special tokens of its
 * tokenizer_config.json (or a template file), NONE_HASH, the index root. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "model_int.h"

/* tokenizer_config.json files are tens of KB (Qwen3's lists its added tokens: 9 KB); a template
 * file is bounded by the template's own source limit. */
#define CONFIG_FILE_MAX (16u << 20)
#define TEMPLATE_FILE_MAX (1u << 20)

const char *kvg_model_name(const kvg_model *m)
{
    return m->name;
}

uint32_t kvg_model_block_size(const kvg_model *m)
{
    return m->block_size;
}

kvg_vllm_algo kvg_model_algo(const kvg_model *m)
{
    return m->algo;
}

bool kvg_model_has_template(const kvg_model *m)
{
    return m->tpl != NULL;
}

uint64_t kvg_model_root(const kvg_model *m)
{
    return m->root;
}

void kvg_model_get_def(const kvg_model *m, kvg_model_def *def)
{
    *def = (kvg_model_def){
        .name = m->name,
        .tokenizer = m->tokenizer_path,
        .tokenizer_config = m->tokenizer_config_path,
        .chat_template = m->chat_template_path,
        .hash_algo = m->algo,
        .hash_seed = m->hash_seed,
        .block_size = m->block_size,
        .token_cache_mib = m->token_cache_mib,
    };
}

void kvg_model_free(kvg_model *m)
{
    if (!m)
        return;
    kvg_tokenizer_cache_free(m->token_cache);
    kvg_tokenizer_free(m->tokenizer);
    kvg_template_free(m->tpl);
    free((char *)m->vars.bos_token);
    free((char *)m->vars.eos_token);
    free(m->name);
    free(m->tokenizer_path);
    free(m->tokenizer_config_path);
    free(m->chat_template_path);
    free(m->hash_seed);
    free(m);
}

static int dup_opt(const char *s, char **out)
{
    *out = NULL;
    if (!s)
        return 0;
    *out = strdup(s);
    return *out ? 0 : -ENOMEM;
}

/* The root of the model's chains in the prefix index: a name for (model, the engine's hash
 * settings). Each field is hashed with its length ahead of it so that no two settings run
 * together; the version prefix keeps these roots apart from byte mode's. */
static uint64_t root_of(const kvg_model *m)
{
    uint64_t head[4] = {m->name_len, m->algo, m->block_size, strlen(m->hash_seed)};
    uint64_t h = XXH3_64bits_withSeed("kvgate token-exact v1", 21, 0);
    h = XXH3_64bits_withSeed(head, sizeof(head), h);
    h = XXH3_64bits_withSeed(m->name, m->name_len, h);
    return XXH3_64bits_withSeed(m->hash_seed, strlen(m->hash_seed), h);
}

/* A special token of tokenizer_config.json: a string, an AddedToken object ({"content": ...}),
 * or null/absent. */
static int special_token(const kvg_json *cfg, const char *key, const char **out, char *msg,
                         size_t msg_len, const char *path)
{
    *out = NULL;
    const kvg_json *v = kvg_json_get(cfg, key);
    if (v && v->type == KVG_JSON_OBJECT)
        v = kvg_json_get(v, "content");
    if (!v || v->type == KVG_JSON_NULL)
        return 0;
    if (v->type != KVG_JSON_STRING || strlen(v->u.str.ptr) != v->u.str.len) {
        snprintf(msg, msg_len, "tokenizer_config %s: %s: must be a string or {\"content\": string}",
                 path, key);
        return KVG_EPARSE;
    }
    *out = strdup(v->u.str.ptr);
    return *out ? 0 : -ENOMEM;
}

static int compile(kvg_model *m, const char *src, size_t len, const char *what, char *msg,
                   size_t msg_len)
{
    char err[256];
    int rc = kvg_template_compile(src, len, NULL, &m->tpl, err, sizeof(err));
    if (rc < 0 && msg && msg_len)
        snprintf(msg, msg_len, "chat_template (%s): %s", what, err);
    return rc;
}

static int file_error(int rc, const char *field, const char *path, char *msg, size_t msg_len)
{
    if (msg && msg_len) {
        if (rc == KVG_ELIMIT)
            snprintf(msg, msg_len, "%s %s: too large", field, path);
        else
            snprintf(msg, msg_len, "%s %s: %s", field, path, kvg_strerror(rc));
    }
    return rc == -EISDIR ? KVG_EPARSE : rc;
}

/* tokenizer_config.json: its chat template (a string, or the "default" of a list of named
 * templates) and its special tokens. */
static int load_config(kvg_model *m, bool want_template, char *msg, size_t msg_len)
{
    const char *path = m->tokenizer_config_path;
    char *data = NULL;
    size_t len = 0;
    int rc = kvg_read_file(path, CONFIG_FILE_MAX, &data, &len);
    if (rc < 0)
        return file_error(rc, "tokenizer_config", path, msg, msg_len);
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_json *cfg = NULL;
    kvg_json_error jerr = {0};
    rc = kvg_json_parse(data, len, &arena, NULL, &cfg, &jerr);
    if (rc < 0) {
        if (rc != -ENOMEM)
            snprintf(msg, msg_len, "tokenizer_config %s: byte %zu: %s", path, jerr.offset,
                     jerr.message);
        goto out;
    }
    if (cfg->type != KVG_JSON_OBJECT) {
        snprintf(msg, msg_len, "tokenizer_config %s: must be a JSON object", path);
        rc = KVG_EPARSE;
        goto out;
    }
    if ((rc = special_token(cfg, "bos_token", &m->vars.bos_token, msg, msg_len, path)) < 0 ||
        (rc = special_token(cfg, "eos_token", &m->vars.eos_token, msg, msg_len, path)) < 0)
        goto out;
    if (!want_template)
        goto out;
    const kvg_json *t = kvg_json_get(cfg, "chat_template");
    if (t && t->type == KVG_JSON_ARRAY) {
        /* transformers' named templates: the one called "default" is the chat template. */
        const kvg_json *found = NULL;
        for (size_t i = 0; i < t->u.arr.count; i++) {
            const kvg_json *name = kvg_json_get(t->u.arr.items[i], "name");
            if (name && name->type == KVG_JSON_STRING && strcmp(name->u.str.ptr, "default") == 0)
                found = kvg_json_get(t->u.arr.items[i], "template");
        }
        t = found;
    }
    if (!t || t->type == KVG_JSON_NULL)
        goto out; /* no template: chat requests stay in byte mode */
    if (t->type != KVG_JSON_STRING) {
        snprintf(msg, msg_len, "tokenizer_config %s: chat_template: must be a string", path);
        rc = KVG_EPARSE;
        goto out;
    }
    rc = compile(m, t->u.str.ptr, t->u.str.len, path, msg, msg_len);
out:
    kvg_arena_done(&arena);
    free(data);
    return rc;
}

int kvg_model_load(const kvg_model_def *def, kvg_model **out, char *msg, size_t msg_len)
{
    char scratch[1];
    if (!msg || !msg_len) {
        msg = scratch;
        msg_len = sizeof(scratch);
    }
    msg[0] = '\0';
    *out = NULL;
    int rc = kvg_model_def_validate(def, msg, msg_len);
    if (rc < 0)
        return rc;
    kvg_model *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->algo = def->hash_algo;
    m->block_size = def->block_size;
    m->token_cache_mib = def->token_cache_mib;
    if (m->token_cache_mib &&
        (rc = kvg_tokenizer_cache_new((size_t)m->token_cache_mib << 20, &m->token_cache)) < 0)
        goto fail;
    if (dup_opt(def->name, &m->name) < 0 || dup_opt(def->tokenizer, &m->tokenizer_path) < 0 ||
        dup_opt(def->tokenizer_config, &m->tokenizer_config_path) < 0 ||
        dup_opt(def->chat_template, &m->chat_template_path) < 0 ||
        dup_opt(def->hash_seed, &m->hash_seed) < 0) {
        rc = -ENOMEM;
        goto fail;
    }
    m->name_len = strlen(m->name);
    char err[512];
    rc = kvg_tokenizer_load_file(m->tokenizer_path, &m->tokenizer, err, sizeof(err));
    if (rc < 0) {
        /* The tokenizer's message names the file when it could not be read; say which field. */
        if (strncmp(err, m->tokenizer_path, strlen(m->tokenizer_path)) == 0)
            snprintf(msg, msg_len, "tokenizer %s", err);
        else
            snprintf(msg, msg_len, "tokenizer %s: %s", m->tokenizer_path, err);
        if (rc == KVG_ECONFIG || rc == -EISDIR)
            rc = KVG_EPARSE; /* a file the tokenizer does not support: a bad definition */
        goto fail;
    }
    if (m->tokenizer_config_path && (rc = load_config(m, !m->chat_template_path, msg, msg_len)) < 0)
        goto fail;
    if (m->chat_template_path) {
        char *src = NULL;
        size_t len = 0;
        rc = kvg_read_file(m->chat_template_path, TEMPLATE_FILE_MAX, &src, &len);
        if (rc < 0) {
            rc = file_error(rc, "chat_template", m->chat_template_path, msg, msg_len);
            goto fail;
        }
        rc = compile(m, src, len, m->chat_template_path, msg, msg_len);
        free(src);
        if (rc < 0)
            goto fail;
    }
    if (m->tpl)
        m->vars.openai_content = kvg_template_wants_parts(m->tpl);
    rc = kvg_vllm_none_hash(m->algo, m->hash_seed, strlen(m->hash_seed), &m->none_hash);
    if (rc < 0) {
        snprintf(msg, msg_len, "hash_seed: must be UTF-8");
        rc = KVG_EPARSE;
        goto fail;
    }
    m->root = root_of(m);
    *out = m;
    return 0;
fail:
    kvg_model_free(m);
    return rc;
}
