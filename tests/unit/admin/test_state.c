/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the state file (admin/state.c): every change saved before its answer, restored
 * at start-up, bad files refused, write failures answered, and concurrent changes saved in order.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admin.h"
#include "admin_helpers.h"
#include "fail_alloc.h"

/* ---- the state file ------------------------------------------------------------------------ */

static void assert_saved(fixture *f, const char *must_contain)
{
    char *text = slurp(f->state_path);
    if (!text)
        fail_msg("no state file after a change");
    if (!strstr(text, must_contain))
        fail_msg("state file lacks %s:\n%s", must_contain, text);
    free(text);
}

/* A restarted gateway's admin: fresh objects, as start-up makes them, and an admin over them
 * that accepts tok-a and keeps its state in f's file (not loaded yet). */
typedef struct restarted {
    kvg_registry *reg;
    kvg_tenants *tenants;
    kvg_policy_state *policy;
    kvg_admin *admin;
} restarted;

static void restart(const fixture *f, restarted *r)
{
    assert_int_equal(make_objects(&r->reg, &r->tenants, &r->policy), 0);
    const char *tokens[] = {"tok-a"};
    kvg_admin_config cfg = {.tokens = tokens,
                            .ntokens = 1,
                            .tenants = r->tenants,
                            .policy = r->policy,
                            .state_path = f->state_path};
    assert_int_equal(kvg_admin_new(&cfg, r->reg, &r->admin), 0);
}

static void restarted_done(restarted *r)
{
    kvg_admin_free(r->admin);
    kvg_registry_free(r->reg);
    kvg_tenants_free(r->tenants);
    kvg_policy_state_free(r->policy);
}

