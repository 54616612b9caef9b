/* SPDX-License-Identifier: Apache-2.0 */
/* The handlers a listener gives its exchanges: the OpenAI API proxy (proxy.c) and the admin
 * API (admin_front.c). */
#ifndef KVG_GATEWAY_HANDLERS_H
#define KVG_GATEWAY_HANDLERS_H

#include "exchange.h"

extern const kvg_handler kvg_proxy_handler;
extern const kvg_handler kvg_admin_handler;

#endif
