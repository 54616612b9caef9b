/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the worker definition's field table (router/worker.c): what each entry point
 * may set and must give, the state file's form, --worker items and kvgate admin bodies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "fields_fix.h"
#include "router.h"

static int decode(fix *f, kvg_worker_def *def, const char *text)
{
    return fix_decode(f, &kvg_worker_fields, def, text);
}

static void test_state_form_round_trip(void **state)
{
    (void)state;
    fix f;
    fix_init(&f, KVG_SET_STATE);
    const char *text = "{\"name\":\"w1\",\"url\":\"http://h:1\",\"models\":[\"a\",\"b\"],"
                       "\"kv_blocks\":4096,\"max_inflight\":0,\"cache_salt\":false,"
                       "\"kv_events_stale_ms\":5000}";
    kvg_worker_def def;
    assert_int_equal(decode(&f, &def, text), 0);
    assert_string_equal(def.name, "w1");
    assert_int_equal(def.nmodels, 2);
    assert_true(def.no_cache_salt);
    assert_int_equal(kvg_worker_def_validate(&def, f.msg, sizeof(f.msg)), 0);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_fields_encode(&kvg_worker_fields, &def, KVG_SET_STATE, &b);
    assert_string_equal(b.data, text);
    kvg_buf_done(&b);
    /* the defaults: every model, unknown capacity, the gateway's limit, a salt */
    kvg_fields_defaults(&kvg_worker_fields, &def);
    assert_null(def.name);
    assert_int_equal(def.nmodels, 0);
    assert_int_equal(def.kv_blocks, 0);
    assert_int_equal(def.max_inflight, 0);
    assert_false(def.no_cache_salt);
    kvg_arena_done(&f.arena);
}

/* The name is required in the files; the admin API takes it from the path (a body may repeat
 * it) and kvgate admin from an argument; the URL is required wherever a body defines one. */
static void test_where_fields_go(void **state)
{
    (void)state;
    static const fix_case cases[] = {
        {KVG_SET_STATE, "{\"url\":\"http://h:1\"}", "name: required"},
        {KVG_SET_CONFIG, "{\"url\":\"http://h:1\"}", "name: required"},
        {KVG_SET_ADMIN, "{\"url\":\"http://h:1\"}", NULL},
        {KVG_SET_ADMIN, "{\"name\":\"w\",\"url\":\"http://h:1\"}", NULL},
        {KVG_SET_ADMIN, "{\"kv_blocks\":1}", "url: required"},
        {KVG_SET_STATE, "{\"name\":\"w\",\"url\":\"http://h:1\",\"source\":\"admin\"}",
         "source: unknown field"},
        {KVG_SET_STATE, "{\"name\":\"w\",\"url\":\"http://h:1\",\"max_inflight\":4294967295}",
         NULL},
        {KVG_SET_CONFIG, "{\"name\":\"w\",\"url\":\"http://h:1\",\"max_inflight\":4294967296}",
         "max_inflight: must be an integer in 0..4294967295"},
    };
    kvg_worker_def def;
    fix_cases(&kvg_worker_fields, &def, cases, KVG_ARRAY_LEN(cases));
}

static int item(fix *f, kvg_worker_def *def, const char *key, const char *text)
{
    return kvg_fields_set_text(&kvg_worker_fields, def, key, strlen(key), text, strlen(text), "",
                               &f->c);
}

/* --worker NAME=URL,model=M,kv_blocks=N,max_inflight=N,cache_salt=on|off */
static void test_flag_items(void **state)
{
    (void)state;
    fix f;
    fix_init(&f, KVG_SET_FLAG);
    kvg_worker_def def;
    kvg_fields_defaults(&kvg_worker_fields, &def);
    assert_int_equal(item(&f, &def, "model", "a"), 0);
    assert_int_equal(item(&f, &def, "model", "b"), 0);
    assert_int_equal(item(&f, &def, "kv_blocks", "64"), 0);
    assert_int_equal(item(&f, &def, "max_inflight", "0"), 0);
    assert_int_equal(item(&f, &def, "cache_salt", "off"), 0);
    assert_int_equal(def.nmodels, 2);
    assert_string_equal(def.models[1], "b");
    assert_int_equal(def.kv_blocks, 64);
    assert_true(def.no_cache_salt);
    assert_int_equal(item(&f, &def, "cache_salt", "on"), 0);
    assert_false(def.no_cache_salt);
    static const struct {
        const char *key, *text, *msg;
    } bad[] = {
        {"kv_blocks", "x", "kv_blocks: must be an integer in 0..4294967295, not string"},
        {"kv_blocks", "-1", "kv_blocks: must be an integer in 0..4294967295"},
        {"max_inflight", "1e3", "max_inflight: must be an integer in 0..4294967295"},
        {"cache_salt", "maybe", "cache_salt: must be true or false, not string"},
        {"models", "a", "models: unknown field"},
        {"name", "w2", "name: unknown field"},
        {"url", "http://h:2", "url: unknown field"},
        {"gpu", "1", "gpu: unknown field"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        assert_int_equal(item(&f, &def, bad[i].key, bad[i].text), KVG_EPARSE);
        assert_string_equal(f.msg, bad[i].msg);
    }
    kvg_arena_done(&f.arena);
}

/* kvgate admin workers put NAME URL [--model M]... [--kv-blocks N] ... */
static void test_cli_body(void **state)
{
    (void)state;
    fix f;
    fix_init(&f, KVG_SET_CLI);
    kvg_json *obj = kvg_fields_json_object(&f.arena);
    static const char *const kv[][2] = {
        {"url", "http://h:1"}, {"model", "m"}, {"kv_blocks", "512"}, {"cache_salt", "false"}};
    for (size_t i = 0; i < KVG_ARRAY_LEN(kv); i++)
        assert_int_equal(kvg_fields_json_set_text(&kvg_worker_fields, obj, kv[i][0],
                                                  strlen(kv[i][0]), kv[i][1], strlen(kv[i][1]),
                                                  &f.c),
                         0);
    assert_int_equal(kvg_fields_json_set_text(&kvg_worker_fields, obj, "name", 4, "w", 1, &f.c),
                     KVG_EPARSE);
    assert_string_equal(f.msg, "name: unknown field");
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_json_write(&b, obj);
    assert_string_equal(
        b.data,
        "{\"url\":\"http://h:1\",\"models\":[\"m\"],\"kv_blocks\":512,\"cache_salt\":false}");
    kvg_buf_done(&b);
    /* which the admin API decodes to the definition the options describe */
    kvg_worker_def def;
    kvg_fields_defaults(&kvg_worker_fields, &def);
    f.c.from = KVG_SET_ADMIN;
    assert_int_equal(kvg_fields_decode(&kvg_worker_fields, &def, obj, "", &f.c), 0);
    assert_int_equal(def.kv_blocks, 512);
    assert_true(def.no_cache_salt);
    kvg_arena_done(&f.arena);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_form_round_trip),
        cmocka_unit_test(test_where_fields_go),
        cmocka_unit_test(test_flag_items),
        cmocka_unit_test(test_cli_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
