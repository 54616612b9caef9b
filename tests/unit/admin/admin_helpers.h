/* SPDX-License-Identifier: Apache-2.0 */
/* What the unit tests of the admin API (test_admin.c, test_probes.c, test_auth.c, test_workers.c,
 * test_tenants.c, test_policy.c, test_audit.c, test_state.c, test_shared.c) share: an admin over
 * fresh objects in a scratch directory, calls and their replies, the error shape, a quiet error
 * log. */
#ifndef KVG_TEST_ADMIN_HELPERS_H
#define KVG_TEST_ADMIN_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "admin.h"
#include "test_parts.h"

/* The Authorization header of an accepted token (setup accepts tok-a and tok-b). */
#define AUTH "Bearer tok-a"

typedef struct fixture {
    kvg_registry *reg;
    kvg_tenants *tenants;
    kvg_policy_state *policy;
    kvg_admin *admin;
    kvg_arena arena; /* for parsed response bodies */
    char dir[64];    /* a fresh folder for the state file and the audit log */
    char state_path[128];
    char audit_path[128];
} fixture;

/** The objects an admin works on, as a gateway creates them at start-up. */
int make_objects(kvg_registry **reg, kvg_tenants **tenants, kvg_policy_state **policy);

/** cmocka setup: a fixture (*state) whose admin accepts the tokens tok-a and tok-b, keeps its
 *  state file and audit log in a fresh directory, and logs errors only. 0, or -1. */
int setup(void **state);

/** cmocka teardown: free what setup made and remove its directory. */
int teardown(void **state);

typedef struct reply {
    int status;
    const char *content_type;
    const char *allow;
    const char *www_authenticate;
    const char *cache_control;
    char *body; /* copy, NUL-terminated; freed by reply_done */
    size_t len;
    kvg_json *json; /* parsed when the body is JSON */
} reply;

/** One request through kvg_admin_handle (from 192.0.2.7:5555; auth the Authorization header or
 *  NULL): the reply, its body copied into f->arena and parsed when it is JSON (the test fails
 *  when a JSON reply does not parse). */
reply call_body(fixture *f, const char *method, const char *path, const char *auth,
                const char *body, size_t body_len);

/** call_body with a NUL-terminated body (NULL: none). */
reply call(fixture *f, const char *method, const char *path, const char *auth, const char *body);

/** The member at a dotted path ("error.message") of v, or NULL. */
const kvg_json *field(const kvg_json *v, const char *path);

/** The string at path in r's JSON body (the test fails without one). */
const char *str_field(const reply *r, const char *path);

/** The integer at path in r's JSON body (the test fails without one). */
int64_t int_field(const reply *r, const char *path);

/** The boolean at path in r's JSON body (the test fails without one). */
bool bool_field(const reply *r, const char *path);

/** The OpenAI error shape, exactly: {"error":{"message","type","code"}}. */
void assert_error(const reply *r, int status, const char *type, const char *msg_prefix);

/** Send the error log (stderr) to /dev/null, for a test that provokes errors on purpose. */
void quiet_stderr(void);

/** Undo quiet_stderr. */
void restore_stderr(void);

/* What ready_cb answers; main sets it true. */
extern bool ready_value;

/** The gateway's readiness as the admin asks it (kvg_admin_set_ready): ready_value. */
bool ready_cb(void *ud);

typedef struct body_case {
    const char *body;
    const char *msg; /* expected message prefix */
} body_case;

/** Read a whole file (caller frees); NULL when it does not exist. */
char *slurp(const char *path);

/* The tests of the other files, which test_admin.c's main runs with its own (test_parts.h). */
TEST_PART_DECLARE(probes_tests);
TEST_PART_DECLARE(auth_tests);
TEST_PART_DECLARE(workers_tests);
TEST_PART_DECLARE(tenants_tests);
TEST_PART_DECLARE(policy_tests);
TEST_PART_DECLARE(audit_tests);
TEST_PART_DECLARE(state_tests);
TEST_PART_DECLARE(shared_tests);

#endif
