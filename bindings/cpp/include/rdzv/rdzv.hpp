// rdzv.hpp: header-only C++17 binding of the rdzv C ABI (include/rdzv.h).
//
// One RAII, move-only class per C handle (Params, Rendezvous, Store, Admin), each a
// std::unique_ptr with the handle's own _free function as deleter. Every failing call throws an exception
// derived from rdzv::Error whose type matches the C status (ClosedError for RDZV_ERR_CLOSED,
// ...); the rdzv_error_t the call returned is always freed before the throw.
//
// Thread-safety is the C library's: Rendezvous, Store and Admin may be used from several
// threads at once (one next() per Rendezvous and one watch_next() per Admin at a time);
// cancel(), shutdown() and set_closed() may be called from another thread to wake a blocked
// next(), Store::cancel() its blocked waits and Admin::cancel() a blocked watch_next(). A
// handle's cancel() is never lost: it ends the calls in progress, or, if none is, the next one
// to start (the C library keeps it: rdzv_cancel). For a cancel of your own, pass a CancelToken
// as the last argument of any call that talks to etcd. Params must not be changed while it is
// being read. Destroying a handle while another
// thread uses it is undefined, as in C: call shutdown() and join the other threads first.
//
// heartbeat(), section_begin()/section_end(), the RAII Section and is_monitored() feed `rdzv run`'s
// hang monitor; outside it they do nothing (see "Progress" below).
//
// A moved-from object holds no handle; calls on it throw ShutdownError, as calls on a closed
// handle do in every binding. A Store's calls throw ShutdownError once its Rendezvous is shut
// down or destroyed: keep the Rendezvous alive while its stores are used.

#ifndef RDZV_RDZV_HPP
#define RDZV_RDZV_HPP

#include <rdzv.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace rdzv {

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// The status's name ("RDZV_ERR_TIMEOUT"; "RDZV_ERR_UNKNOWN" for a value that is not a status).
inline std::string status_name(rdzv_status_t status) {
  return rdzv_status_name(static_cast<int32_t>(status));
}

/// Base of every exception thrown by rdzv. what() is "RDZV_ERR_...: message".
class Error : public std::runtime_error {
 public:
  Error(rdzv_status_t status, const std::string& message)
      : std::runtime_error(status_name(status) + ": " + message),
        status_(status),
        message_(message) {}

  /// The C status code (never RDZV_OK).
  rdzv_status_t status() const noexcept { return status_; }
  /// The library's message, without the status name.
  const std::string& message() const noexcept { return message_; }

 private:
  rdzv_status_t status_;
  std::string message_;
};

// Names match the Rust/Python error family (torch's Rendezvous*Error where one exists).
#define RDZV_HPP_DEFINE_ERROR(Name)                                                      \
  class Name : public Error {                                                            \
   public:                                                                               \
    Name(rdzv_status_t status, const std::string& message) : Error(status, message) {}   \
  };
RDZV_HPP_DEFINE_ERROR(InvalidArgumentError)
RDZV_HPP_DEFINE_ERROR(ClosedError)
RDZV_HPP_DEFINE_ERROR(TimeoutError)
RDZV_HPP_DEFINE_ERROR(ConnectionError)
RDZV_HPP_DEFINE_ERROR(StateError)
RDZV_HPP_DEFINE_ERROR(GracefulExitError)
RDZV_HPP_DEFINE_ERROR(ShutdownError)
RDZV_HPP_DEFINE_ERROR(InternalError)
RDZV_HPP_DEFINE_ERROR(CancelledError)
#undef RDZV_HPP_DEFINE_ERROR

namespace detail {

/// Throws the exception matching `status`. Unknown codes (from a newer library) are Error.
[[noreturn]] inline void throw_status(rdzv_status_t status, const std::string& message) {
  switch (status) {
    case RDZV_ERR_INVALID_ARGUMENT: throw InvalidArgumentError(status, message);
    case RDZV_ERR_CLOSED: throw ClosedError(status, message);
    case RDZV_ERR_TIMEOUT: throw TimeoutError(status, message);
    case RDZV_ERR_CONNECTION: throw ConnectionError(status, message);
    case RDZV_ERR_STATE: throw StateError(status, message);
    case RDZV_ERR_GRACEFUL_EXIT: throw GracefulExitError(status, message);
    case RDZV_ERR_SHUTDOWN: throw ShutdownError(status, message);
    case RDZV_ERR_INTERNAL: throw InternalError(status, message);
    case RDZV_ERR_CANCELLED: throw CancelledError(status, message);
    default: throw Error(status, message);
  }
}

/// Owns the rdzv_error_t a call may produce; check() frees it and throws on failure.
class ErrorSlot {
 public:
  ErrorSlot() = default;
  ErrorSlot(const ErrorSlot&) = delete;
  ErrorSlot& operator=(const ErrorSlot&) = delete;
  ~ErrorSlot() { rdzv_error_free(err_); }

  rdzv_error_t** out() noexcept { return &err_; }

  void check(rdzv_status_t status) {
    if (status == RDZV_OK) return;
    // The message is copied before the error is freed (by the destructor, during unwinding).
    std::string message = err_ != nullptr ? rdzv_error_message(err_) : "";
    throw_status(status, message);
  }

 private:
  rdzv_error_t* err_ = nullptr;
};

/// Calls `fn(rdzv_error_t**)` and throws if it did not return RDZV_OK.
template <class Fn>
void call(Fn&& fn) {
  ErrorSlot slot;
  slot.check(fn(slot.out()));
}

[[noreturn]] inline void throw_empty(const char* what) {
  throw ShutdownError(RDZV_ERR_SHUTDOWN, std::string(what) + " holds no handle (moved from)");
}

struct ParamsDeleter {
  void operator()(rdzv_params_t* p) const noexcept { rdzv_params_free(p); }
};
struct RendezvousDeleter {
  void operator()(rdzv_t* p) const noexcept { rdzv_free(p); }
};
struct StoreDeleter {
  void operator()(rdzv_store_t* p) const noexcept { rdzv_store_free(p); }
};
struct AdminDeleter {
  void operator()(rdzv_admin_t* p) const noexcept { rdzv_admin_free(p); }
};
struct RunStatusDeleter {
  void operator()(rdzv_run_status_t* p) const noexcept { rdzv_run_status_free(p); }
};
struct CancelTokenDeleter {
  void operator()(rdzv_cancel_token_t* p) const noexcept { rdzv_cancel_token_free(p); }
};

/// A library-owned string as std::string ("" for NULL).
inline std::string str(const char* s) { return s != nullptr ? std::string(s) : std::string(); }

/// Frees a library-owned buffer at scope exit.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { rdzv_bytes_free(data, len); }
  template <class T>
  T to() const {
    return data == nullptr ? T() : T(data, data + len);
  }
  uint8_t* data = nullptr;
  size_t len = 0;
};

