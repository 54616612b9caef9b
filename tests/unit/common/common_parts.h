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

#include "test_parts.h"

TEST_PART_DECLARE(snapshot_tests);
TEST_PART_DECLARE(fields_tests);

#endif
