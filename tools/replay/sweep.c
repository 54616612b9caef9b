/* SPDX-License-Identifier: Apache-2.0 */
/* Sweeps: every policy and reference at each worker count x capacity fraction, and their
 * reports (one line per point and row). */
#include "replay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

int replay_sweep_run(const replay_trace *t, const replay_engine_config *base,
                     const double *fractions, size_t nfractions, const unsigned *workers,
                     size_t nworkers, const replay_policy *policies, size_t npolicies,
                     replay_progress_fn *progress, void *ud, replay_sweep *out)
{
    if (!nfractions || !nworkers)
        return -EINVAL;
    uint64_t t0 = kvg_now_ns();
    replay_sweep s = {
        .t = t,
        .nrows = npolicies + REPLAY_REFERENCE_ROWS,
        .npoints = nfractions * nworkers,
    };
    s.points = calloc(s.npoints, sizeof(*s.points));
    if (!s.points)
        return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < s.npoints; i++) {
        replay_sweep_point *p = &s.points[i];
        p->workers = workers[i / nfractions];
        p->fraction = fractions[i % nfractions];
        p->rows = calloc(s.nrows, sizeof(*p->rows));
        if (!p->rows) {
            rc = -ENOMEM;
            break;
        }
        replay_engine_config ec = *base;
        ec.workers = p->workers;
        ec.capacity = 0;
        rc = replay_run(t, &ec, p->fraction, policies, npolicies, p->rows, &s.distinct_blocks);
        p->capacity = ec.capacity;
        if (rc == 0 && progress)
            progress(ud, i + 1, s.npoints, p);
    }
    s.seconds = (double)(kvg_now_ns() - t0) / 1e9;
    if (rc < 0) {
        replay_sweep_done(&s);
        return rc;
    }
    *out = s;
    return 0;
}

void replay_sweep_done(replay_sweep *s)
{
    for (size_t i = 0; s->points && i < s->npoints; i++) {
        for (size_t j = 0; s->points[i].rows && j < s->nrows; j++)
            replay_row_done(&s->points[i].rows[j]);
        free(s->points[i].rows);
    }
    free(s->points);
    memset(s, 0, sizeof(*s));
}

void replay_sweep_text(const replay_sweep *s, FILE *f)
{
    const replay_trace *t = s->t;
    fprintf(f,
            "trace %s: %zu requests, %llu blocks (%llu distinct), %llu prompt tokens; %zu points "
            "in %.1f s\n",
            s->trace, t->n, (unsigned long long)t->blocks, (unsigned long long)s->distinct_blocks,
            (unsigned long long)t->tokens, s->npoints, s->seconds);
    fprintf(f, "%7s %9s %10s %-13s %9s %9s %10s %10s %9s %8s\n", "workers", "fraction", "capacity",
            "row", "block_hit", "token_hit", "ttft_p99ms", "queue_ms", "imbalance", "busy_imb");
    for (size_t i = 0; i < s->npoints; i++) {
        const replay_sweep_point *p = &s->points[i];
        for (size_t j = 0; j < s->nrows; j++) {
            const replay_row *r = &p->rows[j];
            fprintf(f, "%7u %9g %10u %-13s %9.4f %9.4f ", p->workers, p->fraction, p->capacity,
                    r->name, replay_ratio(r->hit_blocks, r->blocks),
                    replay_ratio(r->hit_tokens, r->tokens));
            if (r->policy)
                fprintf(f, "%10.1f %10.1f %9.3f %8.3f\n", r->ttft_p99_ms, r->queue_mean_ms,
                        r->imbalance, r->busy_imbalance);
            else
                fprintf(f, "%10s %10s %9s %8s\n", "-", "-", "-", "-");
        }
    }
}

void replay_sweep_json(const replay_sweep *s, FILE *f)
{
    const replay_trace *t = s->t;
    fprintf(f,
            "{\"requests\":%zu,\"skipped\":%zu,\"blocks\":%llu,\"distinct_blocks\":%llu,"
            "\"tokens\":%llu,\"seconds\":%.6f,\"rows\":[",
            t->n, t->skipped, (unsigned long long)t->blocks, (unsigned long long)s->distinct_blocks,
            (unsigned long long)t->tokens, s->seconds);
    for (size_t i = 0; i < s->npoints; i++) {
        const replay_sweep_point *p = &s->points[i];
        for (size_t j = 0; j < s->nrows; j++) {
            const replay_row *r = &p->rows[j];
            fprintf(f,
                    "%s{\"workers\":%u,\"fraction\":%.17g,\"capacity\":%u,\"name\":\"%s\","
                    "\"kind\":\"%s\",\"hit_blocks\":%llu,\"hit_tokens\":%llu,"
                    "\"block_hit_rate\":%.17g,\"token_hit_rate\":%.17g",
                    i || j ? "," : "", p->workers, p->fraction, p->capacity, r->name,
                    r->policy ? "policy" : "reference", (unsigned long long)r->hit_blocks,
                    (unsigned long long)r->hit_tokens, replay_ratio(r->hit_blocks, r->blocks),
                    replay_ratio(r->hit_tokens, r->tokens));
            if (r->policy)
                fprintf(f,
                        ",\"ttft_p99_ms\":%.17g,\"queue_mean_ms\":%.17g,\"imbalance\":%.17g,"
                        "\"busy_imbalance\":%.17g}",
                        r->ttft_p99_ms, r->queue_mean_ms, r->imbalance, r->busy_imbalance);
            else
                fputs(",\"ttft_p99_ms\":null,\"queue_mean_ms\":null,\"imbalance\":null,"
                      "\"busy_imbalance\":null}",
                      f);
        }
    }
    fputs("]}\n", f);
}

void replay_sweep_csv(const replay_sweep *s, FILE *f)
{
    fputs("workers,fraction,capacity,name,kind,hit_blocks,hit_tokens,block_hit_rate,"
          "token_hit_rate,ttft_p99_ms,queue_mean_ms,imbalance,busy_imbalance\n",
          f);
    for (size_t i = 0; i < s->npoints; i++) {
        const replay_sweep_point *p = &s->points[i];
        for (size_t j = 0; j < s->nrows; j++) {
            const replay_row *r = &p->rows[j];
            fprintf(f, "%u,%.17g,%u,%s,%s,%llu,%llu,%.17g,%.17g,", p->workers, p->fraction,
                    p->capacity, r->name, r->policy ? "policy" : "reference",
                    (unsigned long long)r->hit_blocks, (unsigned long long)r->hit_tokens,
                    replay_ratio(r->hit_blocks, r->blocks), replay_ratio(r->hit_tokens, r->tokens));
            if (r->policy)
                fprintf(f, "%.17g,%.17g,%.17g,%.17g\n", r->ttft_p99_ms, r->queue_mean_ms,
                        r->imbalance, r->busy_imbalance);
            else
                fputs(",,,\n", f);
        }
    }
}