/// A duration as C timeout milliseconds: <= 0 is "do not wait", fractions round up, and huge
/// values (e.g. hours::max()) saturate instead of overflowing; the library caps at one year.
template <class Rep, class Period>
int64_t timeout_ms(std::chrono::duration<Rep, Period> d) {
  const double ms = std::chrono::duration<double, std::milli>(d).count();
  if (!(ms > 0)) return 0;
  constexpr double kCap = 1e15;  // ~31,700 years: far above the library's cap, far below 2^63.
  return ms >= kCap ? static_cast<int64_t>(kCap) : static_cast<int64_t>(std::ceil(ms));
}

constexpr int64_t kStoreDefaultTimeout = -1;

/// Byte views over std::string, std::string_view and std::vector<uint8_t>.
inline const uint8_t* bytes_of(std::string_view s) noexcept {
  return reinterpret_cast<const uint8_t*>(s.data());
}
inline const uint8_t* bytes_of(const std::vector<uint8_t>& v) noexcept { return v.data(); }

/// NUL-terminated pointers to `keys`, valid while `keys` lives.
inline std::vector<const char*> c_keys(const std::vector<std::string>& keys) {
  std::vector<const char*> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(k.c_str());
  return out;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Params
// ---------------------------------------------------------------------------------------------

/// Parameters of a rendezvous (torch's RendezvousParameters).
class Params {
 public:
  /// From explicit values: backend "etcd-v3" (or "etcd"), endpoints "HOST:PORT[,HOST:PORT]",
  /// a non-empty run id and 1 <= min_nodes <= max_nodes.
  Params(const std::string& backend, const std::string& endpoints, const std::string& run_id,
         uint32_t min_nodes, uint32_t max_nodes) {
    rdzv_params_t* out = nullptr;
    detail::call([&](rdzv_error_t** e) {
      return rdzv_params_new(backend.c_str(), endpoints.c_str(), run_id.c_str(), min_nodes,
                             max_nodes, &out, e);
    });
    ptr_.reset(out);
  }

  /// From `etcd://HOST:PORT[,HOST:PORT...]/RUN_ID?name=value&...`.
  static Params from_url(const std::string& url) {
    rdzv_params_t* out = nullptr;
    detail::call([&](rdzv_error_t** e) { return rdzv_params_from_url(url.c_str(), &out, e); });
    return Params(out);
  }

  /// Sets one option (see rdzv_params_set for names). Returns *this for chaining.
  Params& set(const std::string& name, const std::string& value) {
    detail::call([&](rdzv_error_t** e) {
      return rdzv_params_set(checked(), name.c_str(), value.c_str(), e);
    });
    return *this;
  }

  Params(Params&&) noexcept = default;
  Params& operator=(Params&&) noexcept = default;
  Params(const Params&) = delete;
  Params& operator=(const Params&) = delete;

  /// The C handle, still owned by this object (NULL if moved from).
  const rdzv_params_t* raw() const noexcept { return ptr_.get(); }
  rdzv_params_t* raw() noexcept { return ptr_.get(); }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

  /// The C handle; throws ShutdownError if this object was moved from.
  rdzv_params_t* checked() const {
    if (!ptr_) detail::throw_empty("rdzv::Params");
    return ptr_.get();
  }

 private:
  explicit Params(rdzv_params_t* raw) noexcept : ptr_(raw) {}
  std::unique_ptr<rdzv_params_t, detail::ParamsDeleter> ptr_;
};

/// The version of the loaded C library ("MAJOR.MINOR.PATCH").
inline std::string version() { return rdzv_version(); }

/// Receives the library's log records: level, the module that made the record
/// ("rdzv::rendezvous"), and the line (message, then run=, node=, round= ... fields). Which
/// records exist is set by the RDZV_LOG environment variable (default: warnings only).
using LogHandler = std::function<void(rdzv_log_level_t, std::string_view target, std::string_view line)>;

namespace detail {
inline std::unique_ptr<LogHandler>& log_handler_slot() {
  static std::unique_ptr<LogHandler> slot;
  return slot;
}
inline std::mutex& log_handler_mutex() {
  static std::mutex m;
  return m;
}
inline void log_trampoline(rdzv_log_level_t level, const char* target, const char* line,
                           void* user_data) noexcept {
  try {
    (*static_cast<LogHandler*>(user_data))(level, target, line);
  } catch (...) {  // an exception must not unwind into the library
  }
}
}  // namespace detail

/// Routes the library's log records to `handler`. An empty function goes back to stderr. It is
/// called on the thread that made the record (a library thread, or one inside an rdzv call),
/// possibly on several at once, before that code goes on, so one node's records arrive in
/// order. It may call rdzv, but not set_log_handler (which frees the function that is
/// running); records made on its own thread while it runs are dropped, and so is an exception
/// it throws. When this returns, the previous handler is no longer running and never called.
inline void set_log_handler(LogHandler handler) {
  std::lock_guard<std::mutex> lock(detail::log_handler_mutex());
  auto next = handler ? std::make_unique<LogHandler>(std::move(handler)) : nullptr;
  rdzv_set_log_handler(next ? &detail::log_trampoline : nullptr, next.get());
  detail::log_handler_slot() = std::move(next);  // the old one is finished with: free it
}

// ---------------------------------------------------------------------------------------------
// In-process restart: a worker's side of `rdzv run --in-process-restart`
// ---------------------------------------------------------------------------------------------
//
// When a round ends because the membership changed, the launcher asks each healthy worker to
// leave its training loop instead of stopping it:
//
//   for (;;) {
//     rdzv::inprocess::Round round = rdzv::inprocess::next();  // and RANK, ... in the environment
//     setup(round);
//     while (!done && !rdzv::inprocess::check()) step();
//     teardown();                                              // abort the communicators
//     if (done) break;
//   }
namespace inprocess {

/// A worker's place in a round: what torchrun gives a new worker process.
struct Round {
  uint32_t rank, world_size, local_rank, local_world_size, group_rank, group_world_size,
      restart_count;
  std::string master_addr;
  uint16_t master_port;
};

/// Whether this process runs under `rdzv run --in-process-restart`. Never throws.
inline bool enabled() noexcept { return rdzv_inprocess_enabled(); }

/// Whether the launcher asks this worker to leave its training loop (one stat a call: call it
/// every step). False outside `--in-process-restart`. Never throws; safe from any thread.
inline bool check() noexcept { return rdzv_inprocess_check(); }

/// Answers a pending leave, then waits up to `timeout` (negative: no bound) for the next round
/// and sets its variables in the environment (setenv: while no other thread reads it). The
/// first call returns the first round at once. Throws TimeoutError when none came,
/// InvalidArgumentError outside `--in-process-restart`.
inline Round next(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
  rdzv_inprocess_round_t r;
  detail::call([&](rdzv_error_t** e) {
    return rdzv_inprocess_next(static_cast<int64_t>(timeout.count()), &r, e);
  });
  return Round{r.rank,        r.world_size,       r.local_rank,    r.local_world_size,
               r.group_rank,  r.group_world_size, r.restart_count, std::string(r.master_addr),
               r.master_port};
}

}  // namespace inprocess

// ---------------------------------------------------------------------------------------------
// Progress: heartbeats and sections, for `rdzv run`'s hang monitor
// ---------------------------------------------------------------------------------------------
//
// Under `rdzv run` each call is a few stores to a page the launcher reads (tens of
// nanoseconds, no system call); outside it (no RDZV_PROGRESS_FILE) every call returns at once,
// but names and steps are still checked, so a bad one is found before a real run. The page is
// mapped on the process's first progress call. All of these are safe from any thread; sections
// are the process's, not a thread's.

/// One heartbeat: the worker made progress (call it once per training step). Never throws.
inline void heartbeat() noexcept { rdzv_heartbeat(); }

/// Pauses hang monitoring of this process until its next heartbeat or section: for work
/// without steps that may outlast the hang timeout (a final checkpoint, an evaluation, the
/// program's end). exit() pauses by itself. Never throws.
inline void progress_pause() noexcept { rdzv_progress_pause(); }

/// A heartbeat that also says which step the worker reached (a global iteration that goes on
/// from a checkpoint across restarts). Throws InvalidArgumentError for a negative step.
inline void heartbeat(int64_t step) {
  detail::call([&](rdzv_error_t** e) { return rdzv_heartbeat_step(step, e); });
}

namespace detail {
/// A section name as C wants it; a NUL inside would cut the name short, so it is refused here.
inline const char* section_name(const std::string& name) {
  if (name.find('\0') != std::string::npos)
    throw InvalidArgumentError(RDZV_ERR_INVALID_ARGUMENT, "section name: contains a NUL byte");
  return name.c_str();
}
}  // namespace detail

/// Opens the section `name` (1 to 39 bytes of UTF-8): `rdzv run --section-timeout name=SECONDS`
/// runs until section_end(name). Sections nest. Throws InvalidArgumentError for a bad name.
inline void section_begin(const std::string& name) {
  const char* c = detail::section_name(name);
  detail::call([&](rdzv_error_t** e) { return rdzv_section_begin(c, e); });
}

/// Closes the innermost open section called `name` and records how long it took. Throws
/// InvalidArgumentError for a bad name, and under `rdzv run` when no such section is open.
inline void section_end(const std::string& name) {
  const char* c = detail::section_name(name);
  detail::call([&](rdzv_error_t** e) { return rdzv_section_end(c, e); });
}

/// Whether this process runs under `rdzv run`'s progress monitoring (its calls are seen).
inline bool is_monitored() noexcept { return rdzv_is_monitored(); }

/// Tells `rdzv run` which signal makes this process write its threads' stacks to the file named
/// by RDZV_STACKS_FILE; 0 takes it back. Only for a process that installed such a handler: the
/// launcher sends the signal to a hung worker, whose default action would otherwise end it.
inline void set_stack_signal(int signal) {
  detail::call([&](rdzv_error_t** e) { return rdzv_set_stack_signal(signal, e); });
}

/// A section open for the object's lifetime: the constructor opens it (and throws as
/// section_begin does), the destructor closes it and never throws. end() closes it early and
/// throws on failure. Move-only; a moved-from Section closes nothing.
///
///   for (...) { rdzv::Section step("step"); forward(); backward(); rdzv::heartbeat(i); }
class Section {
 public:
  explicit Section(std::string name) : name_(std::move(name)) {
    section_begin(name_);
    open_ = true;
  }
  ~Section() { end_quietly(); }

  Section(Section&& other) noexcept
      : name_(std::move(other.name_)), open_(std::exchange(other.open_, false)) {}
  Section& operator=(Section&& other) noexcept {
    if (this != &other) {
      end_quietly();
      name_ = std::move(other.name_);
      open_ = std::exchange(other.open_, false);
    }
    return *this;
  }
  Section(const Section&) = delete;
  Section& operator=(const Section&) = delete;

  /// Closes the section now (the destructor then does nothing); throws as section_end does.
  void end() {
    if (!open_) return;
    open_ = false;
    section_end(name_);
  }

  const std::string& name() const noexcept { return name_; }
  /// Whether this object still has its section open.
  bool is_open() const noexcept { return open_; }

 private:
  void end_quietly() noexcept {
    if (!open_) return;
    open_ = false;
    rdzv_error_t* err = nullptr;
    rdzv_section_end(name_.c_str(), &err);  // a destructor must not throw: a failure is dropped
    rdzv_error_free(err);
  }

  std::string name_;
  bool open_ = false;
};

// ---------------------------------------------------------------------------------------------
// Cancel tokens
// ---------------------------------------------------------------------------------------------

/// A cancel that cannot be lost: pass it to any call that talks to etcd (next(), a store's
/// get() or set(), num_lost(), watch_next(), status(), ...), and cancel() it from any thread to
/// end them with CancelledError, promptly whatever etcd is doing. It stays cancelled, so a call made
/// with it afterwards throws CancelledError at once: cancelling just before another thread
/// enters the call is no race. Copies share one token (copy it into the thread that cancels);
/// the last copy frees it, and a call holds its own reference while it runs. cancel() never
/// blocks and is safe from any thread, but not from a signal handler.
class CancelToken {
 public:
  CancelToken() {
    rdzv_cancel_token_t* out = nullptr;
    detail::call([&](rdzv_error_t** e) { return rdzv_cancel_token_new(&out, e); });
    ptr_.reset(out, detail::CancelTokenDeleter());
  }

  /// Cancels the token for good: calls waiting with it throw CancelledError, later ones too.
  void cancel() const {
    detail::call([&](rdzv_error_t** e) { return rdzv_cancel_token_cancel(checked(), e); });
  }

  bool is_cancelled() const {
    bool out = false;
    detail::call([&](rdzv_error_t** e) {
      return rdzv_cancel_token_is_cancelled(checked(), &out, e);
    });
    return out;
  }

  /// The C token, still owned by this object (NULL if moved from).
  const rdzv_cancel_token_t* raw() const noexcept { return ptr_.get(); }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

  /// The C token; throws ShutdownError if this object was moved from.
  const rdzv_cancel_token_t* checked() const {
    if (!ptr_) detail::throw_empty("rdzv::CancelToken");
    return ptr_.get();
  }

 private:
  std::shared_ptr<rdzv_cancel_token_t> ptr_;
};

namespace detail {

/// The C token of an optional CancelToken (NULL: none).
inline const rdzv_cancel_token_t* token_of(const CancelToken* cancel) {
  return cancel != nullptr ? cancel->checked() : nullptr;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Store
// ---------------------------------------------------------------------------------------------

/// The store of one round (c10d Store semantics). Thread-safe. Calls without a timeout use
/// the store's default (300 s unless set_timeout() changed it); a timeout <= 0 means "do not
/// wait". Values are bytes: the std::string methods carry them unchanged (NULs included), the
/// *_bytes methods return std::vector<uint8_t>. The waits (get, wait, multi_get) end at once
/// on cancel() or a shutdown of the node and within a second of their timeout, whatever etcd
/// is doing. Every call also takes a CancelToken of your own as its last argument, which ends
/// it in the same way (a write so ended may or may not have been applied).
class Store {
 public:
  Store(Store&&) noexcept = default;
  Store& operator=(Store&&) noexcept = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// Adopts a handle returned by rdzv_next (ownership moves to this object).
  explicit Store(rdzv_store_t* raw) : ptr_(raw) {}

  // --- set ---
  void set(const std::string& key, std::string_view value) const {
    set_raw(key, detail::bytes_of(value), value.size());
  }
  void set(const std::string& key, const char* value) const {
    set(key, std::string_view(value));
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) const {
    set_raw(key, value.data(), value.size());
  }
  void set(const std::string& key, std::string_view value, const CancelToken& cancel) const {
    set_raw(key, detail::bytes_of(value), value.size(), &cancel);
  }
  void set(const std::string& key, const char* value, const CancelToken& cancel) const {
    set(key, std::string_view(value), cancel);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value,
           const CancelToken& cancel) const {
    set_raw(key, value.data(), value.size(), &cancel);
  }

  // --- get: waits for the key to be set ---
  std::string get(const std::string& key) const {
    return get_raw<std::string>(key, detail::kStoreDefaultTimeout);
  }
  template <class Rep, class Period>
  std::string get(const std::string& key, std::chrono::duration<Rep, Period> timeout) const {
    return get_raw<std::string>(key, detail::timeout_ms(timeout));
  }
  template <class Rep, class Period>
  std::string get(const std::string& key, std::chrono::duration<Rep, Period> timeout,
                  const CancelToken& cancel) const {
    return get_raw<std::string>(key, detail::timeout_ms(timeout), &cancel);
  }
  std::vector<uint8_t> get_bytes(const std::string& key) const {
    return get_raw<std::vector<uint8_t>>(key, detail::kStoreDefaultTimeout);
  }
  template <class Rep, class Period>
  std::vector<uint8_t> get_bytes(const std::string& key,
                                 std::chrono::duration<Rep, Period> timeout) const {
    return get_raw<std::vector<uint8_t>>(key, detail::timeout_ms(timeout));
  }
  template <class Rep, class Period>
  std::vector<uint8_t> get_bytes(const std::string& key, std::chrono::duration<Rep, Period> timeout,
                                 const CancelToken& cancel) const {
    return get_raw<std::vector<uint8_t>>(key, detail::timeout_ms(timeout), &cancel);
  }

  /// Atomically adds `delta` to the decimal integer at `key` (absent = 0); returns the sum.
  int64_t add(const std::string& key, int64_t delta) const { return add_raw(key, delta, nullptr); }
  int64_t add(const std::string& key, int64_t delta, const CancelToken& cancel) const {
    return add_raw(key, delta, &cancel);
  }

  /// Sets `key` to `desired` if it holds `expected` (or is absent and `expected` is empty);
  /// returns the value the key holds afterwards.
  std::string compare_set(const std::string& key, std::string_view expected,
                          std::string_view desired) const {
    return compare_set_raw<std::string>(key, detail::bytes_of(expected), expected.size(),
                                        detail::bytes_of(desired), desired.size());
  }
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired) const {
    return compare_set_raw<std::vector<uint8_t>>(key, expected.data(), expected.size(),
                                                 desired.data(), desired.size());
  }
  std::string compare_set(const std::string& key, std::string_view expected,
                          std::string_view desired, const CancelToken& cancel) const {
    return compare_set_raw<std::string>(key, detail::bytes_of(expected), expected.size(),
                                        detail::bytes_of(desired), desired.size(), &cancel);
  }
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired,
                                   const CancelToken& cancel) const {
    return compare_set_raw<std::vector<uint8_t>>(key, expected.data(), expected.size(),
                                                 desired.data(), desired.size(), &cancel);
  }

  // --- wait: until all keys exist, else TimeoutError ---
  void wait(const std::vector<std::string>& keys) const {
    wait_raw(keys, detail::kStoreDefaultTimeout);
  }
  template <class Rep, class Period>
  void wait(const std::vector<std::string>& keys,
            std::chrono::duration<Rep, Period> timeout) const {
    wait_raw(keys, detail::timeout_ms(timeout));
  }
  template <class Rep, class Period>
  void wait(const std::vector<std::string>& keys, std::chrono::duration<Rep, Period> timeout,
            const CancelToken& cancel) const {
    wait_raw(keys, detail::timeout_ms(timeout), &cancel);
  }

  /// Whether all keys exist now. Does not wait.
  bool check(const std::vector<std::string>& keys) const { return check_raw(keys, nullptr); }
  bool check(const std::vector<std::string>& keys, const CancelToken& cancel) const {
    return check_raw(keys, &cancel);
  }

  /// Deletes `key`; returns whether it existed.
  bool delete_key(const std::string& key) const { return delete_key_raw(key, nullptr); }
  bool delete_key(const std::string& key, const CancelToken& cancel) const {
    return delete_key_raw(key, &cancel);
  }

  /// Number of keys in this round's store.
  int64_t num_keys() const { return num_keys_raw(nullptr); }
  int64_t num_keys(const CancelToken& cancel) const { return num_keys_raw(&cancel); }

  // --- multi_get: waits for all keys, returns their values read at one revision ---
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) const {
    return multi_get_raw<std::string>(keys, detail::kStoreDefaultTimeout);
  }
  template <class Rep, class Period>
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     std::chrono::duration<Rep, Period> timeout) const {
    return multi_get_raw<std::string>(keys, detail::timeout_ms(timeout));
  }
  template <class Rep, class Period>
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     std::chrono::duration<Rep, Period> timeout,
                                     const CancelToken& cancel) const {
    return multi_get_raw<std::string>(keys, detail::timeout_ms(timeout), &cancel);
  }
  std::vector<std::vector<uint8_t>> multi_get_bytes(const std::vector<std::string>& keys) const {
    return multi_get_raw<std::vector<uint8_t>>(keys, detail::kStoreDefaultTimeout);
  }
  template <class Rep, class Period>
  std::vector<std::vector<uint8_t>> multi_get_bytes(
      const std::vector<std::string>& keys, std::chrono::duration<Rep, Period> timeout) const {
    return multi_get_raw<std::vector<uint8_t>>(keys, detail::timeout_ms(timeout));
  }
  template <class Rep, class Period>
  std::vector<std::vector<uint8_t>> multi_get_bytes(const std::vector<std::string>& keys,
                                                    std::chrono::duration<Rep, Period> timeout,
                                                    const CancelToken& cancel) const {
    return multi_get_raw<std::vector<uint8_t>>(keys, detail::timeout_ms(timeout), &cancel);
  }

  /// Sets keys[i] to values[i] for all i, all or nothing (beyond 128 keys, each 128 in turn,
  /// as rdzv_store_multi_set says). Sizes must match.
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) const {
    multi_set_raw(keys, values);
  }
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::vector<uint8_t>>& values) const {
    multi_set_raw(keys, values);
  }
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values,
                 const CancelToken& cancel) const {
    multi_set_raw(keys, values, &cancel);
  }
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::vector<uint8_t>>& values,
                 const CancelToken& cancel) const {
    multi_set_raw(keys, values, &cancel);
  }

  /// Ends the get(), wait() and multi_get() calls in progress on this store in other threads
  /// (they throw CancelledError), with or without a CancelToken of your own, and any that start
  /// before they have returned; with none in progress, the next one to start
  /// (rdzv_store_cancel). Never lost, never blocks; used up once a wait has thrown
  /// CancelledError because of it, and the store stays usable.
  void cancel() const {
    detail::call([&](rdzv_error_t** e) { return rdzv_store_cancel(ptr(), e); });
  }

  /// Sets the default timeout of get, wait and multi_get (must be >= 0).
  template <class Rep, class Period>
  void set_timeout(std::chrono::duration<Rep, Period> timeout) {
    // A negative duration is passed through so the library reports it as invalid.
    const int64_t ms = timeout < timeout.zero() ? -1 : detail::timeout_ms(timeout);
    rdzv_store_t* p = mut_ptr();
    detail::call([&](rdzv_error_t** e) { return rdzv_store_set_timeout(p, ms, e); });
  }

  const rdzv_store_t* raw() const noexcept { return ptr_.get(); }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

 private:
  const rdzv_store_t* ptr() const {
    if (!ptr_) detail::throw_empty("rdzv::Store");
    return ptr_.get();
  }
  rdzv_store_t* mut_ptr() {
    if (!ptr_) detail::throw_empty("rdzv::Store");
    return ptr_.get();
  }

  // Each call below passes the C token of `cancel` (NULL: none).

  void set_raw(const std::string& key, const uint8_t* data, size_t len,
               const CancelToken* cancel = nullptr) const {
    const rdzv_store_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    detail::call([&](rdzv_error_t** e) {
      return rdzv_store_set_with_cancel(p, key.c_str(), data, len, token, e);
    });
  }

  int64_t add_raw(const std::string& key, int64_t delta, const CancelToken* cancel) const {
    const rdzv_store_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    int64_t out = 0;
    detail::call([&](rdzv_error_t** e) {
      return rdzv_store_add_with_cancel(p, key.c_str(), delta, token, &out, e);
    });
    return out;
  }

  bool check_raw(const std::vector<std::string>& keys, const CancelToken* cancel) const {
    const rdzv_store_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    auto ks = detail::c_keys(keys);
    bool out = false;
    detail::call([&](rdzv_error_t** e) {
      return rdzv_store_check_with_cancel(p, ks.data(), ks.size(), token, &out, e);
    });
    return out;
  }

  bool delete_key_raw(const std::string& key, const CancelToken* cancel) const {
    const rdzv_store_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    bool deleted = false;
    detail::call([&](rdzv_error_t** e) {
      return rdzv_store_delete_key_with_cancel(p, key.c_str(), token, &deleted, e);
    });
    return deleted;
  }

  int64_t num_keys_raw(const CancelToken* cancel) const {
    const rdzv_store_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    int64_t out = 0;
    detail::call([&](rdzv_error_t** e) { return rdzv_store_num_keys_with_cancel(p, token, &out, e); });
    return out;
  }

  template <class T>
  T get_raw(const std::string& key, int64_t timeout_ms, const CancelToken* cancel = nullptr) const {
    const rdzv_store_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    detail::Buffer buf;
    detail::call([&](rdzv_error_t** e) {
      return rdzv_store_get_with_cancel(p, key.c_str(), timeout_ms, token, &buf.data, &buf.len, e);
    });
    return buf.to<T>();
  }

  template <class T>
  T compare_set_raw(const std::string& key, const uint8_t* expected, size_t expected_len,
                    const uint8_t* desired, size_t desired_len,
                    const CancelToken* cancel = nullptr) const {
    const rdzv_store_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    detail::Buffer buf;
    detail::call([&](rdzv_error_t** e) {
      return rdzv_store_compare_set_with_cancel(p, key.c_str(), expected, expected_len, desired,
                                                desired_len, token, &buf.data, &buf.len, e);
    });
    return buf.to<T>();
  }

  void wait_raw(const std::vector<std::string>& keys, int64_t timeout_ms,
                const CancelToken* cancel = nullptr) const {
    const rdzv_store_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    auto ks = detail::c_keys(keys);
    detail::call([&](rdzv_error_t** e) {
      return rdzv_store_wait_with_cancel(p, ks.data(), ks.size(), timeout_ms, token, e);
    });
  }

  template <class T>
  std::vector<T> multi_get_raw(const std::vector<std::string>& keys, int64_t timeout_ms,
                               const CancelToken* cancel = nullptr) const {
    const rdzv_store_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    auto ks = detail::c_keys(keys);
    std::vector<detail::Buffer> bufs(keys.size());
    std::vector<uint8_t*> data(keys.size(), nullptr);
    std::vector<size_t> lens(keys.size(), 0);
    detail::call([&](rdzv_error_t** e) {
      return rdzv_store_multi_get_with_cancel(p, ks.data(), ks.size(), timeout_ms, token,
                                              data.data(), lens.data(), e);
    });
    // Hand every buffer to its owner first, so none leaks if a copy below throws.
    for (size_t i = 0; i < keys.size(); ++i) {
      bufs[i].data = data[i];
      bufs[i].len = lens[i];
    }
    std::vector<T> out;
    out.reserve(keys.size());
    for (const auto& b : bufs) out.push_back(b.to<T>());
    return out;
  }

  template <class V>
  void multi_set_raw(const std::vector<std::string>& keys, const std::vector<V>& values,
                     const CancelToken* cancel = nullptr) const {
    const rdzv_store_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    if (keys.size() != values.size()) {
      throw InvalidArgumentError(RDZV_ERR_INVALID_ARGUMENT,
                                 "multi_set: " + std::to_string(keys.size()) + " keys but " +
                                     std::to_string(values.size()) + " values");
    }
    auto ks = detail::c_keys(keys);
    std::vector<const uint8_t*> vs;
    std::vector<size_t> lens;
    vs.reserve(values.size());
    lens.reserve(values.size());
    for (const auto& v : values) {
      vs.push_back(detail::bytes_of(v));
      lens.push_back(v.size());
    }
    detail::call([&](rdzv_error_t** e) {
      return rdzv_store_multi_set_with_cancel(p, ks.data(), vs.data(), lens.data(), ks.size(), token,
                                              e);
    });
  }

  std::unique_ptr<rdzv_store_t, detail::StoreDeleter> ptr_;
};

