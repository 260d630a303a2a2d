#include "echelon/model/pipeline.h"
#include "echelon/model/safetensors.h"

#include <ATen/ATen.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <stdexcept>

namespace echelon::model {
namespace {

// Thrown inside a replaying engine when the first stage stopped early: ends the lane, no error.
struct LaneStopped {};

// A model of the same layers as `base` sharing its weights.
Qwen3Model SharedCopy(const Qwen3Model& base) {
  return Qwen3Model(*base, Qwen3ModelImpl::SharingWeights{});
}

}  // namespace

uint64_t NewLaneId() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return gen();
}

// One lane on a stage after the first: an engine replaying the first stage's draws on its own
// thread. Messages arrive in the mailbox; each consumed Forward's reply (the rest of the chain's
// answer) goes back to the caller waiting in Deliver.
class StageServer::Lane : public StageIo, public DrawSource {
 public:
  Lane(uint64_t id, Qwen3Model model, NextStage* next, LaneSpec spec)
      : id_(id), model_(std::move(model)), next_(next), spec_(std::move(spec)) {
    model_->SetStageIo(this);
    thread_ = std::thread([this] { Run(); });
  }
  ~Lane() override {
    if (thread_.joinable()) {
      StageMessage stop;
      stop.stopped = true;
      Push(std::move(stop));
      thread_.join();
    }
  }

  Result<at::Tensor> Deliver(StageMessage m) {
    Push(std::move(m));
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    cv_.wait(lock, [&] { return !replies_.empty() || done_; });
    --waiting_;
    if (!replies_.empty()) {
      at::Tensor reply = std::move(replies_.front());
      replies_.pop_front();
      return reply;
    }
    return error_.ok() ? Status(Aborted("pipeline lane " + std::to_string(id_) + " has ended")) : error_;
  }

  // Ends the lane: the close goes to the engine (it may be waiting for its last draws), then the
  // thread is joined. Returns the lane's error, if any.
  Status Finish(StageMessage close) {
    Push(std::move(close));
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  // No message for `seconds` and no call waiting.
  bool Idle(std::chrono::steady_clock::time_point now, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_ == 0 && std::chrono::duration<double>(now - last_active_).count() > seconds;
  }

  // DrawSource: the next message's draws.
  std::optional<std::vector<int64_t>> Next(const std::vector<int64_t>& rows) override {
    StageMessage m = Pop();
    if (!m.hidden.defined() && m.stopped) return std::nullopt;
    if (!m.has_draws) throw std::runtime_error("pipeline out of step: a message without the draws of the step");
    if (m.rows != rows)
      throw std::runtime_error("pipeline out of step: draws for other rows than this stage's engine decodes");
    std::vector<int64_t> tokens = m.tokens;
    if (m.hidden.defined()) pending_ = std::move(m);  // its hidden states feed the next Forward
    return tokens;
  }

  // StageIo: this Forward's input, from the pending message (whose draws Next took) or the next.
  at::Tensor Input() override {
    if (pending_) {
      current_ = std::move(*pending_);
      pending_.reset();
    } else {
      current_ = Pop();
      if (!current_.hidden.defined() && current_.stopped) throw LaneStopped{};
      if (current_.has_draws) throw std::runtime_error("pipeline out of step: draws where a forward was expected");
    }
    if (!current_.hidden.defined()) throw std::runtime_error("pipeline out of step: the lane closed mid-generation");
    return current_.hidden;
  }

  at::Tensor Output(const at::Tensor& x, bool /*need*/) override {
    at::Tensor reply;
    if (next_ != nullptr) {
      StageMessage on = current_;
      on.hidden = x;
      Result<at::Tensor> r = next_->Forward(id_, std::move(on));
      if (!r.ok()) throw std::runtime_error(r.status().message());
      reply = std::move(r).value();
    } else if (current_.need) {
      reply = x;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      replies_.push_back(std::move(reply));
      last_active_ = std::chrono::steady_clock::now();
    }
    cv_.notify_all();
    return at::Tensor();
  }

 private:
  void Run() {
    Status error;
    try {
      Replay(model_, spec_.prompts, spec_.params, *this);
    } catch (const LaneStopped&) {
    } catch (const std::exception& e) {
      error = Internal("pipeline stage (layers " + std::to_string(model_->range().first) + "-" +
                       std::to_string(model_->range().last - 1) + "): " + e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    error_ = error;
    done_ = true;
    cv_.notify_all();
  }

  void Push(StageMessage m) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      mailbox_.push_back(std::move(m));
      last_active_ = std::chrono::steady_clock::now();
    }
    cv_.notify_all();
  }
  StageMessage Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !mailbox_.empty(); });
    StageMessage m = std::move(mailbox_.front());
    mailbox_.pop_front();
    return m;
  }

  const uint64_t id_;
  Qwen3Model model_;
  NextStage* const next_;
  const LaneSpec spec_;
  // Engine thread only.
  std::optional<StageMessage> pending_;
  StageMessage current_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StageMessage> mailbox_;
  std::deque<at::Tensor> replies_;
  bool done_ = false;
  int64_t waiting_ = 0;  // Deliver calls waiting for their reply
  std::chrono::steady_clock::time_point last_active_ = std::chrono::steady_clock::now();
  Status error_;
  std::thread thread_;
};

