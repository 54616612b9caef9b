/* SPDX-License-Identifier: Apache-2.0 */
/* Serves the admin module's pure request -> response function on the admin listeners. */
#include <string.h>

#include "gateway_int.h"
#include "handlers.h"

static void respond(kvg_exchange *x, kvg_admin_response *resp)
{
    if (resp->www_authenticate)
        kvg_exchange_add_header(x, "www-authenticate", 16, resp->www_authenticate,
                                strlen(resp->www_authenticate));
    if (resp->allow)
        kvg_exchange_add_header(x, "allow", 5, resp->allow, strlen(resp->allow));
    if (resp->cache_control) /* "no-store" on tenant and key answers: a key is shown once */
        kvg_exchange_add_header(x, "cache-control", 13, resp->cache_control,
                                strlen(resp->cache_control));
    if (resp->status == 204 || resp->status == 304)
        kvg_exchange_respond(x, resp->status, 0), kvg_exchange_end(x);
    else
        kvg_exchange_send_body(x, resp->status, resp->content_type, resp->body.data,
                               resp->body.len);
    kvg_admin_response_done(resp);
}

static void handle(kvg_exchange *x)
{
    kvg_gateway *gw = x->thread->gw;
    size_t len = evbuffer_get_length(x->body);
    const char *body = len ? (const char *)evbuffer_pullup(x->body, -1) : NULL;
    kvg_admin_request req = {
        .method = x->method,
        .path = x->path,
        .authorization = kvg_exchange_header(x, "authorization", NULL),
        .body = body,
        .body_len = len,
        .remote = x->remote,
    };
    kvg_admin_response resp;
    kvg_admin_handle(gw->admin, &req, &resp);
    respond(x, &resp);
    /* A change to the registry: wake every thread so idle pools of removed workers close now
     * rather than at their next request. */
    if (strcmp(x->method, "GET") != 0 && strcmp(x->method, "HEAD") != 0)
        kvg_gateway_notify_all(gw);
    kvg_exchange_detach(x);
}

static void on_head(kvg_exchange *x)
{
    x->body_limit = KVG_ADMIN_BODY_MAX;
    if (x->content_length > (int64_t)KVG_ADMIN_BODY_MAX) {
        kvg_exchange_send_error(x, 413, "invalid_request_error", "admin request body too large");
        kvg_exchange_detach(x);
        return;
    }
    if (x->content_length == 0) {
        handle(x);
        return;
    }
    /* A body is coming. A stranger's is refused unread, as the proxy refuses a bad API key
     * before the body: otherwise every connection to the admin port could park up to
     * KVG_ADMIN_BODY_MAX here (200 of them held 245 MB). */
    kvg_admin_request req = {
        .method = x->method,
        .path = x->path,
        .authorization = kvg_exchange_header(x, "authorization", NULL),
        .remote = x->remote,
    };
    kvg_admin_response resp;
    if (!kvg_admin_preauthorize(x->thread->gw->admin, &req, &resp)) {
        respond(x, &resp);
        kvg_exchange_detach(x);
        return;
    }
    kvg_exchange_read_body(x);
}

static void on_abort(kvg_exchange *x)
{
    kvg_exchange_detach(x);
}

const kvg_handler kvg_admin_handler = {
    .on_head = on_head,
    .on_body = handle,
    .on_abort = on_abort,
};