// ---------------------------------------------------------------------------------------------
// Rendezvous
// ---------------------------------------------------------------------------------------------

/// This node's place in a completed round.
struct RoundInfo {
  uint64_t round = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  std::string master_addr;
  uint16_t master_port = 0;
};

/// What next() returns: the round and its store. Works with `auto [info, store] = r.next();`.
struct Round {
  RoundInfo info;
  Store store;
};

/// One node's handle on a rendezvous. The destructor shuts the node down (revoking its lease)
/// and frees the handle; no other thread may be using it then.
class Rendezvous {
 public:
  /// Connects to etcd and registers this node (at most connect_timeout). Does not consume
  /// `params`.
  explicit Rendezvous(const Params& params) {
    rdzv_t* out = nullptr;
    detail::call([&](rdzv_error_t** e) { return rdzv_new(params.checked(), &out, e); });
    ptr_.reset(out);
  }

  Rendezvous(Rendezvous&&) noexcept = default;
  Rendezvous& operator=(Rendezvous&&) noexcept = default;
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  /// Joins the next round and blocks until this node is a member of a completed round (at
  /// most join_timeout). Throws ClosedError, GracefulExitError, TimeoutError, ShutdownError,
  /// CancelledError (cancel() from another thread, made before or during the call), ...
  Round next() { return next_raw(mut_ptr(), nullptr); }

