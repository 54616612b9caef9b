/* SPDX-License-Identifier: Apache-2.0 */
/* The report: one row per policy and per reference, as a table or as JSON. */
#include "replay.h"

#include <string.h>

void replay_report_text(const replay_report *rep, FILE *f)
{
    const replay_trace *t = rep->t;
    fprintf(f,
            "trace %s: %zu requests, %llu blocks (%llu distinct), %llu prompt tokens; %u workers "
            "x %u blocks\n",
            rep->trace, t->n, (unsigned long long)t->blocks,
            (unsigned long long)rep->distinct_blocks, (unsigned long long)t->tokens,
            rep->ec->workers, rep->ec->capacity);
    fprintf(f, "%-13s %9s %9s %9s %10s %10s %10s %9s %8s %8s  %s\n", "policy", "block_hit",
            "token_hit", "predicted", "ttft_p50ms", "ttft_p99ms", "queue_ms", "imbalance",
            "busy_imb", "replay_s", "requests/worker");
    for (size_t i = 0; i < rep->nrows; i++) {
        const replay_row *r = &rep->rows[i];
        fprintf(f, "%-13s %9.4f %9.4f ", r->name, replay_ratio(r->hit_blocks, r->blocks),
                replay_ratio(r->hit_tokens, r->tokens));
        if (!r->policy) {
            fprintf(f, "%9s %10s %10s %10s %9s %8s %8.3f  %s\n", "-", "-", "-", "-", "-", "-",
                    r->seconds,
                    !r->capacity                  ? "(infinite cache)"
                    : strcmp(r->name, "min") == 0 ? "(Belady's MIN on workers x capacity)"
                                                  : "(one LRU of workers x capacity)");
            continue;
        }
        if (r->live)
            fprintf(f, "%9s ", "-"); /* the gateway's prediction is on its /metrics */
        else
            fprintf(f, "%9.4f ", replay_ratio(r->predicted_blocks, r->blocks));
        fprintf(f, "%10.1f %10.1f ", r->ttft_p50_ms, r->ttft_p99_ms);
        if (r->has_queue)
            fprintf(f, "%10.1f %9.3f %8.3f ", r->queue_mean_ms, r->imbalance, r->busy_imbalance);
        else /* live: the engines' queues and busy times are not observed */
            fprintf(f, "%10s %9.3f %8s ", "-", r->imbalance, "-");
        fprintf(f, "%8.3f  ", r->seconds);
        for (unsigned w = 0; w < r->nworkers; w++)
            fprintf(f, "%s%llu", w ? " " : "", (unsigned long long)r->per_worker[w]);
        fputc('\n', f);
    }
    const struct replay_live_errors *e = rep->live;
    if (e)
        fprintf(f,
                "live errors: status %llu, timeout %llu, connection %llu, protocol %llu, tokens "
                "%llu, unsent %llu%s%s\n",
                (unsigned long long)e->status, (unsigned long long)e->timeout,
                (unsigned long long)e->connection, (unsigned long long)e->protocol,
                (unsigned long long)e->tokens, (unsigned long long)e->unsent,
                e->first[0] ? "; first: " : "", e->first);
}

