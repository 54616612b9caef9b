/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: a request's token-exact keys (model/keys.c), what a tenant's body reaches in
 * token-exact mode: the body parse, vLLM's preprocessing, a chat template, the tokenizer (the
 * built-in one of builtin_tokenizer.c) and vLLM's block hash. The first byte picks chat or
 * completions and the scope; the rest is the body. Two models alike but for the pieces cache must
 * agree exactly (result, token count, keys), and the cached one again on a second call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "builtin_tokenizer.h"
#include "model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvg_model *plain, *cached;

static void write_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, len, f) != len)
        abort();
    fclose(f);
}

static void setup(void)
{
    char dir[] = "/tmp/kvg-fuzz-model-XXXXXX";
    if (!mkdtemp(dir))
        abort();
    char tok[64], cfg[64];
    snprintf(tok, sizeof(tok), "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof(cfg), "%s/tokenizer_config.json", dir);
    kvg_buf b;
    fuzz_builtin_tokenizer_json(&b);
    write_file(tok, b.data, b.len);
    kvg_buf_done(&b);
    /* A Qwen-like template: each message between the special tokens, tools as JSON, a
     * generation prompt. */
    static const char config[] =
        "{\"bos_token\":\"<|s|>\",\"eos_token\":{\"content\":\"<|e|>\"},\"chat_template\":"
        "\"{{ bos_token }}{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}"
        "<|s|>{{ m.role }}\\n{% if m.content is string %}{{ m.content }}{% else %}{% for p in "
        "m.content %}{{ p.text }}{% endfor %}{% endif %}<|e|>\\n{% endfor %}"
        "{% if add_generation_prompt %}<|s|>assistant\\n{% endif %}\"}";
    write_file(cfg, config, sizeof(config) - 1);
    kvg_model_def def = {.name = "m",
                         .tokenizer = tok,
                         .tokenizer_config = cfg,
                         .hash_algo = KVG_VLLM_SHA256_CBOR,
                         .hash_seed = "0",
                         .block_size = 4};
    char msg[512];
    if (kvg_model_load(&def, &plain, msg, sizeof(msg)) != 0)
        abort();
    def.token_cache_mib = 1;
    if (kvg_model_load(&def, &cached, msg, sizeof(msg)) != 0)
        abort();
    unlink(tok);
    unlink(cfg);
    rmdir(dir);
}

static bool same(int ra, const kvg_model_keys_out *a, int rb, const kvg_model_keys_out *b)
{
    if (ra != rb)
        return false;
    if (ra != 0)
        return true;
    return a->ntokens == b->ntokens && a->nkeys == b->nkeys &&
           (!a->nkeys || memcmp(a->keys, b->keys, a->nkeys * sizeof(uint64_t)) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (!plain)
        setup();
    kvg_model_input input = data[0] & 1 ? KVG_MODEL_INPUT_CHAT : KVG_MODEL_INPUT_COMPLETIONS;
    static const char *const salts[] = {NULL, "salt-a", "salt-b", ""};
    const char *salt = salts[(data[0] >> 1) & 3];
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_model_keys_out a, b, c;
    char err[256];
    int ra = kvg_model_keys(plain, input, body, len, salt, 64, &arena, &a, err, sizeof(err));
    int rb = kvg_model_keys(cached, input, body, len, salt, 64, &arena, &b, err, sizeof(err));
    int rc = kvg_model_keys(cached, input, body, len, salt, 64, &arena, &c, err, sizeof(err));
    if (!same(ra, &a, rb, &b) || !same(rb, &b, rc, &c))
        abort();
    if (ra == 0 && (a.nkeys > 64 || a.nkeys > a.ntokens / 4))
        abort();
    kvg_arena_done(&arena);
    return 0;
}
