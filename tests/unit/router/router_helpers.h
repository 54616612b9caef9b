/* SPDX-License-Identifier: Apache-2.0 */
/* What the unit tests of the worker registry, the workers, their metrics and routing decisions
 * (test_registry.c, test_worker.c, test_metrics.c, test_route.c) share: a registry and a quick
 * way to define a worker in it. */
#ifndef KVG_TEST_ROUTER_HELPERS_H
#define KVG_TEST_ROUTER_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "router.h"
#include "test_parts.h"

/** A new registry for nthreads threads (asserts it was made); free with kvg_registry_free. */
kvg_registry *new_registry(unsigned nthreads);

/** Define the worker name at url (every model, the defaults) from source src: what
 *  kvg_registry_put returns. */
int put(kvg_registry *reg, const char *name, const char *url, kvg_worker_source src);

/* The tests of the other files, which test_registry.c's main runs with its own (test_parts.h). */
TEST_PART_DECLARE(worker_tests);
TEST_PART_DECLARE(metrics_tests);
TEST_PART_DECLARE(route_tests);

#endif
