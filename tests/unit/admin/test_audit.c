/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the audit log (admin/audit.c): one line per change attempt, in the file and the
 * error log, never a token or key material. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "admin.h"
#include "admin_helpers.h"

/* Run fn with stderr captured; returns what was logged (caller frees). */
static char *capture_stderr(void (*fn)(fixture *), fixture *f)
{
    char tmpl[] = "/tmp/kvg-admin-log-XXXXXX";
    int fd = mkstemp(tmpl);
    assert_true(fd >= 0);
    unlink(tmpl);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fd, 2) >= 0);
    kvg_log_set_level(KVG_LOG_INFO);
    fn(f);
    kvg_log_set_level(KVG_LOG_ERROR);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    off_t len = lseek(fd, 0, SEEK_END);
    assert_true(len >= 0);
    char *text = calloc(1, (size_t)len + 1);
    assert_non_null(text);
    assert_int_equal(pread(fd, text, (size_t)len, 0), len);
    close(fd);
    return text;
}

/* Keys created while the log was captured: none may show up in it. */
static char audit_keys[2][KVG_KEY_LEN + 1];
static char audit_key_id[KVG_KEY_ID_LEN + 1];

static void audit_actions(fixture *f)
{
    call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\"}");
    call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:2\"}");
    call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"https://h:2\"}");
    call(f, "POST", "/admin/v1/workers/w1/drain", AUTH, NULL);
    call(f, "DELETE", "/admin/v1/workers/w1", AUTH, NULL);
    call(f, "GET", "/admin/v1/workers", "Bearer tok-secret-typo", NULL);
    call(f, "GET", "/admin/v1/workers", AUTH, NULL);
    call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{\"sharing\":\"group\",\"group\":\"g1\"}");
    call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{\"sharing\":\"everyone\"}");
    reply r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, NULL);
    snprintf(audit_keys[0], sizeof(audit_keys[0]), "%s", str_field(&r, "key"));
    snprintf(audit_key_id, sizeof(audit_key_id), "%s", str_field(&r, "id"));
    r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, "{}");
    snprintf(audit_keys[1], sizeof(audit_keys[1]), "%s", str_field(&r, "key"));
    char path[128];
    snprintf(path, sizeof(path), "/admin/v1/tenants/acme/keys/%s", audit_key_id);
    call(f, "DELETE", path, AUTH, NULL);
    call(f, "PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"random\"}");
    call(f, "DELETE", "/admin/v1/tenants/acme", AUTH, NULL);
    call(f, "DELETE", "/admin/v1/tenants/bad\"id\n", AUTH, NULL);
    /* the key itself sent as if it were a tenant id */
    snprintf(path, sizeof(path), "/admin/v1/tenants/%s", audit_keys[1]);
    call(f, "GET", path, AUTH, NULL);
    call(f, "DELETE", path, AUTH, NULL);
    call(f, "PUT", "/admin/v1/tenants/x", "Bearer wrong", "{}"); /* not authenticated: no line */
    call(f, "GET", "/admin/v1/tenants", AUTH, NULL);             /* a read: no line */
}

typedef struct audit_want {
    const char *action, *target;
    int status;
    const char *detail; /* prefix */
    /* in the resource before and after, as JSON text: "null" for none, NULL when the line has
     * no before and after (the request failed its checks) */
    const char *before, *after;
} audit_want;

/* The first 8 hex digits of SHA-256("tok-a"): the token that acted, named without itself. */
#define TOKEN_ID "4f66a428"

