// The data plane: a TaskAdapter turns a task into prompts, runs episodes against a policy,
// rewards them, and turns them into training samples. Changing task means changing the
// adapter (selected by name in config); learner and actors stay untouched.
//
//   std::unique_ptr<TaskAdapter> task = CreateAdapter("math", options).value();
//   ECHELON_ASSIGN_OR_RETURN(std::vector<Episode> group, task->RunGroup(task->TrainPrompt(group_id), 8, policy, seed));
//
// Thread contract: an adapter is immutable after creation and its methods may run
// concurrently (each actor thread has its own Policy).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "echelon/common/routes.h"
#include "echelon/common/status.h"

namespace echelon::data {

struct Prompt {
  uint64_t id = 0;
  std::string text;         // what the policy sees (the user message of a chat prompt)
  std::string reference;    // what the adapter checks against (e.g. "85")
  std::string data_source;  // prompts task: the row's data_source (learner side only)
  std::string extra_info;   // prompts task: the row's extra_info as JSON text, "" when none
  std::string system;       // a chat prompt's system message, "" when none
};

// One policy decision: the prompt as token ids, the sampled tokens, and their log-probs under
// the behaviour policy.
struct Turn {
  std::vector<int64_t> prompt_ids;
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;
  std::string text;  // decoded completion
  // The policy version that drew each token (partial rollouts: a generation that moved to a
  // newer snapshot midway); empty: all of them the group's behaviour version.
  std::vector<int64_t> versions;
  // Where the learner knows this turn's draws from (a turn of a group it played for an actor:
  // the seed and row of the Policy::Sample call it asked for): the verifier checks each token
  // is DrawUniform(draw_seed, draw_row, position)'s draw. Set by the learner alone, never read
  // from a worker; draw_row -1: not known.
  uint64_t draw_seed = 0;
  int64_t draw_row = -1;
  // Router replay (rl.router_replay, a mixture-of-experts policy): the routes the actor chose
  // where its choice was close; positions index prompt_ids + tokens. Checked on intake.
  Routes routes;
};

// A whole episode (one GRPO sample); every turn receives the episode's advantage.
struct Episode {
  std::vector<Turn> turns;
  double reward = 0.0;
  bool success = false;  // task-defined (math: exact answer)
  std::map<std::string, double> metrics;  // numbers the reward reported (Scored::metrics)
};

// A completion's reward and the named numbers its reward function reported with it (the
// learner writes their means over each update's batch as reward_metrics; an episode without
// a key counts 0).
struct Scored {
  double reward = 0.0;
  std::map<std::string, double> metrics;
};

// What the policy continues: a user message after an optional system message. With a chat
// template both are rendered as chat turns; without one they are joined by "\n" (see
// model::Vocabulary::EncodePrompt).
struct PolicyPrompt {
  PolicyPrompt(std::string user_text) : user(std::move(user_text)) {}  // NOLINT: a plain prompt
  PolicyPrompt(const char* user_text) : user(user_text) {}             // NOLINT
  PolicyPrompt(std::string system_text, std::string user_text)
      : system(std::move(system_text)), user(std::move(user_text)) {}
  static PolicyPrompt Of(const Prompt& p) { return PolicyPrompt(p.system, p.text); }

