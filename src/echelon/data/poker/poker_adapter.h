// The "poker" task: heads-up fixed-limit Texas Hold'em against a fixed opponent
// (game_state.h for the rules, opponents.h for the bots, observation.h for the prompt and the
// answer vocabulary "f"/"c"/"r").
//
// What the player sees (observation.h): its seat, its two hole cards, a hand-strength digit
// (equity of those cards and the visible board against one random hand, Monte Carlo seeded
// by the visible cards), the visible board, the pot and the action history of the hand.
// Never the opponent's cards, the board cards still to come or the deal seed.
//
// Episodes, groups, rewards:
// - An episode is one whole hand; every policy decision is one Turn.
// - A group (TrainPrompt(group_id)) is one deal, one policy seat and one opponent, played
//   group_size times (duplicate style: same cards, same board, and the opponent answers the
//   same history the same way, so reward differences inside a group come from the policy's
//   choices). RunGroup plays the copies in lockstep, one batched Policy::Sample per decision
//   depth (hand_runner.h).
// - Reward: the policy's net chips at the end of the hand in big blinds, given to the whole
//   episode, so every decision of the hand gets the same advantage (hand_runner.h). It is
//   zero-sum: the opponent wins exactly what the policy loses.
// - Deals where the opponent folds before the policy's first decision are skipped (they
//   would be episodes with no decisions): the group's deal is the first of a seeded series
//   that gives the policy a decision.
// - Prompt::text is the policy's first decision of the deal; Prompt::reference is
//   "deal=<seed> seat=<0|1> opp=<name>".
// - Reward(prompt, completion) is the outcome when the policy answers `completion` at its
//   first decision and checks or calls at every later one. For a hand with one decision (the
//   only ones the learner re-checks) that is exactly the episode's reward.
// - Demonstration (warm-start target) is a legal action drawn uniformly by the deal seed:
//   the warm-start teaches the answer format and leaves a near-random policy for RL.
// - HeldOut() is eval_hands first decisions of held-out deals, scored by Reward (the greedy
//   first action, then check/call): a cheap in-training signal. The real measure is
//   `echelon eval --task poker` (duplicate_eval.h).
//
// Options: PokerOptionTable() (name, default, help; unknown names are an error).
//
//   auto task = CreatePokerAdapter({{"opponent", "tag"}, {"seed", "3"}});
//
// Thread contract: immutable after creation; all methods may run concurrently.
#pragma once

#include <memory>

#include "echelon/common/status.h"
#include "echelon/data/adapter.h"
#include "echelon/data/poker/hand_runner.h"

namespace echelon::data {

Result<std::unique_ptr<TaskAdapter>> CreatePokerAdapter(const AdapterOptions& options);

namespace poker {

// The adapter's options: name, default, help.
const OptionTable& PokerOptionTable();
// The table a prompt stands for, from its reference; InvalidArgument when malformed.
Result<TableSpec> TableOfPrompt(const Prompt& prompt);
// "fold" / "call"; errors name the choices.
Result<IllegalAction> ParseIllegalAction(const std::string& name);

}  // namespace poker
}  // namespace echelon::data
