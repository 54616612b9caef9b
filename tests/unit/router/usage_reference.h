/* SPDX-License-Identifier: Apache-2.0 */
/* The test oracle for router/usage.c (usage_reference.c): the same contract as
 * kvg_usage_scan_init, kvg_usage_scan_init_responses and kvg_usage_scan_feed, on the same
 * struct. Test-only. */
#ifndef KVG_TESTS_USAGE_REFERENCE_H
#define KVG_TESTS_USAGE_REFERENCE_H

#include "router.h"

void kvg_usage_ref_init(kvg_usage_scan *s);
void kvg_usage_ref_init_responses(kvg_usage_scan *s);
void kvg_usage_ref_feed(kvg_usage_scan *s, const char *data, size_t len);

#endif
