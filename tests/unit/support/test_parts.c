/* SPDX-License-Identifier: Apache-2.0 */
/* One cmocka group out of several files' tests (test_parts.h). */
#include "test_parts.h"

#include <stdlib.h>
#include <string.h>

int run_test_parts(const test_part *parts, size_t nparts)
{
    size_t n = 0;
    for (size_t i = 0; i < nparts; i++)
        n += parts[i].count;
    struct CMUnitTest *all = malloc(n * sizeof(*all));
    if (!all)
        return 1;
    for (size_t i = 0, k = 0; i < nparts; k += parts[i++].count)
        memcpy(all + k, parts[i].tests, parts[i].count * sizeof(*all));
    /* The function behind cmocka_run_group_tests, which wants an array whose size it sees. */
    int rc = _cmocka_run_group_tests("tests", all, n, NULL, NULL);
    free(all);
    return rc;
}
