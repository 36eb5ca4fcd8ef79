// Tests of rdzv/gloo.hpp against a real etcd and Gloo's TCP transport on loopback: the adapter's
// calls, a Gloo context connected through a round's store, and the example (four processes that
// allreduce, one SIGKILLed, the survivors allreduce again in a new round). Built only when
// Gloo is installed (Debian's libgloo-dev); without it ctest reports the test skipped.
#include <rdzv/gloo.hpp>
#include <rdzv/rdzv.hpp>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "etcd_server.hpp"
#include "job.hpp"

using namespace std::chrono_literals;
using rdzv_gloo::Event;

namespace {

std::unique_ptr<rdzv_test::EtcdServer>& etcd_slot() {
  static std::unique_ptr<rdzv_test::EtcdServer> server;
  return server;
}

rdzv_test::EtcdServer& etcd() {
  auto& slot = etcd_slot();
  if (!slot) slot = std::make_unique<rdzv_test::EtcdServer>();
  return *slot;
}

class EtcdEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { etcd_slot().reset(); }
};

// The round of a run with one node: a store to test the adapter on.
struct SoloRound {
  explicit SoloRound(const std::string& run)
      : node(rdzv::Params::from_url(etcd().url(run, "min_nodes=1&max_nodes=1&join_timeout=30"))),
        round(node.next()) {}
  rdzv::Rendezvous node;
  rdzv::Round round;
};

std::vector<Event> of_kind(const std::vector<Event>& events, const std::string& kind) {
  std::vector<Event> out;
  for (const auto& e : events)
    if (e.kind == kind) out.push_back(e);
  return out;
}

bool any_error(const std::vector<Event>& events) { return !of_kind(events, "error").empty(); }

// ---------------------------------------------------------------------------------------------
// The adapter
// ---------------------------------------------------------------------------------------------

TEST(GlooStore, CarriesBytesBothWays) {
  SoloRound r("gloo-bytes");
  rdzv::GlooStore adapter(r.round.store);
  const std::vector<char> value = {'a', '\0', '\xff', 'b'};
  adapter.set("k", value);
  EXPECT_EQ(adapter.get("k"), value);
  // What Gloo writes is in the round's store, readable by the rdzv API, and the other way.
  EXPECT_EQ(r.round.store.get("k", 1s), std::string("a\0\xff" "b", 4));
  r.round.store.set("from-rdzv", "xyz");
  EXPECT_EQ(adapter.get("from-rdzv"), (std::vector<char>{'x', 'y', 'z'}));
  adapter.wait({"k", "from-rdzv"}, 1000ms);
}

TEST(GlooStore, WaitHonoursGlooTimeoutThenTheStoresDefault) {
  SoloRound r("gloo-timeouts");
  rdzv::GlooStore adapter(r.round.store);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(adapter.wait({"absent"}, 300ms), rdzv::TimeoutError);
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 300ms);
  EXPECT_LT(waited, 10s) << "Gloo's timeout was not honoured";

  // Without a timeout (and in get) the store's default applies.
  r.round.store.set_timeout(300ms);
  t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(adapter.wait({"absent"}), rdzv::TimeoutError);
  EXPECT_THROW(adapter.get("absent"), rdzv::TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s) << "the store's timeout was not used";
}

// Gloo's connectFullMesh through the adapter, in one process: two nodes, each on its thread.
TEST(GlooStore, ConnectsAContextAndAllreduces) {
  const std::string url = etcd().url("gloo-mesh", "min_nodes=2&max_nodes=2&join_timeout=60");
  auto node = [&url] {
    rdzv::Rendezvous n(rdzv::Params::from_url(url));
    auto [info, store] = n.next();
    auto device = gloo::transport::tcp::CreateDevice("127.0.0.1");
    auto context = rdzv::connect_gloo(info, store, device, 30s);
    EXPECT_EQ(context->rank, static_cast<int>(info.rank));
    EXPECT_EQ(context->size, 2);
    std::vector<int64_t> data = {static_cast<int64_t>(info.rank) + 1, 100};
    gloo::AllreduceOptions opts(context);
    opts.setOutput(data.data(), data.size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<int64_t>));
    gloo::allreduce(opts);
    return data;
  };
  auto a = std::async(std::launch::async, node);
  auto b = std::async(std::launch::async, node);
  ASSERT_EQ(a.wait_for(90s), std::future_status::ready);
  ASSERT_EQ(b.wait_for(90s), std::future_status::ready);
  EXPECT_EQ(a.get(), (std::vector<int64_t>{3, 200}));
  EXPECT_EQ(b.get(), (std::vector<int64_t>{3, 200}));
}

// ---------------------------------------------------------------------------------------------
// The example: 4 processes, one SIGKILLed, 3 go on
// ---------------------------------------------------------------------------------------------

