#include "echelon/sched/staleness_control.h"

#include <algorithm>
#include <cstdio>

namespace echelon::sched {

StalenessControl::StalenessControl(const StalenessControlOptions& options)
    : options_(options), staleness_(std::clamp(options.start, options.min, options.max)) {}

std::optional<StalenessChange> StalenessControl::Observe(const StalenessObservation& o) {
  ++seen_;
  ess_sum_ += o.ess_frac;
  train_sum_ += o.train_s;
  wait_sum_ += o.wait_s;
  if (seen_ < options_.window) return std::nullopt;
  const double ess = ess_sum_ / static_cast<double>(seen_);
  const double busy = train_sum_ + wait_sum_ > 0 ? train_sum_ / (train_sum_ + wait_sum_) : 1.0;
  char reason[128];
  std::optional<StalenessChange> change;
  if (ess < options_.ess_min && staleness_ > options_.min) {
    std::snprintf(reason, sizeof reason, "ess_frac %.3f < %.3f over %lld updates", ess, options_.ess_min,
                  static_cast<long long>(seen_));
    change = StalenessChange{staleness_, std::max(options_.min, staleness_ / 2), reason};
  } else if (ess >= options_.ess_min && busy < options_.busy_target && staleness_ < options_.max) {
    std::snprintf(reason, sizeof reason, "learner busy %.3f < %.3f, ess_frac %.3f over %lld updates", busy,
                  options_.busy_target, ess, static_cast<long long>(seen_));
    change = StalenessChange{staleness_, staleness_ + 1, reason};
  }
  // A window with no change slides by starting over; one with a change starts under the new S.
  seen_ = 0;
  ess_sum_ = train_sum_ = wait_sum_ = 0;
  if (change) staleness_ = change->to;
  return change;
}

double StalenessControl::LrScale() const {
  const int64_t ref = std::max<int64_t>(options_.start, 1);
  if (!options_.couple_lr || staleness_ <= ref) return 1.0;
  return static_cast<double>(ref) / static_cast<double>(staleness_);
}

nlohmann::json StalenessControl::Export() const {
  return {{"staleness", staleness_}, {"seen", seen_}, {"ess_sum", ess_sum_}, {"train_sum", train_sum_},
          {"wait_sum", wait_sum_}};
}

Status StalenessControl::Restore(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgument(where + ": staleness control state is not an object");
  for (const char* key : {"staleness", "seen"})
    if (!j.contains(key) || !j[key].is_number_integer())
      return InvalidArgument(where + ": staleness control state needs an integer '" + std::string(key) + "'");
  for (const char* key : {"ess_sum", "train_sum", "wait_sum"})
    if (!j.contains(key) || !j[key].is_number())
      return InvalidArgument(where + ": staleness control state needs a number '" + std::string(key) + "'");
  const int64_t s = j["staleness"].get<int64_t>(), seen = j["seen"].get<int64_t>();
  if (s < options_.min || s > options_.max)
    return InvalidArgument(where + ": staleness " + std::to_string(s) + " is outside [" + std::to_string(options_.min) +
                           ", " + std::to_string(options_.max) + "] (rl.staleness_min / rl.staleness_max)");
  if (seen < 0 || seen >= std::max<int64_t>(options_.window, 1))
    return InvalidArgument(where + ": staleness control window count " + std::to_string(seen) + " is out of range");
  staleness_ = s;
  seen_ = seen;
  ess_sum_ = j["ess_sum"].get<double>();
  train_sum_ = j["train_sum"].get<double>();
  wait_sum_ = j["wait_sum"].get<double>();
  return Status::Ok();
}

}  // namespace echelon::sched
