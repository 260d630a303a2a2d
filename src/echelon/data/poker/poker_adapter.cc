#include "echelon/data/poker/poker_adapter.h"

#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "echelon/common/fs.h"
#include "echelon/data/adapter_options.h"
#include "echelon/data/poker/observation.h"

namespace echelon::data {
namespace poker {
namespace {

constexpr int64_t kMaxEvalHands = 100000;
constexpr uint64_t kTrainStream = 2;
constexpr uint64_t kEvalStream = 1;
// Redraws before giving up on a deal that gives the policy a decision. Only an opponent on
// the button can fold before the policy acts, in under half of the deals (tag folds Chen < 5),
// so 64 redraws all fail with probability below 1e-19; then the policy takes the button.
constexpr uint64_t kMaxRedraws = 64;

struct PokerOptions {
  uint64_t seed = 0;
  std::optional<RunSecret> secret;  // training deals (held-out ones come from the seed)
  std::vector<OpponentKind> opponents;
  IllegalAction illegal = IllegalAction::kFold;
  int64_t eval_hands = 0;  // defaults: PokerOptionTable()
};

Result<uint64_t> ParseUnsigned(const std::string& key, const std::string& value, uint64_t lo, uint64_t hi) {
  return ParseUnsignedOption("poker", key, value, lo, hi);
}

Result<std::vector<OpponentKind>> ParseOpponentList(const std::string& list) {
  std::vector<OpponentKind> out;
  std::stringstream ss(list);
  std::string name;
  while (std::getline(ss, name, ',')) {
    Result<OpponentKind> k = ParseOpponent(name);
    if (!k.ok()) return InvalidArgument("poker task option opponent: " + k.status().message());
    out.push_back(k.value());
  }
  if (out.empty()) return InvalidArgument("poker task option opponent: empty; known opponents: random, calling-station, tag");
  return out;
}

}  // namespace

// Defaults, with why: two opponents, as training against one overfits it; 200 held-out
// hands are about 1 s of greedy generation at each evaluation.
const OptionTable& PokerOptionTable() {
  static const OptionTable table = {
      {"seed", "0", "held-out deals, and training deals without a secret (`echelon train` sets the run's seed)"},
      SecretOptionRow("training deals, seats and opponents"),
      {"opponent", "calling-station,tag", "one name or a comma list (random, calling-station, tag); each group's "
                                          "opponent is drawn from the list"},
      {"illegal_action", "fold", "consequence of an answer that is not f/c/r or not legal (f when a check is free, r "
                                 "at the cap): fold forfeits the hand, call checks or calls"},
      {"eval_hands", "200", "held-out first decisions (1..100000)"},
  };
  return table;
}

namespace {

Result<PokerOptions> ParseOptions(const AdapterOptions& options) {
  ECHELON_RETURN_IF_ERROR(CheckOptionNames("poker", options, PokerOptionTable()));
  PokerOptions o;
  ECHELON_ASSIGN_OR_RETURN(o.seed, ParseUnsigned("seed", OptionOr(options, PokerOptionTable(), "seed"), 0, UINT64_MAX));
  ECHELON_ASSIGN_OR_RETURN(o.secret, ParseSecretOption("poker", options));
  ECHELON_ASSIGN_OR_RETURN(o.opponents, ParseOpponentList(OptionOr(options, PokerOptionTable(), "opponent")));
  Result<IllegalAction> illegal = ParseIllegalAction(OptionOr(options, PokerOptionTable(), "illegal_action"));
  if (!illegal.ok()) return InvalidArgument("poker task option illegal_action: " + illegal.status().message());
  o.illegal = illegal.value();
  ECHELON_ASSIGN_OR_RETURN(uint64_t eval_hands,
                           ParseUnsigned("eval_hands", OptionOr(options, PokerOptionTable(), "eval_hands"),
                                         1, kMaxEvalHands));
  o.eval_hands = static_cast<int64_t>(eval_hands);
  return o;
}

std::string Reference(const TableSpec& t) {
  return "deal=" + std::to_string(t.deal_seed) + " seat=" + std::to_string(t.policy_seat) +
         " opp=" + OpponentName(t.opponent);
}

class PokerAdapter final : public TaskAdapter {
 public:
  explicit PokerAdapter(PokerOptions o) : opts_(std::move(o)) {
    for (int64_t i = 0; i < opts_.eval_hands; ++i) held_out_.push_back(PromptFor(kEvalStream, i));
  }

  std::string name() const override { return "poker"; }
  // A player acts at most kMaxBetsPerRound times in each of the four betting rounds.
  size_t MaxTurns() const override { return 4 * kMaxBetsPerRound; }
  std::string Alphabet() const override { return PokerAlphabet(); }
  Prompt TrainPrompt(uint64_t group_id) const override { return PromptFor(kTrainStream, group_id); }
  const std::vector<Prompt>& HeldOut() const override { return held_out_; }

  Result<std::vector<Episode>> RunGroup(const Prompt& prompt, int group_size, Policy& policy,
                                        uint64_t seed) const override {
    if (group_size <= 0) return std::vector<Episode>();
    ECHELON_ASSIGN_OR_RETURN(TableSpec table, TableOfPrompt(prompt));
    RunnerOptions ro;
    ro.illegal = opts_.illegal;
    ECHELON_ASSIGN_OR_RETURN(std::vector<PlayedHand> played,
                             PlayHands(std::vector<TableSpec>(group_size, table), policy, seed, ro));
    std::vector<Episode> episodes;
    episodes.reserve(played.size());
    for (PlayedHand& h : played) episodes.push_back(std::move(h.episode));
    return episodes;
  }

