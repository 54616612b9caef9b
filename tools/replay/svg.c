/* SPDX-License-Identifier: Apache-2.0 */
/* The sweep's chart as hand-written SVG: block hit rate against the pooled capacity fraction
 * (log axis), one panel per worker count, one polyline per row, and a legend. */
#include "replay.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* Geometry, in SVG user units. */
#define PANEL_W 520.0
#define PANEL_H 360.0
#define MARGIN_L 64.0 /* room for the y ticks and label, inside a panel */
#define MARGIN_R 16.0
#define MARGIN_T 36.0 /* the panel's title */
#define MARGIN_B 52.0 /* the x ticks and label */
#define TITLE_H 64.0
#define LEGEND_W 170.0
#define COLUMNS 2

static const char *const palette[] = {
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#7f7f7f",
};

/* The stroke of a row: references in black and grey, dashed; policies in colours. */
static void row_style(const replay_row *r, size_t i, const char **color, const char **dash,
                      double *width)
{
    *width = 2;
    *dash = NULL;
    if (r->policy) {
        *color = palette[i % KVG_ARRAY_LEN(palette)];
    } else if (strcmp(r->name, "ceiling") == 0) {
        *color = "#000000";
        *dash = "8 4";
        *width = 1.5;
    } else if (strcmp(r->name, "min") == 0) {
        *color = "#555555";
        *dash = "3 3";
        *width = 1.5;
    } else {
        *color = "#000000";
        *dash = "1 3";
        *width = 2.5;
    }
}

/* Text with &, <, >, " escaped. */
static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            /* XML 1.0 has no other control characters than tab and line feeds */
            fputc((unsigned char)*s < 0x20 ? '?' : *s, f);
        }
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One panel: the points of one worker count, at (x0, y0). */
static void panel(const replay_sweep *s, unsigned workers, const double *fracs, size_t nfracs,
                  double ymax, double x0, double y0, FILE *f)
{
    double pw = PANEL_W - MARGIN_L - MARGIN_R, ph = PANEL_H - MARGIN_T - MARGIN_B;
    double left = x0 + MARGIN_L, top = y0 + MARGIN_T, bottom = top + ph;
    double lmin = log10(fracs[0]), lmax = log10(fracs[nfracs - 1]);
    if (lmax - lmin < 1e-9) {
        lmin -= 0.5;
        lmax += 0.5;
    }
#define XPOS(fr) (left + (log10(fr) - lmin) / (lmax - lmin) * pw)
#define YPOS(v) (bottom - (v) / ymax * ph)
    fprintf(f, "<g class=\"panel\" data-workers=\"%u\">\n", workers);
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"14\" "
            "font-weight=\"bold\">%u workers</text>\n",
            left + pw / 2, y0 + 22, workers);
    /* y ticks: every 0.1 up to 0.5, else every 0.2 */
    double step = ymax <= 0.5 + 1e-9 ? 0.1 : 0.2;
    for (int k = 0; k * step <= ymax + 1e-9; k++) {
        double v = k * step, y = YPOS(v);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%.1f</text>\n",
                left, y, left + pw, y, left - 6, y + 4, v);
    }
    /* x ticks: at each fraction of the sweep, as a percentage of the distinct blocks */
    for (size_t i = 0; i < nfracs; i++) {
        double x = XPOS(fracs[i]);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\">%g%%</text>\n",
                x, top, x, bottom, x, bottom + 16, fracs[i] * 100);
    }
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\">pooled capacity "
            "(workers x capacity) / distinct blocks, log scale</text>\n",
            left + pw / 2, bottom + 36);
    fprintf(f,
            "<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\" "
            "font-size=\"12\">block hit rate</text>\n",
            x0 + 18, top + ph / 2);
    /* the frame over the grid, the rows over both */
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#000000\"/>\n",
            left, top, pw, ph);
    /* one polyline per row, its points in fraction order */
    for (size_t j = 0; j < s->nrows; j++) {
        const char *color, *dash;
        double width;
        const replay_row *first = NULL;
        for (size_t i = 0; i < s->npoints && !first; i++)
            if (s->points[i].workers == workers)
                first = &s->points[i].rows[j];
        if (!first)
            continue;
        row_style(first, j, &color, &dash, &width);
        fputs("<polyline class=\"row\" data-row=\"", f);
        put_escaped(f, first->name);
        fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\"", color, width);
        if (dash)
            fprintf(f, " stroke-dasharray=\"%s\"", dash);
        fputs(" points=\"", f);
        for (size_t k = 0; k < nfracs; k++)
            for (size_t i = 0; i < s->npoints; i++) {
                const replay_sweep_point *p = &s->points[i];
                if (p->workers != workers || p->fraction != fracs[k])
                    continue;
                const replay_row *r = &p->rows[j];
                fprintf(f, "%s%.1f,%.1f", k ? " " : "", XPOS(p->fraction),
                        YPOS(replay_ratio(r->hit_blocks, r->blocks)));
                break;
            }
        fputs("\"/>\n", f);
    }
    fputs("</g>\n", f);
