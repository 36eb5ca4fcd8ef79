/* The C log handler: three nodes on threads form a round with RDZV_LOG=info, and the records
 * reach the handler with their level, module, run, node and round, each node's in order; the
 * handler may call rdzv; after rdzv_set_log_handler(NULL, NULL) records go to stderr again and
 * the handler is never called. Prints the records it got.   Usage: log_test HOST:PORT RUN_ID */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rdzv.h"

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

#define NODES 3
#define MAX_LINES 512

struct sink {
    pthread_mutex_t lock;
    int active; /* cleared once the handler was removed: a later call is a failure */
    int late_calls;
    int n;
    rdzv_log_level_t levels[MAX_LINES];
    char targets[MAX_LINES][64];
    char lines[MAX_LINES][512];
};

static void keep(rdzv_log_level_t level, const char *target, const char *line, void *user_data) {
    struct sink *s = user_data;
    /* Calling rdzv from the handler is allowed. */
    (void)rdzv_status_name(RDZV_OK);
    pthread_mutex_lock(&s->lock);
    if (!s->active) s->late_calls++;
    if (s->n < MAX_LINES) {
        s->levels[s->n] = level;
        snprintf(s->targets[s->n], sizeof s->targets[0], "%s", target);
        snprintf(s->lines[s->n], sizeof s->lines[0], "%s", line);
        s->n++;
    }
    pthread_mutex_unlock(&s->lock);
}

static char url[512];
static char run_field[256];

static void *run_node(void *arg) {
    char *node_id = arg;
    rdzv_params_t *p = NULL;
    rdzv_t *h = NULL;
    rdzv_round_t round;
    CHECK(rdzv_params_from_url(url, &p, NULL) == RDZV_OK, "params");
    CHECK(rdzv_new(p, &h, NULL) == RDZV_OK, "rdzv_new");
    rdzv_params_free(p);
    if (!h) return NULL;
    snprintf(node_id, 32, "%s", rdzv_node_id(h));
    CHECK(rdzv_next(h, &round, NULL, NULL) == RDZV_OK, "next");
    CHECK(rdzv_shutdown(h, NULL) == RDZV_OK, "shutdown");
    rdzv_free(h);
    return NULL;
}

/* Has `line` the word `word` (space-delimited, or at the end)? */
static int has(const char *line, const char *word) {
    size_t n = strlen(word);
    for (const char *at = strstr(line, word); at; at = strstr(at + 1, word))
        if ((at == line || at[-1] == ' ') && (at[n] == ' ' || at[n] == '\0')) return 1;
    return 0;
}

static int starts(const char *line, const char *prefix) { return strncmp(line, prefix, strlen(prefix)) == 0; }

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s HOST:PORT RUN_ID\n", argv[0]); return 64; }
    setenv("RDZV_LOG", "info", 0); /* read at the first call into rdzv */
    snprintf(url, sizeof url, "etcd://%s/%s?min_nodes=%d&max_nodes=%d", argv[1], argv[2], NODES, NODES);
    snprintf(run_field, sizeof run_field, "run=%s", argv[2]);

    static struct sink sink;
    pthread_mutex_init(&sink.lock, NULL);
    sink.active = 1;
    rdzv_set_log_handler(keep, &sink);

    pthread_t threads[NODES];
    char ids[NODES][32];
    memset(ids, 0, sizeof ids);
    for (int i = 0; i < NODES; i++) pthread_create(&threads[i], NULL, run_node, ids[i]);
    for (int i = 0; i < NODES; i++) pthread_join(threads[i], NULL);

    pthread_mutex_lock(&sink.lock);
    int sealed = 0, leaders = 0, connected = 0;
    for (int i = 0; i < sink.n; i++) {
        const char *l = sink.lines[i];
        printf("%s %s\n", sink.targets[i], l);
        if (!has(l, run_field)) continue;
        CHECK(sink.levels[i] == RDZV_LOG_INFO, "level %d for \"%s\"", sink.levels[i], l);
        CHECK(starts(sink.targets[i], "rdzv::"), "target \"%s\"", sink.targets[i]);
        if (starts(l, "round sealed")) {
            sealed++;
            CHECK(has(l, "trigger=max_nodes") && has(l, "world_size=3") && has(l, "round=0"), "sealed: %s", l);
        }
        if (starts(l, "joined round") && has(l, "role=leader")) leaders++;
        if (starts(l, "connected to etcd")) {
            connected++;
            CHECK(strstr(l, " etcd_version=3.") != NULL, "connected: %s", l);
        }
    }
    CHECK(sealed == 1, "%d round sealed records", sealed);
    CHECK(leaders == 1, "%d leaders", leaders);
    CHECK(connected == NODES, "%d connected records", connected);
    /* Each node: connected, joined round 0, round complete, shut down, in this order. */
    for (int n = 0; n < NODES; n++) {
        char node_field[64];
        snprintf(node_field, sizeof node_field, "node=%s", ids[n]);
        const char *order[] = {"connected to etcd", "joined round", "round complete", "shut down"};
        int next = 0;
        for (int i = 0; i < sink.n && next < 4; i++) {
            if (has(sink.lines[i], run_field) && has(sink.lines[i], node_field) && starts(sink.lines[i], order[next])) {
                if (next == 1 || next == 2) CHECK(has(sink.lines[i], "round=0"), "no round=0: %s", sink.lines[i]);
                next++;
            }
        }
        CHECK(next == 4, "node %s: record \"%s\" missing or out of order", ids[n], next < 4 ? order[next] : "");
    }
    pthread_mutex_unlock(&sink.lock);

    /* Back to stderr: the handler is never called again. */
    rdzv_set_log_handler(NULL, NULL);
    pthread_mutex_lock(&sink.lock);
    sink.active = 0;
    pthread_mutex_unlock(&sink.lock);
    rdzv_params_t *p = NULL;
    rdzv_t *h = NULL;
    CHECK(rdzv_params_from_url(url, &p, NULL) == RDZV_OK, "params");
    CHECK(rdzv_new(p, &h, NULL) == RDZV_OK, "a handle after the reset");
    rdzv_params_free(p);
    rdzv_shutdown(h, NULL);
    rdzv_free(h);
    CHECK(sink.late_calls == 0, "handler called %d times after it was removed", sink.late_calls);

    printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
    return failures ? 1 : 0;
}
