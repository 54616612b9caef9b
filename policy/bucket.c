/* SPDX-License-Identifier: Apache-2.0 */
/* Token-bucket arithmetic for rate limits: pure functions over a caller-owned bucket. */
#include "policy.h"

#include <math.h>

/* Refill for the time since the last use. The bucket is full at its first use; time that runs
 * backwards refills nothing, and last_ns never moves back, so the span is not counted twice
 * once the clock catches up. Tokens above burst (the burst was lowered) are cut to it. */
static void refill(kvg_bucket *b, double rate, double burst, uint64_t now_ns)
{
    if (!b->primed) {
        b->tokens = burst;
        b->last_ns = now_ns;
        b->primed = true;
        return;
    }
    if (now_ns > b->last_ns) {
        if (rate > 0)
            b->tokens += (double)(now_ns - b->last_ns) * 1e-9 * rate;
        b->last_ns = now_ns;
    }
    if (b->tokens > burst)
        b->tokens = burst;
}

/* rate == 0 (or below) means no refill at all: the bucket holds burst tokens once, a fixed
 * allowance, and *wait_s is infinity once they are spent. Callers for whom 0 means
 * "unlimited" (tenancy) do not call this for such a limit. */
bool kvg_policy_bucket_take(kvg_bucket *b, double rate, double burst, uint64_t now_ns, double cost,
                            double *wait_s)
{
    refill(b, rate, burst, now_ns);
    if (cost <= b->tokens) {
        b->tokens -= cost;
        if (wait_s)
            *wait_s = 0;
        return true;
    }
    if (wait_s) {
        if (cost > burst || !(rate > 0))
            *wait_s = INFINITY;
        else
            *wait_s = (cost - b->tokens) / rate;
    }
    return false;
}

void kvg_policy_bucket_give(kvg_bucket *b, double burst, double cost)
{
    /* An unused bucket is full at its first use anyway. */
    if (!b->primed || !(cost > 0))
        return;
    b->tokens += cost;
    if (b->tokens > burst)
        b->tokens = burst;
}
