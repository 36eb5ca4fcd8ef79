// An elastic Gloo job: every round of the rendezvous gets its own Gloo context, connected through
// that round's store, and the processes allreduce (sum) in it. After an allreduce a process
// waits until a member of its round is lost (num_lost() > 0), then calls next() again and
// allreduces in the smaller world. It stops after ROUNDS allreduces.
//
//   rdzv_gloo_allreduce URL ID [ROUNDS] [LOST_TIMEOUT_S]
//   URL     etcd://HOST:PORT/RUN?min_nodes=3&max_nodes=4&lease_ttl=2
//   ID      this process's label, 0..62, distinct per process (the launcher's, not a rank)
//   ROUNDS  allreduces to do before leaving (default 2)
//
// Each process contributes [rank + 1, 2^ID]: the first sum must be 1 + ... + world, the second
// is the set of the IDs that took part (so whoever reads the output sees who was in a round).
//
// One line per event on stdout, flushed at once ("t_ns" is the steady clock, CLOCK_MONOTONIC on
// Linux, so a launcher on the same machine can compare it with its own):
//   start id=1 pid=4242 t_ns=...
//   allreduce round=0 rank=2 world=4 id=1 sum=10 expected=10 members=15 t_ns=...
//   lost round=0 rank=2 id=1 lost=1 t_ns=...
//   done id=1 t_ns=...
//   error id=1 what=...            (then exit 1; a wrong sum is exit 3; bad usage 64)
//
// GLOO_HOST chooses the address Gloo listens on (default 127.0.0.1).
#include <rdzv/gloo.hpp>
#include <rdzv/rdzv.hpp>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/transport/tcp/device.h>

#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace {

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One event line, flushed at once: a launcher reads it as it happens, and a process killed
// later has written every line it printed.
__attribute__((format(printf, 1, 2))) void event(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vprintf(fmt, args);
  va_end(args);
  std::fflush(stdout);
}

long parse(const char* s, const char* what, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "%s must be an integer in [%ld, %ld], got '%s'\n", what, lo, hi, s);
    std::exit(64);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5) {
    std::fprintf(stderr, "usage: %s URL ID [ROUNDS] [LOST_TIMEOUT_S]\n", argv[0]);
    return 64;
  }
  const std::string url = argv[1];
  const long id = parse(argv[2], "ID", 0, 62);
  const long rounds = argc > 3 ? parse(argv[3], "ROUNDS", 1, 1000) : 2;
  const auto lost_timeout = std::chrono::seconds(argc > 4 ? parse(argv[4], "LOST_TIMEOUT_S", 1, 86400) : 120);
  event("start id=%ld pid=%d t_ns=%lld\n", id, static_cast<int>(::getpid()), now_ns());

  try {
    rdzv::Rendezvous node(rdzv::Params::from_url(url));
    gloo::transport::tcp::attr attr;
    const char* host = std::getenv("GLOO_HOST");
    attr.hostname = host != nullptr && *host != '\0' ? host : "127.0.0.1";
    // One device serves every round: it is the process's listening socket and event loop;
    // each context creates its own pairs on it.
    auto device = gloo::transport::tcp::CreateDevice(attr);

    for (long done = 0; done < rounds; ++done) {
      auto [info, store] = node.next();
      const long long world = info.world_size;
      {
        // The context lives only as long as its round: the next round is a new mesh.
        auto context = rdzv::connect_gloo(info, store, device);
        std::vector<int64_t> data = {static_cast<int64_t>(info.rank) + 1, int64_t{1} << id};
        gloo::AllreduceOptions opts(context);
        opts.setOutput(data.data(), data.size());
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<int64_t>));
        gloo::allreduce(opts);

        const long long expected = world * (world + 1) / 2;
        event("allreduce round=%llu rank=%u world=%lld id=%ld sum=%lld expected=%lld members=%lld "
              "t_ns=%lld\n",
              static_cast<unsigned long long>(info.round), info.rank, world, id,
              static_cast<long long>(data[0]), expected, static_cast<long long>(data[1]),
              now_ns());
        if (data[0] != expected || __builtin_popcountll(static_cast<unsigned long long>(data[1])) != world) {
          event("error id=%ld what=wrong allreduce result in round %llu\n", id,
                static_cast<unsigned long long>(info.round));
          return 3;
        }
      }
      if (done + 1 == rounds) break;

      // Wait for the round to break. num_lost() answers from a watch the library keeps on the
      // members' leases (no etcd request per call), so a short poll costs nothing; a death
      // shows here within about one lease_ttl. A real trainer would notice in its next
      // collective instead (Gloo throws on a dead peer) and ask num_lost() then.
      const auto deadline = std::chrono::steady_clock::now() + lost_timeout;
      uint32_t lost = 0;
      while ((lost = node.num_lost()) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          event("error id=%ld what=no member of round %llu lost within %lld s\n", id,
                static_cast<unsigned long long>(info.round),
                static_cast<long long>(lost_timeout.count()));
          return 1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      event("lost round=%llu rank=%u id=%ld lost=%u t_ns=%lld\n",
            static_cast<unsigned long long>(info.round), info.rank, id, lost, now_ns());
    }
    node.shutdown();
    event("done id=%ld t_ns=%lld\n", id, now_ns());
    return 0;
  } catch (const std::exception& e) {
    event("error id=%ld what=%s\n", id, e.what());
    return 1;
  }
}