  /// next(), which also throws CancelledError once `cancel` is cancelled (at once, joining
  /// nothing, if it already is). cancel() ends it too.
  Round next(const CancelToken& cancel) { return next_raw(mut_ptr(), cancel.checked()); }

 private:
  Round next_raw(rdzv_t* p, const rdzv_cancel_token_t* token) {
    rdzv_round_t raw{};
    rdzv_store_t* store = nullptr;
    detail::call([&](rdzv_error_t** e) {
      return rdzv_next_with_cancel(p, token, &raw, &store, e);
    });
    Store owned(store);  // owns the store before anything below can throw
    RoundInfo info;
    info.round = raw.round;
    info.rank = raw.rank;
    info.world_size = raw.world_size;
    info.master_port = raw.master_port;
    raw.master_addr[RDZV_ADDR_CAPACITY - 1] = '\0';
    info.master_addr = raw.master_addr;
    return Round{std::move(info), std::move(owned)};
  }

 public:

  // Each call below also takes a CancelToken of your own as its last argument: it throws
  // CancelledError once the token is cancelled, at once if it already is (a write so ended
  // may or may not have been applied).

  /// Whether any node has closed the run.
  bool is_closed() const { return is_closed_raw(nullptr); }
  bool is_closed(const CancelToken& cancel) const { return is_closed_raw(&cancel); }

