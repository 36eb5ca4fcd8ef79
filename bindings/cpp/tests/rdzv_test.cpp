// Tests of the C++ binding against a real etcd. Nodes are threads of this process, each with
// its own Rendezvous handle. Every blocking call is bounded: rendezvous URLs carry a
// join_timeout, futures are awaited with wait_for, store reads carry a timeout.
#include <atomic>
#include <rdzv/rdzv.hpp>

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "etcd_server.hpp"

using namespace std::chrono_literals;

namespace {

// One etcd per test process, started on first use (tests that need no etcd do not pay for it)
// and killed by the environment's TearDown.
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

// A run of exactly n nodes (the round completes when the n-th joins), bounded by join_timeout.
std::string run_url(const std::string& run, int n, int join_timeout_s = 60) {
  return etcd().url(run, "min_nodes=" + std::to_string(n) + "&max_nodes=" + std::to_string(n) +
                             "&join_timeout=" + std::to_string(join_timeout_s));
}

// The future's value, or a test failure if it is not ready within `limit`.
template <class T>
T get_within(std::future<T>& f, std::chrono::seconds limit) {
  if (f.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "not ready within " << limit.count() << " s";
    throw std::runtime_error("timed out waiting for a future");
  }
  return f.get();
}

// Starts next() on `node` in another thread and checks it is still blocked a moment later
// (it needs more nodes than there are). Returns the future of its outcome.
std::future<rdzv::Round> start_blocked_next(rdzv::Rendezvous& node) {
  auto fut = std::async(std::launch::async, [&node] { return node.next(); });
  EXPECT_EQ(fut.wait_for(300ms), std::future_status::timeout) << "next() returned early";
  return fut;
}

// ---------------------------------------------------------------------------------------------
// No etcd needed
// ---------------------------------------------------------------------------------------------

template <class E>
void expect_maps_to(rdzv_status_t status) {
  try {
    rdzv::detail::throw_status(status, "msg");
    FAIL() << "no exception";
  } catch (const E& e) {
    EXPECT_EQ(e.status(), status);
    EXPECT_EQ(e.message(), "msg");
    EXPECT_NE(std::string(e.what()).find(rdzv::status_name(status)), std::string::npos);
  } catch (...) {
    FAIL() << "wrong exception type for " << rdzv_status_name(status);
  }
}

TEST(Errors, EachStatusThrowsItsException) {
  expect_maps_to<rdzv::InvalidArgumentError>(RDZV_ERR_INVALID_ARGUMENT);
  expect_maps_to<rdzv::ClosedError>(RDZV_ERR_CLOSED);
  expect_maps_to<rdzv::TimeoutError>(RDZV_ERR_TIMEOUT);
  expect_maps_to<rdzv::ConnectionError>(RDZV_ERR_CONNECTION);
  expect_maps_to<rdzv::StateError>(RDZV_ERR_STATE);
  expect_maps_to<rdzv::GracefulExitError>(RDZV_ERR_GRACEFUL_EXIT);
  expect_maps_to<rdzv::ShutdownError>(RDZV_ERR_SHUTDOWN);
  expect_maps_to<rdzv::InternalError>(RDZV_ERR_INTERNAL);
  expect_maps_to<rdzv::CancelledError>(RDZV_ERR_CANCELLED);
  // Every one is an rdzv::Error and a std::runtime_error.
  static_assert(std::is_base_of_v<rdzv::Error, rdzv::CancelledError>);
  static_assert(std::is_base_of_v<std::runtime_error, rdzv::Error>);
  expect_maps_to<rdzv::Error>(static_cast<rdzv_status_t>(99));
  EXPECT_EQ(rdzv::status_name(static_cast<rdzv_status_t>(99)), "RDZV_ERR_UNKNOWN");
  EXPECT_EQ(rdzv::status_name(RDZV_ERR_CLOSED), "RDZV_ERR_CLOSED");
}

TEST(Errors, TimeoutConversion) {
  EXPECT_EQ(rdzv::detail::timeout_ms(0ms), 0);
  EXPECT_EQ(rdzv::detail::timeout_ms(-5s), 0);
  EXPECT_EQ(rdzv::detail::timeout_ms(1500ms), 1500);
  EXPECT_EQ(rdzv::detail::timeout_ms(2s), 2000);
  EXPECT_EQ(rdzv::detail::timeout_ms(1us), 1);  // rounds up: never "do not wait" by accident
  EXPECT_GT(rdzv::detail::timeout_ms(std::chrono::hours::max()), 0);  // saturates
}

TEST(Params, BadInputThrowsInvalidArgument) {
  EXPECT_THROW(rdzv::Params::from_url("http://127.0.0.1:2379/run"), rdzv::InvalidArgumentError);
  EXPECT_THROW(rdzv::Params::from_url(""), rdzv::InvalidArgumentError);
  EXPECT_THROW(rdzv::Params("etcd-v3", "127.0.0.1:2379", "", 1, 1), rdzv::InvalidArgumentError);
  EXPECT_THROW(rdzv::Params("etcd-v3", "127.0.0.1:2379", "run", 3, 2), rdzv::InvalidArgumentError);
  EXPECT_THROW(rdzv::Params("zookeeper", "127.0.0.1:2379", "run", 1, 1),
               rdzv::InvalidArgumentError);

  auto params = rdzv::Params::from_url("etcd://127.0.0.1:2379/run?min_nodes=1&max_nodes=2");
  try {
    params.set("no_such_option", "1");
    FAIL() << "no exception";
  } catch (const rdzv::InvalidArgumentError& e) {
    EXPECT_EQ(e.status(), RDZV_ERR_INVALID_ARGUMENT);
    EXPECT_NE(e.message().find("no_such_option"), std::string::npos) << e.message();
  }
  EXPECT_THROW(params.set("join_timeout", "soon"), rdzv::InvalidArgumentError);
  EXPECT_NO_THROW(params.set("join_timeout", "30").set("last_call_timeout", "0.5"));
}

TEST(Move, HandlesAreMoveOnly) {
  static_assert(!std::is_copy_constructible_v<rdzv::Params>);
  static_assert(!std::is_copy_assignable_v<rdzv::Params>);
  static_assert(!std::is_copy_constructible_v<rdzv::Rendezvous>);
  static_assert(!std::is_copy_constructible_v<rdzv::Store>);
  static_assert(std::is_nothrow_move_constructible_v<rdzv::Params>);
  static_assert(std::is_nothrow_move_constructible_v<rdzv::Rendezvous>);
  static_assert(std::is_nothrow_move_constructible_v<rdzv::Store>);
  static_assert(std::is_nothrow_move_assignable_v<rdzv::Rendezvous>);

  auto a = rdzv::Params::from_url("etcd://127.0.0.1:2379/run");
  const rdzv_params_t* raw = a.raw();
  rdzv::Params b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_TRUE(b);
  EXPECT_EQ(b.raw(), raw);
  // A moved-from object holds nothing: using it is a clean ShutdownError, as in every binding.
  EXPECT_THROW(a.set("min_nodes", "1"), rdzv::ShutdownError);
  EXPECT_THROW(rdzv::Rendezvous{a}, rdzv::ShutdownError);
  a = std::move(b);
  EXPECT_TRUE(a);
  EXPECT_NO_THROW(a.set("max_nodes", "4"));
}

// ---------------------------------------------------------------------------------------------
// Against etcd
// ---------------------------------------------------------------------------------------------

TEST(Rendezvous, ThreadsFormOneRoundAndExchangeThroughTheStore) {
  constexpr uint32_t kNodes = 3;
  const std::string url = run_url("round", kNodes);
  struct Outcome {
    rdzv::RoundInfo info;
    std::string node_id;
    std::vector<std::string> peers;
    int64_t arrived;
  };
  std::vector<std::future<Outcome>> futures;
  for (uint32_t i = 0; i < kNodes; ++i) {
    futures.push_back(std::async(std::launch::async, [&url] {
      rdzv::Rendezvous node(rdzv::Params::from_url(url));
      auto [info, store] = node.next();
      store.set("node/" + std::to_string(info.rank), node.node_id());
      std::vector<std::string> keys;
      for (uint32_t r = 0; r < info.world_size; ++r) keys.push_back("node/" + std::to_string(r));
      auto peers = store.multi_get(keys, 30s);
      const int64_t arrived = store.add("arrived", 1);
      return Outcome{info, node.node_id(), std::move(peers), arrived};
    }));
  }
  std::vector<Outcome> outcomes;
  for (auto& f : futures) outcomes.push_back(get_within(f, 90s));

  std::set<uint32_t> ranks;
  std::set<int64_t> arrivals;
  for (const auto& o : outcomes) {
    ranks.insert(o.info.rank);
    arrivals.insert(o.arrived);
    EXPECT_EQ(o.info.world_size, kNodes);
    EXPECT_EQ(o.info.round, outcomes[0].info.round);
    EXPECT_EQ(o.info.master_addr, outcomes[0].info.master_addr);
    EXPECT_EQ(o.info.master_port, outcomes[0].info.master_port);
    EXPECT_FALSE(o.info.master_addr.empty());
    EXPECT_NE(o.info.master_port, 0);
    // Every node read the same values, and its own id sits under its own rank.
    EXPECT_EQ(o.peers, outcomes[0].peers);
    ASSERT_EQ(o.peers.size(), kNodes);
    EXPECT_EQ(o.peers[o.info.rank], o.node_id);
  }
  EXPECT_EQ(ranks, (std::set<uint32_t>{0, 1, 2}));
  EXPECT_EQ(arrivals, (std::set<int64_t>{1, 2, 3}));  // add() is exact under concurrency
}

TEST(Rendezvous, SetClosedWakesBlockedNextWithClosedError) {
  const std::string url = run_url("closed", 2);
  rdzv::Rendezvous waiter(rdzv::Params::from_url(url));
  rdzv::Rendezvous closer(rdzv::Params::from_url(url));
  EXPECT_FALSE(closer.is_closed());

  auto fut = start_blocked_next(waiter);
  const auto t0 = std::chrono::steady_clock::now();
  closer.set_closed();
  // join_timeout is 60 s: ClosedError well within it shows next() was woken, not timed out.
  EXPECT_THROW(get_within(fut, 20s), rdzv::ClosedError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  EXPECT_TRUE(waiter.is_closed());
  EXPECT_THROW(closer.next(), rdzv::ClosedError);  // later calls fail at once
}

TEST(Rendezvous, CancelWakesBlockedNextAndHandleStaysUsable) {
  const std::string url = run_url("cancel", 2);
  rdzv::Rendezvous node(rdzv::Params::from_url(url));
  auto fut = start_blocked_next(node);
  node.cancel();  // once: a cancel is never lost
  try {
    get_within(fut, 3s);
    FAIL() << "next() succeeded alone in a 2-node run";
  } catch (const rdzv::CancelledError& e) {
    EXPECT_EQ(e.status(), RDZV_ERR_CANCELLED);
  }

  // The handle is still usable: it joins a round with a second node.
  auto again = std::async(std::launch::async, [&node] { return node.next().info; });
  auto other = std::async(std::launch::async, [&url] {
    rdzv::Rendezvous second(rdzv::Params::from_url(url));
    return second.next().info;
  });
  const auto a = get_within(again, 90s);
  const auto b = get_within(other, 90s);
  EXPECT_EQ(a.world_size, 2u);
  EXPECT_EQ(b.world_size, 2u);
  EXPECT_EQ((std::set<uint32_t>{a.rank, b.rank}), (std::set<uint32_t>{0, 1}));
}

TEST(Rendezvous, ShutdownWakesBlockedNextAndLaterCallsFail) {
  rdzv::Rendezvous node(rdzv::Params::from_url(run_url("shutdown", 2)));
  auto fut = start_blocked_next(node);
  node.shutdown();
  EXPECT_THROW(get_within(fut, 20s), rdzv::ShutdownError);
  EXPECT_NO_THROW(node.shutdown());  // idempotent
  EXPECT_THROW(node.next(), rdzv::ShutdownError);
}

TEST(Rendezvous, NextTimesOutAfterJoinTimeout) {
  rdzv::Rendezvous node(rdzv::Params::from_url(run_url("timeout", 2, /*join_timeout_s=*/1)));
  auto fut = std::async(std::launch::async, [&node] { return node.next(); });
  EXPECT_THROW(get_within(fut, 30s), rdzv::TimeoutError);
}

TEST(Rendezvous, AccessorsAndMove) {
  const std::string url = run_url("accessors", 1);
  rdzv::Rendezvous a(rdzv::Params::from_url(url));
  const std::string run_id = url.substr(url.rfind('/') + 1, url.find('?') - url.rfind('/') - 1);
  EXPECT_EQ(a.run_id(), run_id);
  EXPECT_EQ(a.backend(), "etcd-v3");
  const std::string id = a.node_id();
  // 16 hex digits, unique per handle, as rdzv.h says.
  EXPECT_EQ(id.size(), 16u);
  EXPECT_TRUE(std::all_of(id.begin(), id.end(), [](char c) { return std::isxdigit(c); })) << id;
  EXPECT_EQ(a.num_waiting(), 0u);

  rdzv::Rendezvous b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.node_id(), id);
  EXPECT_THROW(a.node_id(), rdzv::ShutdownError);
  EXPECT_THROW(a.next(), rdzv::ShutdownError);

  rdzv::Rendezvous c(rdzv::Params::from_url(url));
  EXPECT_NE(c.node_id(), id);
  c = std::move(b);  // frees c's own handle, takes b's
  EXPECT_EQ(c.node_id(), id);
  auto round = c.next();
  EXPECT_EQ(round.info.world_size, 1u);
  EXPECT_EQ(round.info.rank, 0u);
  EXPECT_EQ(c.num_lost(), 0u);
}

TEST(Rendezvous, UnreachableEtcdThrowsConnectionError) {
  const uint16_t port = rdzv_test::free_port();
  const auto url = "etcd://127.0.0.1:" + std::to_string(port) + "/nobody?connect_timeout=1";
  EXPECT_THROW(rdzv::Rendezvous{rdzv::Params::from_url(url)}, rdzv::ConnectionError);
}

// A one-node round: the node and its store (the store is usable while the node lives).
struct NodeAndStore {
  rdzv::Rendezvous node;
  rdzv::Store store;
};

NodeAndStore single_node_store() {
  rdzv::Rendezvous node(rdzv::Params::from_url(run_url("store", 1)));
  rdzv::Store store = node.next().store;
  return {std::move(node), std::move(store)};
}

TEST(Store, Semantics) {
  auto one = single_node_store();
  rdzv::Store& store = one.store;

  store.set("greeting", "hello");
  EXPECT_EQ(store.get("greeting", 5s), "hello");
  EXPECT_EQ(store.get("greeting"), "hello");

  const std::vector<uint8_t> binary = {0, 1, 2, 0, 255};
  store.set("binary", binary);
  EXPECT_EQ(store.get_bytes("binary", 5s), binary);
  const std::string with_nul("a\0b", 3);
  store.set("nul", with_nul);
  EXPECT_EQ(store.get("nul", 5s), with_nul);
  store.set("empty", "");
  EXPECT_EQ(store.get("empty", 5s), "");

  EXPECT_THROW(store.get("missing", 0ms), rdzv::TimeoutError);
  EXPECT_THROW(store.get("missing", 200ms), rdzv::TimeoutError);
  EXPECT_THROW(store.wait({"greeting", "missing"}, 200ms), rdzv::TimeoutError);
  EXPECT_NO_THROW(store.wait({"greeting", "binary"}, 5s));
  EXPECT_TRUE(store.check({"greeting", "binary"}));
  EXPECT_FALSE(store.check({"greeting", "missing"}));

  EXPECT_EQ(store.add("counter", 5), 5);
  EXPECT_EQ(store.add("counter", -2), 3);
  EXPECT_EQ(store.get("counter", 1s), "3");
  EXPECT_THROW(store.add("greeting", 1), rdzv::InvalidArgumentError);  // not an integer

  // compare_set: absent + empty expected sets; a mismatch leaves the value and returns it.
  EXPECT_EQ(store.compare_set("cas", "", "one"), "one");
  EXPECT_EQ(store.compare_set("cas", "wrong", "two"), "one");
  EXPECT_EQ(store.compare_set("cas", "one", "two"), "two");
  EXPECT_EQ(store.compare_set("absent", "x", "y"), "x");
  EXPECT_FALSE(store.check({"absent"}));
  EXPECT_EQ(store.compare_set("cas_bytes", std::vector<uint8_t>{}, std::vector<uint8_t>{7}),
            std::vector<uint8_t>{7});

  store.multi_set({"m/a", "m/b"}, std::vector<std::string>{"A", "B"});
  EXPECT_EQ(store.multi_get({"m/b", "m/a"}, 5s), (std::vector<std::string>{"B", "A"}));
  store.multi_set({"mb/a"}, std::vector<std::vector<uint8_t>>{{1, 2}});
  EXPECT_EQ(store.multi_get_bytes({"mb/a"}, 5s), (std::vector<std::vector<uint8_t>>{{1, 2}}));
  EXPECT_THROW(store.multi_get({"m/a", "missing"}, 200ms), rdzv::TimeoutError);
  EXPECT_THROW(store.multi_set({"x", "y"}, std::vector<std::string>{"only one"}),
               rdzv::InvalidArgumentError);

  const int64_t before = store.num_keys();
  EXPECT_TRUE(store.delete_key("greeting"));
  EXPECT_FALSE(store.delete_key("greeting"));
  EXPECT_EQ(store.num_keys(), before - 1);

  EXPECT_THROW(store.set("", "v"), rdzv::InvalidArgumentError);
  EXPECT_THROW(store.get(std::string(RDZV_MAX_KEY_BYTES + 1, 'k'), 0ms),
               rdzv::InvalidArgumentError);

  // The store default applies to calls without a timeout.
  store.set_timeout(200ms);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(store.get("missing"), rdzv::TimeoutError);
  EXPECT_THROW(store.wait({"missing"}), rdzv::TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  EXPECT_THROW(store.set_timeout(-1s), rdzv::InvalidArgumentError);
}

TEST(Store, GetWaitsForAnotherThreadsSet) {
  auto one = single_node_store();
  rdzv::Store& store = one.store;
  auto fut = std::async(std::launch::async, [&store] { return store.get("late", 30s); });
  EXPECT_EQ(fut.wait_for(200ms), std::future_status::timeout);
  store.set("late", "arrived");
  EXPECT_EQ(get_within(fut, 30s), "arrived");
}

TEST(Store, MoveLeavesAnEmptyStore) {
  auto one = single_node_store();
  rdzv::Store a = std::move(one.store);
  a.set("k", "v");
  rdzv::Store b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.get("k", 1s), "v");
  EXPECT_THROW(a.get("k", 1s), rdzv::ShutdownError);
}

TEST(Store, WaitsEndOnCancelAndWhenTheNodeShutsDown) {
  auto one = single_node_store();
  std::promise<std::string> cancelled;
  auto cancelled_result = cancelled.get_future();
  std::thread waiter([&] {
    try {
      one.store.get("never");
      cancelled.set_value("returned");
    } catch (const rdzv::Error& e) {
      cancelled.set_value(rdzv_status_name(e.status()));
    }
  });
  one.store.cancel();  // once, even if the get has not started yet: it is not lost
  ASSERT_EQ(cancelled_result.wait_for(3s), std::future_status::ready) << "the cancel was lost";
  waiter.join();
  EXPECT_EQ(cancelled_result.get(), "RDZV_ERR_CANCELLED");
  EXPECT_NO_THROW(one.store.set("still", "usable"));

  std::promise<std::string> shut;
  auto shut_result = shut.get_future();
  std::thread waiter2([&] {
    try {
      one.store.get("never");
      shut.set_value("returned");
    } catch (const rdzv::Error& e) {
      shut.set_value(rdzv_status_name(e.status()));
    }
  });
  one.node.shutdown();
  ASSERT_EQ(shut_result.wait_for(10s), std::future_status::ready) << "a get outlived its node";
  waiter2.join();
  EXPECT_EQ(shut_result.get(), "RDZV_ERR_SHUTDOWN");
  EXPECT_THROW(one.store.set("k", "v"), rdzv::ShutdownError);
}

// ---------------------------------------------------------------------------------------------
// Cancels that cannot be lost
// ---------------------------------------------------------------------------------------------

// The race the C cancel calls lose, made deterministic: the cancel comes before the call is
// entered. The call must end at once (join_timeout is 60 s), and the handle stays usable.
TEST(Cancel, HandleCancelBeforeNextIsEnteredEndsIt) {
  const std::string url = run_url("cancel-first", 2);
  rdzv::Rendezvous node(rdzv::Params::from_url(url));
  node.cancel();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(node.next(), rdzv::CancelledError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  // The cancel was used up by that call, which joined nothing: a round of two forms now.
  auto other = std::async(std::launch::async, [&url] {
    rdzv::Rendezvous second(rdzv::Params::from_url(url));
    return second.next().info.world_size;
  });
  EXPECT_EQ(node.next().info.world_size, 2u);
  EXPECT_EQ(get_within(other, 90s), 2u);
}

TEST(Cancel, HandleCancelBeforeAStoreWaitEndsItAndIsUsedUp) {
  auto one = single_node_store();
  one.store.set("here", "v");
  one.store.cancel();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(one.store.get("here", 60s), rdzv::CancelledError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_EQ(one.store.get("here", 5s), "v");
}

// The handles' cancel() is the C library's (rdzv_cancel, rdzv_store_cancel,
// rdzv_admin_cancel): a C call made on the raw handle after it ends too.
TEST(Cancel, HandleCancelIsKeptByTheLibrary) {
  rdzv::Rendezvous node(rdzv::Params::from_url(run_url("cancel-in-c", 2)));
  node.cancel();
  rdzv_round_t round{};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(rdzv_next(const_cast<rdzv_t*>(node.raw()), &round, nullptr, nullptr),
            RDZV_ERR_CANCELLED);
  auto one = single_node_store();
  one.store.set("here", "v");
  one.store.cancel();
  uint8_t* data = nullptr;
  size_t len = 0;
  EXPECT_EQ(rdzv_store_get(one.store.raw(), "here", 60000, &data, &len, nullptr),
            RDZV_ERR_CANCELLED);
  rdzv::Admin admin(rdzv::Params::from_url(etcd().url("cancel-in-c-admin")));
  admin.cancel();
  rdzv_run_status_t* status = nullptr;
  EXPECT_EQ(rdzv_admin_watch(admin.raw(), 60000, &status, nullptr), RDZV_ERR_CANCELLED);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  // Each cancel was used up: the handles work again.
  EXPECT_EQ(one.store.get("here", 5s), "v");
  EXPECT_TRUE(admin.watch_next(10s).has_value());
}

// Every call that talks to etcd takes a CancelToken: one cancelled before the call ends it at
// once and changes nothing.
TEST(Cancel, EveryCallTakesAToken) {
  rdzv::CancelToken token;
  token.cancel();
  const std::string url = run_url("every-call", 1);
  rdzv::Rendezvous node(rdzv::Params::from_url(url));
  rdzv::Store store = node.next().store;
  store.set("here", "v");
  rdzv::Admin admin(rdzv::Params::from_url(url));
  const std::vector<std::string> keys = {"k"};
  const std::vector<std::string> values = {"v"};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(node.is_closed(token), rdzv::CancelledError);
  EXPECT_THROW(node.set_closed(token), rdzv::CancelledError);
  EXPECT_THROW(node.num_waiting(token), rdzv::CancelledError);
  EXPECT_THROW(node.num_lost(token), rdzv::CancelledError);
  EXPECT_THROW(node.drain("no", token), rdzv::CancelledError);
  EXPECT_THROW(node.is_draining(token), rdzv::CancelledError);
  EXPECT_THROW(store.set("k", "v", token), rdzv::CancelledError);
  EXPECT_THROW(store.add("n", 1, token), rdzv::CancelledError);
  EXPECT_THROW(store.compare_set("k", "", "v", token), rdzv::CancelledError);
  EXPECT_THROW(store.check(keys, token), rdzv::CancelledError);
  EXPECT_THROW(store.delete_key("here", token), rdzv::CancelledError);
  EXPECT_THROW(store.num_keys(token), rdzv::CancelledError);
  EXPECT_THROW(store.multi_set(keys, values, token), rdzv::CancelledError);
  EXPECT_THROW(admin.status(token), rdzv::CancelledError);
  EXPECT_THROW(admin.close_run(token), rdzv::CancelledError);
  EXPECT_THROW(admin.purge(true, token), rdzv::CancelledError);
  EXPECT_THROW(admin.drain(node.node_id(), "no", token), rdzv::CancelledError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  // Nothing changed; a live token is no token.
  rdzv::CancelToken live;
  EXPECT_FALSE(node.is_closed(live));
  EXPECT_FALSE(node.is_draining(live));
  EXPECT_EQ(node.num_lost(live), 0u);
  EXPECT_EQ(node.num_waiting(live), 0u);
  EXPECT_FALSE(store.check(keys, live));
  EXPECT_EQ(store.num_keys(live), 1);
  EXPECT_TRUE(store.delete_key("here", live));
  EXPECT_EQ(store.add("n", 2, live), 2);
  store.multi_set(keys, values, live);
  EXPECT_EQ(store.compare_set("k", "v", "w", live), "w");
  EXPECT_EQ(admin.status(live).num_alive, 1u);
  EXPECT_TRUE(admin.purge(false, live).refused());
}

TEST(Cancel, TokenCancelledBeforeTheCallEndsItAtOnce) {
  rdzv::CancelToken token;
  EXPECT_FALSE(token.is_cancelled());
  rdzv::CancelToken copy = token;  // the same token
  copy.cancel();
  EXPECT_TRUE(token.is_cancelled());
  const auto t0 = std::chrono::steady_clock::now();
  rdzv::Rendezvous node(rdzv::Params::from_url(run_url("token-first", 2)));
  EXPECT_THROW(node.next(token), rdzv::CancelledError);
  auto one = single_node_store();
  one.store.set("here", "v");
  EXPECT_THROW(one.store.get("here", 60s, token), rdzv::CancelledError);
  EXPECT_THROW(one.store.wait({"here"}, 60s, token), rdzv::CancelledError);
  EXPECT_THROW(one.store.multi_get({"here"}, 60s, token), rdzv::CancelledError);
  rdzv::Admin admin(rdzv::Params::from_url(etcd().url("token-first-admin")));
  EXPECT_THROW(admin.watch_next(60s, token), rdzv::CancelledError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);  // one join, not join_timeout
  EXPECT_EQ(one.store.get("here", 5s, rdzv::CancelToken()), "v");
}

TEST(Cancel, TokenFromAnotherThreadWakesAWaitingGet) {
  auto one = single_node_store();
  rdzv::CancelToken token;
  auto fut = std::async(std::launch::async, [&] { return one.store.get("never", 60s, token); });
  EXPECT_EQ(fut.wait_for(200ms), std::future_status::timeout) << "get returned early";
  const auto t0 = std::chrono::steady_clock::now();
  std::thread([token] { token.cancel(); }).join();
  EXPECT_THROW(get_within(fut, 3s), rdzv::CancelledError);
  std::fprintf(stderr, "get returned %.3f s after its token was cancelled\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// ---------------------------------------------------------------------------------------------
// Waits while etcd is away: each ends within about a second of its trigger
// ---------------------------------------------------------------------------------------------

// The library's records, to wait for what a call does (its wait watching, its read retrying)
// instead of sleeping. RDZV_LOG is read at the first call into rdzv, and each test runs in a
// process of its own, so a test that makes one of these first gets the debug records.
class Records {
 public:
  Records() {
    ::setenv("RDZV_LOG", "debug", 1);
    rdzv::set_log_handler([this](rdzv_log_level_t, std::string_view, std::string_view line) {
      std::lock_guard<std::mutex> lock(m_);
      lines_.emplace_back(line);
      cv_.notify_all();
    });
  }
  Records(const Records&) = delete;
  Records& operator=(const Records&) = delete;
  ~Records() { rdzv::set_log_handler(nullptr); }

  size_t mark() {
    std::lock_guard<std::mutex> lock(m_);
    return lines_.size();
  }

  // Waits (at most 20 s) for a record after `since` that names `run` and contains `what`.
  void await(size_t since, const std::string& run, const std::string& what) {
    std::unique_lock<std::mutex> lock(m_);
    const bool seen = cv_.wait_for(lock, 20s, [&] {
      return std::any_of(lines_.begin() + static_cast<std::ptrdiff_t>(since), lines_.end(),
                         [&](const std::string& l) {
                           return l.find(run) != std::string::npos &&
                                  l.find(what) != std::string::npos;
                         });
    });
    if (!seen) throw std::runtime_error("no record \"" + what + "\" of run " + run);
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
};

enum class Fault { Killed, Frozen };
enum class Trigger { Cancel, Token, Shutdown, Deadline };

const char* name(Fault f) { return f == Fault::Killed ? "SIGKILL" : "SIGSTOP"; }
const char* name(Trigger t) {
  switch (t) {
    case Trigger::Cancel: return "Store::cancel()";
    case Trigger::Token: return "its CancelToken";
    case Trigger::Shutdown: return "the node's shutdown()";
    case Trigger::Deadline: return "its 3 s timeout";
  }
  return "?";
}

// A get waits on a private etcd; etcd is broken under it, then `trigger` fires. Returns how
// long after the trigger the get returned, and checks how it ended.
double store_get_under(rdzv_test::EtcdServer& server, Records& records, Fault fault,
                       Trigger trigger) {
  const std::string url =
      server.url("faults", "min_nodes=1&max_nodes=1&join_timeout=60&close_timeout=2");
  const std::string run = url.substr(url.rfind('/') + 1, url.find('?') - url.rfind('/') - 1);
  rdzv::Rendezvous node(rdzv::Params::from_url(url));
  rdzv::Store store = node.next().store;
  rdzv::CancelToken token;
  const auto timeout = trigger == Trigger::Deadline ? 3s : 60s;
  size_t since = records.mark();
  const auto started = std::chrono::steady_clock::now();
  auto fut = std::async(std::launch::async, [&] {
    std::string outcome = "returned";
    try {
      store.get("never", timeout, token);
    } catch (const rdzv::Error& e) {
      outcome = rdzv::status_name(e.status());
    }
    return std::make_pair(outcome, std::chrono::steady_clock::now());
  });
  records.await(since, run, "store wait watching");
  since = records.mark();
  if (fault == Fault::Killed) {
    server.kill();
    records.await(since, run, "retrying");  // its watch broke; its read finds etcd gone
  } else {
    server.signal(SIGSTOP);  // its read after the watch's set-up hangs
  }
  std::future<void> shutdown;
  auto fired = std::chrono::steady_clock::now();
  switch (trigger) {
    case Trigger::Cancel: store.cancel(); break;
    case Trigger::Token: token.cancel(); break;
    // shutdown() itself waits up to close_timeout while etcd is away.
    case Trigger::Shutdown: shutdown = std::async(std::launch::async, [&] { node.shutdown(); }); break;
    case Trigger::Deadline: fired = started + timeout; break;
  }
  const auto ended = get_within(fut, 60s);
  const double late = std::chrono::duration<double>(ended.second - fired).count();
  std::fprintf(stderr, "store get, etcd %s under it, %s: returned %.2f s after it (%s)\n",
               name(fault), name(trigger), late, ended.first.c_str());
  if (fault == Fault::Killed) server.restart(); else server.signal(SIGCONT);
  if (shutdown.valid()) shutdown.get();
  switch (trigger) {
    case Trigger::Cancel:
    case Trigger::Token: EXPECT_EQ(ended.first, "RDZV_ERR_CANCELLED"); break;
    case Trigger::Shutdown: EXPECT_EQ(ended.first, "RDZV_ERR_SHUTDOWN"); break;
    // A deadline that passes while etcd does not answer is reported as etcd's failure.
    case Trigger::Deadline:
      EXPECT_TRUE(ended.first == "RDZV_ERR_TIMEOUT" || ended.first == "RDZV_ERR_CONNECTION")
          << ended.first;
      break;
  }
  return late;
}

void store_get_ends_promptly_under(Fault fault) {
  Records records;
  rdzv_test::EtcdServer server;
  for (Trigger t : {Trigger::Cancel, Trigger::Token, Trigger::Shutdown, Trigger::Deadline}) {
    // About a second at most; before the fix these took 27-30 s.
    EXPECT_LT(store_get_under(server, records, fault, t), 3.0) << name(t);
  }
}

TEST(Faults, StoreGetEndsOnCancelShutdownAndDeadlineWhenEtcdIsKilled) {
  store_get_ends_promptly_under(Fault::Killed);
}

TEST(Faults, StoreGetEndsOnCancelShutdownAndDeadlineWhenEtcdIsFrozen) {
  store_get_ends_promptly_under(Fault::Frozen);
}

TEST(Faults, NextEndsOnCancelWhenEtcdIsFrozen) {
  rdzv_test::EtcdServer server;
  rdzv::Rendezvous node(rdzv::Params::from_url(
      server.url("faults-next", "min_nodes=2&max_nodes=2&join_timeout=60&close_timeout=2")));
  auto fut = start_blocked_next(node);
  server.signal(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  node.cancel();
  EXPECT_THROW(get_within(fut, 10s), rdzv::CancelledError);
  const double late = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "next, etcd SIGSTOP under it, cancel(): returned %.2f s after it\n", late);
  server.signal(SIGCONT);
  EXPECT_LT(late, 3.0);
}

// A call that does not wait on other nodes but on etcd alone (here: frozen, connect_timeout
// 60 s) ends on its token within about a second. Without one it took connect_timeout.
TEST(Faults, CallsThatAskEtcdEndOnTheirTokenWhenEtcdIsFrozen) {
  rdzv_test::EtcdServer server;
  const std::string url = server.url(
      "faults-token", "min_nodes=1&max_nodes=1&join_timeout=60&close_timeout=2&connect_timeout=60");
  rdzv::Rendezvous node(rdzv::Params::from_url(url));
  rdzv::Store store = node.next().store;
  rdzv::Admin admin(rdzv::Params::from_url(url));
  server.signal(SIGSTOP);
  const std::vector<std::pair<const char*, std::function<void(const rdzv::CancelToken&)>>> calls = {
      {"is_closed", [&](const rdzv::CancelToken& t) { node.is_closed(t); }},
      {"num_waiting", [&](const rdzv::CancelToken& t) { node.num_waiting(t); }},
      {"set_closed", [&](const rdzv::CancelToken& t) { node.set_closed(t); }},
      {"store set", [&](const rdzv::CancelToken& t) { store.set("k", "v", t); }},
      {"store add", [&](const rdzv::CancelToken& t) { store.add("n", 1, t); }},
      {"admin status", [&](const rdzv::CancelToken& t) { admin.status(t); }},
  };
  for (const auto& [what, call] : calls) {
    rdzv::CancelToken token;
    auto fut = std::async(std::launch::async, [&call = call, token] {
      try {
        call(token);
        return std::string("returned");
      } catch (const rdzv::Error& e) {
        return rdzv::status_name(e.status());
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    token.cancel();
    EXPECT_EQ(get_within(fut, 10s), "RDZV_ERR_CANCELLED") << what;
    const double late = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "%s, etcd SIGSTOP under it, its token: returned %.2f s after it\n", what,
                 late);
    EXPECT_LT(late, 3.0) << what;
  }
  server.signal(SIGCONT);
}

// ---------------------------------------------------------------------------------------------
// Admin and drain
// ---------------------------------------------------------------------------------------------

// `n` nodes on `url`, each with its own handle, that complete one round together (their
// next() calls run at once, in threads). Returned in rank order with their rounds.
struct Formed {
  std::vector<rdzv::Rendezvous> nodes;
  std::vector<rdzv::RoundInfo> rounds;
};

Formed form(std::vector<rdzv::Rendezvous> nodes) {
  std::vector<std::future<rdzv::RoundInfo>> futures;
  for (auto& node : nodes) {
    futures.push_back(std::async(std::launch::async, [&node] { return node.next().info; }));
  }
  std::vector<std::pair<rdzv::RoundInfo, size_t>> ranked;
  for (size_t i = 0; i < futures.size(); ++i) ranked.emplace_back(get_within(futures[i], 90s), i);
  std::sort(ranked.begin(), ranked.end(),
            [](const auto& a, const auto& b) { return a.first.rank < b.first.rank; });
  Formed out;
  for (auto& [info, i] : ranked) {
    out.nodes.push_back(std::move(nodes[i]));
    out.rounds.push_back(info);
  }
  return out;
}

Formed form(const std::string& url, size_t n) {
  std::vector<rdzv::Rendezvous> nodes;
  for (size_t i = 0; i < n; ++i) nodes.emplace_back(rdzv::Params::from_url(url));
  return form(std::move(nodes));
}

std::vector<std::string> node_ids(const std::vector<rdzv::Member>& members) {
  std::vector<std::string> out;
  for (const auto& m : members) out.push_back(m.node_id);
  return out;
}

// Polls num_lost() as an agent does until it is non-zero; a test failure after 30 s.
uint32_t wait_for_loss(const rdzv::Rendezvous& node) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (true) {
    const uint32_t n = node.num_lost();
    if (n > 0) return n;
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "no member counted lost within 30 s";
      return 0;
    }
    std::this_thread::sleep_for(10ms);
  }
}

TEST(Admin, HandleIsMoveOnly) {
  static_assert(!std::is_copy_constructible_v<rdzv::Admin>);
  static_assert(!std::is_copy_assignable_v<rdzv::Admin>);
  static_assert(std::is_nothrow_move_constructible_v<rdzv::Admin>);
  static_assert(std::is_nothrow_move_assignable_v<rdzv::Admin>);
  rdzv::Admin a(rdzv::Params::from_url(etcd().url("admin-move")));
  rdzv::Admin b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move)
  EXPECT_THROW(a.status(), rdzv::ShutdownError);
  EXPECT_FALSE(b.status().exists);
}

TEST(Admin, StatusOfAnAbsentRunIsEmptyNotAnError) {
  const std::string url = etcd().url("admin-absent");
  rdzv::Admin admin(rdzv::Params::from_url(url));
  const rdzv::RunStatus s = admin.status();
  EXPECT_EQ(s.run_id, url.substr(url.rfind('/') + 1));
  EXPECT_FALSE(s.exists);
  EXPECT_FALSE(s.closed);
  EXPECT_FALSE(s.sealed_round.has_value());
  EXPECT_TRUE(s.members.empty());
  EXPECT_TRUE(s.waiting.empty());
  EXPECT_EQ(s.num_alive, 0u);
  EXPECT_EQ(s.num_lost, 0u);
  EXPECT_TRUE(s.lost().empty());
  EXPECT_TRUE(s.draining().empty());
  EXPECT_EQ(s.master_addr, "");
  EXPECT_GT(s.revision, 0);
}

TEST(Admin, AFormedRoundIsListedInRankOrder) {
  const std::string url = run_url("admin-formed", 2);
  Formed f = form(url, 2);
  rdzv::Admin admin(rdzv::Params::from_url(url));
  const rdzv::RunStatus s = admin.status();
  EXPECT_TRUE(s.exists);
  ASSERT_TRUE(s.sealed_round.has_value());
  EXPECT_EQ(*s.sealed_round, f.rounds[0].round);
  ASSERT_EQ(s.members.size(), 2u);
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(s.members[r].rank, r);
    EXPECT_EQ(s.members[r].node_id, f.nodes[r].node_id());
    EXPECT_TRUE(s.members[r].alive);
    EXPECT_FALSE(s.members[r].draining);
    EXPECT_FALSE(s.members[r].addr.empty());
  }
  EXPECT_EQ(s.master_addr, f.rounds[0].master_addr);
  EXPECT_EQ(s.master_port, f.rounds[0].master_port);
  EXPECT_EQ(s.num_alive, 2u);
  EXPECT_EQ(s.num_lost, 0u);
  EXPECT_TRUE(s.waiting.empty());
}

TEST(Admin, ADrainedMemberIsLostAndTheSurvivorsReformWithoutIt) {
  // A lease far longer than the test and a last call longer than the join timeout: round 1
  // forms in time only because the drain is seen at once and nobody waits for the node.
  const std::string url = etcd().url(
      "admin-drain", "min_nodes=2&max_nodes=3&lease_ttl=60&last_call_timeout=60&join_timeout=20");
  Formed f = form(url, 3);
  const std::vector<std::string> ids = {f.nodes[0].node_id(), f.nodes[1].node_id(),
                                        f.nodes[2].node_id()};
  // The survivors track losses from before the drain, as a polling agent does.
  EXPECT_EQ(f.nodes[0].num_lost(), 0u);
  EXPECT_EQ(f.nodes[2].num_lost(), 0u);

  rdzv::Admin admin(rdzv::Params::from_url(url));
  admin.drain(ids[1], "maintenance");
  const rdzv::RunStatus s = admin.status();
  ASSERT_EQ(s.draining().size(), 1u);
  EXPECT_EQ(s.draining()[0].node_id, ids[1]);
  EXPECT_EQ(s.num_draining, 1u);
  EXPECT_EQ(s.num_lost, 0u) << "a drained member is alive, not lost";

  EXPECT_EQ(wait_for_loss(f.nodes[0]), 1u);
  EXPECT_EQ(wait_for_loss(f.nodes[2]), 1u);
  EXPECT_TRUE(f.nodes[1].is_draining());
  EXPECT_FALSE(f.nodes[0].is_draining());
  try {
    f.nodes[1].next();
    FAIL() << "a drained node joined a round";
  } catch (const rdzv::GracefulExitError& e) {
    EXPECT_NE(e.message().find("maintenance"), std::string::npos) << e.message();
  }

  std::vector<rdzv::Rendezvous> survivors;
  survivors.push_back(std::move(f.nodes[0]));
  survivors.push_back(std::move(f.nodes[2]));
  Formed again = form(std::move(survivors));
  for (const auto& info : again.rounds) {
    EXPECT_EQ(info.round, 1u);
    EXPECT_EQ(info.world_size, 2u);
  }
  EXPECT_EQ(again.nodes[0].node_id(), ids[0]) << "rank 0 stays rank 0";
  const rdzv::RunStatus after = admin.status();
  ASSERT_TRUE(after.sealed_round.has_value());
  EXPECT_EQ(*after.sealed_round, 1u);
  EXPECT_EQ(node_ids(after.members), (std::vector<std::string>{ids[0], ids[2]}));
}

TEST(Admin, ANodeDrainsItself) {
  const std::string url = etcd().url("admin-self", "min_nodes=2&max_nodes=2&lease_ttl=60");
  Formed f = form(url, 2);
  EXPECT_EQ(f.nodes[0].num_lost(), 0u);
  EXPECT_FALSE(f.nodes[1].is_draining());
  f.nodes[1].drain("preemption notice");
  EXPECT_TRUE(f.nodes[1].is_draining());
  EXPECT_EQ(wait_for_loss(f.nodes[0]), 1u);
  EXPECT_THROW(f.nodes[1].next(), rdzv::GracefulExitError);
}

TEST(Admin, WatchNextTimesOutThenReturnsTheDrain) {
  const std::string url = etcd().url("admin-watch", "min_nodes=2&max_nodes=2&lease_ttl=60");
  Formed f = form(url, 2);
  rdzv::Admin admin(rdzv::Params::from_url(url));
  const auto first = admin.watch_next(10s);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->members.size(), 2u);
  EXPECT_TRUE(first->draining().empty());

  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(admin.watch_next(200ms).has_value());  // nothing changed
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 150ms);

  // A change made while no watch_next() runs is not lost.
  admin.drain(f.nodes[1].node_id(), "scale down");
  const auto changed = admin.watch_next(10s);
  ASSERT_TRUE(changed.has_value());
  EXPECT_GT(changed->revision, first->revision);
  ASSERT_EQ(changed->draining().size(), 1u);
  EXPECT_EQ(changed->draining()[0].node_id, f.nodes[1].node_id());
  EXPECT_THROW(admin.watch_next(-1ms), rdzv::InvalidArgumentError);
}

TEST(Admin, CancelFromAnotherThreadWakesWatchNext) {
  rdzv::Admin admin(rdzv::Params::from_url(etcd().url("admin-cancel")));
  ASSERT_TRUE(admin.watch_next(10s).has_value());  // the current status
  auto blocked = std::async(std::launch::async, [&admin] { return admin.watch_next(60s); });
  admin.cancel();  // once, even if the call has not started yet: it is not lost
  EXPECT_THROW(get_within(blocked, 3s), rdzv::CancelledError);
  EXPECT_FALSE(admin.watch_next(100ms).has_value());  // still usable
}

TEST(Admin, DrainOfAnUnknownNodeThrowsInvalidArgument) {
  rdzv::Admin admin(rdzv::Params::from_url(etcd().url("admin-unknown", "min_nodes=1")));
  try {
    admin.drain("0123456789abcdef", "scale down");
    FAIL() << "drained a node that does not exist";
  } catch (const rdzv::InvalidArgumentError& e) {
    EXPECT_NE(e.message().find("0123456789abcdef"), std::string::npos) << e.message();
  }
  EXPECT_FALSE(admin.status().exists) << "a failed drain writes nothing";
}

TEST(Admin, CloseRunWakesNextAndPurgeWaitsForTheNodes) {
  const std::string url = run_url("admin-close", 2);
  rdzv::Admin admin(rdzv::Params::from_url(url));
  auto node = std::make_unique<rdzv::Rendezvous>(rdzv::Params::from_url(url));
  auto fut = start_blocked_next(*node);
  admin.close_run();
  EXPECT_THROW(get_within(fut, 20s), rdzv::ClosedError);  // join_timeout is 60 s
  EXPECT_TRUE(admin.status().closed);

  const rdzv::PurgeResult refused = admin.purge();
  EXPECT_TRUE(refused.refused());
  EXPECT_EQ(refused.refused_alive, 1u);
  EXPECT_EQ(refused.deleted, 0);
  EXPECT_TRUE(admin.status().exists);

  node.reset();  // the node leaves; the closed marker stays
  const rdzv::PurgeResult done = admin.purge();
  EXPECT_FALSE(done.refused());
  EXPECT_GT(done.deleted, 0);
  EXPECT_FALSE(admin.status().exists);
}

}  // namespace

TEST(Library, LogRecordsReachTheHandler) {
  // Each test runs in a process of its own: RDZV_LOG is read at the first call into rdzv.
  ::setenv("RDZV_LOG", "info", 1);
  std::mutex m;
  std::vector<std::string> lines;
  rdzv::set_log_handler([&](rdzv_log_level_t level, std::string_view target, std::string_view line) {
    std::lock_guard<std::mutex> lock(m);
    if (level == RDZV_LOG_INFO && target == "rdzv::rendezvous") lines.emplace_back(line);
  });
  {
    rdzv::Rendezvous node(rdzv::Params::from_url(run_url("logs", 1)));
    auto round = node.next();
    EXPECT_EQ(round.info.world_size, 1u);
  }
  rdzv::set_log_handler(nullptr);  // after this, `lines` is no longer written
  const bool complete = std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.rfind("round complete", 0) == 0 && l.find(" round=0 ") != std::string::npos &&
           l.find(" node=") != std::string::npos && l.find(" run=") != std::string::npos;
  });
  EXPECT_TRUE(complete) << lines.size() << " records";
}

