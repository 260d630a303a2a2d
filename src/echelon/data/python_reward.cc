#include "echelon/data/python_reward.h"

#include "echelon/common/parallel.h"

#include <nlohmann/json.hpp>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

extern char** environ;

namespace echelon::data {
namespace {

// The worker: loads the user's file, then answers one JSON line per request line. The
// protocol keeps its own copy of stdout; the user's prints go to stderr.
constexpr char kRunner[] = R"PY(
import importlib.util, json, math, numbers, os, sys, traceback
path, name = sys.argv[1], sys.argv[2]
proto = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

def send(obj):
    proto.write(json.dumps(obj) + "\n")
    proto.flush()

def where(exc):
    if isinstance(exc, SyntaxError) and exc.filename:
        return "%s:%s: SyntaxError: %s" % (exc.filename, exc.lineno, exc.msg)
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(path)]
    f = (mine or frames or [None])[-1]
    at = "%s:%d" % (f.filename, f.lineno) if f else path
    return "%s: %s: %s" % (at, type(exc).__name__, exc)

def number(v):
    return isinstance(v, numbers.Real) and math.isfinite(float(v))

try:
    spec = importlib.util.spec_from_file_location("echelon_user_reward", path)
    if spec is None:
        raise ImportError("not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError("%s defines no function %s" % (path, name))
except BaseException as e:
    send({"ok": False, "error": where(e)})
    sys.exit(0)
send({"ok": True})

for line in sys.stdin:
    req = json.loads(line)
    try:
        r = fn(data_source=req["data_source"], solution_str=req["solution_str"],
               ground_truth=req["ground_truth"], extra_info=json.loads(req["extra_info"]))
    except Exception as e:
        send({"ok": False, "error": where(e)})
        continue
    extras = {}
    if isinstance(r, dict):
        if "score" not in r:
            send({"ok": False, "error": "%s returned a dict without \"score\" (keys: %s)" % (name, sorted(r))})
            continue
        bad = [k for k, v in r.items() if k != "score" and not number(v)]
        if bad:
            send({"ok": False, "error": "%s returned %s = %r: the other keys must be finite numbers (they become metrics)" % (name, bad[0], r[bad[0]])})
            continue
        extras = {str(k): float(v) for k, v in r.items() if k != "score"}
        r = r["score"]
    if not number(r):
        send({"ok": False, "error": "%s returned %r (%s), not a finite number" % (name, r, type(r).__name__)})
        continue
    send({"ok": True, "score": float(r), "extras": extras})
)PY";

std::string Clip(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

std::string SampleText(const std::string& data_source, const std::string& solution, const std::string& truth) {
  return "on data_source " + nlohmann::json(data_source).dump() + ", ground_truth " +
         nlohmann::json(Clip(truth, 80)).dump() + ", solution_str " + nlohmann::json(Clip(solution, 120)).dump();
}

}  // namespace

Result<std::unique_ptr<PythonReward>> PythonReward::Start(const PythonRewardOptions& options) {
  if (options.file.empty()) return InvalidArgument("python reward: no file given");
  if (::access(options.file.c_str(), R_OK) != 0)
    return NotFound("python reward file " + options.file + ": " + std::strerror(errno));
  std::unique_ptr<PythonReward> r(new PythonReward(options));
  ECHELON_RETURN_IF_ERROR(r->Spawn());
  return r;
}

PythonReward::~PythonReward() {
  if (pid_ < 0) return;
  ::close(from_worker_);  // the worker sees the end of its input and exits
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

Status PythonReward::Spawn() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    return Internal(std::string("python reward: socketpair: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  std::vector<std::string> args = {options_.python, "-u", "-c", kRunner, options_.file, options_.function};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, options_.python.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return FailedPrecondition("python reward: cannot start " + options_.python + ": " + std::strerror(rc));
  }
  pid_ = pid;
  from_worker_ = to_worker_ = fds[0];
  buffer_.clear();
  Result<std::string> ready = ReadLine(options_.load_timeout_seconds);
  if (!ready.ok()) {
    Kill();
    return ready.status().WithContext("python reward " + options_.file + ": loading");
  }
  const nlohmann::json j = nlohmann::json::parse(ready.value(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("ok", false) != true) {
    Kill();
    return InvalidArgument("python reward " + options_.file + " does not load: " +
                           (j.is_object() ? j.value("error", std::string("?")) : ready.value()));
  }
  return Status::Ok();
}

void PythonReward::Kill() {
  if (pid_ < 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  ::close(from_worker_);
  pid_ = -1;
  from_worker_ = to_worker_ = -1;
}

Result<std::string> PythonReward::ReadLine(double timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  for (;;) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return DeadlineExceeded("no answer within " + std::to_string(timeout_seconds) + " s");
    pollfd p{from_worker_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;
    char chunk[4096];
    const ssize_t n = ::read(from_worker_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
      ::close(from_worker_);
      from_worker_ = to_worker_ = -1;
      return Unavailable("the Python worker exited (" +
                         (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                              : "status " + std::to_string(WEXITSTATUS(status))) +
                         ")");
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

Result<ExternalScore> PythonReward::Score(const std::string& data_source, const std::string& solution_str,
                                        const std::string& ground_truth, const std::string& extra_info_json,
                                        double timeout_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string where = options_.file + ":" + options_.function + " " + SampleText(data_source, solution_str, ground_truth);
  if (pid_ < 0) ECHELON_RETURN_IF_ERROR(Spawn().WithContext(where));
  const std::string request = nlohmann::json{{"data_source", data_source},
                                             {"solution_str", solution_str},
                                             {"ground_truth", ground_truth},
                                             {"extra_info", extra_info_json}}
                                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                              "\n";
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(to_worker_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Kill();
      return Unavailable(where + ": the Python worker is gone");
    }
    sent += static_cast<size_t>(n);
  }
  Result<std::string> line = ReadLine(timeout_seconds > 0 ? std::min(timeout_seconds, options_.timeout_seconds)
                                                         : options_.timeout_seconds);
  if (!line.ok()) {
    Kill();  // a hung call is killed; the next call starts a fresh worker
    return Status(line.status().code(), where + ": " + line.status().message());
  }
  const nlohmann::json j = nlohmann::json::parse(line.value(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("ok")) return Internal(where + ": garbled answer from the Python worker: " + Clip(line.value(), 200));
  if (j["ok"] != true) return InvalidArgument(j.value("error", std::string("?")) + " (" + where + ")");
  ExternalScore s;
  if (!j.contains("score") || !j["score"].is_number())
    return Internal(where + ": garbled answer from the Python worker: " + Clip(line.value(), 200));
  s.score = j["score"].get<double>();
  const nlohmann::json extras = j.value("extras", nlohmann::json::object());
  for (const auto& [k, v] : extras.items()) {
    if (!v.is_number()) return Internal(where + ": garbled answer from the Python worker: " + Clip(line.value(), 200));
    s.extras[k] = v.get<double>();
  }
  return s;
}

Result<std::unique_ptr<PythonRewardPool>> PythonRewardPool::Start(const PythonRewardOptions& options, int workers) {
  std::unique_ptr<PythonRewardPool> pool(new PythonRewardPool());
  for (int i = 0; i < std::max(1, workers); ++i) {
    ECHELON_ASSIGN_OR_RETURN(std::unique_ptr<PythonReward> w, PythonReward::Start(options));
    pool->workers_.push_back(std::move(w));
    pool->free_.push_back(static_cast<size_t>(i));
  }
  return pool;
}

Result<ExternalScore> PythonRewardPool::ScoreOne(const RewardSample& s,
                                                std::optional<std::chrono::steady_clock::time_point> deadline) {
  const auto spent = [&] {
    return ResourceExhausted(options().file + ":" + options().function + ": the group's reward budget is spent " +
                             SampleText(s.data_source, s.solution_str, s.ground_truth));
  };
  size_t w = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const auto idle = [&] { return !free_.empty(); };
    if (!deadline) {
      freed_.wait(lock, idle);
    } else if (!freed_.wait_until(lock, *deadline, idle)) {
      return spent();
    }
    w = free_.back();
    free_.pop_back();
  }
  double left = 0;  // no cut below the per-call limit
  if (deadline) {
    left = std::chrono::duration<double>(*deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(w);
      freed_.notify_one();
      return spent();
    }
  }
  Result<ExternalScore> out = workers_[w]->Score(s.data_source, s.solution_str, s.ground_truth, s.extra_info_json, left);
  // Cut by the budget rather than by the call's own limit.
  if (!out.ok() && out.status().code() == StatusCode::kDeadlineExceeded && deadline && left < options().timeout_seconds)
    out = spent();
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(w);
  }
  freed_.notify_one();
  return out;
}

std::vector<Result<ExternalScore>> PythonRewardPool::ScoreAll(const std::vector<RewardSample>& samples,
                                                              double budget_seconds) {
  std::vector<Result<ExternalScore>> out(samples.size(), Result<ExternalScore>(Internal("not scored")));
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (budget_seconds > 0)
    deadline = std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(budget_seconds));
  // Every sample's result, failures included: ParallelFor's early stop is not wanted here.
  (void)ParallelFor(samples.size(), static_cast<int>(workers_.size()), [&](size_t i) -> Status {
    out[i] = ScoreOne(samples[i], deadline);
    return Status::Ok();
  });
  return out;
}

}  // namespace echelon::data