  /// Closes the run for every node; blocked next() calls anywhere throw ClosedError.
  void set_closed() const { set_closed_raw(nullptr); }
  void set_closed(const CancelToken& cancel) const { set_closed_raw(&cancel); }

  /// Nodes waiting for a round after this node's last one (non-zero: call next()).
  uint32_t num_waiting() const { return num_waiting_raw(nullptr); }
  uint32_t num_waiting(const CancelToken& cancel) const { return num_waiting_raw(&cancel); }

  /// Members of this node's last round whose lease expired (non-zero: call next()).
  uint32_t num_lost() const { return num_lost_raw(nullptr); }
  uint32_t num_lost(const CancelToken& cancel) const { return num_lost_raw(&cancel); }

  /// Ends the next() in progress in another thread (it throws CancelledError), with or without
  /// a CancelToken of your own, or, if none is, the next one to start: a cancel just before
  /// another thread enters next() is not lost (rdzv_cancel). Used up once a next() has thrown
  /// CancelledError because of it; the handle stays usable. Never blocks.
  void cancel() const {
    detail::call([&](rdzv_error_t** e) { return rdzv_cancel(ptr(), e); });
  }

  /// Releases this node (wakes a blocked next(), revokes the lease). Idempotent; later calls
  /// throw ShutdownError. Does not close the run for the others.
  /// Not const: the handle changes (it is shut down). Safe from any thread.
  void shutdown() {
    rdzv_t* p = mut_ptr();
    detail::call([&](rdzv_error_t** e) { return rdzv_shutdown(p, e); });
  }

