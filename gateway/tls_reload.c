/* SPDX-License-Identifier: Apache-2.0 */
/* Certificates of the TLS listeners after start: what was loaded, in the log and as a metric,
 * and SIGHUP's reload of the files for new connections, keeping the running context when the
 * new files or settings are bad. */
#include <inttypes.h>
#include <string.h>

#include "gateway_int.h"
#include "prom.h"

void kvg_gateway_tls_log_loaded(const kvg_listener *l, const kvg_tls_cert_info *info)
{
    kvg_log_info("%s listener %s: TLS certificate %s loaded: subject %s, expires %s",
                 l->is_admin ? "admin" : "front", l->cfg.address, l->cfg.tls_cert, info->subject,
                 info->not_after[0] ? info->not_after : "(unknown)");
}

static void reload_listener(kvg_listener *l, const kvg_config *next)
{
    SSL_CTX *ctx = NULL;
    kvg_tls_cert_info info;
    char err[600];
    if (kvg_tls_ctx_new(&l->cfg, &next->tls, &ctx, &info, err, sizeof(err)) < 0) {
        kvg_log_error("%s listener %s: TLS reload failed, new connections keep the running "
                      "certificate: %s",
                      l->is_admin ? "admin" : "front", l->cfg.address, err);
        return;
    }
    kvg_tls_slot_replace(&l->tls, ctx, info.not_after_s);
    kvg_gateway_tls_log_loaded(l, &info);
}

/* The paths are the running ones: a listener's files are named at start (changing them, like
 * any listener change, needs a restart); what a reload re-reads is their content. */
static void warn_moved(const kvg_listener *l, const kvg_listener_config *nl)
{
    if (!nl || strcmp(nl->address, l->cfg.address) != 0 || !nl->tls_cert)
        return;
    if (strcmp(nl->tls_cert, l->cfg.tls_cert) != 0 || strcmp(nl->tls_key, l->cfg.tls_key) != 0)
        kvg_log_warn("listener %s: new tls_cert/tls_key paths take effect after a restart; "
                     "reloading %s and %s",
                     l->cfg.address, l->cfg.tls_cert, l->cfg.tls_key);
}

void kvg_gateway_tls_reload(kvg_gateway *gw, const kvg_config *next)
{
    char err[600];
    bool any = false;
    for (size_t i = 0; i < gw->nlisteners; i++)
        any = any || gw->listeners[i].has_tls;
    for (size_t i = 0; i < gw->nadmin_listeners; i++)
        any = any || gw->admin_listeners[i].has_tls;
    if (!any)
        return;
    if (kvg_tls_settings_check(&next->tls, err, sizeof(err)) < 0) {
        kvg_log_error("TLS reload failed, new connections keep the running certificates and "
                      "settings: %s",
                      err);
        return;
    }
    for (size_t i = 0; i < gw->nlisteners; i++) {
        if (!gw->listeners[i].has_tls)
            continue;
        warn_moved(&gw->listeners[i], i < next->nlisteners ? &next->listeners[i] : NULL);
        reload_listener(&gw->listeners[i], next);
    }
    for (size_t i = 0; i < gw->nadmin_listeners; i++) {
        if (!gw->admin_listeners[i].has_tls)
            continue;
        warn_moved(&gw->admin_listeners[i],
                   i < next->nadmin_listeners ? &next->admin_listeners[i] : NULL);
        reload_listener(&gw->admin_listeners[i], next);
    }
}

void kvg_tls_stats_write(kvg_buf *out, void *arg)
{
    kvg_gateway *gw = arg;
    bool header = false;
    for (int g = 0; g < 2; g++) {
        kvg_listener *ls = g ? gw->admin_listeners : gw->listeners;
        size_t n = g ? gw->nadmin_listeners : gw->nlisteners;
        for (size_t i = 0; i < n; i++) {
            if (!ls[i].has_tls)
                continue;
            if (!header)
                kvg_prom_put_header(out, "kvgate_tls_certificate_expiry_timestamp_seconds",
                                    KVG_PROM_GAUGE,
                                    "When the certificate new TLS connections get expires "
                                    "(Unix time; reloaded by SIGHUP).");
            header = true;
            int64_t t = atomic_load(&ls[i].tls.not_after_s);
            kvg_prom_put_u64(out, "kvgate_tls_certificate_expiry_timestamp_seconds",
                             KVG_PROM_LABELS({"listener", g ? "admin" : "front"},
                                             {"address", ls[i].cfg.address}),
                             t > 0 ? (uint64_t)t : 0);
        }
    }
}
