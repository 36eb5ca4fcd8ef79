// Benchmark of the Gloo example (prints numbers, asserts nothing): 4 processes of
// rdzv_gloo_allreduce against an etcd at ENDPOINT; per run,
//   start:    from fork to the first allreduce done, median over the 4 processes;
//   detect:   from the SIGKILL of rank 0 to the survivors' num_lost() > 0 (median);
//   recovery: from the SIGKILL to the survivors' second allreduce done (median and the last,
//             i.e. when the smaller world had finished its first collective).
// Times the processes print are CLOCK_MONOTONIC, the launcher's steady clock.
//
//   rdzv_gloo_bench ENDPOINT [RUNS] [LEASE_TTL_S]      (scripts/bench.sh --gloo runs it)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "job.hpp"

using rdzv_gloo::Clock;
using rdzv_gloo::Event;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double ms_between(Clock::time_point from, long long to_ns) {
  return (to_ns - std::chrono::duration_cast<std::chrono::nanoseconds>(from.time_since_epoch()).count()) / 1e6;
}

std::vector<Event> matching(const std::vector<Event>& es, const std::string& kind, bool later_round) {
  std::vector<Event> out;
  for (const auto& e : es)
    if (e.kind == kind && (e.num("round") > 0) == later_round) out.push_back(e);
  return out;
}

[[noreturn]] void fail(const std::string& what, const rdzv_gloo::Job& job) {
  std::fprintf(stderr, "%s\n%s", what.c_str(), job.transcript().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr, "usage: %s ENDPOINT [RUNS] [LEASE_TTL_S]\n", argv[0]);
    return 64;
  }
  const std::string endpoint = argv[1];
  const int runs = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::string ttl = argc > 3 ? argv[3] : "2";
  constexpr int n = 4;
  std::printf("gloo example: %d processes, lease_ttl = %s s, TCP on loopback, %d runs\n", n, ttl.c_str(), runs);
  std::printf("%4s %12s %12s %16s %14s\n", "run", "start (ms)", "detect (ms)", "recovery median", "recovery last");
  std::vector<double> starts, detects, recoveries, lasts;
  auto has_error = [](const std::vector<Event>& es) {
    return std::any_of(es.begin(), es.end(), [](const Event& e) { return e.kind == "error"; });
  };
  for (int run = 0; run < runs; ++run) {
    const std::string url = "etcd://" + endpoint + "/gloo-bench-" + std::to_string(::getpid()) + "-" +
                            std::to_string(run) + "?min_nodes=3&max_nodes=4&last_call_timeout=10&join_timeout=60" +
                            "&lease_ttl=" + ttl;
    rdzv_gloo::Job job(RDZV_GLOO_EXAMPLE, url, n, 2);
    if (!job.wait_until([&](const std::vector<Event>& es) {
          return has_error(es) || matching(es, "allreduce", false).size() == n;
        }, std::chrono::seconds(120)) || has_error(job.events()))
      fail("round 0 did not complete", job);
    std::vector<double> start;
    int victim = -1;
    for (const auto& e : matching(job.events(), "allreduce", false)) {
      start.push_back(ms_between(job.started(e.id), e.num("t_ns")));
      if (e.num("rank") == 0) victim = e.id;
    }
    const auto killed = job.kill(victim);
    if (!job.wait_until([&](const std::vector<Event>& es) {
          return has_error(es) || matching(es, "allreduce", true).size() == n - 1;
        }, std::chrono::seconds(120)) || has_error(job.events()))
      fail("the survivors did not allreduce again", job);
    std::vector<double> detect, recovery;
    for (const auto& e : job.events()) {
      if (e.kind == "lost") detect.push_back(ms_between(killed, e.num("t_ns")));
      if (e.kind == "allreduce" && e.num("round") > 0) recovery.push_back(ms_between(killed, e.num("t_ns")));
    }
    const double last = *std::max_element(recovery.begin(), recovery.end());
    std::printf("%4d %12.1f %12.1f %16.1f %14.1f\n", run, median(start), median(detect), median(recovery), last);
    std::fflush(stdout);
    starts.push_back(median(start));
    detects.push_back(median(detect));
    recoveries.push_back(median(recovery));
    lasts.push_back(last);
    for (int id = 0; id < n; ++id)
      if (id != victim && job.wait_exit(id, std::chrono::seconds(60)) != 0) fail("a survivor did not exit 0", job);
  }
  std::printf("%4s %12.1f %12.1f %16.1f %14.1f   (medians over runs)\n", "all", median(starts), median(detects),
              median(recoveries), median(lasts));
  return 0;
}