  /// Marks this node as leaving the run (a planned departure, e.g. on a preemption notice),
  /// as Admin::drain() does for any node: the other members count it in num_lost() at once
  /// and re-form without it, and this node's next() throws GracefulExitError. Does not close
  /// the run. `reason` is shown in that error and in logs.
  void drain(const std::string& reason = "") { drain_raw(reason, nullptr); }
  void drain(const std::string& reason, const CancelToken& cancel) { drain_raw(reason, &cancel); }

  /// Whether this node was drained (by drain(), an operator or a scheduler): its agent should
  /// stop its workers and leave. One etcd read.
  bool is_draining() const { return is_draining_raw(nullptr); }
  bool is_draining(const CancelToken& cancel) const { return is_draining_raw(&cancel); }

  std::string run_id() const { return rdzv_run_id(ptr()); }
  std::string backend() const { return rdzv_backend(ptr()); }
  /// Hex digits, unique per handle.
  std::string node_id() const { return rdzv_node_id(ptr()); }

  const rdzv_t* raw() const noexcept { return ptr_.get(); }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

 private:
  const rdzv_t* ptr() const {
    if (!ptr_) detail::throw_empty("rdzv::Rendezvous");
    return ptr_.get();
  }
  rdzv_t* mut_ptr() {
    if (!ptr_) detail::throw_empty("rdzv::Rendezvous");
    return ptr_.get();
  }