TEST(Library, LogHandlerMayCallRdzv) {
  // Records come on the library's runtime threads and inside other calls: a blocking call
  // from the handler there once failed (a panic caught at the C boundary), and a node shut
  // down there was never released.
  ::setenv("RDZV_LOG", "info", 1);
  const std::string url = run_url("logreenter", 1);
  rdzv::Rendezvous observer(rdzv::Params::from_url(url));
  rdzv::Rendezvous victim(rdzv::Params::from_url(url));
  std::mutex m;
  int calls = 0;
  std::vector<std::string> failures;
  std::atomic<bool> shut_down{false};
  rdzv::set_log_handler([&](rdzv_log_level_t, std::string_view, std::string_view line) {
    std::string failure;
    try {
      if (observer.is_closed()) failure = "is_closed() said true";
      // No lock held here: other threads' records wait on `m`, and shutdown may wait on them.
      if (line.rfind("round complete", 0) == 0 && !shut_down.exchange(true)) victim.shutdown();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    std::lock_guard<std::mutex> lock(m);
    ++calls;
    if (!failure.empty()) failures.push_back(failure);
  });
  {
    rdzv::Rendezvous node(rdzv::Params::from_url(url));
    EXPECT_EQ(node.next().info.world_size, 1u);
  }
  rdzv::set_log_handler(nullptr);
  EXPECT_GT(calls, 0);
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures[0];
  EXPECT_TRUE(shut_down);
}

TEST(Library, VersionIsMajorMinorPatch) {
  const std::string v = rdzv::version();
  EXPECT_EQ(std::count(v.begin(), v.end(), '.'), 2) << v;
}

TEST(Library, VersionIsTheHeaders) {
  // The library loaded and the rdzv.h this test was compiled with come from the same build.
  EXPECT_EQ(rdzv::version(), RDZV_VERSION);
}

// ---------------------------------------------------------------------------------------------
// Progress (heartbeats and sections). The page is mapped on a process's first progress call,
// from RDZV_PROGRESS_FILE as it is then, so the monitored cases run in a child: this program
// again, with RDZV_CPP_TEST_PROGRESS_CHILD naming what it does (main() below), and the test
// reads the page it wrote at the offsets src/progress/layout.rs documents.
// ---------------------------------------------------------------------------------------------

extern "C" char** environ;

namespace {

constexpr size_t kPageBytes = 4096;
constexpr size_t kMagicAt = 0, kVersionPidAt = 8, kBeatsAt = 16, kLastBeatAt = 24, kStepAt = 32,
                 kStackSignalAt = 56, kOpenDepthAt = 72, kOpenNameAt = 88, kSectionsAt = 192,
                 kSectionBytes = 64, kSectionCountOff = 40;

// A zeroed page in a temporary file, removed with the object.
class PageFile {
 public:
  PageFile() {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/rdzv-progress-XXXXXX";
    const int fd = ::mkstemp(path_.data());
    if (fd < 0 || ::ftruncate(fd, kPageBytes) != 0) throw std::runtime_error("cannot make " + path_);
    ::close(fd);
  }
  ~PageFile() { ::unlink(path_.c_str()); }
  PageFile(const PageFile&) = delete;
  PageFile& operator=(const PageFile&) = delete;

  const std::string& path() const { return path_; }

  std::string bytes() const {
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  uint64_t word(size_t offset) const {
    const std::string page = bytes();
    uint64_t w = 0;
    if (page.size() >= offset + 8) std::memcpy(&w, page.data() + offset, 8);
    return w;
  }
  std::string name(size_t offset, size_t len) const {
    const std::string page = bytes().substr(offset, len);
    return page.substr(0, page.find('\0'));
  }

 private:
  std::string path_;
};

// Runs this program as a progress child doing `mode`, with RDZV_PROGRESS_FILE set to `page`
// ("" leaves it unset); returns its exit status (-1 if it did not exit).
int run_progress_child(const std::string& mode, const std::string& page) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var(*e);
    if (var.rfind("RDZV_PROGRESS_FILE=", 0) != 0 && var.rfind("RDZV_CPP_TEST_PROGRESS_CHILD=", 0) != 0)
      env.push_back(var);
  }
  env.push_back("RDZV_CPP_TEST_PROGRESS_CHILD=" + mode);
  if (!page.empty()) env.push_back("RDZV_PROGRESS_FILE=" + page);
  std::vector<char*> envp;
  for (auto& var : env) envp.push_back(var.data());
  envp.push_back(nullptr);
  char arg0[] = "rdzv_cpp_tests";
  char* argv[] = {arg0, nullptr};
  pid_t pid = 0;
  if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

template <class E, class Fn>
bool throws(Fn&& fn) {
  try {
    fn();
  } catch (const E&) {
    return true;
  } catch (...) {
  }
  return false;
}

// The child's side. Says what went wrong on stderr (which the test shows) and exits 1.
int progress_child(const std::string& mode) {
  const auto fail = [](const char* what) {
    std::cerr << "progress child: " << what << "\n";
    return 1;
  };
  if (mode == "unmappable") {
    // RDZV_PROGRESS_FILE names no file: not monitored, and nothing fails.
    if (rdzv::is_monitored()) return fail("monitored without a page");
    rdzv::heartbeat();
    rdzv::heartbeat(3);
    rdzv::section_begin("step");
    rdzv::section_end("step");
    return 0;
  }
  if (mode != "monitored") return fail("unknown mode");
  if (!rdzv::is_monitored()) return fail("not monitored");
  rdzv::heartbeat();
  rdzv::heartbeat();
  rdzv::heartbeat(41);  // beats 3, step 41 (the page holds step + 1)
  if (!throws<rdzv::InvalidArgumentError>([] { rdzv::heartbeat(-1); }))
    return fail("heartbeat(-1) did not throw InvalidArgumentError");
  { rdzv::Section step("step"); }  // one ended "step"
  {
    rdzv::Section moved("moved");
    rdzv::Section owner(std::move(moved));  // only `owner` ends it, once
    if (moved.is_open() || !owner.is_open()) return fail("a moved Section still owns its section");
  }
  if (!throws<rdzv::InvalidArgumentError>([] { rdzv::section_end("never-open"); }))
    return fail("ending a section that is not open did not throw under monitoring");
  rdzv::Section early("early");
  early.end();
  if (!throws<rdzv::InvalidArgumentError>([] { rdzv::section_end("early"); }))
    return fail("Section::end() left its section open");
  rdzv::set_stack_signal(SIGRTMIN + 4);
  rdzv::section_begin("outer");
  rdzv::section_begin("forward");  // left open: depth 2, innermost "forward"
  return 0;
}

TEST(Progress, HeartbeatsStepAndSectionsReachThePage) {
  PageFile page;
  ASSERT_EQ(run_progress_child("monitored", page.path()), 0) << "see the child's stderr above";
  EXPECT_EQ(page.name(kMagicAt, 8), "RDZVPRG1");
  EXPECT_EQ(page.word(kVersionPidAt) & 0xffffffffu, 1u);  // layout version
  EXPECT_NE(page.word(kVersionPidAt) >> 32, 0u);          // the child's pid
  EXPECT_EQ(page.word(kBeatsAt), 3u);
  EXPECT_GT(page.word(kLastBeatAt), 0u);
  EXPECT_EQ(page.word(kStepAt), 42u);
  EXPECT_EQ(page.word(kStackSignalAt), static_cast<uint64_t>(SIGRTMIN + 4));
  EXPECT_EQ(page.word(kOpenDepthAt), 2u);
  EXPECT_EQ(page.name(kOpenNameAt, 48), "forward");
  // Ended sections, in the order their names were first ended: one of each.
  const char* ended[] = {"step", "moved", "early"};
  for (size_t slot = 0; slot < 3; ++slot) {
    const size_t at = kSectionsAt + slot * kSectionBytes;
    EXPECT_EQ(page.name(at, 40), ended[slot]);
    EXPECT_EQ(page.word(at + kSectionCountOff), 1u) << ended[slot];
  }
}

TEST(Progress, AProgressFileThatCannotBeMappedIsNotMonitoredAndNothingFails) {
  EXPECT_EQ(run_progress_child("unmappable", "/nonexistent/rdzv-progress-page"), 0);
}

TEST(Progress, OutsideRdzvRunEveryCallIsANoOpButBadNamesFail) {
  if (std::getenv("RDZV_PROGRESS_FILE") != nullptr) GTEST_SKIP() << "RDZV_PROGRESS_FILE is set";
  EXPECT_FALSE(rdzv::is_monitored());
  rdzv::heartbeat();
  EXPECT_NO_THROW(rdzv::heartbeat(7));
  EXPECT_NO_THROW(rdzv::section_begin("step"));
  EXPECT_NO_THROW(rdzv::section_end("step"));
  EXPECT_NO_THROW(rdzv::section_end("never-open"));  // only checked under rdzv run
  EXPECT_NO_THROW({ rdzv::Section s("forward"); });
  EXPECT_NO_THROW(rdzv::set_stack_signal(0));
  // Steps and names are checked everywhere.
  EXPECT_THROW(rdzv::heartbeat(-1), rdzv::InvalidArgumentError);
  EXPECT_THROW(rdzv::section_begin(""), rdzv::InvalidArgumentError);
  EXPECT_THROW(rdzv::section_begin(std::string(40, 'x')), rdzv::InvalidArgumentError);
  EXPECT_NO_THROW(rdzv::section_begin(std::string(39, 'x')));
  EXPECT_THROW(rdzv::section_end(std::string("a\0b", 3)), rdzv::InvalidArgumentError);
  EXPECT_THROW(rdzv::Section(""), rdzv::InvalidArgumentError);
  EXPECT_THROW(rdzv::set_stack_signal(65), rdzv::InvalidArgumentError);
  static_assert(!std::is_copy_constructible_v<rdzv::Section>);
  static_assert(std::is_nothrow_move_constructible_v<rdzv::Section>);
  static_assert(std::is_nothrow_destructible_v<rdzv::Section>);
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* mode = std::getenv("RDZV_CPP_TEST_PROGRESS_CHILD")) return progress_child(mode);
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new EtcdEnvironment);
  return RUN_ALL_TESTS();
}

// Outside `rdzv run --in-process-restart` (this test process has no RDZV_INPROCESS_FILE): a
// worker's loop is told so, and next() refuses. The rounds themselves are tested through the
// same C functions in tests/all/c_api.rs and bindings/go/inprocess_test.go.
TEST(InProcess, OutsideTheFlagNothingIsAskedAndNextRefuses) {
  ASSERT_EQ(std::getenv("RDZV_INPROCESS_FILE"), nullptr);
  EXPECT_FALSE(rdzv::inprocess::enabled());
  EXPECT_FALSE(rdzv::inprocess::check());
  EXPECT_THROW(rdzv::inprocess::next(std::chrono::milliseconds(10)), rdzv::InvalidArgumentError);
}
