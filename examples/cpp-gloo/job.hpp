// Launcher of the Gloo example for its test and its benchmark: starts N processes of
// rdzv_gloo_allreduce (IDs 0..N-1), reads their output lines as they come, kills one with a
// real signal and reaps them. Every wait is on an event (a line, an exit) with a deadline;
// nothing sleeps.
//
// Every process dies with the launcher: the children get PR_SET_PDEATHSIG(SIGKILL), and the
// destructor SIGKILLs and reaps those still running. PR_SET_PDEATHSIG fires when the thread
// that forked ends, so construct a Job on a thread that outlives it (the test's or main's).
#ifndef RDZV_EXAMPLES_CPP_GLOO_JOB_HPP
#define RDZV_EXAMPLES_CPP_GLOO_JOB_HPP

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace rdzv_gloo {

using Clock = std::chrono::steady_clock;

/// One output line of a process: "KIND key=value ..." parsed ("what=" takes the rest of the
/// line). Lines that are not events (a library's log on stderr) have an empty `kind`.
struct Event {
  int id = -1;          // the process's ID (its index in the Job)
  std::string kind;     // start, allreduce, lost, done, error
  std::map<std::string, std::string> fields;
  std::string line;     // as printed
  Clock::time_point at; // when the launcher read it

  bool has(const std::string& key) const { return fields.count(key) != 0; }
  long long num(const std::string& key) const {
    auto it = fields.find(key);
    if (it == fields.end()) throw std::runtime_error("no field '" + key + "' in: " + line);
    return std::stoll(it->second);
  }
};

inline Event parse_event(int id, const std::string& line, Clock::time_point at) {
  static const char* const kinds[] = {"start", "allreduce", "lost", "done", "error"};
  Event e;
  e.id = id;
  e.line = line;
  e.at = at;
  const size_t sp = line.find(' ');
  const std::string first = line.substr(0, sp);
  bool known = false;
  for (const char* k : kinds) known = known || first == k;
  if (!known || sp == std::string::npos) return e;
  e.kind = first;
  for (size_t pos = sp + 1; pos < line.size();) {
    const size_t eq = line.find('=', pos);
    if (eq == std::string::npos) break;
    const std::string key = line.substr(pos, eq - pos);
    size_t end = key == "what" ? std::string::npos : line.find(' ', eq + 1);
    e.fields[key] = line.substr(eq + 1, end == std::string::npos ? end : end - eq - 1);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return e;
}

class Job {
 public:
  /// Starts `n` processes `exe URL ID ROUNDS` (IDs 0..n-1), stdout and stderr into one pipe each.
  Job(const std::string& exe, const std::string& url, int n, int rounds) : procs_(n) {
    try {
      for (int id = 0; id < n; ++id)
        spawn(exe, {exe, url, std::to_string(id), std::to_string(rounds)}, id);
    } catch (...) {
      stop();  // no destructor runs for a constructor that throws: end those started
      throw;
    }
  }

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  ~Job() { stop(); }

  int size() const { return static_cast<int>(procs_.size()); }

  /// When process `id` was forked (launcher's clock).
  Clock::time_point started(int id) const { return procs_.at(id).started; }

  /// Waits until `done(events)` holds (checked on every new line or exit) or `timeout` passes;
  /// returns whether it held.
  bool wait_until(const std::function<bool(const std::vector<Event>&)>& done,
                  std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return done(events_); });
  }

  /// Every line so far, in the order read.
  std::vector<Event> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

  /// Sends SIGKILL to process `id` and returns when it was sent.
  Clock::time_point kill(int id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& p = procs_.at(id);
    if (p.exited) throw std::runtime_error("process " + std::to_string(id) + " already exited");
    const auto at = Clock::now();
    if (::kill(p.pid, SIGKILL) != 0) throw std::runtime_error(std::string("kill: ") + std::strerror(errno));
    return at;
  }

  /// Waits for process `id` to exit and be reaped; its wait status, or -1 after `timeout`.
  int wait_exit(int id, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& p = procs_.at(id);
    if (!cv_.wait_for(lock, timeout, [&] { return p.exited; })) return -1;
    return p.status;
  }

  /// Every process's output, for a failure message.
  std::string transcript() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (const auto& e : events_) out += "[" + std::to_string(e.id) + "] " + e.line + "\n";
    for (size_t id = 0; id < procs_.size(); ++id) {
      const auto& p = procs_[id];
      out += "[" + std::to_string(id) + "] " +
             (!p.exited ? std::string("running")
              : WIFEXITED(p.status) ? "exit " + std::to_string(WEXITSTATUS(p.status))
              : WIFSIGNALED(p.status) ? "killed by signal " + std::to_string(WTERMSIG(p.status))
                                      : "status " + std::to_string(p.status)) +
             "\n";
    }
    return out;
  }

 private:
  // Kills the processes still running and waits for every reader (each reaps its process).
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Only unreaped processes are killed: their pids cannot have been reused yet.
      for (auto& p : procs_)
        if (p.pid > 0 && !p.exited) ::kill(p.pid, SIGKILL);
    }
    for (auto& p : procs_)
      if (p.reader.joinable()) p.reader.join();
  }

  struct Proc {
    pid_t pid = -1;
    Clock::time_point started;
    bool exited = false;  // reaped (under mu_, so kill() never signals a reused pid)
    int status = 0;
    std::thread reader;
  };

  void spawn(const std::string& exe, std::vector<std::string> args, int id) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    auto& p = procs_[id];
    p.started = Clock::now();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Only async-signal-safe calls until exec (the launcher has threads). SIGKILL when the
      // launcher's thread ends; if it already has, nobody would send it: exit instead.
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(127);
      const int null = ::open("/dev/null", O_RDONLY);
      if (null < 0 || ::dup2(null, 0) < 0 || ::dup2(fds[1], 1) < 0 || ::dup2(fds[1], 2) < 0) ::_exit(127);
      ::execve(exe.c_str(), argv.data(), environ);
      static const char failed[] = "exec failed\n";
      ssize_t ignored = ::write(2, failed, sizeof failed - 1);
      (void)ignored;
      ::_exit(127);
    }
    const int fork_errno = errno;
    ::close(fds[1]);
    if (pid < 0) {
      ::close(fds[0]);
      throw std::runtime_error(std::string("fork failed: ") + std::strerror(fork_errno));
    }
    p.pid = pid;
    p.reader = std::thread([this, id, fd = fds[0]] { read_and_reap(id, fd); });
  }

  // Reads process `id`'s lines until EOF (it exited or was killed), then reaps it.
  void read_and_reap(int id, int fd) {
    std::string pending;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      const auto at = Clock::now();
      pending.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        Event e = parse_event(id, pending.substr(0, nl), at);
        pending.erase(0, nl + 1);
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back(std::move(e));
        cv_.notify_all();
      }
    }
    ::close(fd);
    const pid_t pid = procs_[id].pid;
    // Wait for the exit without reaping, so the pid stays this process's while kill() or the
    // destructor may signal it; then reap under the lock.
    siginfo_t info{};
    while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
    }
    std::lock_guard<std::mutex> lock(mu_);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!pending.empty()) events_.push_back(parse_event(id, pending, Clock::now()));
    procs_[id].status = status;
    procs_[id].exited = true;
    cv_.notify_all();
  }

  std::vector<Proc> procs_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> events_;
};

}  // namespace rdzv_gloo

#endif  // RDZV_EXAMPLES_CPP_GLOO_JOB_HPP
