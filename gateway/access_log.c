/* SPDX-License-Identifier: Apache-2.0 */
/* What happens when an exchange ends: one JSON access-log line, and the front's own counters
 * (connections, requests by status class, protocol errors) in Prometheus text. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gateway_int.h"
#include "prom.h"

#define ACCESS_PATH_MAX 512

static void put_str_or_null(kvg_buf *b, const char *s)
{
    if (s)
        kvg_buf_json_string(b, s, KVG_MIN(strlen(s), ACCESS_PATH_MAX)); /* paths can be huge */
    else
        kvg_buf_puts(b, "null");
}

/* What the user felt: time to first token, the mean gap between output events (ITL), the events
 * and the output tokens the engine reported; null where unknown. */
static void put_output(kvg_buf *b, const kvg_exchange *x)
{
    kvg_buf_puts(b, ",\"ttft_ms\":");
    if (x->ttft_ns)
        kvg_buf_printf(b, "%.3f", (double)x->ttft_ns / 1e6);
    else
        kvg_buf_puts(b, "null");
    kvg_buf_puts(b, ",\"itl_ms\":");
    if (x->output_events >= 2)
        kvg_buf_printf(b, "%.3f", (double)x->output_span_ns / 1e6 / (double)(x->output_events - 1));
    else
        kvg_buf_puts(b, "null");
    kvg_buf_printf(
        b, ",\"output_events\":%llu,\"output_tokens\":", (unsigned long long)x->output_events);
    if (x->have_output_tokens)
        kvg_buf_printf(b, "%lld", (long long)x->output_tokens);
    else
        kvg_buf_puts(b, "null");
}

void kvg_thread_exchange_finished(void *thread, kvg_exchange *x)
{
    kvg_thread *t = thread;
    kvg_gateway *gw = t->gw;
    int status = x->status; /* 0: no head went out */
    unsigned cls = status >= 100 && status < 600 ? (unsigned)status / 100 : 0;
    atomic_fetch_add_explicit(&gw->stats.requests_by_class[cls], 1, memory_order_relaxed);
    if (gw->access_log_fd < 0)
        return;
    uint64_t now = kvg_now_ns();
    char ts[32];
    kvg_format_time(kvg_wall_ns() - (now - x->start_ns), ts, sizeof(ts));
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_reserve(&b, 512);
    kvg_buf_printf(&b, "{\"time\":\"%s\",\"request_id\":", ts);
    put_str_or_null(&b, x->request_id[0] ? x->request_id : NULL);
    kvg_buf_puts(&b, ",\"remote\":");
    put_str_or_null(&b, x->remote);
    kvg_buf_printf(&b, ",\"proto\":\"%s\",\"tls\":%s,\"method\":", kvg_exchange_proto_str(x->proto),
                   x->tls ? "true" : "false");
    put_str_or_null(&b, x->method);
    kvg_buf_puts(&b, ",\"path\":");
    put_str_or_null(&b, x->path);
    /* 499 as nginx logs it: the client left before the response ended (status_sent says what
     * it had been sent, 0 when nothing). */
    kvg_buf_printf(
        &b, ",\"status\":%d,\"status_sent\":%d,\"model\":", x->client_gone ? 499 : status, status);
    put_str_or_null(&b, x->model);
    kvg_buf_puts(&b, ",\"tenant\":");
    put_str_or_null(&b, x->tenant);
    kvg_buf_puts(&b, ",\"worker\":");
    put_str_or_null(&b, x->worker_name);
    kvg_buf_printf(
        &b,
        ",\"tries\":%u,\"retries\":%u,\"bytes_in\":%llu,\"bytes_out\":%llu,\"duration_ms\":%.3f,"
        "\"ttfb_ms\":",
        x->tries, x->retries, (unsigned long long)x->bytes_in, (unsigned long long)x->bytes_out,
        (double)(now - x->start_ns) / 1e6);
    if (kvg_exchange_head_sent(x))
        kvg_buf_printf(&b, "%.3f", (double)(x->first_byte_ns - x->start_ns) / 1e6);
    else
        kvg_buf_puts(&b, "null");
    put_output(&b, x);
    kvg_buf_puts(&b, ",\"error\":");
    put_str_or_null(&b, x->error_type);
    kvg_buf_puts(&b, "}\n");
    if (!b.failed) {
        /* One write per line with O_APPEND: lines from all threads stay whole. */
        ssize_t w = write(gw->access_log_fd, b.data, b.len);
        (void)w;
    }
    kvg_buf_done(&b);
}