  std::string system;
  std::string user;
};

// An episode replayed by the learner from its actions: its reward, and the prompt the policy
// saw before each action the task took. Fewer prompts than actions means the episode had
// ended (or hit the task's turn limit) before the rest: an honest actor never sends those.
struct Replay {
  Scored scored;
  bool success = false;
  std::vector<PolicyPrompt> prompts;
};

// What an adapter drives: samples one completion per prompt.
class Policy {
 public:
  virtual ~Policy() = default;
  // One completion per prompt, in order; an error (the prompt cannot be encoded, the inference
  // server failed) fails the whole call.
  virtual Result<std::vector<Turn>> Sample(const std::vector<PolicyPrompt>& prompts, uint64_t seed) = 0;
};

class TaskAdapter {
 public:
  virtual ~TaskAdapter() = default;
  virtual std::string name() const = 0;
  // Every character prompts and answers may contain (for the character tokenizer).
  virtual std::string Alphabet() const = 0;
  // Whether the adapter holds what training needs (an adapter built only to score and to play
  // prompts handed out by the learner, as an actor's is, may not); the error says what is missing.
  virtual Status ReadyToTrain() const { return Status::Ok(); }
  // The training prompt for a group id; deterministic, so a re-issued group is identical.
  virtual Prompt TrainPrompt(uint64_t group_id) const = 0;
  // Which training prompt a group id stands for: groups with one key are the same prompt (a
  // dataset row seen again in a later epoch), whose response lengths deadline-aware dispatch
  // learns (sched/completion_forecast.h). By default every group is a prompt of its own.
  virtual uint64_t TrainPromptKey(uint64_t group_id) const { return group_id; }
  // The held-out evaluation set (disjoint from training prompts).
  virtual const std::vector<Prompt>& HeldOut() const = 0;
  // Plays `group_size` episodes of one prompt with the policy (one batched call for
  // single-turn tasks) and rewards them. The policy's error fails the group.
  virtual Result<std::vector<Episode>> RunGroup(const Prompt& prompt, int group_size, Policy& policy,
                                        uint64_t seed) const = 0;
  // Reward of one completion for a prompt (the learner re-checks what it can verify). An error
  // (a user's reward function failed) names the function and the sample; the learner refuses
  // that group, and stops the run when the reward fails on many groups in a row
  // (learn/trajectory_intake.h).
  virtual Result<Scored> Reward(const Prompt& prompt, const std::string& completion) const = 0;
  // The rewards of several completions of one prompt (a group); adapters that score in batches
  // (a scoring service) override it.
  virtual Result<std::vector<Scored>> RewardGroup(const Prompt& prompt, const std::vector<std::string>& completions) const {
    std::vector<Scored> out;
    for (const std::string& c : completions) {
      ECHELON_ASSIGN_OR_RETURN(Scored s, Reward(prompt, c));
      out.push_back(std::move(s));
    }
    return out;
  }
  // Replays an episode of a multi-turn task from its actions (the decoded text of each turn):
  // what the learner trains on instead of the actor's word. nullopt when the adapter cannot
  // replay (the actor's reward then stands and its prompts are not checked). An error is
  // handled as Reward's is.
  virtual Result<std::optional<Replay>> ReplayEpisode(const Prompt& prompt,
                                                      const std::vector<std::string>& actions) const {
    (void)prompt;
    (void)actions;
    return std::optional<Replay>();
  }
  // The most turns (policy calls) one episode can have; the learner refuses an episode with no
  // turn or more than this (bad_turn_count). Above 1, every episode is replayed with
  // ReplayEpisode; at 1 the learner scores the group with RewardGroup and checks that the
  // prompt is the group's.
  virtual size_t MaxTurns() const { return 1; }
  // Whether RunGroup samples the group in one Policy::Sample call of group_size copies of the
  // prompt with the group's seed (RunSingleTurnGroup), so a verifier can recompute each
  // token's seeded draw (learn/behaviour_verifier.h).
  virtual bool SamplesWithGroupSeed() const { return false; }
  // Whether greedy evaluation plays whole episodes with RunGroup (a multi-turn environment)
  // rather than scoring one completion per held-out prompt with Reward.
  virtual bool EvalPlaysEpisodes() const { return false; }
  // Whether an actor's adapter computes the same rewards as the learner's (a reward the
  // learner alone can compute, as a Python function on its host, makes this false: the learner
  // then scores every group and does not count the actors' rewards as wrong).
  virtual bool ActorsCanScore() const { return true; }
  // Supervised target text for the warm-start (what a correct answer looks like).
  virtual std::string Demonstration(const Prompt& prompt) const = 0;
  // Writes the held-out set in the form `echelon eval --data` reads back, so a run's
  // checkpoints can be evaluated later on exactly its held-out problems.
  virtual Status ExportHeldOut(const std::string& path) const = 0;
};

// Adapter options as flat key -> string (from the config's `task:` section, minus `name`).
using AdapterOptions = std::map<std::string, std::string>;

// Creates an adapter by registered name; errors list the known names or name the bad option.
Result<std::unique_ptr<TaskAdapter>> CreateAdapter(const std::string& name, const AdapterOptions& options);
std::vector<std::string> AdapterNames();

// One option an adapter takes: its name, its default as text ("": none) and what it does.
// An adapter names its options once, in its table: the name check, the defaults and
// `echelon train --help` read it (data/adapter_options.h).
struct OptionSpec {
  std::string name;
  std::string default_value;
  std::string help;
};
using OptionTable = std::vector<OptionSpec>;

// A registered adapter's options (name, default, help: data/adapter_options.h), or nullptr
// for an unknown name.
const OptionTable* AdapterOptionTable(const std::string& name);

}  // namespace echelon::data