  bool is_closed_raw(const CancelToken* cancel) const {
    const rdzv_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    bool out = false;
    detail::call([&](rdzv_error_t** e) { return rdzv_is_closed_with_cancel(p, token, &out, e); });
    return out;
  }
  void set_closed_raw(const CancelToken* cancel) const {
    const rdzv_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    detail::call([&](rdzv_error_t** e) { return rdzv_set_closed_with_cancel(p, token, e); });
  }
  uint32_t num_waiting_raw(const CancelToken* cancel) const {
    const rdzv_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    uint32_t out = 0;
    detail::call([&](rdzv_error_t** e) { return rdzv_num_waiting_with_cancel(p, token, &out, e); });
    return out;
  }
  uint32_t num_lost_raw(const CancelToken* cancel) const {
    const rdzv_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    uint32_t out = 0;
    detail::call([&](rdzv_error_t** e) { return rdzv_num_lost_with_cancel(p, token, &out, e); });
    return out;
  }
  void drain_raw(const std::string& reason, const CancelToken* cancel) {
    rdzv_t* p = mut_ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    detail::call([&](rdzv_error_t** e) {
      return rdzv_drain_with_cancel(p, reason.c_str(), token, e);
    });
  }
  bool is_draining_raw(const CancelToken* cancel) const {
    const rdzv_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    bool out = false;
    detail::call([&](rdzv_error_t** e) { return rdzv_is_draining_with_cancel(p, token, &out, e); });
    return out;
  }

  std::unique_ptr<rdzv_t, detail::RendezvousDeleter> ptr_;
};

// ---------------------------------------------------------------------------------------------
// Admin
// ---------------------------------------------------------------------------------------------

/// A member of the sealed round.
struct Member {
  uint32_t rank = 0;
  std::string node_id;
  /// The address it registered; "" when it is not alive.
  std::string addr;
  /// Its lease is live. A member that is not alive is lost: the survivors re-form without it.
  bool alive = false;
  /// It was drained (a planned departure): the survivors re-form without it at once.
  bool draining = false;
};

/// A node that joined the round open for joining.
struct Joiner {
  std::string node_id;
  std::string addr;
  /// Its rank in the sealed round if it was a member (a re-rendezvous is under way); empty
  /// for a newcomer waiting to be admitted.
  std::optional<uint32_t> member_rank;
  /// It was drained: it will not be sealed into a round.
  bool draining = false;
};

/// A run as an operator sees it, read at one etcd revision (a consistent snapshot even while
/// rounds form). A run that does not exist (never started, finished and cleaned up, or purged)
/// has `exists` false and is otherwise empty; that is not an error.
struct RunStatus {
  std::string run_id;
  bool exists = false;
  /// The run was closed (the marker lasts `retention`).
  bool closed = false;
  /// The round open for joining.
  uint64_t open_round = 0;
  /// The last sealed round (the one the members are running), if one is recorded.
  std::optional<uint64_t> sealed_round;
  /// Rank 0's bootstrap address and port (MASTER_ADDR/MASTER_PORT); "" and 0 without a
  /// sealed round.
  std::string master_addr;
  uint16_t master_port = 0;
  /// The sealed round's members, in rank order.
  std::vector<Member> members;
  /// Nodes that joined the open round, in arrival order: newcomers waiting to be admitted,
  /// and members already re-joining during a re-rendezvous.
  std::vector<Joiner> waiting;
  /// Members of the sealed round that are not alive.
  size_t num_lost = 0;
  /// Members of the sealed round that are alive but drained.
  size_t num_draining = 0;
  /// Live nodes of the run: members, waiting nodes and spares alike.
  size_t num_alive = 0;
  /// The etcd revision the status was read at; watch_next() gives increasing revisions.
  int64_t revision = 0;

  /// Members of the sealed round whose lease has expired.
  std::vector<Member> lost() const {
    std::vector<Member> out;
    for (const auto& m : members)
      if (!m.alive) out.push_back(m);
    return out;
  }

  /// Members of the sealed round that are alive but drained (leaving).
  std::vector<Member> draining() const {
    std::vector<Member> out;
    for (const auto& m : members)
      if (m.alive && m.draining) out.push_back(m);
    return out;
  }
};

/// What Admin::purge() did: `deleted` keys, or nothing because `refused_alive` nodes of the run
/// are alive.
struct PurgeResult {
  int64_t deleted = 0;
  uint32_t refused_alive = 0;
  bool refused() const noexcept { return refused_alive > 0; }
};

namespace detail {

/// Copies a status and frees it (also when a copy throws).
inline RunStatus take_status(rdzv_run_status_t* raw) {
  std::unique_ptr<rdzv_run_status_t, RunStatusDeleter> owned(raw);
  RunStatus out;
  out.run_id = str(raw->run_id);
  out.exists = raw->exists;
  out.closed = raw->closed;
  out.open_round = raw->open_round;
  if (raw->has_sealed) out.sealed_round = raw->sealed_round;
  out.master_addr = str(raw->master_addr);
  out.master_port = raw->master_port;
  // The arrays are read only up to their counts: an empty one may point anywhere.
  out.members.reserve(raw->num_members);
  for (size_t i = 0; i < raw->num_members; ++i) {
    const rdzv_member_t& m = raw->members[i];
    out.members.push_back(Member{m.rank, str(m.node_id), str(m.addr), m.alive, m.draining});
  }
  out.waiting.reserve(raw->num_waiting);
  for (size_t i = 0; i < raw->num_waiting; ++i) {
    const rdzv_joiner_t& j = raw->waiting[i];
    Joiner joiner{str(j.node_id), str(j.addr), std::nullopt, j.draining};
    if (j.member_rank >= 0) joiner.member_rank = static_cast<uint32_t>(j.member_rank);
    out.waiting.push_back(std::move(joiner));
  }
  out.num_lost = raw->num_lost;
  out.num_draining = raw->num_draining;
  out.num_alive = raw->num_alive;
  out.revision = raw->revision;
  return out;
}

}  // namespace detail

