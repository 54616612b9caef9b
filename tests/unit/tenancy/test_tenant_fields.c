/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the tenant definition's field table (tenancy/tenant.c): what each entry point
 * may set and must give, ranges, the admin form and kvgate admin bodies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "fields_fix.h"
#include "tenancy.h"

static int decode(fix *f, kvg_tenant_def *def, const char *text)
{
    return fix_decode(f, &kvg_tenant_fields, def, text);
}

static void test_admin_form(void **state)
{
    (void)state;
    fix f;
    fix_init(&f, KVG_SET_ADMIN);
    kvg_tenant_def def;
    assert_int_equal(decode(&f, &def, "{}"), 0);
    assert_int_equal(def.sharing, KVG_SHARING_ISOLATED);
    assert_null(def.group);
    const char *text = "{\"id\":\"acme\",\"sharing\":\"group\",\"group\":\"g\",\"models\":[\"m\"],"
                       "\"rate\":{\"rps\":0.5,\"burst\":10,\"prompt_bytes_per_s\":1048576.5,"
                       "\"prompt_bytes_burst\":0},\"max_inflight\":64}";
    assert_int_equal(decode(&f, &def, text), 0);
    assert_int_equal(kvg_tenant_def_validate(&def, f.msg, sizeof(f.msg)), 0);
    assert_true(def.limits.rps == 0.5 && def.limits.prompt_bytes_per_s == 1048576.5);
    assert_int_equal(def.limits.max_inflight, 64);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_fields_encode(&kvg_tenant_fields, &def, KVG_SET_ADMIN, &b);
    assert_string_equal(b.data, text);
    kvg_buf_done(&b);
    /* a null group is no group, at every entry point */
    assert_int_equal(decode(&f, &def, "{\"group\":null}"), 0);
    assert_null(def.group);
    kvg_arena_done(&f.arena);
}

static void test_where_and_ranges(void **state)
{
    (void)state;
    static const fix_case cases[] = {
        {KVG_SET_STATE, "{\"sharing\":\"global\"}", "id: required"},
        {KVG_SET_STATE, "{\"id\":\"a\"}", "sharing: required"},
        {KVG_SET_ADMIN, "{\"max_inflight\":4294967295}", NULL},
        {KVG_SET_ADMIN, "{\"rate\":{\"rps\":1e15}}", NULL},
        {KVG_SET_STATE, "{\"id\":\"a\",\"sharing\":\"isolated\",\"rate\":{\"rps\":1.5e15}}",
         "rate.rps: must be a number in 0..1e15"},
        {KVG_SET_ADMIN, "{\"rate\":{\"burst\":-0.5}}", "rate.burst: must be a number in 0..1e15"},
        {KVG_SET_ADMIN, "{\"keys\":[]}", "keys: unknown field"},
        {KVG_SET_ADMIN, "{\"sharing\":\"all\"}", "sharing: must be isolated, group or global"},
    };
    kvg_tenant_def def;
    fix_cases(&kvg_tenant_fields, &def, cases, KVG_ARRAY_LEN(cases));
}

/* kvgate admin tenants put ID [--sharing S] [--group G] [--model M]... [--rps N] ... */
static void test_cli_body(void **state)
{
    (void)state;
    fix f;
    fix_init(&f, KVG_SET_CLI);
    kvg_json *obj = kvg_fields_json_object(&f.arena);
    static const char *const kv[][2] = {{"sharing", "group"}, {"group", "g"}, {"model", "a"},
                                        {"rps", "2"},         {"burst", "4"}, {"max_inflight", "8"},
                                        {"model", "b"}};
    for (size_t i = 0; i < KVG_ARRAY_LEN(kv); i++)
        assert_int_equal(kvg_fields_json_set_text(&kvg_tenant_fields, obj, kv[i][0],
                                                  strlen(kv[i][0]), kv[i][1], strlen(kv[i][1]),
                                                  &f.c),
                         0);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_json_write(&b, obj);
    assert_string_equal(b.data, "{\"sharing\":\"group\",\"group\":\"g\",\"models\":[\"a\",\"b\"],"
                                "\"rate\":{\"rps\":2,\"burst\":4},\"max_inflight\":8}");
    kvg_buf_done(&b);
    assert_int_equal(kvg_fields_json_set_text(&kvg_tenant_fields, obj, "id", 2, "x", 1, &f.c),
                     KVG_EPARSE);
    assert_string_equal(f.msg, "id: unknown field");
    assert_int_equal(kvg_fields_json_set_text(&kvg_tenant_fields, obj, "rate.rps", 8, "3", 1, &f.c),
                     KVG_EPARSE);
    assert_string_equal(f.msg, "rate.rps: appears more than once");
    kvg_tenant_def def;
    kvg_fields_defaults(&kvg_tenant_fields, &def);
    f.c.from = KVG_SET_ADMIN;
    assert_int_equal(kvg_fields_decode(&kvg_tenant_fields, &def, obj, "", &f.c), 0);
    def.id = "t";
    assert_int_equal(kvg_tenant_def_validate(&def, f.msg, sizeof(f.msg)), 0);
    assert_true(def.limits.burst == 4);
    kvg_arena_done(&f.arena);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admin_form),
        cmocka_unit_test(test_where_and_ranges),
        cmocka_unit_test(test_cli_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
