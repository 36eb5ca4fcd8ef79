// heartbeat.c's measurement through the C++ binding (rdzv::heartbeat, with and without a step,
// rdzv::section_begin and rdzv::section_end); same arguments and output.
#include <rdzv/rdzv.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {
double ns_per_call(std::chrono::steady_clock::time_point start, long calls) {
  const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
  return took.count() / static_cast<double>(calls);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s REPS CALLS SECTION_CALLS\n", argv[0]);
    return 2;
  }
  const long reps = std::atol(argv[1]), calls = std::atol(argv[2]), section_calls = std::atol(argv[3]);
  const std::string name = "step";
  rdzv::heartbeat();
  std::printf("monitored %d\nheartbeat", rdzv::is_monitored() ? 1 : 0);
  for (long r = 0; r < reps; r++) {
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; i++) rdzv::heartbeat();
    std::printf(" %.3f", ns_per_call(start, calls));
  }
  std::printf("\nstep");
  for (long r = 0; r < reps; r++) {
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; i++) rdzv::heartbeat(static_cast<int64_t>(i));
    std::printf(" %.3f", ns_per_call(start, calls));
  }
  std::printf("\nsection");
  for (long r = 0; r < reps; r++) {
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < section_calls; i++) {
      rdzv::section_begin(name);
      rdzv::section_end(name);
    }
    std::printf(" %.3f", ns_per_call(start, section_calls));
  }
  std::printf("\n");
  return 0;
}