void replay_report_json(const replay_report *rep, FILE *f)
{
    const replay_trace *t = rep->t;
    const replay_engine_config *ec = rep->ec;
    fprintf(f,
            "{\"requests\":%zu,\"skipped\":%zu,\"blocks\":%llu,\"distinct_blocks\":%llu,"
            "\"tokens\":%llu,\"workers\":%u,\"capacity\":%u,\"max_running\":%u,"
            "\"prefill_us\":%.17g,\"decode_us\":%.17g,\"rows\":[",
            t->n, t->skipped, (unsigned long long)t->blocks,
            (unsigned long long)rep->distinct_blocks, (unsigned long long)t->tokens, ec->workers,
            ec->capacity, ec->max_running, ec->prefill_us, ec->decode_us);
    for (size_t i = 0; i < rep->nrows; i++) {
        const replay_row *r = &rep->rows[i];
        fprintf(f,
                "%s{\"name\":\"%s\",\"kind\":\"%s\",\"capacity\":%llu,\"requests\":%llu,"
                "\"blocks\":%llu,\"hit_blocks\":%llu,\"tokens\":%llu,\"hit_tokens\":%llu,"
                "\"block_hit_rate\":%.17g,\"token_hit_rate\":%.17g,\"seconds\":%.6f",
                i ? "," : "", r->name,
                r->live     ? "live"
                : r->policy ? "policy"
                            : "reference",
                (unsigned long long)r->capacity, (unsigned long long)r->requests,
                (unsigned long long)r->blocks, (unsigned long long)r->hit_blocks,
                (unsigned long long)r->tokens, (unsigned long long)r->hit_tokens,
                replay_ratio(r->hit_blocks, r->blocks), replay_ratio(r->hit_tokens, r->tokens),
                r->seconds);
        if (r->policy) {
            if (r->live) /* nothing predicted here: the gateway's /metrics has it */
                fputs(",\"predicted_blocks\":null,\"predicted_hit_rate\":null", f);
            else
                fprintf(f, ",\"predicted_blocks\":%llu,\"predicted_hit_rate\":%.17g",
                        (unsigned long long)r->predicted_blocks,
                        replay_ratio(r->predicted_blocks, r->blocks));
            fprintf(f,
                    ",\"ttft_p50_ms\":%.17g,\"ttft_p99_ms\":%.17g,\"ttft_mean_ms\":%.17g,"
                    "\"imbalance\":%.17g,\"requests_per_worker\":[",
                    r->ttft_p50_ms, r->ttft_p99_ms, r->ttft_mean_ms, r->imbalance);
            for (unsigned w = 0; w < r->nworkers; w++)
                fprintf(f, "%s%llu", w ? "," : "", (unsigned long long)r->per_worker[w]);
            fputc(']', f);
            if (r->has_queue && r->busy_us) {
                fprintf(f,
                        ",\"queue_mean_ms\":%.17g,\"queue_p99_ms\":%.17g,\"busy_imbalance\":%.17g,"
                        "\"busy_seconds_per_worker\":[",
                        r->queue_mean_ms, r->queue_p99_ms, r->busy_imbalance);
                for (unsigned w = 0; w < r->nworkers; w++)
                    fprintf(f, "%s%.6f", w ? "," : "", (double)r->busy_us[w] / 1e6);
                fputc(']', f);
            } else {
                fputs(",\"queue_mean_ms\":null,\"queue_p99_ms\":null,\"busy_imbalance\":null,"
                      "\"busy_seconds_per_worker\":null",
                      f);
            }
        }
        fputc('}', f);
    }
    fputc(']', f);
    const struct replay_live_errors *e = rep->live;
    if (e) {
        fprintf(f,
                ",\"live_errors\":{\"status\":%llu,\"timeout\":%llu,\"connection\":%llu,"
                "\"protocol\":%llu,\"tokens\":%llu,\"unsent\":%llu,\"first\":",
                (unsigned long long)e->status, (unsigned long long)e->timeout,
                (unsigned long long)e->connection, (unsigned long long)e->protocol,
                (unsigned long long)e->tokens, (unsigned long long)e->unsent);
        kvg_buf b;
        kvg_buf_init(&b);
        kvg_buf_json_string(&b, e->first, strlen(e->first));
        fputs(b.failed || !b.data ? "\"\"" : b.data, f);
        kvg_buf_done(&b);
        fputc('}', f);
    }
    fputs("}\n", f);
}

void replay_report_csv(const replay_report *rep, FILE *f)
{
    fputs("name,kind,workers,capacity,requests,blocks,hit_blocks,tokens,hit_tokens,"
          "block_hit_rate,token_hit_rate,predicted_blocks,predicted_hit_rate,ttft_p50_ms,"
          "ttft_p99_ms,ttft_mean_ms,imbalance,queue_mean_ms,queue_p99_ms,busy_imbalance,seconds\n",
          f);
    for (size_t i = 0; i < rep->nrows; i++) {
        const replay_row *r = &rep->rows[i];
        fprintf(f, "%s,%s,%u,%llu,%llu,%llu,%llu,%llu,%llu,%.17g,%.17g,", r->name,
                r->policy ? "policy" : "reference", rep->ec->workers,
                (unsigned long long)r->capacity, (unsigned long long)r->requests,
                (unsigned long long)r->blocks, (unsigned long long)r->hit_blocks,
                (unsigned long long)r->tokens, (unsigned long long)r->hit_tokens,
                replay_ratio(r->hit_blocks, r->blocks), replay_ratio(r->hit_tokens, r->tokens));
        if (r->policy)
            fprintf(f, "%llu,%.17g,%.17g,%.17g,%.17g,%.17g,",
                    (unsigned long long)r->predicted_blocks,
                    replay_ratio(r->predicted_blocks, r->blocks), r->ttft_p50_ms, r->ttft_p99_ms,
                    r->ttft_mean_ms, r->imbalance);
        else
            fputs(",,,,,,", f);
        if (r->has_queue)
            fprintf(f, "%.17g,%.17g,%.17g,", r->queue_mean_ms, r->queue_p99_ms, r->busy_imbalance);
        else
            fputs(",,,", f);
        fprintf(f, "%.6f\n", r->seconds);
    }
}
