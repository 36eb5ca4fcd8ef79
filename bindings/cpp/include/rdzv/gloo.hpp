// gloo.hpp: a round's rdzv::Store as a Gloo rendezvous store, so Gloo (PyTorch's CPU
// collectives; Debian's libgloo-dev) connects its processes through the round they formed.
//
// Optional: include it only in programs that use Gloo (they link libgloo, CMake target `gloo`
// from find_package(Gloo)); rdzv.hpp itself never needs Gloo.
//
//   rdzv::Rendezvous node(rdzv::Params::from_url(url));
//   auto [info, store] = node.next();
//   auto device = gloo::transport::tcp::CreateDevice("127.0.0.1");   // or an interface
//   auto context = rdzv::connect_gloo(info, store, device);            // full mesh, this round
//   gloo::AllreduceOptions opts(context); ...
//
// Every key Gloo writes lives in that round's store, which no other round sees, so a new
// round needs no cleanup and no prefix: call next() again and connect a new context. Two
// contexts in one round (two process groups) need distinct keys: wrap the adapter in
// gloo::rendezvous::PrefixStore.
//
// Errors are rdzv's: a wait or get that runs out of time throws rdzv::TimeoutError, a store of
// a shut-down node rdzv::ShutdownError (all derive from std::runtime_error, as Gloo's do).

#ifndef RDZV_GLOO_HPP
#define RDZV_GLOO_HPP

#include <rdzv/rdzv.hpp>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rdzv {

/// Adapts an rdzv::Store to gloo::rendezvous::Store. It borrows the store: the Store (and the
/// Rendezvous it came from) must outlive every use of the adapter, which with Gloo means until
/// connectFullMesh returns (a connected context no longer uses its store).
class GlooStore : public ::gloo::rendezvous::Store {
 public:
  explicit GlooStore(const rdzv::Store& store) noexcept : store_(store) {}

  GlooStore(const GlooStore&) = delete;
  GlooStore& operator=(const GlooStore&) = delete;

  /// Gloo's values are bytes in std::vector<char>; rdzv stores them unchanged (NULs included).
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::string_view(data.data(), data.size()));
  }

  /// Waits for the key as Gloo's own stores do, for at most the store's default timeout
  /// (rdzv::Store::set_timeout). Gloo relies on it: connectFullMesh gets every peer's
  /// "rank_N" key (its host name) without waiting for it first.
  std::vector<char> get(const std::string& key) override {
    const std::string value = store_.get(key);
    return std::vector<char>(value.begin(), value.end());
  }

  /// Waits for all keys for the store's default timeout.
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys); }

  /// Waits for all keys for `timeout` (Gloo passes its context's timeout, 30 s by default).
  /// Gloo's base class ignores the timeout; honouring it makes a peer that never arrives fail
  /// connectFullMesh in that time rather than the store's (300 s by default).
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }

  const rdzv::Store& store() const noexcept { return store_; }

 private:
  const rdzv::Store& store_;
};

/// A Gloo context of this round, connected to every other member (full mesh) through the
/// round's store: rank and size are the round's. `timeout` bounds the connection and is the
/// context's timeout for its collectives afterwards (Gloo's default is 30 s). Every member of
/// the round must call it, with the same round; it returns when all are connected.
inline std::shared_ptr<::gloo::rendezvous::Context> connect_gloo(
    const RoundInfo& round, const rdzv::Store& store,
    std::shared_ptr<::gloo::transport::Device> device,
    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto context = std::make_shared<::gloo::rendezvous::Context>(static_cast<int>(round.rank),
                                                               static_cast<int>(round.world_size));
  context->setTimeout(timeout);
  GlooStore adapter(store);
  context->connectFullMesh(adapter, device);
  return context;
}

}  // namespace rdzv

#endif  // RDZV_GLOO_HPP
