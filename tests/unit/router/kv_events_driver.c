/* SPDX-License-Identifier: Apache-2.0 */
/* Test driver for the KV-event decoder: reads payloads from stdin, each as a 4-byte big-endian
 * length and its bytes, and prints one JSON line per payload with what kvg_kv_decode made of it
 * (or its error), for tests/integration/test_kv_events_decoder.py to compare with Python's
 * msgpack. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router.h"

#define PAYLOAD_MAX (256u << 20)

static const char *rc_name(int rc)
{
    switch (rc) {
    case 0:
        return "ok";
    case KVG_EPARSE:
        return "EPARSE";
    case KVG_ELIMIT:
        return "ELIMIT";
    case -ENOMEM:
        return "ENOMEM";
    default:
        return "other";
    }
}

static void put_json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void print_batch(const kvg_kv_batch *b)
{
    uint64_t bits;
    memcpy(&bits, &b->ts, sizeof(bits));
    printf("{\"rc\":\"ok\",\"ts_bits\":%" PRIu64 ",\"dp_rank\":", bits);
    if (b->has_dp_rank)
        printf("%" PRId64, b->dp_rank);
    else
        printf("null");
    printf(",\"nhashes\":%zu,\"events\":[", b->nhashes);
    for (size_t i = 0; i < b->nevents; i++) {
        const kvg_kv_event *e = &b->events[i];
        printf("%s{\"kind\":\"%s\",\"medium\":\"%s\",\"hashes\":[", i ? "," : "",
               kvg_kv_event_kind_str(e->kind), kvg_kv_medium_str(e->medium));
        for (uint32_t h = 0; h < e->nhashes; h++)
            printf("%s%" PRIu64, h ? "," : "", e->hashes[h]);
        printf("]");
        if (e->kind == KVG_KV_BLOCK_STORED) {
            printf(",\"parent\":");
            if (e->has_parent)
                printf("%" PRIu64, e->parent);
            else
                printf("null");
            printf(",\"ntokens\":%" PRIu64 ",\"block_size\":%" PRIu32 ",\"lora_id\":", e->ntokens,
                   e->block_size);
            if (e->has_lora_id)
                printf("%" PRId64, e->lora_id);
            else
                printf("null");
        }
        printf("}");
    }
    printf("]}\n");
}

int main(void)
{
    kvg_kv_decoder *d = NULL;
    if (kvg_kv_decoder_new(NULL, &d) != 0)
        return 1;
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (;;) {
        uint8_t hdr[4];
        if (fread(hdr, 1, 4, stdin) != 4)
            break;
        size_t len = (size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 | (size_t)hdr[2] << 8 | hdr[3];
        if (len > PAYLOAD_MAX)
            return 2;
        if (len > cap) {
            /* Exactly len bytes, so ASan sees a read past the payload. */
            free(buf);
            buf = malloc(len);
            cap = len;
            if (!buf)
                return 3;
        }
        uint8_t *p = buf;
        if (len < cap) {
            /* A fresh buffer of the exact size for every shorter payload too. */
            p = malloc(len ? len : 1);
            if (!p)
                return 3;
        }
        if (fread(p, 1, len, stdin) != len)
            return 4;
        kvg_kv_batch b;
        int rc = kvg_kv_decode(d, p, len, &b);
        if (rc == 0) {
            print_batch(&b);
        } else {
            printf("{\"rc\":\"%s\",\"error\":", rc_name(rc));
            put_json_str(kvg_kv_decoder_error(d));
            printf("}\n");
        }
        if (p != buf)
            free(p);
        fflush(stdout);
    }
    free(buf);
    kvg_kv_decoder_free(d);
    return 0;
}
