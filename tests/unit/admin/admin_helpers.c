/* SPDX-License-Identifier: Apache-2.0 */
/* The admin tests' fixture, calls, replies and error log (admin_helpers.h). */
#include "admin_helpers.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The objects an admin works on, as a gateway creates them at start-up. */
int make_objects(kvg_registry **reg, kvg_tenants **tenants, kvg_policy_state **policy)
{
    kvg_registry_config rcfg = {.nthreads = 2};
    if (kvg_registry_new(&rcfg, reg) < 0 || kvg_tenants_new(tenants) < 0 ||
        kvg_policy_state_new(policy) < 0)
        return -1;
    return 0;
}

int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/kvg-admin-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    snprintf(f->state_path, sizeof(f->state_path), "%s/state.json", f->dir);
    snprintf(f->audit_path, sizeof(f->audit_path), "%s/audit.log", f->dir);
    if (make_objects(&f->reg, &f->tenants, &f->policy) < 0)
        return -1;
    const char *tokens[] = {"tok-a", "tok-b"};
    kvg_admin_config cfg = {
        .tokens = tokens,
        .ntokens = 2,
        .tenants = f->tenants,
        .policy = f->policy,
        .state_path = f->state_path,
        .audit_path = f->audit_path,
    };
    if (kvg_admin_new(&cfg, f->reg, &f->admin) < 0)
        return -1;
    kvg_arena_init(&f->arena, 0);
    kvg_log_set_level(KVG_LOG_ERROR); /* keep the audit lines out of the TAP output */
    *state = f;
    return 0;
}

static void remove_dir(const char *dir)
{
    static const char *const names[] = {"state.json", "audit.log", "file", "ro"};
    char path[256];
    for (size_t i = 0; i < KVG_ARRAY_LEN(names); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
        rmdir(path);
    }
    rmdir(dir);
}

int teardown(void **state)
{
    fixture *f = *state;
    kvg_admin_free(f->admin);
    kvg_registry_free(f->reg);
    kvg_tenants_free(f->tenants);
    kvg_policy_state_free(f->policy);
    kvg_arena_done(&f->arena);
    remove_dir(f->dir);
    free(f);
    return 0;
}

reply call_body(fixture *f, const char *method, const char *path, const char *auth,
                const char *body, size_t body_len)
{
    kvg_admin_request req = {
        .method = method,
        .path = path,
        .authorization = auth,
        .body = body,
        .body_len = body_len,
        .remote = "192.0.2.7:5555",
    };
    kvg_admin_response resp;
    memset(&resp, 0xa5, sizeof(resp)); /* the handler must fill every field */
    kvg_admin_handle(f->admin, &req, &resp);
    reply r = {
        .status = resp.status,
        .content_type = resp.content_type,
        .allow = resp.allow,
        .www_authenticate = resp.www_authenticate,
        .cache_control = resp.cache_control,
    };
    assert_non_null(r.content_type);
    assert_false(resp.body.failed);
    r.len = resp.body.len;
    r.body = kvg_arena_strndup(&f->arena, resp.body.len ? resp.body.data : "", resp.body.len);
    assert_non_null(r.body);
    kvg_admin_response_done(&resp);
    if (strcmp(r.content_type, "application/json") == 0 && r.len) {
        kvg_json_error err;
        if (kvg_json_parse(r.body, r.len, &f->arena, NULL, &r.json, &err) != 0)
            fail_msg("response is not JSON (%s): %s", err.message, r.body);
    }
    return r;
}

reply call(fixture *f, const char *method, const char *path, const char *auth, const char *body)
{
    return call_body(f, method, path, auth, body, body ? strlen(body) : 0);
}

const kvg_json *field(const kvg_json *v, const char *path)
{
    /* dotted path of object members */
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    char *save = NULL;
    for (char *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save))
        v = kvg_json_get(v, k);
    return v;
}

const char *str_field(const reply *r, const char *path)
{
    assert_non_null(r->json);
    const kvg_json *v = field(r->json, path);
    if (!v || v->type != KVG_JSON_STRING)
        fail_msg("no string %s in %s", path, r->body);
    return v->u.str.ptr;
}

int64_t int_field(const reply *r, const char *path)
{
    const kvg_json *v = field(r->json, path);
    if (!v || v->type != KVG_JSON_NUMBER || !v->u.num.is_int)
        fail_msg("no integer %s in %s", path, r->body);
    return v->u.num.ival;
}

bool bool_field(const reply *r, const char *path)
{
    const kvg_json *v = field(r->json, path);
    if (!v || (v->type != KVG_JSON_TRUE && v->type != KVG_JSON_FALSE))
        fail_msg("no boolean %s in %s", path, r->body);
    return v->type == KVG_JSON_TRUE;
}

/* The OpenAI error shape, exactly: {"error":{"message","type","code"}}. */
void assert_error(const reply *r, int status, const char *type, const char *msg_prefix)
{
    if (r->status != status)
        fail_msg("status %d, expected %d: %s", r->status, status, r->body);
    assert_string_equal(r->content_type, "application/json");
    assert_non_null(r->json);
    assert_int_equal(r->json->type, KVG_JSON_OBJECT);
    assert_int_equal(r->json->u.obj.count, 1);
    const kvg_json *e = kvg_json_get(r->json, "error");
    assert_non_null(e);
    assert_int_equal(e->u.obj.count, 3);
    assert_string_equal(str_field(r, "error.type"), type);
    assert_int_equal(int_field(r, "error.code"), status);
    const char *m = str_field(r, "error.message");
    if (strncmp(m, msg_prefix, strlen(msg_prefix)) != 0)
        fail_msg("message \"%s\" does not start with \"%s\"", m, msg_prefix);
}

/* The error log, for tests that provoke errors on purpose: off, then back. */
static int saved_stderr = -1;

void quiet_stderr(void)
{
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    assert_true(null >= 0);
    saved_stderr = dup(2);
    assert_true(saved_stderr >= 0);
    assert_true(dup2(null, 2) >= 0);
    close(null);
}

void restore_stderr(void)
{
    assert_true(dup2(saved_stderr, 2) >= 0);
    close(saved_stderr);
    saved_stderr = -1;
}

bool ready_value;

bool ready_cb(void *ud)
{
    assert_ptr_equal(ud, &ready_value);
    return ready_value;
}

/* Read a whole file (caller frees); NULL when it does not exist. */
char *slurp(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    kvg_buf b;
    kvg_buf_init(&b);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
        kvg_buf_append(&b, chunk, n);
    fclose(fp);
    kvg_buf_putc(&b, '\0');
    assert_false(b.failed);
    return kvg_buf_steal(&b, NULL);
}
