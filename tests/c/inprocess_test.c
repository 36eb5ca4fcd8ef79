/*
 * The C worker side of in-process restart (rdzv_inprocess_*), driven by tests/all/c_api.rs as
 * `rdzv run --in-process-restart` drives a worker: two rounds, with a leave between them.
 * Prints one ROUND line per round (what rdzv_inprocess_next filled and the RANK it set in the
 * environment) and LEAVING once rdzv_inprocess_check says to leave; exits 0 after the second
 * round, 1 on any failure.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "rdzv.h"

int main(void) {
    if (!rdzv_inprocess_enabled()) {
        puts("NOT ENABLED");
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        rdzv_inprocess_round_t r;
        rdzv_error_t *err = NULL;
        if (rdzv_inprocess_next(10000, &r, &err) != RDZV_OK) {
            printf("NEXT FAILED %s\n", rdzv_error_message(err));
            rdzv_error_free(err);
            return 1;
        }
        const char *env_rank = getenv("RANK");
        printf("ROUND rank=%u world=%u local=%u lws=%u group=%u groups=%u restart=%u master=%s:%u env_rank=%s\n",
               r.rank, r.world_size, r.local_rank, r.local_world_size, r.group_rank,
               r.group_world_size, r.restart_count, r.master_addr, (unsigned)r.master_port,
               env_rank ? env_rank : "unset");
        fflush(stdout);
        if (i == 1) {
            break;
        }
        while (!rdzv_inprocess_check()) {
            struct timespec pause = {0, 5 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        puts("LEAVING");
        fflush(stdout);
    }
    return 0;
}
