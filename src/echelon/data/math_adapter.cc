#include "echelon/data/math_adapter.h"

#include <cctype>
#include <set>
#include <unordered_set>
#include <utility>

#include "echelon/data/adapter_kit.h"
#include "echelon/data/adapter_options.h"
#include "echelon/data/math_jsonl.h"

namespace echelon::data {
namespace {

constexpr int64_t kMaxOperandLimit = 999999999;  // 9 digits, as the JSONL reader accepts

}  // namespace

// Defaults, with why: max_operand 99 gives 20,000 problems, learnable in minutes on a CPU;
// 500 held-out problems give +-2.2% standard error on an accuracy near 50%.
const OptionTable& MathOptionTable() {
  static const OptionTable table = {
      {"seed", "0", "problem draws and held-out split (`echelon train` sets the run's seed)"},
      {"max_operand", "99", "generated problems a + b and a - b with operands in [0, max_operand]"},
      {"eval_size", "500", "held-out problems (at most half of the space); exclusive with eval_file"},
      {"train_file", "", "JSONL problems to train on instead of generated ones (needs eval_file)"},
      {"eval_file", "", "JSONL held-out problems"},
      {"answer", "exact", "exact: the completion is the number; last_number: its last integer is the answer"},
  };
  return table;
}

namespace {

struct MathOptions {
  uint64_t seed = 0;
  int64_t max_operand = 0;  // defaults: MathOptionTable()
  int64_t eval_size = 0;
  std::string train_file;
  std::string eval_file;
  bool last_number = false;  // answer: last_number
};

// The last integer written in `text` without leading zeros ("-011" -> "-11", "-0" -> "0"),
// or "" when there is none. A '-' directly before the digits is its sign.
std::string LastInteger(const std::string& text) {
  size_t end = text.size();
  while (end > 0 && !std::isdigit(static_cast<unsigned char>(text[end - 1]))) --end;
  if (end == 0) return "";
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(text[begin - 1]))) --begin;
  size_t first = begin;
  while (first + 1 < end && text[first] == '0') ++first;
  std::string digits = text.substr(first, end - first);
  const bool negative = begin > 0 && text[begin - 1] == '-' && digits != "0";
  return negative ? "-" + digits : digits;
}

constexpr uint64_t kEvalStream = 1;
constexpr uint64_t kTrainStream = 2;
constexpr uint64_t kShuffleStream = 3;

Result<uint64_t> ParseUnsigned(const std::string& key, const std::string& value, uint64_t lo,
                               uint64_t hi) {
  return ParseUnsignedOption("math", key, value, lo, hi);
}

// Problems in the generated space: 2 operators x (M+1)^2 operand pairs.
uint64_t SpaceSize(int64_t max_operand) {
  const uint64_t n = static_cast<uint64_t>(max_operand) + 1;
  return 2 * n * n;
}

MathProblem ProblemAt(uint64_t index, int64_t max_operand) {
  const uint64_t n = static_cast<uint64_t>(max_operand) + 1;
  const uint64_t pair = index / 2;
  return MathProblem{static_cast<int64_t>(pair % n), index % 2 == 0 ? '+' : '-',
                     static_cast<int64_t>(pair / n)};
}

// train_file needs eval_file; eval_file replaces eval_size.
Status CheckSources(const AdapterOptions& options, const MathOptions& o) {
  if (!o.train_file.empty() && o.eval_file.empty()) {
    return InvalidArgument(
        "math task option train_file needs eval_file: the held-out set must come from the "
        "same source as the training problems");
  }
  if (!o.eval_file.empty() && options.count("eval_size")) {
    return InvalidArgument(
        "math task options eval_size and eval_file are exclusive: the held-out set is every "
        "line of eval_file");
  }
  return Status::Ok();
}

