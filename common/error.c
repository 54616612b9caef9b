/* SPDX-License-Identifier: Apache-2.0 */
/* Names for kvgate's error codes and for negative errno values. */
#include "common.h"

#include <string.h>

static const char *const kvg_errors[] = {
    [KVG_EPARSE - KVG_EFIRST] = "malformed input",
    [KVG_ELIMIT - KVG_EFIRST] = "limit exceeded",
    [KVG_ETYPE - KVG_EFIRST] = "wrong type",
    [KVG_ENOTFOUND - KVG_EFIRST] = "not found",
    [KVG_EPROTO - KVG_EFIRST] = "protocol error",
    [KVG_ETLS - KVG_EFIRST] = "TLS error",
    [KVG_ECONFIG - KVG_EFIRST] = "invalid configuration",
};

const char *kvg_strerror(int err)
{
    if (err == 0)
        return "success";
    if (err >= KVG_EFIRST && err < KVG_ELAST)
        return kvg_errors[err - KVG_EFIRST];
    if (err < 0 && err > -4096)
        return strerror(-err); /* glibc's table is static and thread-safe to read */
    return "unknown error";
}