static void test_audit_log(void **state)
{
    fixture *f = *state;
    char *log = capture_stderr(audit_actions, f);
    char *file = slurp(f->audit_path);
    assert_non_null(file);
    char key_target[64], key_listed[64];
    snprintf(key_target, sizeof(key_target), "acme/%s", audit_key_id);
    snprintf(key_listed, sizeof(key_listed), "\"keys\":[{\"id\":\"%s\"", audit_key_id);
    const audit_want want[] = {
        {"worker.put", "w1", 201, "created url=http://h:1", "null", "\"url\":\"http://h:1\""},
        {"worker.put", "w1", 200, "replaced url=http://h:2", "\"url\":\"http://h:1\"",
         "\"url\":\"http://h:2\""},
        {"worker.put", "w1", 400, "url: https is not supported", "\"url\":\"http://h:2\"",
         "\"url\":\"http://h:2\""},
        {"worker.drain", "w1", 200, "draining", "\"draining\":false", "\"draining\":true"},
        {"worker.delete", "w1", 204, "deleted", "{\"name\":\"w1\"", "null"},
        {"tenant.put", "acme", 201, "created sharing=group:g1", "null", "\"group\":\"g1\""},
        {"tenant.put", "acme", 400, "sharing: must be", "\"group\":\"g1\"", "\"group\":\"g1\""},
        {"key.create", key_target, 201, "created", "\"keys\":[]", key_listed},
        {"key.create", "acme/", 201, "created", key_listed, key_listed},
        {"key.delete", key_target, 204, "deleted", key_listed, "\"keys\":[{\"id\":\"k"},
        {"policy.put", "policy", 200, "policy=random", "{\"policy\":\"cost\"",
         "{\"policy\":\"random\""},
        {"tenant.delete", "acme", 204, "deleted", "{\"id\":\"acme\"", "null"},
        {"tenant.delete", "bad\"id\n", 400, "id: ", NULL, NULL},
        {"tenant.delete", "kvg-[redacted]", 404, "tenant \"kvg-[redacted]\" not found", "null",
         "null"},
    };

    /* the file: one JSON object per line, exactly these fields */
    size_t n = 0;
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    for (char *line = file, *nl; (nl = strchr(line, '\n')); line = nl + 1, n++) {
        assert_true(n < KVG_ARRAY_LEN(want));
        kvg_json *v;
        kvg_json_error err;
        if (kvg_json_parse(line, (size_t)(nl - line), &arena, NULL, &v, &err) != 0)
            fail_msg("audit line %zu is not JSON (%s): %.*s", n, err.message, (int)(nl - line),
                     line);
        assert_int_equal(v->type, KVG_JSON_OBJECT);
        static const char *const names[] = {"time",   "remote", "token",  "action", "target",
                                            "status", "detail", "before", "after"};
        size_t count = want[n].before ? 9 : 7;
        assert_int_equal(v->u.obj.count, count);
        for (size_t k = 0; k < count; k++)
            assert_string_equal(v->u.obj.keys[k], names[k]);
        assert_string_equal(kvg_json_get(v, "token")->u.str.ptr, TOKEN_ID);
        /* before and after: the resource as JSON (an object, or null), holding what is wanted */
        const char *before = strstr(line, ",\"before\":");
        assert_true((before != NULL && before < nl) == (want[n].before != NULL));
        if (want[n].before) {
            const char *after = strstr(before, ",\"after\":");
            assert_true(after && after < nl);
            char *b = kvg_arena_strndup(&arena, before + 10, (size_t)(after - before - 10));
            char *a = kvg_arena_strndup(&arena, after + 9, (size_t)(nl - 1 - after - 9));
            if (!strstr(b, want[n].before) || !strstr(a, want[n].after))
                fail_msg("line %zu: before %s after %s; expected %s and %s", n, b, a,
                         want[n].before, want[n].after);
            if (strcmp(want[n].before, "null") == 0)
                assert_string_equal(b, "null");
            if (strcmp(want[n].after, "null") == 0)
                assert_string_equal(a, "null");
            assert_int_equal(kvg_json_get(v, "before")->type,
                             *b == 'n' ? KVG_JSON_NULL : KVG_JSON_OBJECT);
        }
        const char *ts = kvg_json_get(v, "time")->u.str.ptr;
        assert_int_equal(strlen(ts), 24);
        assert_true(ts[4] == '-' && ts[10] == 'T' && ts[19] == '.' && ts[23] == 'Z');
        assert_string_equal(kvg_json_get(v, "remote")->u.str.ptr, "192.0.2.7:5555");
        assert_string_equal(kvg_json_get(v, "action")->u.str.ptr, want[n].action);
        const char *target = kvg_json_get(v, "target")->u.str.ptr;
        if (strncmp(target, want[n].target, strlen(want[n].target)) != 0)
            fail_msg("line %zu: target %s, expected %s", n, target, want[n].target);
        assert_int_equal(kvg_json_get(v, "status")->u.num.ival, want[n].status);
        const char *detail = kvg_json_get(v, "detail")->u.str.ptr;
        if (strncmp(detail, want[n].detail, strlen(want[n].detail)) != 0)
            fail_msg("line %zu: detail \"%s\", expected \"%s\"", n, detail, want[n].detail);
        /* the same line went to the error log, without before and after */
        const char *cut = before && before < nl ? before : nl - 1;
        char *copy = kvg_arena_strndup(&arena, line, (size_t)(cut - line));
        if (!strstr(log, copy) || strstr(log, copy)[cut - line] != '}')
            fail_msg("audit line %zu not in the error log:\n%s", n, log);
    }
    assert_int_equal(n, KVG_ARRAY_LEN(want));
    kvg_arena_done(&arena);

    /* the error log: those lines at info level, plus the authentication failures as warnings */
    size_t lines = 0, audit = 0;
    for (const char *p = log; (p = strchr(p, '\n')); p++)
        lines++;
    for (const char *p = log; (p = strstr(p, "[info] admin: audit {\"time\":")); p++)
        audit++;
    assert_int_equal(audit, KVG_ARRAY_LEN(want));
    assert_non_null(strstr(log, "[warn] admin: remote=192.0.2.7:5555 GET /admin/v1/workers: "
                                "authentication failed: invalid admin token\n"));
    assert_int_equal(lines, audit + 2);

    /* never a token, never key material */
    for (int i = 0; i < 2; i++) {
        const char *secret = audit_keys[i] + strlen(KVG_KEY_PREFIX);
        assert_null(strstr(log, secret));
        assert_null(strstr(file, secret));
    }
    for (const char *p = file; (p = strstr(p, "kvg-")); p++)
        assert_memory_equal(p, "kvg-[redacted]", 14);
    for (const char *p = log; (p = strstr(p, "kvg-")); p++)
        assert_memory_equal(p, "kvg-[redacted]", 14);
    assert_null(strstr(log, "tok-a"));
    assert_null(strstr(log, "tok-secret-typo"));
    free(file);
    free(log);
}

const struct CMUnitTest audit_tests[] = {
    cmocka_unit_test_setup_teardown(test_audit_log, setup, teardown),
};
const size_t audit_tests_count = KVG_ARRAY_LEN(audit_tests);