static void test_persistence(void **state)
{
    fixture *f = *state;
    char msg[256];
    /* no file yet: a fresh start */
    assert_null(slurp(f->state_path));
    assert_int_equal(kvg_admin_load_state(f->admin, msg, sizeof(msg)), 0);
    /* reads save nothing */
    call(f, "GET", "/admin/v1/tenants", AUTH, NULL);
    assert_null(slurp(f->state_path));

    assert_int_equal(call(f, "PUT", "/admin/v1/tenants/acme", AUTH,
                          "{\"sharing\":\"group\",\"group\":\"g1\",\"models\":[\"m\"],"
                          "\"rate\":{\"rps\":2.5,\"burst\":10},\"max_inflight\":3}")
                         .status,
                     201);
    assert_saved(f, "\"acme\"");
    struct stat st;
    assert_int_equal(stat(f->state_path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    reply r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, NULL);
    assert_int_equal(r.status, 201);
    char key[KVG_KEY_LEN + 1], key_id[KVG_KEY_ID_LEN + 1];
    snprintf(key, sizeof(key), "%s", str_field(&r, "key"));
    snprintf(key_id, sizeof(key_id), "%s", str_field(&r, "id"));
    assert_saved(f, key_id);
    assert_int_equal(call(f, "PUT", "/admin/v1/tenants/gone", AUTH, "{}").status, 201);
    assert_saved(f, "\"gone\"");
    assert_int_equal(call(f, "DELETE", "/admin/v1/tenants/gone", AUTH, NULL).status, 204);
    char *text = slurp(f->state_path);
    assert_null(strstr(text, "\"gone\""));
    free(text);
    assert_int_equal(call(f, "PUT", "/admin/v1/workers/w1", AUTH,
                          "{\"url\":\"http://h:1\",\"models\":[\"m\"],\"kv_blocks\":7,"
                          "\"cache_salt\":false}")
                         .status,
                     201);
    assert_saved(f, "\"w1\"");
    assert_int_equal(
        call(f, "PUT", "/admin/v1/workers/w2", AUTH, "{\"url\":\"http://h:2\"}").status, 201);
    assert_int_equal(call(f, "DELETE", "/admin/v1/workers/w2", AUTH, NULL).status, 204);
    text = slurp(f->state_path);
    assert_null(strstr(text, "\"w2\""));
    free(text);
    assert_int_equal(call(f, "POST", "/admin/v1/workers/w1/drain", AUTH, NULL).status, 200);
    assert_int_equal(
        call(f, "PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"round_robin\"}").status, 200);
    assert_saved(f, "round_robin");

    /* the file: version 1 and the three sections */
    text = slurp(f->state_path);
    kvg_json *root;
    assert_int_equal(kvg_json_parse(text, strlen(text), &f->arena, NULL, &root, NULL), 0);
    assert_int_equal(kvg_json_get(root, "version")->u.num.ival, 1);
    assert_int_equal(kvg_json_get(root, "tenants")->type, KVG_JSON_ARRAY);
    assert_int_equal(kvg_json_get(root, "workers")->type, KVG_JSON_ARRAY);
    assert_int_equal(kvg_json_get(root, "policy")->type, KVG_JSON_OBJECT);
    assert_null(strstr(text, key + strlen(KVG_KEY_PREFIX)));
    free(text);

    /* a restart: fresh objects, the same file */
    restarted rs;
    restart(f, &rs);
    assert_int_equal(kvg_admin_load_state(rs.admin, msg, sizeof(msg)), 0);

    kvg_tenant_set *set = kvg_tenants_acquire(rs.tenants);
    assert_int_equal(kvg_tenant_set_count(set), 1);
    kvg_tenant *t = kvg_tenant_set_authenticate(set, key, strlen(key));
    assert_non_null(t);
    assert_string_equal(kvg_tenant_id(t), "acme");
    assert_int_equal(kvg_tenant_sharing(t), KVG_SHARING_GROUP);
    assert_string_equal(kvg_tenant_group(t), "g1");
    assert_int_equal(kvg_tenant_model_count(t), 1);
    assert_true(kvg_tenant_limits_of(t)->rps == 2.5);
    assert_true(kvg_tenant_limits_of(t)->burst == 10);
    assert_int_equal(kvg_tenant_limits_of(t)->max_inflight, 3);
    assert_int_equal(kvg_tenant_key_count(t), 1);
    assert_string_equal(kvg_tenant_key(t, 0)->id, key_id);
    kvg_tenant_set_unref(set);

    kvg_worker_set *ws = kvg_registry_acquire(rs.reg);
    assert_int_equal(kvg_worker_set_count(ws), 1);
    kvg_worker *w = kvg_worker_set_find(ws, "w1");
    assert_non_null(w);
    assert_string_equal(kvg_worker_url(w), "http://h:1");
    assert_int_equal(kvg_worker_kv_blocks(w), 7);
    assert_int_equal(kvg_worker_source_of(w), KVG_WORKER_SOURCE_ADMIN);
    assert_false(kvg_worker_injects_salt(w));
    kvg_worker_set_unref(ws);

    kvg_policy_config pc;
    kvg_policy_state_get(rs.policy, &pc);
    assert_int_equal(pc.kind, KVG_POLICY_ROUND_ROBIN);

    /* what the restored admin answers and saves next is the same state */
    kvg_admin_request req = {
        .method = "GET", .path = "/admin/v1/tenants/acme", .authorization = AUTH};
    kvg_admin_response resp;
    kvg_admin_handle(rs.admin, &req, &resp);
    assert_int_equal(resp.status, 200);
    assert_non_null(strstr(resp.body.data, key_id));
    kvg_admin_response_done(&resp);
    restarted_done(&rs);
}

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static void test_load_errors(void **state)
{
    fixture *f = *state;
    static const struct {
        const char *text;
        int rc;
        const char *msg; /* after "state file PATH: " */
    } cases[] = {
        {"", KVG_EPARSE, "invalid JSON at byte 0"},
        {"{\"version\":1", KVG_EPARSE, "invalid JSON at byte"},
        {"[]", KVG_EPARSE, "must be a JSON object"},
        {"{}", KVG_EPARSE, "version: required"},
        {"{\"version\":2}", KVG_EPARSE, "version: must be 1"},
        {"{\"version\":\"1\"}", KVG_EPARSE, "version: must be 1"},
        {"{\"version\":1,\"version\":1}", KVG_EPARSE, "invalid JSON"},
        {"{\"version\":1,\"extra\":[]}", KVG_EPARSE, "extra: unknown field"},
        {"{\"version\":1,\"tenants\":{}}", KVG_EPARSE, "tenants: must be an array"},
        {"{\"version\":1,\"workers\":null}", KVG_EPARSE, "workers: must be an array"},
        {"{\"version\":1,\"policy\":[]}", KVG_EPARSE, "policy: must be an object"},
        {"{\"version\":1,\"policy\":{\"policy\":\"zzz\"}}", KVG_EPARSE, "policy: policy: "},
        {"{\"version\":1,\"policy\":{\"max_blocks\":0}}", KVG_EPARSE,
         "policy: max_blocks: must be an integer in 1..1048576"},
        {"{\"version\":1,\"tenants\":[{\"nonsense\":1}]}", KVG_EPARSE, "tenants: "},
        {"{\"version\":1,\"workers\":[{\"name\":\"w\"}]}", KVG_EPARSE, "workers: "},
    };
    char msg[512], prefix[200];
    snprintf(prefix, sizeof(prefix), "state file %s: ", f->state_path);
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        write_file(f->state_path, cases[i].text);
        msg[0] = '\0';
        int rc = kvg_admin_load_state(f->admin, msg, sizeof(msg));
        if (rc != cases[i].rc || strncmp(msg, prefix, strlen(prefix)) != 0 ||
            strncmp(msg + strlen(prefix), cases[i].msg, strlen(cases[i].msg)) != 0)
            fail_msg("case %zu (%s): rc %d, message \"%s\"", i, cases[i].text, rc, msg);
    }
    /* nothing was applied by the bad files */
    kvg_tenant_set *set = kvg_tenants_acquire(f->tenants);
    assert_int_equal(kvg_tenant_set_count(set), 0);
    kvg_tenant_set_unref(set);
    kvg_policy_config pc;
    kvg_policy_state_get(f->policy, &pc);
    assert_int_equal(pc.kind, KVG_POLICY_COST);

    /* sections may be absent */
    write_file(f->state_path, "{\"version\":1}\n");
    assert_int_equal(kvg_admin_load_state(f->admin, msg, sizeof(msg)), 0);
    write_file(f->state_path, "{\"version\":1,\"policy\":{\"policy\":\"random\"}}");
    assert_int_equal(kvg_admin_load_state(f->admin, msg, sizeof(msg)), 0);
    kvg_policy_state_get(f->policy, &pc);
    assert_int_equal(pc.kind, KVG_POLICY_RANDOM);

    /* a folder where the file should be */
    unlink(f->state_path);
    assert_int_equal(mkdir(f->state_path, 0700), 0);
    assert_true(kvg_admin_load_state(f->admin, msg, sizeof(msg)) < 0);
    assert_non_null(strstr(msg, "cannot read it"));
    rmdir(f->state_path);
}

