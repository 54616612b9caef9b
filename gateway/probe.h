/* SPDX-License-Identifier: Apache-2.0 */
/* The control thread's GETs to workers (probe.c), and the two rounds built on them: health
 * checks (health.c) and engine-load scrapes (scrape.c). */
#ifndef KVG_GATEWAY_PROBE_H
#define KVG_GATEWAY_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "router.h"

typedef struct kvg_gateway kvg_gateway;
typedef struct kvg_probe kvg_probe;

typedef struct kvg_probe_spec {
    const char *path;
    const char *headers;          /* extra request header lines, each ending "\r\n"; or NULL */
    uint32_t timeout_ms;          /* connect to the end of the response */
    size_t body_max;              /* 0: done at a 2xx head; else keep the body up to this */
    const char *error_status_msg; /* why, for a non-2xx status */
    const char *too_large_msg;    /* why, for a body over body_max */
    /** Called once: why is NULL for a 2xx response (with its body when body_max > 0), else
     *  the reason it failed. Runs inside the probe's callbacks; body is borrowed. */
    void (*done)(kvg_gateway *gw, kvg_worker *w, const char *why, const char *body, size_t len);
} kvg_probe_spec;

/** Start one probe of w unless the previous one using the same thread slot of w is still
 *  running; spec must outlive it; list collects the probes in flight (kvg_probe_free_all). On
 *  memory failure nothing starts (the next round tries again). */
void kvg_probe_start(kvg_gateway *gw, kvg_worker *w, unsigned slot, const kvg_probe_spec *spec,
                     kvg_link *list);
/** Free every probe of list without calling back (shutdown). */
void kvg_probe_free_all(kvg_link *list);

/** Start periodic health checks on the control thread. */
int kvg_health_start(kvg_gateway *gw);
void kvg_health_stop(kvg_gateway *gw);

/** Start scraping the engines' load on the control thread (gateway/scrape.c); nothing when
 *  scrape.interval_ms is 0. 0 or -ENOMEM. */
int kvg_scrape_start(kvg_gateway *gw);
/** Stop it and free the scrapes in flight. Safe when never started, and more than once. */
void kvg_scrape_stop(kvg_gateway *gw);
/** How old a scraped load may be and still count for routing: 3 x scrape.interval_ms; 0 when
 *  scraping is off (kvg_route_request.engine_load_max_age_ns). */
uint64_t kvg_scrape_max_age_ns(const kvg_gateway *gw);

#endif
