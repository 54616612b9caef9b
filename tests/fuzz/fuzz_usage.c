/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: kvg_usage_scan_feed on any bytes (a worker's response). It never fails, and the
 * values and output events it reads do not depend on where the bytes are split: one feed, two
 * feeds at a cut chosen by the input, and byte by byte give the same scan, for the chat keys and
 * the Responses API's (the input's last byte chooses). Each is also what the byte-at-a-time
 * reader it replaced reads (tests/unit/router/usage_reference.c, the oracle), fed the same way,
 * with a blank line after it so that the event in progress counts too. */
#include <stdlib.h>
#include <string.h>

#include "router.h"
#include "usage_reference.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void same(const kvg_usage_scan *a, const kvg_usage_scan *b)
{
    for (int f = 0; f < KVG_USAGE_FIELD_COUNT; f++)
        if (a->value[f] != b->value[f] || a->value[f] < -1)
            abort();
    if (a->output_events != b->output_events)
        abort();
}

static void init(kvg_usage_scan *s, bool responses)
{
    if (responses)
        kvg_usage_scan_init_responses(s);
    else
        kvg_usage_scan_init(s);
}

static void ref_init(kvg_usage_scan *s, bool responses)
{
    if (responses)
        kvg_usage_ref_init_responses(s);
    else
        kvg_usage_ref_init(s);
}

/* s read so far against the oracle fed data[0, cut) and data[cut, size), then both a blank line. */
static void same_as_oracle(kvg_usage_scan *s, const char *text, size_t size, size_t cut,
                           bool responses)
{
    kvg_usage_scan ref;
    ref_init(&ref, responses);
    kvg_usage_ref_feed(&ref, text, cut);
    kvg_usage_ref_feed(&ref, text + cut, size - cut);
    same(s, &ref);
    if (s->event_output != ref.event_output || s->state != ref.state || s->alive != ref.alive)
        abort();
    kvg_usage_scan_feed(s, "\n\n", 2);
    kvg_usage_ref_feed(&ref, "\n\n", 2);
    same(s, &ref);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    bool responses = size && (data[size - 1] & 1);
    kvg_usage_scan whole, two, bytes;
    init(&whole, responses);
    kvg_usage_scan_feed(&whole, text, size);

    size_t cut = size ? data[0] % (size + 1) : 0;
    init(&two, responses);
    kvg_usage_scan_feed(&two, text, cut);
    uint64_t mid = two.output_events;
    kvg_usage_scan_feed(&two, text + cut, size - cut);
    if (mid > two.output_events)
        abort();
    same(&whole, &two);

    init(&bytes, responses);
    for (size_t i = 0; i < size; i++)
        kvg_usage_scan_feed(&bytes, text + i, 1);
    same(&whole, &bytes);
    /* An event needs at least a value's opening and first byte and a blank line. */
    if (whole.output_events > size / 4)
        abort();

    same_as_oracle(&whole, text, size, size, responses);
    same_as_oracle(&two, text, size, cut, responses);
    same_as_oracle(&bytes, text, size, size, responses);
    return 0;
}