static void test_state_write_failure(void **state)
{
    fixture *f = *state;
    /* the state file's folder is a plain file: every write fails */
    char path[200], file[160];
    snprintf(file, sizeof(file), "%s/file", f->dir);
    write_file(file, "x");
    snprintf(path, sizeof(path), "%s/state.json", file);
    const char *tokens[] = {"tok-a"};
    kvg_admin_config cfg = {.tokens = tokens,
                            .ntokens = 1,
                            .tenants = f->tenants,
                            .policy = f->policy,
                            .state_path = path,
                            .audit_path = f->audit_path};
    kvg_admin *a;
    assert_int_equal(kvg_admin_new(&cfg, f->reg, &a), 0);
    kvg_admin *good = f->admin;
    f->admin = a;
    quiet_stderr();

    reply r = call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{}");
    assert_error(&r, 500, "server_error", "the change is applied but could not be saved: ");
    assert_non_null(strstr(str_field(&r, "error.message"), path));
    assert_int_equal(call(f, "GET", "/admin/v1/tenants/acme", AUTH, NULL).status, 200);
    r = call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\"}");
    assert_error(&r, 500, "server_error", "the change is applied but could not be saved");
    r = call(f, "PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"random\"}");
    assert_error(&r, 500, "server_error", "the change is applied but could not be saved");
    r = call(f, "DELETE", "/admin/v1/workers/w1", AUTH, NULL);
    assert_error(&r, 500, "server_error", "the change is applied but could not be saved");

    /* a key that cannot be saved is not handed out, and does not exist */
    r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, NULL);
    assert_error(&r, 500, "server_error", "the key could not be saved, so it was not created");
    assert_null(kvg_json_get(r.json, "key"));
    kvg_tenant_set *set = kvg_tenants_acquire(f->tenants);
    assert_int_equal(kvg_tenant_key_count(kvg_tenant_set_find(set, "acme")), 0);
    kvg_tenant_set_unref(set);
    /* rejected changes do not try to save */
    r = call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{\"x\":1}");
    assert_int_equal(r.status, 400);

    /* the audit log tells */
    char *audit = slurp(f->audit_path);
    assert_non_null(strstr(audit, "\"action\":\"tenant.put\",\"target\":\"acme\",\"status\":500,"
                                  "\"detail\":\"the change is applied but could not be saved"));
    assert_non_null(strstr(audit, "\"action\":\"key.create\",\"target\":\"acme/k"));
    free(audit);
    restore_stderr();
    f->admin = good;
    kvg_admin_free(a);
}

