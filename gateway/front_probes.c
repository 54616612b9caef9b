/* SPDX-License-Identifier: Apache-2.0 */
/* The optional health paths of the front listeners (probes.front_healthz, front_readyz), for
 * load balancers that cannot reach the admin port: the admin module's own /healthz and
 * /readyz answers, without a token, in front of the proxy. */
#include <string.h>

#include "gateway_int.h"
#include "handlers.h"

static bool path_is(const char *path, const char *want)
{
    if (!want)
        return false;
    size_t n = strcspn(path, "?");
    return strlen(want) == n && memcmp(path, want, n) == 0;
}

static void on_head(kvg_exchange *x)
{
    kvg_gateway *gw = x->thread->gw;
    const char *probe = path_is(x->path, gw->cfg.probes.front_healthz)  ? "/healthz"
                        : path_is(x->path, gw->cfg.probes.front_readyz) ? "/readyz"
                                                                        : NULL;
    if (!probe) {
        kvg_proxy_handler.on_head(x);
        return;
    }
    if (strcmp(x->method, "GET") != 0 && strcmp(x->method, "HEAD") != 0) {
        kvg_exchange_add_header(x, "allow", 5, "GET, HEAD", 9);
        kvg_exchange_send_error(x, 405, "invalid_request_error", "use GET for %s", probe);
        kvg_exchange_detach(x);
        return;
    }
    /* HEAD is GET without the body, which the fronts leave out themselves. */
    kvg_admin_request req = {.method = "GET", .path = probe, .remote = x->remote};
    kvg_admin_response resp;
    kvg_admin_handle(gw->admin, &req, &resp); /* a read: never blocks */
    kvg_exchange_add_header(x, "cache-control", 13, "no-store", 8);
    kvg_exchange_send_body(x, resp.status, resp.content_type, resp.body.data, resp.body.len);
    kvg_admin_response_done(&resp);
    kvg_exchange_detach(x);
}

static void on_body(kvg_exchange *x)
{
    kvg_proxy_handler.on_body(x);
}

static void on_writable(kvg_exchange *x)
{
    if (kvg_proxy_handler.on_writable)
        kvg_proxy_handler.on_writable(x);
}

static void on_abort(kvg_exchange *x)
{
    kvg_proxy_handler.on_abort(x);
}

const kvg_handler kvg_front_probe_handler = {
    .on_head = on_head,
    .on_body = on_body,
    .on_writable = on_writable,
    .on_abort = on_abort,
};
