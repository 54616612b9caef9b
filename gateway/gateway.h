/* SPDX-License-Identifier: Apache-2.0 */
/* The gateway as a library: built from a configuration, run until stopped, freed. main.c is its
 * command line; a test can run a whole gateway in process. */
#ifndef KVG_GATEWAY_H
#define KVG_GATEWAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef struct kvg_gateway kvg_gateway;

/** Build a gateway from cfg, which it takes over (frees it, also on failure; cfg is left
 *  zeroed): state directory, admin token and server secret, registry, tenants, policy, prefix
 *  index, the admin API with its state file restored, threads (not started) with their
 *  listeners bound (kvg_gateway_port says where), the access log. Sets the process's log level
 *  and ignores SIGPIPE. argv, when not NULL, is the command line cfg came from: the gateway
 *  then handles SIGTERM and SIGINT (drain) and SIGHUP (reload from argv); with NULL, for a
 *  gateway embedded in a test, no signal is touched. 0 or a negative code (logged). */
int kvg_gateway_new(kvg_config *cfg, int argc, char **argv, kvg_gateway **out);
/** Run until stopped: health checks, scrapes and front threads start, the port file is
 *  written, and the control loop runs on the calling thread until a signal or
 *  kvg_gateway_stop ends the graceful shutdown; returns once every thread has ended. 0, or a
 *  negative code when it could not start. Once per gateway. */
int kvg_gateway_run(kvg_gateway *gw);
/** Ask a running gateway to drain and stop, as SIGTERM does. Any thread. */
void kvg_gateway_stop(kvg_gateway *gw);
/** The port the i-th front (admin false) or admin listener is bound to; 0 when there is none. */
uint16_t kvg_gateway_port(const kvg_gateway *gw, bool admin, size_t i);
/** Free a gateway after kvg_gateway_run returned, or one never run. NULL is a no-op. */
void kvg_gateway_free(kvg_gateway *gw);

#endif
