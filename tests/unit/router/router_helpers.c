/* SPDX-License-Identifier: Apache-2.0 */
/* A registry for a test, and a worker defined in it in one call (router_helpers.h). */
#include "router_helpers.h"

kvg_registry *new_registry(unsigned nthreads)
{
    kvg_registry_config cfg = {.nthreads = nthreads};
    kvg_registry *reg = NULL;
    assert_int_equal(kvg_registry_new(&cfg, &reg), 0);
    assert_non_null(reg);
    return reg;
}

int put(kvg_registry *reg, const char *name, const char *url, kvg_worker_source src)
{
    kvg_worker_def def = {.name = name, .url = url};
    char msg[256];
    return kvg_registry_put(reg, &def, src, msg, sizeof(msg));
}
