/* SPDX-License-Identifier: Apache-2.0 */
/* An in-process gateway for fuzz targets: one gateway thread driven by hand, clients on
 * socketpairs, and a fake worker on loopback whose answer the target chooses. */
#ifndef KVG_FUZZ_HARNESS_H
#define KVG_FUZZ_HARNESS_H

#include <stddef.h>
#include <stdint.h>

/* The API key of the harness's tenant; corpus requests carry it as a bearer token. */
#define HARNESS_KEY "kvg-fuzzfuzzfuzzfuzzfuzzfuzzfuzzfuzzfuzzfuzzfuz"

/** Set up the gateway once (idempotent). */
void harness_init(void);
/** Set what the fake worker answers to every request (copied). */
void harness_set_worker_response(const uint8_t *data, size_t len);
/** Feed bytes to a new front connection as a client would, run the gateway until the
 *  connection is done (or a bound on loop turns), and drop the client. */
void harness_run_client(const uint8_t *data, size_t len);

#endif
