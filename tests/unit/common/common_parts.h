/* SPDX-License-Identifier: Apache-2.0 */
/* The tests of test_snapshot.c and test_fields.c, which test_common.c's main runs with its own as
 * one group (test_parts.h): common/ is one module, one test executable. */
#ifndef KVG_TEST_COMMON_PARTS_H
#define KVG_TEST_COMMON_PARTS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

extern const struct CMUnitTest snapshot_tests[];
extern const size_t snapshot_tests_count;
extern const struct CMUnitTest fields_tests[];
extern const size_t fields_tests_count;

#endif
