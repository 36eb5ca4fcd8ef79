/* End-to-end test of the C ABI, compiled against include/rdzv.h and linked with the built
 * library: the header's and the library's versions, bad input at the boundary, then three
 * nodes on threads forming a round and exchanging values through the store, and the run's
 * store across rounds.   Usage: rdzv_test ETCD_HOST:PORT RUN_ID */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <pthread.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rdzv.h"

/* A program's own names beside the header's: the header defines only rdzv_ and RDZV_ names, so
 * these compile (they did not when it leaked the progress page's layout as macros). */
enum { SECTIONS = 3, VERSION = 2, PAGE_BYTES = 1, MAGIC_AT = 0 };

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

#define NODES 3
static char url[512];
/* Options added to every URL of the test, from RDZV_TEST_URL_OPTIONS (for example a longer
 * connect_timeout under valgrind, which runs the program tens of times slower on one core). */
static const char *extra = "";

/* Expects `st` to be `want` with an error object whose message contains `fragment`. */
static void expect(rdzv_status_t st, rdzv_error_t *err, rdzv_status_t want, const char *fragment) {
    CHECK(st == want, "status %s, want %s", rdzv_status_name(st), rdzv_status_name(want));
    CHECK(err != NULL, "no error object for %s", rdzv_status_name(want));
    if (err) {
        CHECK(rdzv_error_status(err) == want, "error object status %d", rdzv_error_status(err));
        CHECK(strstr(rdzv_error_message(err), fragment) != NULL, "message \"%s\" lacks \"%s\"",
              rdzv_error_message(err), fragment);
    }
    rdzv_error_free(err);
}

/* Runs `call` (which writes &err) and checks its status and error object. */
#define EXPECT(call, want, fragment) do { rdzv_error_t *err = NULL; rdzv_status_t st_ = (call); \
    expect(st_, err, want, fragment); } while (0)

static void bad_input(void) {
    rdzv_params_t *p = NULL;
    EXPECT(rdzv_params_from_url(NULL, &p, &err), RDZV_ERR_INVALID_ARGUMENT, "url");
    EXPECT(rdzv_params_from_url("etcd://h:1/j", NULL, &err), RDZV_ERR_INVALID_ARGUMENT, "out");
    EXPECT(rdzv_params_from_url("etcd://h:1/j?min_nodes=3&max_nodes=1", &p, &err), RDZV_ERR_INVALID_ARGUMENT, "max_nodes");
    CHECK(p == NULL, "output written on failure");
    EXPECT(rdzv_params_from_url("etcd://h:1/\xff\xfe", &p, &err), RDZV_ERR_INVALID_ARGUMENT, "UTF-8");
    /* A NULL error pointer is allowed: only the status comes back. */
    CHECK(rdzv_params_new("etcd-v3", "h:1", "", 1, 1, &p, NULL) == RDZV_ERR_INVALID_ARGUMENT, "empty run id");
    CHECK(rdzv_params_new("etcd-v3", "h:1", "j", 1, 2, &p, NULL) == RDZV_OK, "valid params");
    EXPECT(rdzv_params_set(p, "colour", "red", &err), RDZV_ERR_INVALID_ARGUMENT, "unknown option");
    EXPECT(rdzv_new(NULL, NULL, &err), RDZV_ERR_INVALID_ARGUMENT, "out");
    rdzv_t *h = NULL;
    EXPECT(rdzv_new(NULL, &h, &err), RDZV_ERR_INVALID_ARGUMENT, "params");
    rdzv_round_t round;
    EXPECT(rdzv_next(NULL, &round, NULL, &err), RDZV_ERR_INVALID_ARGUMENT, "rdzv");
    uint32_t n;
    EXPECT(rdzv_num_waiting(NULL, &n, &err), RDZV_ERR_INVALID_ARGUMENT, "rdzv");
    EXPECT(rdzv_store_set(NULL, "k", NULL, 0, &err), RDZV_ERR_INVALID_ARGUMENT, "store");
    CHECK(rdzv_run_id(NULL) == NULL, "run id of NULL");
    CHECK(strcmp(rdzv_status_name(RDZV_ERR_TIMEOUT), "RDZV_ERR_TIMEOUT") == 0, "status name");
    CHECK(strcmp(rdzv_status_name(99), "RDZV_ERR_UNKNOWN") == 0, "unknown status name");
    rdzv_params_free(p);
    rdzv_params_free(NULL);
    rdzv_free(NULL);
    rdzv_store_free(NULL);
    rdzv_error_free(NULL);
    rdzv_bytes_free(NULL, 0);
    bool cancelled;
    EXPECT(rdzv_cancel_token_new(NULL, &err), RDZV_ERR_INVALID_ARGUMENT, "out");
    EXPECT(rdzv_cancel_token_cancel(NULL, &err), RDZV_ERR_INVALID_ARGUMENT, "token");
    EXPECT(rdzv_cancel_token_is_cancelled(NULL, &cancelled, &err), RDZV_ERR_INVALID_ARGUMENT, "token");
    rdzv_cancel_token_free(NULL);
}

