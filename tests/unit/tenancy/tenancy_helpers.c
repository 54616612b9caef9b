/* SPDX-License-Identifier: Apache-2.0 */
/* Stores, tenants, digests, JSON and scratch directories for the tenancy tests
 * (tenancy_helpers.h). */
#include "tenancy_helpers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

kvg_tenants *new_store(void)
{
    kvg_tenants *ts = NULL;
    assert_int_equal(kvg_tenants_new(&ts), 0);
    assert_non_null(ts);
    return ts;
}

int put_def(kvg_tenants *ts, const kvg_tenant_def *def, bool *created)
{
    char msg[256];
    int rc = kvg_tenants_put(ts, def, created, msg, sizeof(msg));
    if (rc != 0 && rc != -ENOMEM)
        print_message("put %s: %s\n", def->id ? def->id : "(null)", msg);
    return rc;
}

int put_simple(kvg_tenants *ts, const char *id)
{
    kvg_tenant_def d = {.id = id};
    return put_def(ts, &d, NULL);
}

void sha256(const char *s, size_t len, uint8_t out[32])
{
    unsigned n = 0;
    assert_true(EVP_Digest(s, len, out, &n, EVP_sha256(), NULL));
    assert_int_equal(n, 32);
}

void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

kvg_json *parse(kvg_arena *a, const char *text)
{
    kvg_json *j = NULL;
    kvg_json_error err;
    int rc = kvg_json_parse(text, strlen(text), a, NULL, &j, &err);
    if (rc != 0)
        fail_msg("json: %s at %zu", err.message, err.offset);
    return j;
}

void release_all(kvg_tenant *t)
{
    while (kvg_tenant_inflight(t))
        kvg_tenant_release(t);
}

void expect_line(const char *text, const char *line)
{
    if (!strstr(text, line))
        fail_msg("missing line %s in:\n%s", line, text);
}

int load(kvg_tenants *ts, const char *text, char *msg, size_t msg_len)
{
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *j = parse(&a, text);
    int rc = kvg_tenants_from_json(ts, j, msg, msg_len);
    kvg_arena_done(&a);
    return rc;
}

void make_tmpdir(char *dir, size_t len)
{
    const char *base = getenv("TMPDIR");
    snprintf(dir, len, "%s/kvg-tenancy-XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(dir));
}