  Result<Scored> Reward(const Prompt& prompt, const std::string& completion) const override {
    Result<TableSpec> table = TableOfPrompt(prompt);
    if (!table.ok()) return Scored{};
    return Scored{ChipsToBigBlinds(ReplayHand(table.value(), {completion}, opts_.illegal).chips), {}};
  }

  // A hand is replayed from its deal: the learner never takes an actor's chips on its word.
  Result<std::optional<Replay>> ReplayEpisode(const Prompt& prompt, const std::vector<std::string>& actions) const override {
    ECHELON_ASSIGN_OR_RETURN(TableSpec table, TableOfPrompt(prompt));
    ReplayedHand hand = ReplayHand(table, actions, opts_.illegal);
    Replay out;
    out.scored.reward = ChipsToBigBlinds(hand.chips);
    out.success = hand.chips > 0;
    for (std::string& p : hand.prompts) out.prompts.emplace_back(std::move(p));
    return std::optional<Replay>(std::move(out));
  }

  std::string Demonstration(const Prompt& prompt) const override {
    Result<TableSpec> table = TableOfPrompt(prompt);
    if (!table.ok()) return "c";
    HandState hand(DealFromSeed(table->deal_seed));
    AdvanceOpponent(hand, table.value());
    const std::vector<Action> legal = hand.LegalActions();
    if (legal.empty()) return "c";
    return std::string(1, ActionChar(legal[HashCombine(table->deal_seed, 0x64656d6fULL) % legal.size()]));
  }

  Status ExportHeldOut(const std::string& path) const override {
    std::string text;
    for (const Prompt& p : held_out_) {
      const TableSpec t = TableOfPrompt(p).value();
      text += nlohmann::json{{"id", p.id},
                             {"deal_seed", std::to_string(t.deal_seed)},
                             {"seat", t.policy_seat},
                             {"opponent", OpponentName(t.opponent)},
                             {"prompt", p.text}}
                  .dump() +
              "\n";
    }
    return WriteFileAtomic(path, text);
  }

 private:
  // What stream index `index`'s deals are drawn from: a training deal from the run's secret, so
  // a worker cannot know the hands of a group it plays (or will play); held-out ones from the
  // seed, the same in every run with it.
  uint64_t StreamKey(uint64_t stream, uint64_t index) const {
    if (stream == kTrainStream && opts_.secret) return opts_.secret->Draw("poker deal", index);
    return HashCombine(HashCombine(opts_.seed, stream), index);
  }

  // The table of stream index `index`: the first redraw whose deal gives the policy a decision.
  TableSpec TableFor(uint64_t stream, uint64_t index) const {
    TableSpec t;
    for (uint64_t attempt = 0; attempt < kMaxRedraws; ++attempt) {
      const uint64_t h = HashCombine(StreamKey(stream, index), attempt);
      t.deal_seed = h;
      t.policy_seat = static_cast<int>(HashCombine(h, 1) & 1);
      t.opponent = opts_.opponents[HashCombine(h, 2) % opts_.opponents.size()];
      HandState hand(DealFromSeed(t.deal_seed));
      AdvanceOpponent(hand, t);
      if (!hand.finished()) return t;
    }
    t.policy_seat = 0;  // the button always acts first: a decision is certain
    return t;
  }

  Prompt PromptFor(uint64_t stream, uint64_t index) const {
    const TableSpec t = TableFor(stream, index);
    HandState hand(DealFromSeed(t.deal_seed));
    AdvanceOpponent(hand, t);
    return Prompt{index, PromptText(hand, t.policy_seat), Reference(t)};
  }

  const PokerOptions opts_;
  std::vector<Prompt> held_out_;
};

}  // namespace

Result<IllegalAction> ParseIllegalAction(const std::string& name) {
  if (name == "fold") return IllegalAction::kFold;
  if (name == "call") return IllegalAction::kCall;
  return InvalidArgument("expected \"fold\" (forfeit the hand) or \"call\" (check/call instead), got \"" + name + "\"");
}

Result<TableSpec> TableOfPrompt(const Prompt& prompt) {
  std::istringstream in(prompt.reference);
  std::string deal, seat, opp;
  in >> deal >> seat >> opp;
  const std::string bad = "poker prompt " + std::to_string(prompt.id) + ": malformed reference \"" + prompt.reference +
                          "\" (expected \"deal=<seed> seat=<0|1> opp=<name>\")";
  if (deal.rfind("deal=", 0) != 0 || (seat != "seat=0" && seat != "seat=1") || opp.rfind("opp=", 0) != 0) {
    return InvalidArgument(bad);
  }
  TableSpec t;
  Result<uint64_t> seed = ParseUnsigned("deal", deal.substr(5), 0, UINT64_MAX);
  if (!seed.ok()) return InvalidArgument(bad);
  t.deal_seed = seed.value();
  t.policy_seat = seat == "seat=1" ? 1 : 0;
  Result<OpponentKind> k = ParseOpponent(opp.substr(4));
  if (!k.ok()) return InvalidArgument(bad);
  t.opponent = k.value();
  return t;
}

}  // namespace poker

Result<std::unique_ptr<TaskAdapter>> CreatePokerAdapter(const AdapterOptions& options) {
  ECHELON_ASSIGN_OR_RETURN(poker::PokerOptions o, poker::ParseOptions(options));
  return std::unique_ptr<TaskAdapter>(new poker::PokerAdapter(std::move(o)));
}

}  // namespace echelon::data
