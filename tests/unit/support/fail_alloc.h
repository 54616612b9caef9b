/* SPDX-License-Identifier: Apache-2.0 */
/* Failing allocator for unit tests: malloc, calloc and realloc are wrapped at link time
 * (-Wl,--wrap) so a test can make exactly the n-th allocation fail. */
#ifndef KVG_TEST_FAIL_ALLOC_H
#define KVG_TEST_FAIL_ALLOC_H

#include <stdbool.h>

/** Make the n-th allocation from now fail (0 = the next one); every other one succeeds. */
void fail_alloc_nth(long n);
/** Stop injecting failures. Returns true when the armed failure was actually injected. */
bool fail_alloc_off(void);

#endif