/* The header this program was compiled with and the library it loaded are the same version. */
static void header_and_library_agree(void) {
    CHECK(strcmp(rdzv_version(), RDZV_VERSION) == 0, "library %s, header %s", rdzv_version(), RDZV_VERSION);
    char numbers[64];
    snprintf(numbers, sizeof numbers, "%d.%d.%d", RDZV_VERSION_MAJOR, RDZV_VERSION_MINOR, RDZV_VERSION_PATCH);
    CHECK(strncmp(RDZV_VERSION, numbers, strlen(numbers)) == 0, "RDZV_VERSION %s, the numbers %s", RDZV_VERSION, numbers);
}

/* How much slower this run may be than the bounds below say: RDZV_TEST_TIME_SCALE (the valgrind
 * run sets it: valgrind runs the program's threads one at a time, tens of times slower). */
static double time_scale(void) {
    const char *scale = getenv("RDZV_TEST_TIME_SCALE");
    double s = scale ? atof(scale) : 1.0;
    return s >= 1.0 ? s : 1.0;
}

static double seconds_since(const struct timespec *t0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

struct blocked_get { rdzv_store_t *store; rdzv_cancel_token_t *token; rdzv_status_t status; };

static void *get_never(void *arg) {
    struct blocked_get *g = arg;
    uint8_t *v = NULL;
    size_t len = 0;
    g->status = rdzv_store_get_with_cancel(g->store, "never", 60000, g->token, &v, &len, NULL);
    return NULL;
}

/* A cancel token stays cancelled: a call made with one that is already cancelled returns
 * RDZV_ERR_CANCELLED at once, and one that waits returns when another thread cancels it. */
static void cancel_tokens(const char *endpoint, const char *run, rdzv_store_t *s) {
    rdzv_cancel_token_t *token = NULL;
    bool cancelled = true;
    CHECK(rdzv_cancel_token_new(&token, NULL) == RDZV_OK, "new token");
    CHECK(rdzv_cancel_token_is_cancelled(token, &cancelled, NULL) == RDZV_OK && !cancelled, "fresh token");
    uint8_t *v = NULL;
    size_t len = 0;
    /* No token, or one nobody cancelled: a plain get. */
    CHECK(rdzv_store_get_with_cancel(s, "k", 0, NULL, &v, &len, NULL) == RDZV_OK && len == 1, "NULL token");
    rdzv_bytes_free(v, len);
    CHECK(rdzv_store_get_with_cancel(s, "k", 0, token, &v, &len, NULL) == RDZV_OK && len == 1, "live token");
    rdzv_bytes_free(v, len);

    struct blocked_get g = { s, token, RDZV_OK };
    pthread_t t;
    pthread_create(&t, NULL, get_never, &g);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(rdzv_cancel_token_cancel(token, NULL) == RDZV_OK, "cancel");
    pthread_join(t, NULL);
    CHECK(g.status == RDZV_ERR_CANCELLED, "blocked get: %s", rdzv_status_name(g.status));
    CHECK(seconds_since(&t0) < 3 * time_scale(), "blocked get took %.1f s after the cancel", seconds_since(&t0));
    CHECK(rdzv_cancel_token_is_cancelled(token, &cancelled, NULL) == RDZV_OK && cancelled, "cancelled");
    CHECK(rdzv_cancel_token_cancel(token, NULL) == RDZV_OK, "cancel twice");

    /* Cancelled before the call: at once, even for a key that exists. */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    EXPECT(rdzv_store_get_with_cancel(s, "k", 60000, token, &v, &len, &err), RDZV_ERR_CANCELLED, "token");
    const char *keys[] = {"k", "never"};
    EXPECT(rdzv_store_wait_with_cancel(s, keys, 2, 60000, token, &err), RDZV_ERR_CANCELLED, "token");
    uint8_t *vals[2];
    size_t lens[2];
    EXPECT(rdzv_store_multi_get_with_cancel(s, keys, 2, 60000, token, vals, lens, &err),
           RDZV_ERR_CANCELLED, "token");
    /* A node that waits for a second one (join_timeout 60 s) is not even joined. */
    char wait_url[512];
    snprintf(wait_url, sizeof wait_url, "etcd://%s/%s-token?min_nodes=2&max_nodes=2&join_timeout=60%s",
             endpoint, run, extra);
    rdzv_params_t *p = NULL;
    rdzv_t *h = NULL;
    rdzv_round_t round;
    CHECK(rdzv_params_from_url(wait_url, &p, NULL) == RDZV_OK, "token params");
    CHECK(rdzv_new(p, &h, NULL) == RDZV_OK, "token handle");
    EXPECT(rdzv_next_with_cancel(h, token, &round, NULL, &err), RDZV_ERR_CANCELLED, "token");
    rdzv_admin_t *a = NULL;
    rdzv_run_status_t *status = NULL;
    CHECK(rdzv_admin_new(p, &a, NULL) == RDZV_OK, "admin handle");
    EXPECT(rdzv_admin_watch_with_cancel(a, 60000, token, &status, &err), RDZV_ERR_CANCELLED, "token");
    CHECK(rdzv_admin_status(a, &status, NULL) == RDZV_OK && status->num_waiting == 0,
          "the cancelled next joined nothing");
    rdzv_run_status_free(status);
    CHECK(seconds_since(&t0) < 3 * time_scale(), "cancelled calls took %.1f s", seconds_since(&t0));
    rdzv_admin_free(a);
    rdzv_free(h);
    rdzv_params_free(p);
    rdzv_cancel_token_free(token);
}

/* Every call that talks to etcd has a _with_cancel form: with a cancelled token each returns
 * RDZV_ERR_CANCELLED at once and changes nothing; with NULL it is the plain call. */
static void every_call_takes_a_token(const char *endpoint, const char *run, rdzv_store_t *s) {
    char token_url[512];
    snprintf(token_url, sizeof token_url, "etcd://%s/%s-every?min_nodes=1&max_nodes=1%s", endpoint, run, extra);
    rdzv_params_t *p = NULL;
    rdzv_t *h = NULL;
    rdzv_admin_t *a = NULL;
    rdzv_cancel_token_t *token = NULL;
    rdzv_round_t round;
    CHECK(rdzv_params_from_url(token_url, &p, NULL) == RDZV_OK, "params");
    CHECK(rdzv_new(p, &h, NULL) == RDZV_OK, "handle");
    CHECK(rdzv_admin_new(p, &a, NULL) == RDZV_OK, "admin handle");
    CHECK(rdzv_next(h, &round, NULL, NULL) == RDZV_OK, "round");
    CHECK(rdzv_cancel_token_new(&token, NULL) == RDZV_OK, "token");
    CHECK(rdzv_cancel_token_cancel(token, NULL) == RDZV_OK, "cancel");
    bool yes = true;
    uint32_t count = 7;
    int64_t n = 0;
    uint8_t *v = NULL;
    size_t len = 0;
    const char *keys[] = {"k"};
    const uint8_t *vals[] = {(const uint8_t *)"x"};
    const size_t lens[] = {1};
    rdzv_run_status_t *status = NULL;
    int64_t deleted = 0;
    uint32_t alive = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    EXPECT(rdzv_is_closed_with_cancel(h, token, &yes, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_set_closed_with_cancel(h, token, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_num_waiting_with_cancel(h, token, &count, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_num_lost_with_cancel(h, token, &count, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_drain_with_cancel(h, "no", token, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_is_draining_with_cancel(h, token, &yes, &err), RDZV_ERR_CANCELLED, "token");
    rdzv_store_t *run_store = NULL;
    EXPECT(rdzv_run_store_with_cancel(h, token, &run_store, &err), RDZV_ERR_CANCELLED, "token");
    CHECK(run_store == NULL, "run store written on failure");
    EXPECT(rdzv_store_set_with_cancel(s, "cancelled", (const uint8_t *)"x", 1, token, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_store_add_with_cancel(s, "cancelled-count", 1, token, &n, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_store_compare_set_with_cancel(s, "cancelled", NULL, 0, (const uint8_t *)"x", 1, token, &v, &len, &err),
           RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_store_check_with_cancel(s, keys, 1, token, &yes, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_store_delete_key_with_cancel(s, "k", token, &yes, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_store_num_keys_with_cancel(s, token, &n, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_store_multi_set_with_cancel(s, keys, vals, lens, 1, token, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_admin_status_with_cancel(a, token, &status, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_admin_close_with_cancel(a, token, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_admin_purge_with_cancel(a, true, token, &deleted, &alive, &err), RDZV_ERR_CANCELLED, "token");
    EXPECT(rdzv_admin_drain_with_cancel(a, rdzv_node_id(h), "no", token, &err), RDZV_ERR_CANCELLED, "token");
    CHECK(seconds_since(&t0) < 3 * time_scale(), "cancelled calls took %.1f s", seconds_since(&t0));
    /* Nothing was changed, and without a token (NULL) the calls work. */
    CHECK(rdzv_is_closed_with_cancel(h, NULL, &yes, NULL) == RDZV_OK && !yes, "closed by a cancelled close");
    CHECK(rdzv_is_draining_with_cancel(h, NULL, &yes, NULL) == RDZV_OK && !yes, "drained by a cancelled drain");
    CHECK(rdzv_num_lost_with_cancel(h, NULL, &count, NULL) == RDZV_OK && count == 0, "num lost");
    CHECK(rdzv_num_waiting_with_cancel(h, NULL, &count, NULL) == RDZV_OK && count == 0, "num waiting");
    CHECK(rdzv_store_check_with_cancel(s, keys, 1, NULL, &yes, NULL) == RDZV_OK && yes, "check k");
    const char *unset[] = {"cancelled", "cancelled-count"};
    CHECK(rdzv_store_check_with_cancel(s, unset, 2, NULL, &yes, NULL) == RDZV_OK && !yes,
          "a cancelled write was applied");
    CHECK(rdzv_store_add_with_cancel(s, "counted", 2, NULL, &n, NULL) == RDZV_OK && n == 2, "add");
    CHECK(rdzv_store_num_keys_with_cancel(s, NULL, &n, NULL) == RDZV_OK && n > 0, "num keys");
    CHECK(rdzv_admin_status_with_cancel(a, NULL, &status, NULL) == RDZV_OK && status->num_alive == 1 &&
          !status->closed, "status");
    rdzv_run_status_free(status);
    CHECK(rdzv_admin_purge_with_cancel(a, false, NULL, &deleted, &alive, NULL) == RDZV_OK && alive == 1,
          "purge refused while a node lives");
    rdzv_cancel_token_free(token);
    rdzv_admin_free(a);
    rdzv_free(h);
    rdzv_params_free(p);
}

struct next_call { rdzv_t *h; rdzv_status_t status; rdzv_round_t round; };

static void *call_next(void *arg) {
    struct next_call *c = arg;
    c->status = rdzv_next(c->h, &c->round, NULL, NULL);
    return NULL;
}

struct watch_call { rdzv_admin_t *a; rdzv_status_t status; };

static void *call_watch(void *arg) {
    struct watch_call *c = arg;
    rdzv_run_status_t *status = NULL;
    c->status = rdzv_admin_watch(c->a, 60000, &status, NULL);
    rdzv_run_status_free(status);
    return NULL;
}

/* A handle's cancel made before another thread enters the call ends that call (the race C
 * callers used to lose), once: the handle's next call runs normally. */
static void handle_cancels_are_never_lost(const char *endpoint, const char *run, rdzv_store_t *s) {
    char cancel_url[512];
    snprintf(cancel_url, sizeof cancel_url, "etcd://%s/%s-handle?min_nodes=2&max_nodes=2&join_timeout=60%s",
             endpoint, run, extra);
    rdzv_params_t *p = NULL;
    rdzv_t *h = NULL, *other = NULL;
    CHECK(rdzv_params_from_url(cancel_url, &p, NULL) == RDZV_OK, "params");
    CHECK(rdzv_new(p, &h, NULL) == RDZV_OK, "handle");
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(rdzv_cancel(h, NULL) == RDZV_OK, "cancel");
    struct next_call c = { h, RDZV_OK, {0} };
    pthread_t t;
    pthread_create(&t, NULL, call_next, &c);
    pthread_join(t, NULL);
    CHECK(c.status == RDZV_ERR_CANCELLED, "next after rdzv_cancel: %s", rdzv_status_name(c.status));
    CHECK(seconds_since(&t0) < 3 * time_scale(), "the cancelled next took %.1f s", seconds_since(&t0));
    /* Used up: the handle's next call forms a round with another node. */
    CHECK(rdzv_new(p, &other, NULL) == RDZV_OK, "other handle");
    struct next_call o = { other, RDZV_OK, {0} };
    pthread_create(&t, NULL, call_next, &o);
    rdzv_round_t round;
    CHECK(rdzv_next(h, &round, NULL, NULL) == RDZV_OK && round.world_size == 2, "next after the cancel");
    pthread_join(t, NULL);
    CHECK(o.status == RDZV_OK && o.round.world_size == 2, "the other node: %s", rdzv_status_name(o.status));

    /* A store's cancel made before a wait starts in another thread ends it. */
    CHECK(rdzv_store_cancel(s, NULL) == RDZV_OK, "store cancel");
    struct blocked_get g = { s, NULL, RDZV_OK };
    pthread_create(&t, NULL, get_never, &g);
    pthread_join(t, NULL);
    CHECK(g.status == RDZV_ERR_CANCELLED, "get after rdzv_store_cancel: %s", rdzv_status_name(g.status));
    uint8_t *v = NULL;
    size_t len = 0;
    CHECK(rdzv_store_get(s, "k", 60000, &v, &len, NULL) == RDZV_OK && len == 1, "get after the cancel");
    rdzv_bytes_free(v, len);

    /* An admin's cancel made before a watch starts in another thread ends it. */
    rdzv_admin_t *a = NULL;
    CHECK(rdzv_admin_new(p, &a, NULL) == RDZV_OK, "admin handle");
    CHECK(rdzv_admin_cancel(a, NULL) == RDZV_OK, "admin cancel");
    struct watch_call w = { a, RDZV_OK };
    pthread_create(&t, NULL, call_watch, &w);
    pthread_join(t, NULL);
    CHECK(w.status == RDZV_ERR_CANCELLED, "watch after rdzv_admin_cancel: %s", rdzv_status_name(w.status));
    rdzv_run_status_t *status = NULL;
    CHECK(rdzv_admin_watch(a, 60000, &status, NULL) == RDZV_OK && status->exists, "watch after the cancel");
    rdzv_run_status_free(status);
    CHECK(seconds_since(&t0) < 30 * time_scale(), "handle cancels took %.1f s", seconds_since(&t0));
    rdzv_admin_free(a);
    rdzv_free(other);
    rdzv_free(h);
    rdzv_params_free(p);
}

struct result { rdzv_status_t status; rdzv_round_t round; char peers[NODES][16]; };

static void *run_node(void *arg) {
    struct result *out = arg;
    rdzv_params_t *p = NULL;
    rdzv_t *h = NULL;
    rdzv_store_t *s = NULL;
    rdzv_error_t *err = NULL;
    if ((out->status = rdzv_params_from_url(url, &p, &err)) != RDZV_OK) goto done;
    out->status = rdzv_new(p, &h, &err);
    rdzv_params_free(p);
    if (out->status != RDZV_OK) goto done;
    if ((out->status = rdzv_next(h, &out->round, &s, &err)) != RDZV_OK) goto done;
    char key[32], value[16];
    snprintf(key, sizeof key, "rank/%u", out->round.rank);
    snprintf(value, sizeof value, "from-%u", out->round.rank);
    if ((out->status = rdzv_store_set(s, key, (const uint8_t *)value, strlen(value), &err)) != RDZV_OK) goto done;
    const char *keys[NODES] = {"rank/0", "rank/1", "rank/2"};
    uint8_t *values[NODES];
    size_t lens[NODES];
    if ((out->status = rdzv_store_multi_get(s, keys, NODES, 30000, values, lens, &err)) != RDZV_OK) goto done;
    for (int i = 0; i < NODES; i++) {
        snprintf(out->peers[i], sizeof out->peers[i], "%.*s", (int)lens[i], (const char *)values[i]);
        rdzv_bytes_free(values[i], lens[i]);
    }
    int64_t total = 0;
    out->status = rdzv_store_add(s, "count", 1, &total, &err);
done:
    if (err) { fprintf(stderr, "node: %s\n", rdzv_error_message(err)); rdzv_error_free(err); }
    rdzv_store_free(s);
    if (h) rdzv_shutdown(h, NULL);
    rdzv_free(h);
    return NULL;
}

/* A process that forks after using the library can make and use new handles in the child;
 * a handle inherited from the parent refuses to work there instead of hanging. */
static void fork_child_uses_new_handles(const char *endpoint, const char *run) {
    char fork_url[512];
    snprintf(fork_url, sizeof fork_url, "etcd://%s/%s-fork?min_nodes=1&max_nodes=1%s", endpoint, run, extra);
    rdzv_params_t *p = NULL;
    rdzv_t *parent = NULL;
    CHECK(rdzv_params_from_url(fork_url, &p, NULL) == RDZV_OK, "fork params");
    CHECK(rdzv_new(p, &parent, NULL) == RDZV_OK, "parent handle");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        rdzv_round_t r;
        if (rdzv_next(parent, &r, NULL, NULL) != RDZV_ERR_INVALID_ARGUMENT) _exit(10);
        rdzv_t *child = NULL;
        if (rdzv_new(p, &child, NULL) != RDZV_OK) _exit(11);
        if (rdzv_next(child, &r, NULL, NULL) != RDZV_OK) _exit(12);
        if (r.world_size != 1 || r.rank != 0) _exit(13);
        if (rdzv_shutdown(child, NULL) != RDZV_OK) _exit(14);
        rdzv_free(child);
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child failed with code %d",
          WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    /* The parent's handle still works after the fork. */
    rdzv_round_t r;
    CHECK(rdzv_next(parent, &r, NULL, NULL) == RDZV_OK, "parent next after fork");
    rdzv_free(parent);
    rdzv_params_free(p);
}

/* The run's store: the same store functions over the whole run. A value set in round 0 is read
 * in round 2, when round 0's own store is gone; a second handle on it sees the same keys; its
 * calls fail with RDZV_ERR_SHUTDOWN once the node is shut down, and the handle is freed with
 * rdzv_store_free after the node's rdzv_free. */
static void run_store(const char *endpoint, const char *run) {
    char run_url[512];
    snprintf(run_url, sizeof run_url, "etcd://%s/%s-run-store?min_nodes=1&max_nodes=1%s", endpoint, run, extra);
    rdzv_params_t *p = NULL;
    rdzv_t *h = NULL;
    rdzv_store_t *round0 = NULL, *rs = NULL, *again = NULL;
    rdzv_round_t round;
    CHECK(rdzv_params_from_url(run_url, &p, NULL) == RDZV_OK, "run store params");
    CHECK(rdzv_new(p, &h, NULL) == RDZV_OK, "run store handle");
    EXPECT(rdzv_run_store(NULL, &rs, &err), RDZV_ERR_INVALID_ARGUMENT, "node");
    EXPECT(rdzv_run_store(h, NULL, &err), RDZV_ERR_INVALID_ARGUMENT, "out");
    CHECK(rdzv_run_store(h, &rs, NULL) == RDZV_OK && rs != NULL, "run store before any round");
    CHECK(rdzv_next(h, &round, &round0, NULL) == RDZV_OK && round.round == 0, "round 0");
    CHECK(rdzv_store_set(rs, "notes/why", (const uint8_t *)"set in round 0", 14, NULL) == RDZV_OK, "set");
    int64_t n = 0;
    CHECK(rdzv_store_add(rs, "restarts", 2, &n, NULL) == RDZV_OK && n == 2, "add");
    CHECK(rdzv_store_set(round0, "k", (const uint8_t *)"v", 1, NULL) == RDZV_OK, "round 0 set");
    CHECK(rdzv_next(h, &round, NULL, NULL) == RDZV_OK && round.round == 1, "round 1");
    CHECK(rdzv_next(h, &round, NULL, NULL) == RDZV_OK && round.round == 2, "round 2");
    uint8_t *v = NULL;
    size_t len = 0;
    EXPECT(rdzv_store_get(round0, "k", 0, &v, &len, &err), RDZV_ERR_STATE, "no longer exists");
    CHECK(rdzv_run_store(h, &again, NULL) == RDZV_OK, "a second run store handle");
    CHECK(rdzv_store_get(again, "notes/why", 0, &v, &len, NULL) == RDZV_OK && len == 14 &&
          memcmp(v, "set in round 0", 14) == 0, "read in round 2");
    rdzv_bytes_free(v, len);
    CHECK(rdzv_store_add(again, "restarts", 1, &n, NULL) == RDZV_OK && n == 3, "add again");
    CHECK(rdzv_store_num_keys(rs, &n, NULL) == RDZV_OK && n == 2, "num keys %lld", (long long)n);
    rdzv_admin_t *a = NULL;
    rdzv_run_status_t *status = NULL;
    CHECK(rdzv_admin_new(p, &a, NULL) == RDZV_OK, "admin handle");
    CHECK(rdzv_admin_status(a, &status, NULL) == RDZV_OK && status->exists, "status");
    rdzv_run_status_free(status);
    CHECK(rdzv_shutdown(h, NULL) == RDZV_OK, "shutdown");
    EXPECT(rdzv_store_set(rs, "after", (const uint8_t *)"1", 1, &err), RDZV_ERR_SHUTDOWN, "run store");
    EXPECT(rdzv_run_store(h, &again, &err), RDZV_ERR_SHUTDOWN, "shut down");
    /* The last node out took the run, its store with it. */
    CHECK(rdzv_admin_status(a, &status, NULL) == RDZV_OK && !status->exists, "run left in etcd");
    rdzv_run_status_free(status);
    rdzv_admin_free(a);
    rdzv_free(h);
    rdzv_store_free(again);
    rdzv_store_free(rs);
    rdzv_store_free(round0);
    rdzv_params_free(p);
}

/* Edge cases at the store boundary: zero and huge timeouts, bad keys, oversized values, and a
 * few thousand random byte strings fed to the parsers. Each gives its documented status. */
static void edge_cases(const char *endpoint, const char *run) {
    char edge_url[512];
    snprintf(edge_url, sizeof edge_url, "etcd://%s/%s-edge?min_nodes=1&max_nodes=1%s", endpoint, run, extra);
    rdzv_params_t *p = NULL;
    rdzv_t *h = NULL;
    rdzv_store_t *s = NULL;
    rdzv_round_t round;
    CHECK(rdzv_params_from_url(edge_url, &p, NULL) == RDZV_OK, "edge params");
    CHECK(rdzv_new(p, &h, NULL) == RDZV_OK, "edge handle");
    CHECK(rdzv_next(h, &round, &s, NULL) == RDZV_OK, "edge round");
    uint8_t *v = NULL;
    size_t len = 0;
    /* Zero timeout: no wait, an absent key is a timeout at once. */
    EXPECT(rdzv_store_get(s, "absent", 0, &v, &len, &err), RDZV_ERR_TIMEOUT, "absent");
    /* A huge timeout is capped, not an overflow: a present key returns at once. */
    CHECK(rdzv_store_set(s, "k", (const uint8_t *)"v", 1, NULL) == RDZV_OK, "set k");
    CHECK(rdzv_store_get(s, "k", INT64_MAX, &v, &len, NULL) == RDZV_OK && len == 1, "huge timeout");
    rdzv_bytes_free(v, len);
    EXPECT(rdzv_store_set(s, "", (const uint8_t *)"v", 1, &err), RDZV_ERR_INVALID_ARGUMENT, "key");
    EXPECT(rdzv_store_set(s, "bin\xff\xfe", (const uint8_t *)"v", 1, &err), RDZV_ERR_INVALID_ARGUMENT, "UTF-8");
    EXPECT(rdzv_store_set(s, "k", NULL, 5, &err), RDZV_ERR_INVALID_ARGUMENT, "value");
    size_t big = 2u << 20;
    uint8_t *huge = calloc(big, 1);
    EXPECT(rdzv_store_set(s, "big", huge, big, &err), RDZV_ERR_INVALID_ARGUMENT, "bytes");
    free(huge);
    /* Binary values round-trip exactly, NUL bytes included. */
    const uint8_t bin[4] = {0, 255, 0, 7};
    CHECK(rdzv_store_set(s, "bin", bin, 4, NULL) == RDZV_OK, "set binary");
    CHECK(rdzv_store_get(s, "bin", -1, &v, &len, NULL) == RDZV_OK && len == 4 && memcmp(v, bin, 4) == 0,
          "binary round trip");
    rdzv_bytes_free(v, len);
    EXPECT(rdzv_store_set_timeout(s, -5, &err), RDZV_ERR_INVALID_ARGUMENT, "timeout_ms");
    cancel_tokens(endpoint, run, s);
    every_call_takes_a_token(endpoint, run, s);
    handle_cancels_are_never_lost(endpoint, run, s);
    /* Random bytes into the parsers: a status, never a crash. */
    unsigned seed = 12345;
    for (int i = 0; i < 3000; i++) {
        char junk[64];
        size_t n = (size_t)(rand_r(&seed) % 63);
        for (size_t j = 0; j < n; j++) junk[j] = (char)(1 + rand_r(&seed) % 255);
        junk[n] = 0;
        rdzv_params_t *q = NULL;
        rdzv_error_t *e = NULL;
        rdzv_status_t st = rdzv_params_from_url(junk, &q, &e);
        CHECK(st == RDZV_OK || st == RDZV_ERR_INVALID_ARGUMENT, "url fuzz status %d", st);
        rdzv_error_free(e);
        rdzv_params_free(q);
        e = NULL;
        st = rdzv_params_set(p, junk, junk, &e);
        CHECK(st == RDZV_OK || st == RDZV_ERR_INVALID_ARGUMENT, "set fuzz status %d", st);
        rdzv_error_free(e);
    }
    rdzv_store_free(s);
    rdzv_shutdown(h, NULL);
    rdzv_free(h);
    rdzv_params_free(p);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s HOST:PORT RUN_ID\n", argv[0]); return 64; }
    if (getenv("RDZV_TEST_URL_OPTIONS")) extra = getenv("RDZV_TEST_URL_OPTIONS");
    snprintf(url, sizeof url, "etcd://%s/%s?min_nodes=%d&max_nodes=%d%s", argv[1], argv[2], NODES, NODES,
             extra);
    header_and_library_agree();
    bad_input();

    pthread_t threads[NODES];
    struct result results[NODES];
    memset(results, 0, sizeof results);
    for (int i = 0; i < NODES; i++) pthread_create(&threads[i], NULL, run_node, &results[i]);
    for (int i = 0; i < NODES; i++) pthread_join(threads[i], NULL);
    int seen[NODES] = {0};
    for (int i = 0; i < NODES; i++) {
        CHECK(results[i].status == RDZV_OK, "node %d: %s", i, rdzv_status_name(results[i].status));
        if (results[i].status != RDZV_OK) continue;
        CHECK(results[i].round.world_size == NODES, "world size %u", results[i].round.world_size);
        CHECK(results[i].round.rank < NODES, "rank %u", results[i].round.rank);
        if (results[i].round.rank < NODES) seen[results[i].round.rank]++;
        CHECK(results[i].round.master_port != 0, "master port");
        CHECK(strlen(results[i].round.master_addr) > 0, "master addr");
        for (int r = 0; r < NODES; r++) {
            char want[16];
            snprintf(want, sizeof want, "from-%d", r);
            CHECK(strcmp(results[i].peers[r], want) == 0, "peer %d read \"%s\"", r, results[i].peers[r]);
        }
    }
    for (int r = 0; r < NODES; r++) CHECK(seen[r] == 1, "rank %d taken %d times", r, seen[r]);
    /* Under valgrind the forked child's deliberate leak of the parent's runtime would count. */
    if (!getenv("RDZV_TEST_NO_FORK")) fork_child_uses_new_handles(argv[1], argv[2]);
    edge_cases(argv[1], argv[2]);
    run_store(argv[1], argv[2]);
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
    return failures ? 1 : 0;
}
