/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: HTTP/2 frames after a valid connection preface (the h2 input path). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    harness_init();
    uint8_t *buf = malloc(size + 24);
    if (!buf)
        return 0;
    memcpy(buf, preface, 24);
    memcpy(buf + 24, data, size);
    harness_run_client(buf, size + 24);
    free(buf);
    return 0;
}