// At most half the space is held out, so a training draw hits a free problem at least half
// the time and there is always plenty left to train on.
Result<int64_t> ParseEvalSize(const AdapterOptions& options, int64_t max_operand) {
  const uint64_t space = SpaceSize(max_operand);
  Result<uint64_t> n = ParseUnsigned("eval_size", OptionOr(options, MathOptionTable(), "eval_size"),
                                     1, space / 2);
  if (!n.ok()) {
    return InvalidArgument(n.status().message() + " (at most half of the " +
                           std::to_string(space) + " problems max_operand " +
                           std::to_string(max_operand) + " allows)");
  }
  return static_cast<int64_t>(n.value());
}

Result<MathOptions> ParseOptions(const AdapterOptions& options) {
  ECHELON_RETURN_IF_ERROR(CheckOptionNames("math", options, MathOptionTable()));
  MathOptions o;
  ECHELON_ASSIGN_OR_RETURN(o.seed, ParseUnsigned("seed", OptionOr(options, MathOptionTable(), "seed"),
                                                 0, UINT64_MAX));
  ECHELON_ASSIGN_OR_RETURN(uint64_t max_operand,
                           ParseUnsigned("max_operand",
                                         OptionOr(options, MathOptionTable(), "max_operand"), 1,
                                         kMaxOperandLimit));
  o.max_operand = static_cast<int64_t>(max_operand);
  const std::string answer = OptionOr(options, MathOptionTable(), "answer");
  if (answer != "exact" && answer != "last_number")
    return InvalidArgument("math task option answer: expected exact or last_number, got \"" + answer + "\"");
  o.last_number = answer == "last_number";
  o.train_file = OptionOr(options, MathOptionTable(), "train_file");
  o.eval_file = OptionOr(options, MathOptionTable(), "eval_file");
  ECHELON_RETURN_IF_ERROR(CheckSources(options, o));
  if (o.eval_file.empty()) {
    ECHELON_ASSIGN_OR_RETURN(o.eval_size, ParseEvalSize(options, o.max_operand));
  }
  return o;
}

class MathAdapter final : public TaskAdapter {
 public:
  static Result<std::unique_ptr<TaskAdapter>> Create(const MathOptions& o) {
    std::unique_ptr<MathAdapter> m(new MathAdapter(o));
    ECHELON_RETURN_IF_ERROR(m->LoadHeldOut());
    ECHELON_RETURN_IF_ERROR(m->LoadTrain());
    return std::unique_ptr<TaskAdapter>(std::move(m));
  }

  std::string name() const override { return "math"; }
  std::string Alphabet() const override { return kMathAlphabet; }

  uint64_t TrainPromptKey(uint64_t group_id) const override {
    return train_.empty() ? group_id : order_[group_id % order_.size()];
  }

  Prompt TrainPrompt(uint64_t group_id) const override {
    if (!train_.empty()) {
      Prompt p = train_[order_[group_id % order_.size()]];
      p.id = group_id;
      return p;
    }
    // Rejection: at most half the space is held out (checked at creation), so the expected
    // number of draws is below 2.
    for (uint64_t attempt = 0;; ++attempt) {
      uint64_t index = StableHash(opts_.seed, kTrainStream, group_id, attempt) % space_;
      MathProblem p = ProblemAt(index, opts_.max_operand);
      if (!held_out_keys_.count(p.Question())) return p.ToPrompt(group_id);
    }
  }

  const std::vector<Prompt>& HeldOut() const override { return held_out_; }

  Result<std::vector<Episode>> RunGroup(const Prompt& prompt, int group_size, Policy& policy,
                                        uint64_t seed) const override {
    return RunSingleTurnGroup(*this, prompt, group_size, policy, seed);
  }
  bool SamplesWithGroupSeed() const override { return true; }

  // answer=exact: " 85", "85 " and "085" are wrong, so the policy must learn the format.
  // answer=last_number: the last integer of the completion counts ("The sum is 85." is right).
  Result<Scored> Reward(const Prompt& prompt, const std::string& completion) const override {
    if (opts_.last_number) return Scored{LastInteger(completion) == prompt.reference ? 1.0 : 0.0, {}};
    return Scored{completion == prompt.reference ? 1.0 : 0.0, {}};
  }