StageServer::StageServer(Qwen3Model model, NextStage* next, double lane_idle_seconds)
    : next_(next), lane_idle_seconds_(lane_idle_seconds) {
  if (model) SetModel(std::move(model), -1);
}

void StageServer::SetModel(Qwen3Model model, int64_t version) {
  TORCH_CHECK(model && model->range().first > 0, "StageServer: the first stage samples; it is not served");
  std::lock_guard<std::mutex> lock(mu_);
  // Weights of other layers (the pipeline was split anew) serve no lane from now on.
  const LayerRange r = model->range();
  for (auto it = models_.begin(); it != models_.end();)
    it = it->second->range().first != r.first || it->second->range().last != r.last ? models_.erase(it) : std::next(it);
  models_.insert_or_assign(version, std::move(model));
  while (models_.size() > kKeptVersions) models_.erase(models_.begin());
}

int64_t StageServer::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return models_.empty() ? -1 : models_.rbegin()->first;
}

int64_t StageServer::wanted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wanted_;
}

StageServer::~StageServer() = default;

std::shared_ptr<StageServer::Lane> StageServer::Find(uint64_t lane) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = lanes_.find(lane);
  return it == lanes_.end() ? nullptr : it->second;
}

int64_t StageServer::open_lanes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(lanes_.size());
}

Status StageServer::Open(uint64_t lane, const LaneSpec& spec) {
  std::vector<std::shared_ptr<Lane>> idle;  // closed here, outside the lock (joins their threads)
  Qwen3Model model(nullptr);
  {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    wanted_ = std::max(wanted_, spec.version);
    if (models_.empty()) return Unavailable("this pipeline stage holds no weights yet");
    const auto held = spec.version < 0 ? std::prev(models_.end()) : models_.find(spec.version);
    if (held == models_.end()) {
      const LayerRange r = models_.rbegin()->second->range();
      const std::string what = "pipeline stage (layers " + std::to_string(r.first) + "-" + std::to_string(r.last - 1) +
                               ") holds snapshots v" + std::to_string(models_.begin()->first) + "..v" +
                               std::to_string(models_.rbegin()->first) + ", the lane needs v" +
                               std::to_string(spec.version);
      // Ahead of this stage: it is fetching that snapshot. Behind it: the first stage must move on.
      if (spec.version > models_.rbegin()->first) return Unavailable(what);
      return Aborted(what);
    }
    model = held->second;
    for (auto it = lanes_.begin(); it != lanes_.end();) {
      if (it->second->Idle(now, lane_idle_seconds_)) {
        spdlog::warn("pipeline stage (layers {}-{}): closing lane {}, silent for over {:g} s", model->range().first,
                     model->range().last - 1, it->first, lane_idle_seconds_);
        idle.push_back(std::move(it->second));
        it = lanes_.erase(it);
      } else {
        ++it;
      }
    }
  }
  idle.clear();
  if (Find(lane) != nullptr) return InvalidArgument("pipeline lane " + std::to_string(lane) + " is already open");
  if (next_ != nullptr) ECHELON_RETURN_IF_ERROR(next_->Open(lane, spec));
  auto l = std::make_shared<Lane>(lane, SharedCopy(model), next_, spec);
  std::lock_guard<std::mutex> lock(mu_);
  lanes_.emplace(lane, std::move(l));
  return Status::Ok();
}

Result<at::Tensor> StageServer::Forward(uint64_t lane, StageMessage m) {
  std::shared_ptr<Lane> l = Find(lane);
  if (l == nullptr) return NotFound("pipeline lane " + std::to_string(lane) + " is not open on this stage");
  if (!m.hidden.defined()) return InvalidArgument("pipeline forward without hidden states");
  return l->Deliver(std::move(m));
}

Status StageServer::Close(uint64_t lane, StageMessage m) {
  std::shared_ptr<Lane> l;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = lanes_.find(lane);
    if (it == lanes_.end()) return NotFound("pipeline lane " + std::to_string(lane) + " is not open on this stage");
    l = std::move(it->second);
    lanes_.erase(it);
  }
  m.hidden = at::Tensor();
  Status here = l->Finish(m);
  Status later = next_ != nullptr ? next_->Close(lane, std::move(m)) : Status::Ok();
  return here.ok() ? later : here;
}

namespace {

// The first stage's end of one lane: its last layer's output goes down the chain with the
// previous step's draws, and the last stage's output comes back.
class FirstStageIo : public StageIo {
 public:
  FirstStageIo(uint64_t lane, NextStage& next) : lane_(lane), next_(next) {}

  at::Tensor Input() override { throw std::logic_error("the first stage embeds its input"); }
  at::Tensor Output(const at::Tensor& x, bool need) override {
    StageMessage m = TakeDraws();
    m.hidden = x;
    m.need = need;
    Result<at::Tensor> r = next_.Forward(lane_, std::move(m));
    if (!r.ok()) throw std::runtime_error(r.status().message());
    if (need && !r.value().defined()) throw std::runtime_error("pipeline: the last stage sent no output");
    return std::move(r).value();
  }