TEST(GlooExample, SurvivorsOfASigkillAllreduceInANewRound) {
  // lease_ttl = 2 s (the minimum): a death shows in num_lost within about 2 s. The first round
  // seals when the 4th process joins (max_nodes), the second once the 3 survivors have (a
  // re-formed round does not wait for the last call); last_call_timeout only bounds how long
  // round 0 would wait for a 4th process once 3 have joined.
  const std::string url = etcd().url(
      "gloo-example", "min_nodes=3&max_nodes=4&lease_ttl=2&last_call_timeout=10&join_timeout=60");
  constexpr int n = 4;
  rdzv_gloo::Job job(RDZV_GLOO_EXAMPLE, url, n, /*rounds=*/2);

  // Round 0: every process allreduces in a world of 4.
  ASSERT_TRUE(job.wait_until(
      [](const std::vector<Event>& es) { return of_kind(es, "allreduce").size() == n || any_error(es); },
      90s))
      << "not every process allreduced in round 0:\n" << job.transcript();
  const auto first = of_kind(job.events(), "allreduce");
  ASSERT_FALSE(any_error(job.events())) << job.transcript();
  ASSERT_EQ(first.size(), static_cast<size_t>(n)) << job.transcript();
  std::set<long long> ranks, ids;
  int victim = -1;
  for (const auto& e : first) {
    EXPECT_EQ(e.num("round"), 0) << e.line;
    EXPECT_EQ(e.num("world"), 4) << e.line;
    EXPECT_EQ(e.num("sum"), 1 + 2 + 3 + 4) << e.line;
    EXPECT_EQ(e.num("members"), 0b1111) << e.line;  // every ID took part
    EXPECT_EQ(e.num("id"), e.id) << e.line;
    ranks.insert(e.num("rank"));
    ids.insert(e.id);
    if (e.num("rank") == 0) victim = e.id;
  }
  EXPECT_EQ(ranks, (std::set<long long>{0, 1, 2, 3}));
  EXPECT_EQ(ids, (std::set<long long>{0, 1, 2, 3}));
  ASSERT_GE(victim, 0) << job.transcript();

  // Kill rank 0 (its lease, not a goodbye, is what the others notice).
  job.kill(victim);
  const int status = job.wait_exit(victim, 30s);
  ASSERT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "process " << victim << " did not die of SIGKILL:\n" << job.transcript();

  // Round 1: the 3 survivors saw the loss, formed a new round and allreduced in it.
  auto second_round = [](const std::vector<Event>& es) {
    std::vector<Event> out;
    for (const auto& e : of_kind(es, "allreduce"))
      if (e.num("round") > 0) out.push_back(e);
    return out;
  };
  ASSERT_TRUE(job.wait_until(
      [&](const std::vector<Event>& es) { return second_round(es).size() == n - 1 || any_error(es); },
      90s))
      << "the survivors did not allreduce again:\n" << job.transcript();
  ASSERT_FALSE(any_error(job.events())) << job.transcript();
  const auto second = second_round(job.events());
  ASSERT_EQ(second.size(), static_cast<size_t>(n - 1)) << job.transcript();
  ranks.clear();
  ids.clear();
  const long long round1 = second[0].num("round");
  for (const auto& e : second) {
    EXPECT_NE(e.id, victim) << e.line;
    EXPECT_EQ(e.num("round"), round1) << e.line;
    EXPECT_EQ(e.num("world"), 3) << e.line;
    EXPECT_EQ(e.num("sum"), 1 + 2 + 3) << e.line;
    EXPECT_EQ(e.num("members"), 0b1111 & ~(1LL << victim)) << e.line;  // the victim is not in it
    ranks.insert(e.num("rank"));
    ids.insert(e.id);
  }
  EXPECT_EQ(ranks, (std::set<long long>{0, 1, 2}));
  EXPECT_EQ(ids.count(victim), 0u);
  EXPECT_EQ(ids.size(), 3u);

  // Each survivor saw the loss in round 0 before joining again, and leaves cleanly.
  for (int id = 0; id < n; ++id) {
    if (id == victim) continue;
    const int code = job.wait_exit(id, 60s);
    EXPECT_TRUE(code != -1 && WIFEXITED(code) && WEXITSTATUS(code) == 0)
        << "survivor " << id << " did not exit 0:\n" << job.transcript();
  }
  const auto events = job.events();
  for (int id = 0; id < n; ++id) {
    const auto is = [id](const std::string& kind) {
      return [id, kind](const Event& e) { return e.id == id && e.kind == kind; };
    };
    if (id == victim) {
      EXPECT_EQ(std::count_if(events.begin(), events.end(), is("allreduce")), 1);
      EXPECT_EQ(std::count_if(events.begin(), events.end(), is("lost")), 0);
      continue;
    }
    auto lost = std::find_if(events.begin(), events.end(), is("lost"));
    ASSERT_NE(lost, events.end()) << "survivor " << id << " printed no loss:\n" << job.transcript();
    EXPECT_EQ(lost->num("round"), 0);
    EXPECT_GE(lost->num("lost"), 1);
    EXPECT_EQ(std::count_if(events.begin(), events.end(), is("done")), 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new EtcdEnvironment);
  return RUN_ALL_TESTS();
}