void kvg_front_stats_write(kvg_buf *out, void *arg)
{
    kvg_gateway *gw = arg;
    kvg_front_stats *s = &gw->stats;
    static const char *const protocols[KVG_PROTO_COUNT] = {
        [KVG_PROTO_HTTP1] = "http1", [KVG_PROTO_HTTP2] = "http2"};
    kvg_prom_put_by_label(out, "kvgate_connections_total", KVG_PROM_COUNTER,
                          "Front connections accepted, by protocol.", "protocol", protocols,
                          s->connections_total, KVG_PROTO_COUNT);
    kvg_prom_put_scalar_i64(
        out, "kvgate_connections_open", KVG_PROM_GAUGE,
        "Front connections open now (TLS handshakes and protocol detection included).",
        atomic_load(&s->connections_open));
    kvg_prom_put_scalar_i64(out, "kvgate_connections_limit", KVG_PROM_GAUGE,
                            "Front connections the gateway serves at once "
                            "(limits.max_connections, or derived from the descriptor limit); "
                            "past it new ones are refused politely.",
                            gw->max_connections);
    kvg_prom_put_scalar_i64(out, "kvgate_admin_connections_open", KVG_PROM_GAUGE,
                            "Admin connections open now.", atomic_load(&s->admin_connections_open));
    static const char *const listeners[2] = {"front", "admin"};
    kvg_prom_put_by_label(out, "kvgate_connections_refused_total", KVG_PROM_COUNTER,
                          "Connections refused at a connection limit (HTTP/1.1: 503, HTTP/2: "
                          "GOAWAY, TLS: closed).",
                          "listener", listeners, s->connections_refused, 2);
    kvg_prom_put_scalar_u64(
        out, "kvgate_admin_connections_evicted_total", KVG_PROM_COUNTER,
        "Idle admin connections closed to make room for a new one at admin.max_connections.",
        atomic_load(&s->admin_connections_evicted));
    static const char *const accept_kinds[KVG_ACCEPT_ERR_COUNT] = {"descriptors", "memory",
                                                                   "other"};
    kvg_prom_put_by_label(out, "kvgate_accept_errors_total", KVG_PROM_COUNTER,
                          "Failed accepts: descriptors (EMFILE, ENFILE) and memory (ENOBUFS, "
                          "ENOMEM) pause the listener for 500 ms.",
                          "reason", accept_kinds, s->accept_errors, KVG_ACCEPT_ERR_COUNT);
    static const char *const classes[6] = {"0xx", "1xx", "2xx", "3xx", "4xx", "5xx"};
    kvg_prom_put_by_label(out, "kvgate_http_requests_total", KVG_PROM_COUNTER,
                          "Requests answered by the front, by status class (0xx: the client left "
                          "before a status).",
                          "class", classes, s->requests_by_class, 6);
    kvg_prom_put_scalar_u64(out, "kvgate_tls_handshake_failures_total", KVG_PROM_COUNTER,
                            "TLS handshakes that failed.", atomic_load(&s->tls_handshake_failures));
    kvg_prom_put_scalar_u64(out, "kvgate_protocol_errors_total", KVG_PROM_COUNTER,
                            "Connections or requests dropped for malformed HTTP/1.1 or HTTP/2.",
                            atomic_load(&s->protocol_errors));
    kvg_prom_put_scalar_u64(out, "kvgate_timeouts_total", KVG_PROM_COUNTER,
                            "Front read and send timeouts and upstream connect/response timeouts.",
                            atomic_load(&s->timeouts));
    kvg_prom_put_scalar_u64(out, "kvgate_send_timeouts_total", KVG_PROM_COUNTER,
                            "Responses aborted because no byte moved toward the client for "
                            "limits.send_timeout_ms (the worker's request is cancelled).",
                            atomic_load(&s->send_timeouts));
    /* The two budgets are separate objects, not an array: their own loop. */
    const kvg_budget *budgets[2] = {&gw->body_budget, &gw->response_budget};
    static const char *const budget_kinds[2] = {"request_body", "response"};
    kvg_prom_put_header(out, "kvgate_buffer_bytes", KVG_PROM_GAUGE,
                        "Bytes held for requests in flight: request bodies (received and "
                        "rewritten) and responses queued toward clients.");
    for (unsigned i = 0; i < 2; i++)
        kvg_prom_put_u64(out, "kvgate_buffer_bytes", KVG_PROM_LABELS({"kind", budget_kinds[i]}),
                         atomic_load(&budgets[i]->used));
    kvg_prom_put_header(out, "kvgate_buffer_budget_bytes", KVG_PROM_GAUGE,
                        "The budget of kvgate_buffer_bytes (limits.body_budget_mib, "
                        "limits.response_budget_mib).");
    for (unsigned i = 0; i < 2; i++)
        kvg_prom_put_u64(out, "kvgate_buffer_budget_bytes",
                         KVG_PROM_LABELS({"kind", budget_kinds[i]}), budgets[i]->limit);
    static const char *const scopes[2] = {"gateway", "tenant"};
    kvg_prom_put_by_label(out, "kvgate_buffer_refusals_total", KVG_PROM_COUNTER,
                          "Request bodies refused at the body budget: the gateway's whole budget "
                          "(503) or a tenant's share of it (429).",
                          "scope", scopes, gw->body_budget.refused, 2);
    kvg_prom_put_scalar_u64(out, "kvgate_shutting_down", KVG_PROM_GAUGE,
                            "1 while the gateway drains for exit.",
                            atomic_load(&gw->shutting_down) ? 1 : 0);
}
