/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: arbitrary bytes from a worker as the answer to a valid request (the upstream
 * HTTP/1.1 response path and the relay of what it yields to an HTTP/1.1 client). */
#include <string.h>

#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char request[] =
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        "authorization: Bearer " HARNESS_KEY "\r\n"
        "content-type: application/json\r\ncontent-length: 55\r\n\r\n"
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\"}]}";
    harness_init();
    harness_set_worker_response(data, size);
    harness_run_client((const uint8_t *)request, strlen(request));
    return 0;
}
