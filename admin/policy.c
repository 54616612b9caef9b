/* SPDX-License-Identifier: Apache-2.0 */
/* /admin/v1/policy: show and change the routing policy settings (fields omitted from a PUT keep
 * their value); a change is saved before the answer. */
#include "admin_int.h"

#include <stdio.h>

static void respond_policy(admin_ctx *c, const kvg_policy_config *cfg)
{
    kvg_admin_json(c->resp, 200);
    kvg_policy_config_to_json(cfg, &c->resp->body);
}

void kvg_admin_policy_get(admin_ctx *c)
{
    kvg_policy_config cfg;
    kvg_policy_state_get(c->admin->policy, &cfg);
    respond_policy(c, &cfg);
}

void kvg_admin_policy_put(admin_ctx *c)
{
    char msg[256];
    /* Changes are serialised (change_lock): nothing else sets the policy in between. */
    kvg_policy_config cfg;
    kvg_policy_state_get(c->admin->policy, &cfg);
    if (kvg_policy_config_apply_json(&cfg, c->body, msg, sizeof(msg)) < 0) {
        kvg_admin_fail(c, 400, "%s", msg);
        return;
    }
    if (!kvg_admin_applied(c, kvg_policy_state_set(c->admin->policy, &cfg), NULL))
        return;
    kvg_admin_detail(c, "policy=%s", kvg_policy_kind_str(cfg.kind));
    respond_policy(c, &cfg);
}
