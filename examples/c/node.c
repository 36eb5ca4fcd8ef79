/* A rendezvous node in plain C: joins one round, publishes "c" under its rank in the round's
 * store, reads every rank's value, prints one JSON line and leaves.
 *
 *   cc -Iinclude examples/c/node.c -Ltarget/debug -lrdzv -o node && ./node URL
 */
#include <stdio.h>
#include <stdlib.h>
#include "rdzv.h"

static int fail(const char *what, rdzv_status_t status, rdzv_error_t *error) {
    printf("{\"lang\":\"c\",\"error\":\"%s\",\"during\":\"%s\",\"message\":\"%s\"}\n",
           rdzv_status_name(status), what, rdzv_error_message(error));
    rdzv_error_free(error);
    return 2;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s etcd://HOST:PORT/RUN_ID?min_nodes=N&max_nodes=M\n", argv[0]);
        return 64;
    }
    rdzv_error_t *error = NULL;
    rdzv_params_t *params = NULL;
    rdzv_status_t st = rdzv_params_from_url(argv[1], &params, &error);
    if (st != RDZV_OK) return fail("params", st, error);

    rdzv_t *node = NULL;
    st = rdzv_new(params, &node, &error);
    rdzv_params_free(params); /* the handle keeps its own copy */
    if (st != RDZV_OK) return fail("new", st, error);

    rdzv_round_t round;
    rdzv_store_t *store = NULL;
    st = rdzv_next(node, &round, &store, &error);
    if (st != RDZV_OK) { rdzv_free(node); return fail("next", st, error); }

    char key[32];
    snprintf(key, sizeof key, "node/%u", round.rank);
    st = rdzv_store_set(store, key, (const uint8_t *)"c", 1, &error);
    if (st != RDZV_OK) return fail("set", st, error);

    printf("{\"lang\":\"c\",\"rank\":%u,\"world_size\":%u,\"round\":%llu,\"peers\":[",
           round.rank, round.world_size, (unsigned long long)round.round);
    for (uint32_t r = 0; r < round.world_size; r++) {
        snprintf(key, sizeof key, "node/%u", r);
        uint8_t *value = NULL;
        size_t len = 0;
        st = rdzv_store_get(store, key, 60000, &value, &len, &error);
        if (st != RDZV_OK) return fail("get", st, error);
        printf("%s\"%.*s\"", r ? "," : "", (int)len, (const char *)value);
        rdzv_bytes_free(value, len);
    }
    printf("]}\n");
    rdzv_store_free(store);
    st = rdzv_shutdown(node, &error);
    rdzv_free(node);
    return st == RDZV_OK ? 0 : fail("shutdown", st, error);
}
