/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of model/: loading a model from small files written here (what each file may hold,
 * each error naming its file and field), the definition's checks, and the index root. The
 * tokenizer and the template have their own oracle tests; these check the loader around them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "tiny_tokenizer.h"

static char dir[64];

static void write_file(const char *name, const char *text)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const char *path_of(const char *name)
{
    static char paths[64][128];
    static int next;
    char *p = paths[next++ % 64];
    snprintf(p, 128, "%s/%s", dir, name);
    return p;
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/kvg-model-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    write_file("tokenizer.json", TINY_TOKENIZER_JSON);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static kvg_model_def def_of(void)
{
    return (kvg_model_def){.name = "m",
                           .tokenizer = path_of("tokenizer.json"),
                           .hash_algo = KVG_VLLM_SHA256_CBOR,
                           .hash_seed = "42",
                           .block_size = 16};
}

static kvg_model *load_ok(const kvg_model_def *def)
{
    kvg_model *m = NULL;
    char msg[512];
    int rc = kvg_model_load(def, &m, msg, sizeof(msg));
    if (rc)
        fail_msg("load: %s (%s)", msg, kvg_strerror(rc));
    return m;
}

static void load_fails(const kvg_model_def *def, int want, const char *needle)
{
    kvg_model *m = (kvg_model *)1;
    char msg[512] = "";
    int rc = kvg_model_load(def, &m, msg, sizeof(msg));
    if (rc != want || !strstr(msg, needle))
        fail_msg("want %d with \"%s\", got %d: %s", want, needle, rc, msg);
    assert_null(m);
}

/* A tokenizer alone: completions only; the definition round-trips; NONE_HASH is the seed's. */
static void test_tokenizer_only(void **state)
{
    (void)state;
    kvg_model_def def = def_of();
    kvg_model *m = load_ok(&def);
    assert_string_equal(kvg_model_name(m), "m");
    assert_int_equal(kvg_model_block_size(m), 16);
    assert_int_equal(kvg_model_algo(m), KVG_VLLM_SHA256_CBOR);
    assert_false(kvg_model_has_template(m));
    kvg_model_def back;
    kvg_model_get_def(m, &back);
    assert_string_equal(back.tokenizer, def.tokenizer);
    assert_null(back.tokenizer_config);
    assert_null(back.chat_template);
    assert_string_equal(back.hash_seed, "42");
    kvg_model_free(m);
}

/* tokenizer_config.json: the template as a string or as the "default" of named ones; special
 * tokens as strings or {content}; a template file overrides the config's. */
static void test_config_and_template(void **state)
{
    (void)state;
    write_file("cfg1.json", "{\"chat_template\":\"{{ bos_token }}{% for m in messages %}"
                            "{{ m.content }}{% endfor %}\",\"bos_token\":{\"content\":\"<s>\","
                            "\"lstrip\":false},\"eos_token\":\"</s>\"}");
    kvg_model_def def = def_of();
    def.tokenizer_config = path_of("cfg1.json");
    kvg_model *m = load_ok(&def);
    assert_true(kvg_model_has_template(m));
    kvg_model_free(m);

    write_file("cfg2.json", "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"x\"},"
                            "{\"name\":\"default\",\"template\":\"{{ messages }}\"}],"
                            "\"bos_token\":null}");
    def.tokenizer_config = path_of("cfg2.json");
    m = load_ok(&def);
    assert_true(kvg_model_has_template(m));
    kvg_model_free(m);

    /* No chat_template in the config: chat stays in byte mode, the model still loads. */
    write_file("cfg3.json", "{\"eos_token\":\"</s>\"}");
    def.tokenizer_config = path_of("cfg3.json");
    m = load_ok(&def);
    assert_false(kvg_model_has_template(m));
    kvg_model_free(m);

    /* A template file wins over the config (whose template would not even compile). */
    write_file("cfg4.json", "{\"chat_template\":\"{% if %}\"}");
    write_file("t.jinja", "{{ messages[0].content }}\n");
    def.tokenizer_config = path_of("cfg4.json");
    def.chat_template = path_of("t.jinja");
    m = load_ok(&def);
    assert_true(kvg_model_has_template(m));
    kvg_model_free(m);
}

/* Each error names its field and file. */
static void test_errors(void **state)
{
    (void)state;
    kvg_model_def def = def_of();
    def.tokenizer = path_of("missing.json");
    load_fails(&def, -ENOENT, "tokenizer ");
    load_fails(&def, -ENOENT, "missing.json");

    def = def_of();
    def.tokenizer = "relative/tokenizer.json";
    load_fails(&def, KVG_EPARSE, "tokenizer: must be an absolute path");

    def = def_of();
    write_file("bad_tok.json", "{\"model\":{\"type\":\"WordPiece\"}}");
    def.tokenizer = path_of("bad_tok.json");
    load_fails(&def, KVG_EPARSE, "bad_tok.json");

    def = def_of();
    write_file("cfg_bad.json", "{\"chat_template\":\"{% if %}\"}");
    def.tokenizer_config = path_of("cfg_bad.json");
    load_fails(&def, KVG_EPARSE, "chat_template (");
    write_file("cfg_json.json", "{\"chat_template\":");
    def.tokenizer_config = path_of("cfg_json.json");
    load_fails(&def, KVG_EPARSE, "tokenizer_config ");
    write_file("cfg_bos.json", "{\"bos_token\":7}");
    def.tokenizer_config = path_of("cfg_bos.json");
    load_fails(&def, KVG_EPARSE, "bos_token: must be a string");
    write_file("cfg_tpl.json", "{\"chat_template\":7}");
    def.tokenizer_config = path_of("cfg_tpl.json");
    load_fails(&def, KVG_EPARSE, "chat_template: must be a string");
    def.tokenizer_config = dir; /* a directory */
    load_fails(&def, KVG_EPARSE, "tokenizer_config ");

    def = def_of();
    def.chat_template = path_of("nope.jinja");
    load_fails(&def, -ENOENT, "chat_template ");

    def = def_of();
    def.hash_seed = NULL;
    load_fails(&def, KVG_EPARSE, "hash_seed: required");
    def = def_of();
    def.hash_seed = "\xff";
    load_fails(&def, KVG_EPARSE, "hash_seed: must be UTF-8");
    def = def_of();
    def.block_size = 0;
    load_fails(&def, KVG_EPARSE, "block_size");
    def = def_of();
    def.name = "a\nb";
    load_fails(&def, KVG_EPARSE, "name: must not contain control characters");
}

/* The root depends on each of name, algorithm, seed and block size, and on nothing else (the
 * files may move: the engine's names for its blocks do not). */
static void test_root(void **state)
{
    (void)state;
    kvg_model_def def = def_of();
    kvg_model *base = load_ok(&def);
    uint64_t r0 = kvg_model_root(base);
    kvg_model_free(base);

    write_file("copy.json", TINY_TOKENIZER_JSON);
    def.tokenizer = path_of("copy.json");
    kvg_model *m = load_ok(&def);
    assert_true(kvg_model_root(m) == r0);
    kvg_model_free(m);

    kvg_model_def v[4] = {def_of(), def_of(), def_of(), def_of()};
    v[0].name = "m2";
    v[1].hash_algo = KVG_VLLM_XXHASH_CBOR;
    v[2].hash_seed = "43";
    v[3].block_size = 32;
    uint64_t roots[4];
    for (int i = 0; i < 4; i++) {
        m = load_ok(&v[i]);
        roots[i] = kvg_model_root(m);
        assert_true(roots[i] != r0);
        for (int j = 0; j < i; j++)
            assert_true(roots[i] != roots[j]);
        kvg_model_free(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_only),
        cmocka_unit_test(test_config_and_template),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_root),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
