/* SPDX-License-Identifier: Apache-2.0 */
/* The process-wide series every Prometheus exporter has: kvgate_build_info and process_*. */
#ifndef KVG_GATEWAY_PROCESS_METRICS_H
#define KVG_GATEWAY_PROCESS_METRICS_H

#include "common.h"

/** Append kvgate_build_info and the standard process_* series (CPU seconds, resident and
 *  virtual memory, open and maximum descriptors, start time), read from /proc/self as the
 *  Prometheus client libraries read them. A series whose source cannot be read is left out.
 *  A kvg_admin_metrics_fn: arg is unused. Thread-safe. */
void kvg_process_stats_write(kvg_buf *out, void *arg);

#endif
