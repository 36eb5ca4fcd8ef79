// Test fixture: a real etcd (the first `etcd` on PATH: Debian's 3.4 or one built by
// scripts/etcd-build.sh) on free loopback ports with a temporary data directory. Ready when etcd
// logs "ready to serve client requests" (waited for with a timeout, never a fixed sleep);
// killed and its data removed on destruction, and killed too when the test process dies, even
// by SIGKILL (PR_SET_PDEATHSIG). A test can crash it (kill), freeze it (signal(SIGSTOP)) and
// start it again on the same ports and data (restart).
#ifndef RDZV_TESTS_ETCD_SERVER_HPP
#define RDZV_TESTS_ETCD_SERVER_HPP

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace rdzv_test {

inline uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("could not bind a free port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The first executable `name` in a directory of PATH, or "" if there is none.
inline std::string find_on_path(const std::string& name) {
  const char* env = std::getenv("PATH");
  const std::string dirs = env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin";
  for (size_t start = 0;;) {
    const size_t end = dirs.find(':', start);
    std::string dir = dirs.substr(start, end == std::string::npos ? end : end - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    std::error_code ec;
    if (std::filesystem::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (end == std::string::npos) return "";
    start = end + 1;
  }
}

class EtcdServer {
 public:
  explicit EtcdServer(std::chrono::seconds ready_timeout = std::chrono::seconds(30)) {
    name_ = "rdzv-cpp-test-" + std::to_string(::getpid());
    std::string tmpl = (std::filesystem::temp_directory_path() / "rdzv-cpp-etcd-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    data_dir_ = tmpl;
    client_port_ = free_port();
    do peer_port_ = free_port();
    while (peer_port_ == client_port_);
    launch(ready_timeout);
  }

  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;
  ~EtcdServer() {
    kill();
    std::error_code ec;
    std::filesystem::remove_all(data_dir_, ec);
  }

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }

  /// A rendezvous URL on this server whose run id is unique in this process.
  std::string url(const std::string& run, const std::string& query = "") const {
    static std::atomic<int> seq{0};
    std::string u = "etcd://" + endpoint() + "/" + run + "-" + std::to_string(::getpid()) + "-" +
                    std::to_string(seq++);
    return query.empty() ? u : u + "?" + query;
  }

  /// SIGKILL, as a crash would; the data stays for restart().
  void kill() {
    pid_t pid;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return spawned_; });  // the reader has forked (or failed to)
      pid = pid_;
      pid_ = -1;
    }
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    if (reader_.joinable()) reader_.join();
  }

  /// Sends `sig` to etcd: SIGSTOP freezes it (connections stay open, nothing answers),
  /// SIGCONT resumes it.
  void signal(int sig) {
    std::lock_guard<std::mutex> lock(mu_);
    if (pid_ > 0) ::kill(pid_, sig);
  }

  /// Starts etcd again (after kill(), or killing it first) on the same ports and data.
  void restart(std::chrono::seconds ready_timeout = std::chrono::seconds(30)) {
    kill();
    launch(ready_timeout);
  }

 private:
  void launch(std::chrono::seconds ready_timeout) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      spawned_ = ready_ = exited_ = false;
      log_.clear();
    }
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {"etcd",
                                     "--name", name_,
                                     "--data-dir", data_dir_.string(),
                                     "--listen-client-urls", client,
                                     "--advertise-client-urls", client,
                                     "--listen-peer-urls", peer,
                                     "--initial-advertise-peer-urls", peer,
                                     "--initial-cluster", name_ + "=" + peer};
    const std::string path = find_on_path("etcd");
    if (path.empty()) {
      std::filesystem::remove_all(data_dir_);
      throw std::runtime_error("could not start etcd: it is not on PATH");
    }

    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    // One thread forks etcd, then drains its output for its whole life (so etcd never blocks on
    // a full pipe), and so lives as long as etcd: PR_SET_PDEATHSIG fires when the thread that
    // forked ends, not the process, and the first test to ask for the server may be running on
    // a thread that ends before the test process does.
    reader_ = std::thread([this, path, args = std::move(args), fds]() mutable {
      const bool started = spawn(path, args, fds[1]);
      ::close(fds[1]);
      if (started) {
        read_output(fds[0]);
      } else {
        ::close(fds[0]);
      }
    });

    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, ready_timeout, [this] { return ready_ || exited_; }) || !ready_) {
      const std::string why = exited_ ? "etcd exited before it was ready" : "etcd not ready in time";
      const std::string log = log_tail_locked();
      lock.unlock();
      kill();
      std::error_code ec;
      std::filesystem::remove_all(data_dir_, ec);
      throw std::runtime_error(why + "; last output:\n" + log);
    }
    std::fprintf(stderr, "etcd %s ready at %s\n",
                 version_.empty() ? "(version not logged)" : version_.c_str(), endpoint().c_str());
  }

  // Forks and execs etcd with stdin from /dev/null and stdout and stderr into `out` (etcd 3.4
  // logs on stderr). In the child of this threaded process only async-signal-safe calls are
  // made until exec. Returns false if fork failed, with the reason in the log.
  bool spawn(const std::string& path, std::vector<std::string>& args, int out) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // SIGKILL when the forking thread (hence the test process) ends; if the parent died
      // before this call, nobody would send it: exit instead.
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(127);
      const int null = ::open("/dev/null", O_RDONLY);
      if (null < 0 || ::dup2(null, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(out, 2) < 0) ::_exit(127);
      if (null > 2) ::close(null);
      ::execve(path.c_str(), argv.data(), environ);
      static const char failed[] = "exec of etcd failed\n";
      ssize_t ignored = ::write(2, failed, sizeof failed - 1);
      (void)ignored;
      ::_exit(127);
    }
    const int fork_errno = errno;
    std::lock_guard<std::mutex> lock(mu_);
    pid_ = pid;
    spawned_ = true;
    if (pid < 0) {
      log_.push_back(std::string("fork failed: ") + std::strerror(fork_errno));
      exited_ = true;
    }
    cv_.notify_all();
    return pid > 0;
  }

  void read_output(int fd) {
    std::string pending;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      pending.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        std::lock_guard<std::mutex> lock(mu_);
        if (version_.empty() && !ready_) version_ = version_in_log(line);
        if (line.find("ready to serve client requests") != std::string::npos) ready_ = true;
        log_.push_back(std::move(line));
        if (log_.size() > 20) log_.pop_front();
        cv_.notify_all();
      }
    }
    ::close(fd);
    std::lock_guard<std::mutex> lock(mu_);
    exited_ = true;
    cv_.notify_all();
  }

  // The server version in a startup log line: "etcd Version: 3.4.23" (3.4) or
  // "etcd-version":"3.7.3" (3.5 and later, JSON); empty if the line has none.
  static std::string version_in_log(const std::string& line) {
    for (const std::string marker : {"etcd Version: ", "\"etcd-version\":\""}) {
      const size_t at = line.find(marker);
      if (at == std::string::npos) continue;
      const size_t start = at + marker.size();
      return line.substr(start, line.find_first_of("\" \t", start) - start);
    }
    return "";
  }

  std::string log_tail_locked() const {
    std::string out;
    for (const auto& l : log_) out += l + "\n";
    return out;
  }

  std::string name_;
  std::filesystem::path data_dir_;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  pid_t pid_ = -1;        // set by the reader when it has forked
  bool spawned_ = false;  // the reader has forked, or failed to
  bool ready_ = false;
  bool exited_ = false;
  std::string version_;  // written by the reader until ready, read after
  std::deque<std::string> log_;
};

}  // namespace rdzv_test

#endif  // RDZV_TESTS_ETCD_SERVER_HPP
