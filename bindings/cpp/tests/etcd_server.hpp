// Test fixture: a real etcd, started by the repository's etcd-test-server program (the Rust
// tests' own etcd, as a program: tests/fixtures/etcd-test-server.rs, built by `cargo build`;
// RDZV_ETCD_TEST_SERVER names another copy), which says the endpoint once etcd is ready, ends
// etcd and its data when this process closes its input or dies, and removes what killed
// earlier runs left. A test can crash the server (kill), freeze it (signal(SIGSTOP)) and start
// it again on the same ports and data (restart).
#ifndef RDZV_TESTS_ETCD_SERVER_HPP
#define RDZV_TESTS_ETCD_SERVER_HPP

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

extern char** environ;

namespace rdzv_test {

/// A loopback port free a moment ago (for a URL where nothing must listen).
inline uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("could not bind a free port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

class EtcdServer {
 public:
  /// Waits at most `ready_timeout` for each answer of the program (it tries etcd up to 3 times,
  /// 30 s each).
  explicit EtcdServer(std::chrono::seconds ready_timeout = std::chrono::seconds(100)) {
    const char* env = std::getenv("RDZV_ETCD_TEST_SERVER");
    const std::string program = env != nullptr ? env : RDZV_ETCD_TEST_SERVER;
    // One socket for its stdin and stdout: a write to a program that died fails (MSG_NOSIGNAL)
    // instead of killing this process with SIGPIPE.
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw std::runtime_error("socketpair failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, sv[1], 0);
    posix_spawn_file_actions_adddup2(&actions, sv[1], 1);
    char* argv[] = {const_cast<char*>(program.c_str()), nullptr};
    const int err = ::posix_spawn(&pid_, program.c_str(), &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(sv[1]);
    fd_ = sv[0];
    if (err != 0) {
      close_and_reap();
      throw std::runtime_error("could not start " + program + " (`cargo build` builds it): " +
                               std::strerror(err));
    }
    try {
      ready(answer(ready_timeout));
    } catch (...) {
      close_and_reap();
      throw;
    }
  }

  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;
  ~EtcdServer() { close_and_reap(); }

  std::string endpoint() const { return endpoint_; }

  /// A rendezvous URL on this server whose run id is unique in this process.
  std::string url(const std::string& run, const std::string& query = "") const {
    static std::atomic<int> seq{0};
    std::string u = "etcd://" + endpoint() + "/" + run + "-" + std::to_string(::getpid()) + "-" +
                    std::to_string(seq++);
    return query.empty() ? u : u + "?" + query;
  }

  /// SIGKILL, as a crash would; the data stays for restart().
  void kill() { expect_ok(ask("kill", std::chrono::seconds(30))); }

  /// Sends `sig` to etcd: SIGSTOP freezes it (connections stay open, nothing answers),
  /// SIGCONT resumes it.
  void signal(int sig) { expect_ok(ask("signal " + std::to_string(sig), std::chrono::seconds(30))); }

  /// Starts etcd again (after kill(), or killing it first) on the same ports and data.
  void restart(std::chrono::seconds ready_timeout = std::chrono::seconds(100)) {
    ready(ask("restart", ready_timeout));
  }

 private:
  // "ENDPOINT PID DATADIR VERSION"
  void ready(const std::string& line) {
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || line.rfind("error ", 0) == 0)
      throw std::runtime_error("etcd-test-server: " + line);
    endpoint_ = line.substr(0, sp);
  }

  static void expect_ok(const std::string& line) {
    if (line != "ok") throw std::runtime_error("etcd-test-server: " + line);
  }

  std::string ask(const std::string& command, std::chrono::seconds timeout) {
    const std::string line = command + "\n";
    if (::send(fd_, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
      throw std::runtime_error("etcd-test-server is gone (its stderr is above)");
    return answer(timeout);
  }

  // The program's next line, waited for at most `timeout`.
  std::string answer(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    size_t nl;
    while ((nl = pending_.find('\n')) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, left.count() > 0 ? static_cast<int>(left.count()) : 0);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) throw std::runtime_error("etcd-test-server did not answer in time");
      char buf[512];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error("etcd-test-server exited (its stderr is above)");
      pending_.append(buf, static_cast<size_t>(n));
    }
    std::string line = pending_.substr(0, nl);
    pending_.erase(0, nl + 1);
    return line;
  }

  // The end of its input: it kills etcd, removes the data and exits.
  void close_and_reap() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (pid_ > 0) {
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
  }

  pid_t pid_ = -1;  // the program's
  int fd_ = -1;     // its stdin and stdout
  std::string pending_;
  std::string endpoint_;
};

}  // namespace rdzv_test

#endif  // RDZV_TESTS_ETCD_SERVER_HPP
