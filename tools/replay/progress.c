/* SPDX-License-Identifier: Apache-2.0 */
/* The progress line of long replays: on a terminal only, rewritten in place on stderr. */
#include "replay.h"

#include <unistd.h>

#include "common.h"

void replay_progress_init(replay_progress *p)
{
    p->tty = isatty(STDERR_FILENO) == 1;
    p->start_ns = kvg_now_ns();
}

void replay_progress_update(void *ud, size_t done, size_t total, const replay_sweep_point *last)
{
    replay_progress *p = ud;
    if (!p->tty)
        return;
    double el = (double)(kvg_now_ns() - p->start_ns) / 1e9;
    double left = done ? el * (double)(total - done) / (double)done : 0;
    /* \033[K clears what a longer line before left on the right. */
    fprintf(stderr,
            "\rkvgate-replay: %zu/%zu points (last: %u workers, fraction %g), %.1f s, ~%.0f s "
            "left\033[K",
            done, total, last->workers, last->fraction, el, left);
    fflush(stderr);
}

void replay_progress_end(replay_progress *p)
{
    if (p->tty) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
}
