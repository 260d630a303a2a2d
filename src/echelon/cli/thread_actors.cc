#include "echelon/cli/thread_actors.h"

#include "echelon/learn/trajectory_intake.h"
#include "echelon/rollout/model_policy.h"

namespace echelon::cli {

ThreadActors::ThreadActors(int64_t count, std::vector<double> slowdowns, const Clock* clock)
    : count_(count), slowdowns_(std::move(slowdowns)), clock_(clock) {}

ThreadActors::~ThreadActors() { StopWork(); }

Status ThreadActors::Start(learn::TrajectoryIntake* intake, const std::string& run_spec_json, std::ostream& progress) {
  ECHELON_ASSIGN_OR_RETURN(contract::ActorSetup setup, contract::ParseRunSpec(run_spec_json));
  setup_ = std::make_unique<contract::ActorSetup>(std::move(setup));
  for (int64_t i = 0; i < count_; ++i) {
    auto policy = std::make_unique<rollout::ModelPolicy>(model::Qwen3Model(setup_->model), setup_->vocab,
                                                         setup_->sampling);
    rollout::ActorOptions ao;
    ao.name = "actor-" + std::to_string(i);
    ao.partial = setup_->partial;
    ao.slowdown = i < static_cast<int64_t>(slowdowns_.size()) ? slowdowns_[i] : 1.0;
    actors_.push_back(std::make_unique<rollout::Actor>(ao, intake, intake, intake, &intake->task(),
                                                       std::move(policy), clock_));
  }
  for (auto& a : actors_) threads_.emplace_back([this, actor = a.get()] { actor->Run(stop_); });
  progress << count_ << " actor threads started" << std::endl;
  return Status::Ok();
}

void ThreadActors::StopWork() {
  stop_ = true;
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

}  // namespace echelon::cli