#undef XPOS
#undef YPOS
}

int replay_svg_write(const replay_sweep *s, FILE *f)
{
    if (!s->npoints)
        return -EINVAL;
    /* The distinct fractions and worker counts, in order; the y range from the highest rate. */
    double *fracs = malloc(s->npoints * sizeof(*fracs));
    unsigned *workers = malloc(s->npoints * sizeof(*workers));
    if (!fracs || !workers) {
        free(fracs);
        free(workers);
        return -ENOMEM;
    }
    size_t nf = 0, nw = 0;
    double top = 0;
    for (size_t i = 0; i < s->npoints; i++) {
        const replay_sweep_point *p = &s->points[i];
        bool seen = false;
        for (size_t k = 0; k < nf; k++)
            seen |= fracs[k] == p->fraction;
        if (!seen)
            fracs[nf++] = p->fraction;
        seen = false;
        for (size_t k = 0; k < nw; k++)
            seen |= workers[k] == p->workers;
        if (!seen)
            workers[nw++] = p->workers;
        for (size_t j = 0; j < s->nrows; j++)
            top = KVG_MAX(top, replay_ratio(p->rows[j].hit_blocks, p->rows[j].blocks));
    }
    qsort(fracs, nf, sizeof(*fracs), cmp_double);
    double ymax = KVG_MAX(0.1, ceil(top * 10 - 1e-9) / 10);
    size_t cols = KVG_MIN(nw, (size_t)COLUMNS), rows = (nw + cols - 1) / cols;
    double width = cols * PANEL_W + LEGEND_W, height = TITLE_H + rows * PANEL_H;

    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n",
            width, height, width, height);
    fputs("<title>kvgate-replay: ", f);
    put_escaped(f, s->trace ? s->trace : "");
    fputs("</title>\n<text x=\"16\" y=\"26\" font-size=\"17\" font-weight=\"bold\">Prefix-cache "
          "hit rate against KV capacity: ",
          f);
    put_escaped(f, s->trace ? s->trace : "");
    fprintf(f,
            "</text>\n<text x=\"16\" y=\"48\" font-size=\"12\">%zu requests, %llu blocks (%llu "
            "distinct); kvgate-replay, every policy and the references at each point</text>\n",
            s->t->n, (unsigned long long)s->t->blocks, (unsigned long long)s->distinct_blocks);
    for (size_t w = 0; w < nw; w++)
        panel(s, workers[w], fracs, nf, ymax, (double)(w % cols) * PANEL_W,
              TITLE_H + (double)(w / cols) * PANEL_H, f);

    /* The legend, once for all panels: the rows are the same in each. */
    double lx = cols * PANEL_W + 8, ly = TITLE_H + MARGIN_T + 8;
    fputs("<g class=\"legend\">\n", f);
    for (size_t j = 0; j < s->nrows; j++) {
        const replay_row *r = &s->points[0].rows[j];
        const char *color, *dash;
        double w;
        row_style(r, j, &color, &dash, &w);
        double y = ly + (double)j * 20;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"%.1f\"",
                lx, y, lx + 28, y, color, w);
        if (dash)
            fprintf(f, " stroke-dasharray=\"%s\"", dash);
        fprintf(f, "/>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">", lx + 34, y + 4);
        put_escaped(f, r->name);
        fputs(r->policy                         ? ""
              : strcmp(r->name, "ceiling") == 0 ? " (infinite cache)"
              : strcmp(r->name, "min") == 0     ? " (Belady's MIN)"
                                                : " (one LRU)",
              f);
        fputs("</text>\n", f);
    }
    fputs("</g>\n</svg>\n", f);
    free(fracs);
    free(workers);
    return ferror(f) ? -EIO : 0;
}