  void SetDraws(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) {
    draws_.has_draws = true;
    draws_.rows = rows;
    draws_.tokens = tokens;
  }
  StageMessage TakeDraws() { return std::exchange(draws_, StageMessage()); }

 private:
  const uint64_t lane_;
  NextStage& next_;
  StageMessage draws_;
};

}  // namespace

Result<std::vector<Completion>> PipelineGenerate(Qwen3Model& first, NextStage& next,
                                                 const std::vector<std::vector<int64_t>>& prompts,
                                                 const SamplingParams& params, int64_t micro_batches,
                                                 const StepCallback& on_step, int64_t version) {
  if (first->range().first != 0) return InvalidArgument("PipelineGenerate: `first` must hold the first layers");
  const int64_t rows = static_cast<int64_t>(prompts.size());
  if (rows == 0 || params.max_new_tokens <= 0) return std::vector<Completion>(prompts.size());
  const int64_t lanes = std::clamp<int64_t>(micro_batches, 1, rows);
  struct LaneRun {
    uint64_t id = 0;
    int64_t begin = 0;
    LaneSpec spec;
    std::vector<Completion> out;
    Status status;
  };
  std::vector<LaneRun> runs(static_cast<size_t>(lanes));
  for (int64_t j = 0, begin = 0; j < lanes; ++j) {
    LaneRun& run = runs[static_cast<size_t>(j)];
    const int64_t size = rows / lanes + (j < rows % lanes ? 1 : 0);
    run.id = NewLaneId();
    run.begin = begin;
    run.spec.prompts.assign(prompts.begin() + begin, prompts.begin() + begin + size);
    run.spec.params = params;
    run.spec.params.first_row = params.first_row + begin;
    run.spec.version = version;
    if (params.slots > 0) run.spec.params.slots = std::max<int64_t>(1, params.slots / lanes);
    if (!params.max_new_tokens_per_row.empty())
      run.spec.params.max_new_tokens_per_row.assign(params.max_new_tokens_per_row.begin() + begin,
                                                    params.max_new_tokens_per_row.begin() + begin + size);
    begin += size;
  }
  // Open every lane before any starts, so a stage that is not there fails the call at once.
  for (size_t j = 0; j < runs.size(); ++j) {
    const Status opened = next.Open(runs[j].id, runs[j].spec);
    if (opened.ok()) continue;
    for (size_t i = 0; i < j; ++i) {
      StageMessage stop;
      stop.stopped = true;
      (void)next.Close(runs[i].id, stop);
    }
    return opened.WithContext("opening pipeline lane");
  }
  std::mutex step_mu;
  auto lane_main = [&](LaneRun& run) {
    Qwen3Model model = SharedCopy(first);
    FirstStageIo io(run.id, next);
    model->SetStageIo(&io);
    bool stopped = false;
    const StepCallback step = [&](const std::vector<int64_t>& lane_rows, const std::vector<int64_t>& tokens,
                                  const std::vector<float>& logprobs) {
      io.SetDraws(lane_rows, tokens);
      if (!on_step) return true;
      std::vector<int64_t> global(lane_rows);
      for (int64_t& r : global) r += run.begin;
      std::lock_guard<std::mutex> lock(step_mu);
      stopped = !on_step(global, tokens, logprobs);
      return !stopped;
    };
    try {
      run.out = Generate(model, run.spec.prompts, run.spec.params, step);
    } catch (const std::exception& e) {
      run.status = Internal(std::string("pipeline generation: ") + e.what());
      stopped = true;
    }
    StageMessage close = io.TakeDraws();
    close.stopped = stopped;
    const Status closed = next.Close(run.id, std::move(close));
    if (run.status.ok()) run.status = closed;
  };
  std::vector<std::thread> threads;
  for (size_t j = 1; j < runs.size(); ++j) threads.emplace_back(lane_main, std::ref(runs[j]));
  lane_main(runs[0]);
  for (std::thread& t : threads) t.join();
  std::vector<Completion> out;
  out.reserve(prompts.size());
  for (LaneRun& run : runs) {
    ECHELON_RETURN_IF_ERROR(run.status);
    for (Completion& c : run.out) out.push_back(std::move(c));
  }
  return out;
}

Result<StageSnapshot> LoadStageSnapshot(const ModelConfig& config, const std::string& safetensors_bytes,
                                        const std::string& where) {
  ECHELON_ASSIGN_OR_RETURN(SafetensorsFile f, ParseSafetensors(safetensors_bytes, where));
  StageSnapshot out;
  ECHELON_ASSIGN_OR_RETURN(out.layers, RangeOfTensors(f.tensors));
  out.model = Qwen3Model(config, out.layers);
  ECHELON_RETURN_IF_ERROR(out.model->LoadStateDict(f.tensors, where));
  out.model->eval();
  return out;
}

}  // namespace echelon::model
