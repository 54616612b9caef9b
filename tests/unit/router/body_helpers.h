/* SPDX-License-Identifier: Apache-2.0 */
/* What the unit tests of the body scanner (test_body.c, test_body_lex.c, test_body_canon.c)
 * share: running a body through it, and checking what a rewritten body means. */
#ifndef KVG_TEST_BODY_HELPERS_H
#define KVG_TEST_BODY_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "router.h"
#include "test_parts.h"

#define SALT "s4lt_0123456789-ABCDEFGHIJKLMNOPQRSTUVWXYZabc"

typedef struct result {
    int rc;
    kvg_buf out;
    kvg_body_info info;
    kvg_json_error err;
    kvg_arena arena;
} result;

/** kvg_body_rewrite of body into r (r->rc, out, info, err); done() frees what r holds. */
void run(result *r, const char *body, size_t len, const char *salt);
void done(result *r);
/** kvg_body_scan of the NUL-terminated body for api into r, with SALT; returns r->rc. */
int scan(result *r, const char *body, kvg_body_api api);
/** Rewrite an accepted body and check the output's meaning, the removal count, and that
 *  rewriting the output again changes nothing but the salt. */
void check_semantics(const char *body, size_t len, const char *salt);
/** Replace "%" in pattern by the JSON string of SALT. */
void expand(const char *pattern, char *buf, size_t len);

typedef struct bad_case {
    const char *body;
    int rc;
    size_t offset;
    const char *msg; /* expected message prefix */
} bad_case;

/* The tests of test_body_lex.c and test_body_canon.c, which test_body.c's main runs with its own
 * (test_parts.h). */
TEST_PART_DECLARE(body_lex_tests);
TEST_PART_DECLARE(body_canon_tests);

#endif
