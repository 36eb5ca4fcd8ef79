// The cost of a heartbeat and of a section begin+end pair through the C ABI, in this process's
// mode: monitored when RDZV_PROGRESS_FILE names a page (scripts/bench.sh --heartbeat makes
// one), not monitored otherwise. Every program of this directory takes the same arguments and
// prints the same lines, which benches/heartbeat/run.py reads:
//
//   heartbeat REPS CALLS SECTION_CALLS  ->  monitored 0|1
//                                           heartbeat NS_PER_CALL ... (one per repetition)
//                                           step NS_PER_CALL ...    (heartbeats with a step)
//                                           section NS_PER_PAIR ... (begin and end)
//
// One heartbeat comes first (it maps the page), then REPS x CALLS timed ones of each kind, so
// a monitored run leaves 1 + 2 x REPS x CALLS beats on the page, and REPS x SECTION_CALLS
// ends of the section "step".
#include <rdzv.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s REPS CALLS SECTION_CALLS\n", argv[0]);
    return 2;
  }
  const long reps = atol(argv[1]), calls = atol(argv[2]), section_calls = atol(argv[3]);
  rdzv_heartbeat();
  printf("monitored %d\nheartbeat", rdzv_is_monitored() ? 1 : 0);
  for (long r = 0; r < reps; r++) {
    const double start = now_ns();
    for (long i = 0; i < calls; i++) rdzv_heartbeat();
    printf(" %.3f", (now_ns() - start) / (double)calls);
  }
  printf("\nstep");
  for (long r = 0; r < reps; r++) {
    const double start = now_ns();
    for (long i = 0; i < calls; i++) {
      if (rdzv_heartbeat_step(i, NULL) != RDZV_OK) {
        fprintf(stderr, "heartbeat with a step failed\n");
        return 1;
      }
    }
    printf(" %.3f", (now_ns() - start) / (double)calls);
  }
  printf("\nsection");
  for (long r = 0; r < reps; r++) {
    const double start = now_ns();
    for (long i = 0; i < section_calls; i++) {
      if (rdzv_section_begin("step", NULL) != RDZV_OK || rdzv_section_end("step", NULL) != RDZV_OK) {
        fprintf(stderr, "section failed\n");
        return 1;
      }
    }
    printf(" %.3f", (now_ns() - start) / (double)section_calls);
  }
  printf("\n");
  return 0;
}
