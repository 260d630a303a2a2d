#include "echelon/cli/processes.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace echelon::cli {

std::string SelfExe() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("echelon") : p.string();
}

Status StartLocalRanks(ProcessGroup* group, int world, int port, double timeout_seconds, const std::string& log_dir) {
  for (int r = 1; r < world; ++r) {
    const std::string name = "rank-" + std::to_string(r);
    ECHELON_RETURN_IF_ERROR(group->Start(name,
                                         {SelfExe(), "learner-rank", "--rank", std::to_string(r), "--world",
                                          std::to_string(world), "--local-rank", std::to_string(r), "--master",
                                          "127.0.0.1:" + std::to_string(port), "--timeout",
                                          std::to_string(timeout_seconds)},
                                         log_dir + "/" + name + ".log"));
  }
  return Status::Ok();
}

ProcessGroup::~ProcessGroup() { StopAll(5.0); }

Result<pid_t> ProcessGroup::Spawn(const Child& c) {
  int log = ::open(c.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return Internal("cannot open " + c.log_path + ": " + std::strerror(errno));
  std::vector<char*> args;
  for (const std::string& a : c.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log);
    return Internal(std::string("fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    ::setpgid(0, 0);  // a Ctrl-C in the terminal reaches the parent, which stops us in order
    // A parent killed outright (SIGKILL, OOM) cannot stop us: the kernel does, so no actor
    // outlives its run. (The signal follows the forking thread, which lives as long as we do.)
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) _exit(0);  // the parent died before prctl took effect
    ::execv(args[0], args.data());
    _exit(127);
  }
  ::close(log);
  return pid;
}

Status ProcessGroup::Start(const std::string& name, const std::vector<std::string>& argv, const std::string& log_path) {
  Child c{argv, log_path, -1, 0};
  ECHELON_ASSIGN_OR_RETURN(c.pid, Spawn(c));
  {
    std::lock_guard<std::mutex> lock(mu_);
    children_[name] = c;
  }
  if (!supervisor_.joinable()) supervisor_ = std::thread([this] { Supervise(); });
  return Status::Ok();
}

void ProcessGroup::Supervise() {
  while (!stopping_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [name, c] : children_) {
      if (c.pid <= 0 || stopping_.load()) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.pid = -1;
      // Status 0 is a clean exit: the learner told the actor that the run is over.
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      if (c.restarts >= max_restarts_) {
        spdlog::error("{} exited (status {}) and was restarted {} times already; giving up on it (log: {})", name,
                      status, c.restarts, c.log_path);
        continue;
      }
      spdlog::warn("{} exited unexpectedly (status {}); restarting it (log: {})", name, status, c.log_path);
      Result<pid_t> pid = Spawn(c);
      if (pid.ok()) {
        c.pid = pid.value();
        ++c.restarts;
        ++restarts_;
      }
    }
  }
}

bool ProcessGroup::WaitAll(double timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (true) {
    bool running = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [name, c] : children_) {
        int status = 0;
        if (c.pid > 0 && ::waitpid(c.pid, &status, WNOHANG) == c.pid) c.pid = -1;
        running = running || c.pid > 0;
      }
    }
    if (!running) {
      StopAll(0);  // none left: ends the supervisor
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      StopAll(5.0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void ProcessGroup::StopAll(double timeout_seconds) {
  stopping_ = true;
  if (supervisor_.joinable()) supervisor_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, c] : children_)
    if (c.pid > 0) ::kill(c.pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  for (auto& [name, c] : children_) {
    while (c.pid > 0) {
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.pid = -1;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        spdlog::warn("{} did not stop within {:.0f} s; killing it", name, timeout_seconds);
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &status, 0);
        c.pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace echelon::cli