/* Restoring under allocation failures: all or nothing per section, never a crash or a leak. */
static void test_load_alloc_failures(void **state)
{
    fixture *f = *state;
    assert_int_equal(call(f, "PUT", "/admin/v1/tenants/a", AUTH, "{\"models\":[\"m\"]}").status,
                     201);
    assert_int_equal(call(f, "POST", "/admin/v1/tenants/a/keys", AUTH, NULL).status, 201);
    assert_int_equal(
        call(f, "PUT", "/admin/v1/tenants/b", AUTH, "{\"sharing\":\"group\",\"group\":\"g\"}")
            .status,
        201);
    assert_int_equal(call(f, "PUT", "/admin/v1/workers/w", AUTH, "{\"url\":\"http://h:1\"}").status,
                     201);
    assert_int_equal(call(f, "PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"random\"}").status,
                     200);
    long injections = 0;
    for (long n = 0;; n++) {
        restarted rs;
        restart(f, &rs);
        char msg[256];
        fail_alloc_nth(n);
        int rc = kvg_admin_load_state(rs.admin, msg, sizeof(msg));
        bool injected = fail_alloc_off();
        injections += injected;
        if (!injected)
            assert_int_equal(rc, 0);
        else if (rc != 0 && rc != -ENOMEM)
            fail_msg("allocation %ld: %d %s", n, rc, msg);
        if (!injected || rc == 0) {
            kvg_tenant_set *set = kvg_tenants_acquire(rs.tenants);
            assert_int_equal(kvg_tenant_set_count(set), 2);
            kvg_tenant_set_unref(set);
        }
        restarted_done(&rs);
        if (!injected)
            break;
    }
    assert_true(injections > 5);
    print_message("# %ld allocation failures injected while loading\n", injections);
}

/* Changes from several threads: each saves the whole state, and the file after the last one
 * must hold every change (no slower writer puts an older state back). */
typedef struct changer_arg {
    fixture *f;
    int id;
    int failures;
} changer_arg;

#define CHANGES_PER_THREAD 40

static void *changer(void *p)
{
    changer_arg *ca = p;
    for (int i = 0; i < CHANGES_PER_THREAD; i++) {
        char path[64];
        snprintf(path, sizeof(path), "/admin/v1/tenants/t%d-%d", ca->id, i);
        kvg_admin_request put = {.method = "PUT",
                                 .path = path,
                                 .authorization = AUTH,
                                 .body = "{}",
                                 .body_len = 2,
                                 .remote = "thread"};
        kvg_admin_response resp;
        kvg_admin_handle(ca->f->admin, &put, &resp);
        ca->failures += resp.status != 201;
        kvg_admin_response_done(&resp);
        strcat(path, "/keys");
        kvg_admin_request key = {.method = "POST", .path = path, .authorization = AUTH};
        kvg_admin_handle(ca->f->admin, &key, &resp);
        ca->failures += resp.status != 201;
        kvg_admin_response_done(&resp);
    }
    return NULL;
}

static void test_concurrent_changes(void **state)
{
    fixture *f = *state;
    pthread_t th[4];
    changer_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (changer_arg){.f = f, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, changer, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    char *text = slurp(f->state_path);
    kvg_json *root;
    assert_int_equal(kvg_json_parse(text, strlen(text), &f->arena, NULL, &root, NULL), 0);
    const kvg_json *tenants = kvg_json_get(root, "tenants");
    assert_int_equal(tenants->u.arr.count, 4 * CHANGES_PER_THREAD);
    for (size_t i = 0; i < tenants->u.arr.count; i++) {
        const kvg_json *keys = kvg_json_get(tenants->u.arr.items[i], "keys");
        assert_non_null(keys);
        assert_int_equal(keys->u.arr.count, 1);
    }
    free(text);
    /* and the audit log has one whole line per change */
    char *audit = slurp(f->audit_path);
    size_t lines = 0;
    for (const char *p = audit; (p = strchr(p, '\n')); p++)
        lines++;
    assert_int_equal(lines, 2 * 4 * CHANGES_PER_THREAD);
    free(audit);
}

const struct CMUnitTest state_tests[] = {
    cmocka_unit_test_setup_teardown(test_persistence, setup, teardown),
    cmocka_unit_test_setup_teardown(test_load_errors, setup, teardown),
    cmocka_unit_test_setup_teardown(test_state_write_failure, setup, teardown),
    cmocka_unit_test_setup_teardown(test_load_alloc_failures, setup, teardown),
    cmocka_unit_test_setup_teardown(test_concurrent_changes, setup, teardown),
};
const size_t state_tests_count = KVG_ARRAY_LEN(state_tests);