  std::string Demonstration(const Prompt& prompt) const override { return prompt.reference; }
  Status ExportHeldOut(const std::string& path) const override { return WriteMathJsonl(path, held_out_); }

 private:
  explicit MathAdapter(const MathOptions& o) : opts_(o), space_(SpaceSize(o.max_operand)) {}

  Status LoadHeldOut();
  Status LoadTrain();
  Status LoadHeldOutFile();

  const MathOptions opts_;
  const uint64_t space_;
  std::vector<Prompt> held_out_;
  std::unordered_set<std::string> held_out_keys_;  // canonical questions
  std::vector<Prompt> train_;                       // JSONL mode only
  std::vector<size_t> order_;                       // seeded shuffle of train_
};

// Canonical key of a prompt text "A+B=" (so "007+1=" and "7+1=" are the same problem).
std::string KeyOf(const Prompt& p) {
  return ParseMathQuestion(p.text.substr(0, p.text.size() - 1))->Question();
}

Status MathAdapter::LoadHeldOut() {
  if (!opts_.eval_file.empty()) return LoadHeldOutFile();
  for (uint64_t draw = 0; static_cast<int64_t>(held_out_.size()) < opts_.eval_size; ++draw) {
    MathProblem p = ProblemAt(StableHash(opts_.seed, kEvalStream, draw, 0) % space_, opts_.max_operand);
    if (!held_out_keys_.insert(p.Question()).second) continue;
    held_out_.push_back(p.ToPrompt(held_out_.size()));
  }
  return Status::Ok();
}

Status MathAdapter::LoadHeldOutFile() {
  Result<std::vector<Prompt>> eval = ReadMathJsonl(opts_.eval_file);
  if (!eval.ok()) return eval.status().WithContext("math task eval_file");
  held_out_ = std::move(eval).value();
  uint64_t in_space = 0;
  for (size_t i = 0; i < held_out_.size(); ++i) {
    held_out_[i].id = i;
    MathProblem p = *ParseMathQuestion(KeyOf(held_out_[i]));
    const bool inside = p.a <= opts_.max_operand && p.b <= opts_.max_operand;
    if (held_out_keys_.insert(p.Question()).second && inside) ++in_space;
  }
  // Generated training prompts avoid these; keep at least half the space free for them.
  if (opts_.train_file.empty() && in_space > space_ / 2) {
    return InvalidArgument("math task eval_file " + opts_.eval_file + " holds " +
                           std::to_string(in_space) + " of the " + std::to_string(space_) +
                           " generated problems; at most half may be held out: raise "
                           "max_operand or give a train_file");
  }
  return Status::Ok();
}

Status MathAdapter::LoadTrain() {
  if (opts_.train_file.empty()) return Status::Ok();
  Result<std::vector<Prompt>> train = ReadMathJsonl(opts_.train_file);
  if (!train.ok()) return train.status().WithContext("math task train_file");
  train_ = std::move(train).value();
  for (const Prompt& p : train_) {
    if (held_out_keys_.count(KeyOf(p))) {
      return InvalidArgument("math task train_file " + opts_.train_file + ":" +
                             std::to_string(p.id) + ": question \"" +
                             p.text.substr(0, p.text.size() - 1) +
                             "\" is also in eval_file; held-out problems must not be trained on");
    }
  }
  // Fisher-Yates with the fixed hash, so the order is the same everywhere.
  order_.resize(train_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
  for (size_t i = order_.size(); i > 1; --i) {
    std::swap(order_[i - 1], order_[StableHash(opts_.seed, kShuffleStream, i, 0) % i]);
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<TaskAdapter>> CreateMathAdapter(const AdapterOptions& options) {
  ECHELON_ASSIGN_OR_RETURN(MathOptions o, ParseOptions(options));
  return MathAdapter::Create(o);
}

}  // namespace echelon::data
