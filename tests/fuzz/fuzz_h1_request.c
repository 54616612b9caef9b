/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: arbitrary bytes from a client on the front port (HTTP/1.1 request path, and the
 * protocol sniffing in front of it), through the proxy to a fake worker. */
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    harness_init();
    harness_run_client(data, size);
    return 0;
}