/// An operator's or scheduler's handle on one run (named by the run id and key prefix of its
/// Params; min_nodes and max_nodes do not matter here). It never joins the run: it holds no
/// lease, so it is never counted, waited for or sealed into a round. Thread-safe, except that
/// one watch_next() runs at a time per handle; cancel() from another thread wakes it. Status
/// and watch need read access to the run's prefix in etcd; close_run(), purge() and drain()
/// need write access. The destructor frees the handle and does not affect the run; no other
/// thread may be using it then (cancel() and join a watching thread first).
class Admin {
 public:
  /// Connects to etcd (at most connect_timeout) and registers nothing. Does not consume
  /// `params`.
  explicit Admin(const Params& params) {
    rdzv_admin_t* out = nullptr;
    detail::call([&](rdzv_error_t** e) { return rdzv_admin_new(params.checked(), &out, e); });
    ptr_.reset(out);
  }

  Admin(Admin&&) noexcept = default;
  Admin& operator=(Admin&&) noexcept = default;
  Admin(const Admin&) = delete;
  Admin& operator=(const Admin&) = delete;

  // Each call below also takes a CancelToken of your own as its last argument: it throws
  // CancelledError once the token is cancelled, at once if it already is (a write so ended
  // may or may not have been applied).

  /// The run's status now (two or three etcd reads, at most connect_timeout).
  RunStatus status() const { return status_raw(nullptr); }
  RunStatus status(const CancelToken& cancel) const { return status_raw(&cancel); }

  /// The run's current status on the handle's first call; after that, waits for the next
  /// change an operator would see (a join, a seal, a loss, a drain, a close; not the workers'
  /// store traffic) and returns the new status, so successive calls return every change in
  /// order. Empty when nothing changed within `timeout`: nothing is lost, the next call goes
  /// on from there. Throws CancelledError when cancel() is called from another thread,
  /// ConnectionError when etcd stays unreachable for connect_timeout (call again to resume),
  /// InvalidArgumentError for a negative timeout or when another watch_next() is running.
  template <class Rep, class Period>
  std::optional<RunStatus> watch_next(std::chrono::duration<Rep, Period> timeout) const {
    return watch_raw(ptr(), timeout, nullptr);
  }

  /// watch_next(), which also throws CancelledError once `cancel` is cancelled (at once if it
  /// already is). cancel() ends it too.
  template <class Rep, class Period>
  std::optional<RunStatus> watch_next(std::chrono::duration<Rep, Period> timeout,
                                      const CancelToken& cancel) const {
    return watch_raw(ptr(), timeout, cancel.checked());
  }

  /// Ends the watch_next() in progress in another thread (it throws CancelledError), with or
  /// without a CancelToken of your own, or, if none is, the next one to start: never lost
  /// (rdzv_admin_cancel). Used up once a watch_next() has thrown CancelledError because of
  /// it; the handle stays usable and its watch loses nothing. Never blocks.
  void cancel() const {
    detail::call([&](rdzv_error_t** e) { return rdzv_admin_cancel(ptr(), e); });
  }

  /// Closes the run for every node, as Rendezvous::set_closed() does: blocked and later
  /// next() calls throw ClosedError.
  void close_run() const { close_run_raw(nullptr); }
  void close_run(const CancelToken& cancel) const { close_run_raw(&cancel); }

  /// Deletes every key of the run (rounds, stores, round counter, closed marker), so its id
  /// can be used again at once. While any node of the run is alive it deletes nothing and says
  /// how many are (refused_alive), unless `force`, which leaves running nodes without their
  /// keys (they fail). The check and the delete are one transaction.
  PurgeResult purge(bool force = false) const { return purge_raw(force, nullptr); }
  PurgeResult purge(bool force, const CancelToken& cancel) const { return purge_raw(force, &cancel); }

  /// Marks node `node_id` (a Rendezvous's node_id(), or as the status names it) as leaving the
  /// run: a planned departure (preemption notice, maintenance, scale-down). The other members
  /// count it in num_lost() at once and re-form without it; its own next() throws
  /// GracefulExitError and its is_draining() turns true. Does not close the run. `reason` is
  /// shown to the node and in logs. Throws InvalidArgumentError naming the node if it is not a
  /// live node of the run.
  void drain(const std::string& node_id, const std::string& reason = "") const {
    drain_raw(node_id, reason, nullptr);
  }
  void drain(const std::string& node_id, const std::string& reason,
             const CancelToken& cancel) const {
    drain_raw(node_id, reason, &cancel);
  }

  const rdzv_admin_t* raw() const noexcept { return ptr_.get(); }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

 private:
  const rdzv_admin_t* ptr() const {
    if (!ptr_) detail::throw_empty("rdzv::Admin");
    return ptr_.get();
  }

  RunStatus status_raw(const CancelToken* cancel) const {
    const rdzv_admin_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    rdzv_run_status_t* out = nullptr;
    detail::call([&](rdzv_error_t** e) { return rdzv_admin_status_with_cancel(p, token, &out, e); });
    return detail::take_status(out);
  }
  void close_run_raw(const CancelToken* cancel) const {
    const rdzv_admin_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    detail::call([&](rdzv_error_t** e) { return rdzv_admin_close_with_cancel(p, token, e); });
  }
  PurgeResult purge_raw(bool force, const CancelToken* cancel) const {
    const rdzv_admin_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    PurgeResult out;
    detail::call([&](rdzv_error_t** e) {
      return rdzv_admin_purge_with_cancel(p, force, token, &out.deleted, &out.refused_alive, e);
    });
    return out;
  }
  void drain_raw(const std::string& node_id, const std::string& reason,
                 const CancelToken* cancel) const {
    const rdzv_admin_t* p = ptr();
    const rdzv_cancel_token_t* token = detail::token_of(cancel);
    detail::call([&](rdzv_error_t** e) {
      return rdzv_admin_drain_with_cancel(p, node_id.c_str(), reason.c_str(), token, e);
    });
  }

  template <class Rep, class Period>
  static std::optional<RunStatus> watch_raw(const rdzv_admin_t* p,
                                            std::chrono::duration<Rep, Period> timeout,
                                            const rdzv_cancel_token_t* token) {
    // A negative duration is passed through so the library reports it as invalid.
    const int64_t ms = timeout < timeout.zero() ? -1 : detail::timeout_ms(timeout);
    rdzv_run_status_t* out = nullptr;
    detail::ErrorSlot slot;
    const rdzv_status_t status = rdzv_admin_watch_with_cancel(p, ms, token, &out, slot.out());
    if (status == RDZV_ERR_TIMEOUT) return std::nullopt;  // nothing changed: not a failure
    slot.check(status);
    return detail::take_status(out);
  }

  std::unique_ptr<rdzv_admin_t, detail::AdminDeleter> ptr_;
};

}  // namespace rdzv

#endif  // RDZV_RDZV_HPP
