/* SPDX-License-Identifier: Apache-2.0 */
/* What the unit tests of tenancy/ (test_tenants.c, test_tenant.c, test_keys.c, test_metrics.c,
 * test_persist.c) share: a store, tenants put into it, digests, JSON, a scratch directory. */
#ifndef KVG_TEST_TENANCY_HELPERS_H
#define KVG_TEST_TENANCY_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tenancy.h"
#include "test_parts.h"

/* A second in nanoseconds, the unit of the clocks tenancy/ takes. */
#define SEC 1000000000ull

/** An empty tenant store (asserts it was made); free with kvg_tenants_free. */
kvg_tenants *new_store(void);

/** kvg_tenants_put of def, printing the message of a refusal other than -ENOMEM; returns its
 *  code. */
int put_def(kvg_tenants *ts, const kvg_tenant_def *def, bool *created);

/** put_def of a tenant with only an id: isolated, every model, no limits. */
int put_simple(kvg_tenants *ts, const char *id);

/** The SHA-256 of s (len bytes) into out. */
void sha256(const char *s, size_t len, uint8_t out[32]);

/** n bytes of d as 2n lowercase hex digits and a NUL into out. */
void hex(const uint8_t *d, size_t n, char *out);

/** text parsed as JSON into a (the test fails when it is not JSON). */
kvg_json *parse(kvg_arena *a, const char *text);

/** Release every request t has in flight. */
void release_all(kvg_tenant *t);

/** Fail the test unless line occurs in text (which the message shows). */
void expect_line(const char *text, const char *line);

/** kvg_tenants_from_json of the JSON text (parsed with parse()): its code, and msg. */
int load(kvg_tenants *ts, const char *text, char *msg, size_t msg_len);

/** A new empty directory under $TMPDIR (or /tmp), its path into dir. */
void make_tmpdir(char *dir, size_t len);

/* The tests of the other files, which test_tenants.c's main runs with its own (test_parts.h). */
TEST_PART_DECLARE(tenant_tests);
TEST_PART_DECLARE(keys_tests);
TEST_PART_DECLARE(metrics_tests);
TEST_PART_DECLARE(persist_tests);

#endif
