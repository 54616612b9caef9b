/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: admin API requests (method, path, authorization and JSON body all from the
 * input) against a live registry, tenant store and policy state (no state file, no audit
 * file); every request must get a well-formed response. */
#include <stdlib.h>
#include <string.h>

#include "admin.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvg_registry *reg;
static kvg_tenants *tenants;
static kvg_policy_state *policy;
static kvg_model_registry *models;
static kvg_admin *admin;

/* Take the next '\n'-terminated field from the input. */
static char *field(const uint8_t **p, const uint8_t *end)
{
    const uint8_t *nl = memchr(*p, '\n', (size_t)(end - *p));
    size_t n = nl ? (size_t)(nl - *p) : (size_t)(end - *p);
    char *s = strndup((const char *)*p, n);
    *p += n + (nl ? 1 : 0);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!reg) {
        kvg_log_set_level(KVG_LOG_ERROR);
        kvg_registry_config rc = {.nthreads = 1};
        static const char *const tokens[] = {"fuzz-token-0123456789"};
        if (kvg_registry_new(&rc, &reg) < 0 || kvg_tenants_new(&tenants) < 0 ||
            kvg_policy_state_new(&policy) < 0 || kvg_model_registry_new(&models) < 0)
            abort();
        kvg_admin_config ac = {
            .tokens = tokens, .ntokens = 1, .tenants = tenants, .policy = policy, .models = models};
        if (kvg_admin_new(&ac, reg, &admin) < 0)
            abort();
    }
    const uint8_t *p = data, *end = data + size;
    char *method = field(&p, end);
    char *path = field(&p, end);
    char *auth = field(&p, end);
    kvg_admin_request req = {
        .method = method,
        .path = path,
        .authorization = auth[0] == '-'   ? NULL
                         : auth[0] == '+' ? "Bearer fuzz-token-0123456789"
                                          : auth,
        .body = (const char *)p,
        .body_len = (size_t)(end - p),
        .remote = "fuzz",
    };
    kvg_admin_response resp;
    kvg_admin_handle(admin, &req, &resp);
    if (resp.status < 100 || resp.status > 599 || !resp.content_type)
        abort();
    kvg_admin_response_done(&resp);
    free(method);
    free(path);
    free(auth);
    return 0;
}
