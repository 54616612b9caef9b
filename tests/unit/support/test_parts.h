/* SPDX-License-Identifier: Apache-2.0 */
/* Run the tests of several files of one executable as one cmocka group: a test executable split
 * by the source files it tests still gives one TAP plan, which is all meson's TAP reader takes. */
#ifndef KVG_TEST_PARTS_H
#define KVG_TEST_PARTS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* One file's tests. Each file defines `const struct CMUnitTest <file>_tests[]` and
 * `const size_t <file>_tests_count = KVG_ARRAY_LEN(<file>_tests)`; main lists the parts. */
typedef struct test_part {
    const struct CMUnitTest *tests;
    size_t count;
} test_part;

/* For the main file: the declaration of another file's part, TEST_PART_DECLARE(worker_tests);. */
#define TEST_PART_DECLARE(name)                                                                    \
    extern const struct CMUnitTest name[];                                                         \
    extern const size_t name##_count

/** Run the parts' tests in order as one group named "tests", as cmocka_run_group_tests(tests,
 *  NULL, NULL) would for one array. Returns what it returns: the number of failed tests (or 1
 *  when memory runs out before any test ran). */
int run_test_parts(const test_part *parts, size_t nparts);

#endif
