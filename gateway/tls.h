/* SPDX-License-Identifier: Apache-2.0 */
/* TLS contexts of listeners (tls.c). */
#ifndef KVG_GATEWAY_TLS_H
#define KVG_GATEWAY_TLS_H

#include <openssl/ssl.h>
#include <stdbool.h>
#include <stddef.h>

#include "config.h"

/** Build the TLS context of a listener (ALPN h2, http/1.1). 0 or KVG_ETLS with err. */
int kvg_tls_ctx_new(const kvg_listener_config *cfg, SSL_CTX **out, char *err, size_t err_len);
/** Selected ALPN protocol of a finished handshake is "h2". */
bool kvg_tls_is_h2(SSL *ssl);

#endif
