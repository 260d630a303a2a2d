// Resumable groups: a lease that ends midway is continued from the prefix its holder reported,
// by a worker that draws what the first would have; the prefix is verified before it is handed
// on, and neither its reporter nor the next holder can change it.
#include <gtest/gtest.h>

#include <thread>

#include "echelon/contract/group_seed.h"
#include "echelon/data/adapter.h"
#include "echelon/learn/snapshot_publisher.h"
#include "echelon/learn/trajectory_intake.h"
#include "echelon/model/testing.h"
#include "echelon/rollout/actor.h"
#include "echelon/rollout/model_policy.h"

namespace echelon::learn {
namespace {

constexpr int kGroup = 4;
constexpr int64_t kMaxNewTokens = 24;
const RunSecret kSecret = RunSecret::FromSeed(5);
const contract::WorkRequest kResumes{/*continues_prefixes=*/true, /*snapshot_version=*/0};

model::SamplingParams Sampling() {
  model::SamplingParams sp;
  sp.temperature = 1.0;
  sp.max_new_tokens = kMaxNewTokens;
  return sp;
}

// The learner's side (dispatcher, intake, verifier checking every group and every draw) and one
// worker's policy on the published v0.
struct Resumable {
  Resumable()
      : dispatcher({/*max_staleness=*/2, /*batch_groups=*/2, /*lease_seconds=*/10}, &clock),
        task(data::CreateAdapter("math", {{"seed", "1"}, {"eval_size", "10"}}).value()),
        vocab(model::Vocabulary::Characters(task->Alphabet())),
        config(model::TinyTestConfig(vocab.id_end(), 32)),
        weights(config),
        intake(&dispatcher, task.get(), &vocab, {vocab.id_end(), kGroup, kMaxNewTokens, kSecret, /*resume=*/true}),
        verifier(config, Options()),
        policy(model::Qwen3Model(config), vocab, Sampling()) {
    weights->InitWeights(3);
    intake.SetVerifier(&verifier);
    Publish(0);
    EXPECT_TRUE(policy.LoadSnapshot(*intake.Latest().weights, 0).ok());
  }
  static VerifyOptions Options() {
    VerifyOptions o;
    o.fraction = 1.0;
    o.tolerance = 1e-3;
    o.window = 2;
    o.sampling = Sampling();
    o.secret = kSecret;
    o.draws = true;
    return o;
  }
  void Publish(int64_t version) {
    intake.Publish(MakeSnapshot(weights, version).value());
    dispatcher.SetVersion(version);
  }

  // The whole group a worker draws for `a` from the start.
  std::vector<data::Turn> Draw(const contract::Assignment& a) {
    return policy.Sample(std::vector<data::PolicyPrompt>(kGroup, data::PolicyPrompt::Of(a.prompt)), a.seed).value();
  }
  // The first `lengths[j]` tokens of each sample, as its holder reports them (v0 drew them).
  static std::vector<contract::PrefixPart> Prefix(const std::vector<data::Turn>& full, const std::vector<size_t>& lengths) {
    std::vector<contract::PrefixPart> parts;
    for (size_t j = 0; j < full.size(); ++j) {
      if (lengths[j] == 0) continue;
      contract::PrefixPart p{static_cast<int64_t>(j), 0};
      p.tokens.assign(full[j].tokens.begin(), full[j].tokens.begin() + static_cast<std::ptrdiff_t>(lengths[j]));
      p.logprobs.assign(full[j].logprobs.begin(), full[j].logprobs.begin() + static_cast<std::ptrdiff_t>(lengths[j]));
      p.versions.assign(lengths[j], 0);
      parts.push_back(p);
    }
    return parts;
  }
  // A submission of `turns` for `a` by `actor`, as an actor sends it.
  static contract::GroupRollout Rollout(const contract::Assignment& a, const std::string& actor,
                                        std::vector<data::Turn> turns) {
    contract::GroupRollout g;
    g.group_id = a.work.group_id;
    g.lease_id = a.work.lease_id;
    g.actor = actor;
    g.behavior_version = 0;
    for (data::Turn& t : turns) g.episodes.emplace_back().turns.push_back(std::move(t));
    return g;
  }
  // The lease ends (its worker was preempted) and the group waits for re-issue.
  void Preempt() {
    clock.Advance(11);
    dispatcher.ExpireLeases();
  }

  SimulatedClock clock;
  sched::Dispatcher dispatcher;
  std::unique_ptr<data::TaskAdapter> task;
  model::Vocabulary vocab;
  model::ModelConfig config;
  model::Qwen3Model weights;
  TrajectoryIntake intake;
  BehaviourVerifier verifier;
  rollout::ModelPolicy policy;
};

size_t Tokens(const std::vector<data::Turn>& turns) {
  size_t n = 0;
  for (const data::Turn& t : turns) n += t.tokens.size();
  return n;
}

// Cut points of a group's samples: one empty, one finished, two midway.
std::vector<size_t> Cuts(const std::vector<data::Turn>& full) {
  std::vector<size_t> cuts;
  for (size_t j = 0; j < full.size(); ++j)
    cuts.push_back(j == 0 ? 0 : j == 1 ? full[j].tokens.size() : full[j].tokens.size() / 2);
  return cuts;
}

// A worker preempted midway, and a real actor that takes the group over: the submitted group is
// token for token what one worker would have drawn with the group's seed, the prefix's tokens
// are counted once (consumed, not preempted), and only what the first worker drew past its last
// report is lost.
TEST(ResumableGroupsTest, AResumedGroupIsTheDrawsOfOneWorkerAndOnlyTheUnreportedTailIsLost) {
  Resumable r;
  const contract::Assignment a = r.intake.AcquireWith("first#1", kResumes).value();
  ASSERT_TRUE(a.report_prefix);
  ASSERT_TRUE(a.prefix.empty());
  const std::vector<data::Turn> full = r.Draw(a);
  const std::vector<size_t> cuts = Cuts(full);
  ASSERT_GT(full[2].tokens.size(), 1u);
  const std::vector<contract::PrefixPart> parts = Resumable::Prefix(full, cuts);
  ASSERT_TRUE(r.intake.ReportPrefix("first#1", a.work, parts));
  int64_t kept = 0;
  for (size_t c : cuts) kept += static_cast<int64_t>(c);
  // The first worker drew 5 more tokens after its last prefix report, then vanished.
  r.dispatcher.Renew(a.work.group_id, a.work.lease_id, "first#1", kept + 5);
  r.Preempt();

  rollout::ActorOptions options;
  options.name = "second#1";
  auto policy = std::make_unique<rollout::ModelPolicy>(model::Qwen3Model(r.config), r.vocab, Sampling());
  rollout::Actor actor(options, &r.intake, &r.intake, &r.intake, r.task.get(), std::move(policy));
  std::atomic<bool> stop{false};
  std::thread t([&] { actor.Run(stop); });
  std::vector<contract::GroupRollout> got;
  for (int i = 0; i < 600 && got.empty(); ++i) got = r.intake.Drain(0.05);
  stop = true;
  t.join();
  ASSERT_FALSE(got.empty()) << "the second worker submitted nothing";
  const contract::GroupRollout& g = got[0];
  ASSERT_EQ(g.group_id, a.work.group_id);
  EXPECT_EQ(g.actor, "second#1");
  ASSERT_EQ(g.episodes.size(), full.size());
  for (size_t j = 0; j < full.size(); ++j) {
    const data::Turn& turn = g.episodes[j].turns[0];
    EXPECT_EQ(turn.tokens, full[j].tokens) << "sample " << j;
    ASSERT_EQ(turn.logprobs.size(), full[j].logprobs.size());
    for (size_t i = 0; i < cuts[j]; ++i) EXPECT_EQ(turn.logprobs[i], full[j].logprobs[i]) << "the prefix as reported";
    for (size_t i = cuts[j]; i < turn.logprobs.size(); ++i) EXPECT_NEAR(turn.logprobs[i], full[j].logprobs[i], 1e-5);
  }
  const sched::DispatchCounts c = r.dispatcher.counts();
  EXPECT_EQ(c.resumed, 1u);
  EXPECT_EQ(c.tokens_carried, static_cast<uint64_t>(kept));
  EXPECT_EQ(c.tokens_preempted, 5u) << "only the tail drawn after the last report";
  EXPECT_EQ(r.verifier.stats().draw_mismatched, 0);
  EXPECT_GE(r.verifier.stats().checked, 1) << "a resumed group is always checked";
  EXPECT_TRUE(r.intake.actor_forged().empty());
}

// A prefix whose tokens are not the seeded draws (or whose log-probs are made up) passes the
// report's checks and is continued; the resumed group, always verified, fails, and the blame
// goes to the worker that drew the failing part, never to the one that continued it: the
// forger is struck, the continuing worker's refusal (prefix_forged) is no strike, and the group
// starts over.
TEST(ResumableGroupsTest, AForgedPrefixStrikesItsReporterNotTheWorkerThatContinuedIt) {
  for (const bool lie_about_logprobs : {false, true}) {
    Resumable r;
    const contract::Assignment a = r.intake.AcquireWith("forger#1", kResumes).value();
    std::vector<data::Turn> full = r.Draw(a);
    std::vector<contract::PrefixPart> parts = Resumable::Prefix(full, Cuts(full));
    ASSERT_GE(parts.size(), 2u);
    contract::PrefixPart& forged = parts[1];
    if (lie_about_logprobs) {
      for (float& lp : forged.logprobs) lp = std::max(lp - 2.0f, -50.0f);
    } else {  // text of its own choosing, with the log-probs the policy gives it
      for (int64_t& tok : forged.tokens) tok = tok == 5 ? 6 : 5;
      at::NoGradGuard no_grad;
      const std::vector<int64_t> prompt = r.vocab.EncodePrompt(a.prompt.system, a.prompt.text).value();
      forged.logprobs = model::ScoreCompletion(r.policy.model(), prompt, forged.tokens, 1.0);
    }
    ASSERT_TRUE(r.intake.ReportPrefix("forger#1", a.work, parts)) << "well-formed: only a recomputation tells";
    r.Preempt();
    const contract::Assignment b = r.intake.AcquireWith("honest#1", kResumes).value();
    EXPECT_EQ(b.work.group_id, a.work.group_id);
    ASSERT_EQ(b.prefix.size(), full.size());
    const std::vector<data::Turn> turns =
        r.policy.Continue(std::vector<data::PolicyPrompt>(kGroup, data::PolicyPrompt::Of(b.prompt)), b.seed, b.prefix)
            .value();
    const contract::SubmitOutcome out = r.intake.Submit(Resumable::Rollout(b, "honest#1", turns));
    EXPECT_FALSE(out.accepted);
    EXPECT_EQ(out.reason, "prefix_forged");
    EXPECT_FALSE(out.forged) << "the worker that continued it is not blamed";
    const std::string reason = lie_about_logprobs ? "prefix_logprob_mismatch" : "prefix_sample_not_drawn";
    EXPECT_EQ(r.intake.refusals()[reason], 1) << reason;
    EXPECT_EQ(r.intake.actor_forged()["forger"], 1);
    EXPECT_EQ(r.intake.actor_forged().count("honest"), 0u);
    // Started over, the next worker's whole group is accepted.
    const contract::Assignment c = r.intake.AcquireWith("honest#2", kResumes).value();
    EXPECT_EQ(c.work.group_id, a.work.group_id);
    EXPECT_TRUE(c.prefix.empty());
    EXPECT_TRUE(r.intake.Submit(Resumable::Rollout(c, "honest#2", r.Draw(c))).accepted);
  }
}

// The next holder must hand back exactly the prefix it was given: a changed log-prob, token or
// version of it is refused as forged, and the group goes to another worker with the prefix.
TEST(ResumableGroupsTest, ASubmissionThatAltersItsHandedPrefixIsRefused) {
  for (int change = 0; change < 3; ++change) {
    Resumable r;
    const contract::Assignment a = r.intake.AcquireWith("first#1", kResumes).value();
    const std::vector<data::Turn> full = r.Draw(a);
    ASSERT_TRUE(r.intake.ReportPrefix("first#1", a.work, Resumable::Prefix(full, Cuts(full))));
    r.Preempt();
    const contract::Assignment b = r.intake.AcquireWith("second#1", kResumes).value();
    ASSERT_EQ(b.prefix.size(), full.size());
    std::vector<data::Turn> turns =
        r.policy.Continue(std::vector<data::PolicyPrompt>(kGroup, data::PolicyPrompt::Of(b.prompt)), b.seed, b.prefix)
            .value();
    data::Turn& t = turns[2];
    if (change == 0) t.logprobs[0] -= 0.5f;
    if (change == 1) t.tokens[0] = t.tokens[0] == 5 ? 6 : 5;
    if (change == 2) {
      r.Publish(1);  // the prefix claimed as v1's: newer, so the group's staleness would look lower
      t.versions.assign(t.versions.size(), 1);
    }
    const contract::SubmitOutcome out = r.intake.Submit(Resumable::Rollout(b, "second#1", turns));
    EXPECT_FALSE(out.accepted) << "change " << change;
    EXPECT_EQ(out.reason, "prefix_altered") << "change " << change;
    EXPECT_TRUE(out.forged);
    // The group goes on with its verified prefix to the next worker.
    const contract::Assignment c = r.intake.AcquireWith("third#1", kResumes).value();
    EXPECT_EQ(c.work.group_id, a.work.group_id);
    EXPECT_EQ(Tokens(c.prefix), Tokens(b.prefix));
  }
}

// Only the lease's holder reports, each part continues what was kept (a resent overlap must be
// what was kept), and a malformed part is refused whole and strikes its reporter.
TEST(ResumableGroupsTest, OnlyTheHolderReportsAndEveryPartContinuesWhatWasKept) {
  Resumable r;
  const contract::Assignment a = r.intake.AcquireWith("holder#1", kResumes).value();
  const std::vector<data::Turn> full = r.Draw(a);
  size_t j = 0;  // the longest sample
  for (size_t i = 1; i < full.size(); ++i)
    if (full[i].tokens.size() > full[j].tokens.size()) j = i;
  ASSERT_GE(full[j].tokens.size(), 4u);
  std::vector<size_t> cut(full.size(), 0);
  cut[j] = 2;
  const std::vector<contract::PrefixPart> two = Resumable::Prefix(full, cut);
  EXPECT_FALSE(r.intake.ReportPrefix("thief#1", a.work, two)) << "another worker's lease";
  sched::WorkItem other = a.work;
  other.lease_id += 100;
  EXPECT_FALSE(r.intake.ReportPrefix("holder#1", other, two)) << "a lease it does not hold";
  contract::PrefixPart gap = two[0];
  gap.from = 2;
  EXPECT_FALSE(r.intake.ReportPrefix("holder#1", a.work, {gap})) << "a gap: an earlier report was lost";
  EXPECT_TRUE(r.intake.actor_forged().empty()) << "none of these is a forgery";
  ASSERT_TRUE(r.intake.ReportPrefix("holder#1", a.work, two));
  // A resend of a report whose reply was lost, overlapping what was kept, with two more tokens.
  cut[j] = 4;
  const std::vector<contract::PrefixPart> four = Resumable::Prefix(full, cut);
  ASSERT_TRUE(r.intake.ReportPrefix("holder#1", a.work, four));
  contract::PrefixPart rewritten = four[0];
  rewritten.tokens[1] = rewritten.tokens[1] == 5 ? 6 : 5;
  EXPECT_FALSE(r.intake.ReportPrefix("holder#1", a.work, {rewritten}));
  EXPECT_EQ(r.intake.refusals()["prefix_rewritten"], 1);
  contract::PrefixPart bad = four[0];
  bad.from = 4;
  bad.logprobs = {std::numeric_limits<float>::quiet_NaN(), -1.0f, -1.0f, -1.0f};
  EXPECT_FALSE(r.intake.ReportPrefix("holder#1", a.work, {bad}));
  EXPECT_EQ(r.intake.refusals()["prefix_bad_logprob"], 1);
  contract::PrefixPart unpublished = four[0];
  unpublished.from = 4;
  unpublished.versions.assign(4, 7);
  EXPECT_FALSE(r.intake.ReportPrefix("holder#1", a.work, {unpublished}));
  EXPECT_EQ(r.intake.refusals()["prefix_bad_token_version"], 1);
  contract::PrefixPart long_part = four[0];
  long_part.from = 4;
  long_part.tokens.assign(kMaxNewTokens, 5);
  long_part.logprobs.assign(kMaxNewTokens, -1.0f);
  long_part.versions.assign(kMaxNewTokens, 0);
  EXPECT_FALSE(r.intake.ReportPrefix("holder#1", a.work, {long_part}));
  EXPECT_EQ(r.intake.refusals()["prefix_too_long"], 1);
  EXPECT_EQ(r.intake.actor_forged()["holder"], 4);
  // What was kept is the four tokens, unchanged by the refused reports.
  r.Preempt();
  const contract::Assignment b = r.intake.AcquireWith("next#1", kResumes).value();
  ASSERT_EQ(b.prefix.size(), full.size());
  EXPECT_EQ(b.prefix[j].tokens, std::vector<int64_t>(full[j].tokens.begin(), full[j].tokens.begin() + 4));
  EXPECT_EQ(Tokens(b.prefix), 4u);
}

// A prefix is dropped, and the group starts over with its kept tokens counted as preempted,
// when the group could no longer be consumed (its oldest token's version + S is below the
// learner's), when the actor cannot continue prefixes, or when its snapshot is older than the
// prefix's newest token.
TEST(ResumableGroupsTest, APrefixThatCannotBeContinuedIsDroppedAndCountedPreempted) {
  for (int why = 0; why < 3; ++why) {
    Resumable r;
    const contract::Assignment a = r.intake.AcquireWith("first#1", kResumes).value();
    const std::vector<data::Turn> full = r.Draw(a);
    ASSERT_TRUE(r.intake.ReportPrefix("first#1", a.work, Resumable::Prefix(full, Cuts(full))));
    const uint64_t kept = Tokens(full) - full[0].tokens.size() - (full[2].tokens.size() - full[2].tokens.size() / 2) -
                          (full[3].tokens.size() - full[3].tokens.size() / 2);
    r.Preempt();
    contract::WorkRequest request = kResumes;
    if (why == 0) {
      for (int64_t v = 1; v <= 2; ++v) r.Publish(v);  // S = 2: a v0 token can enter no update after 2 -> 3
      request.snapshot_version = 2;
    }
    if (why == 1) request.continues_prefixes = false;
    if (why == 2) request.snapshot_version = -1;  // no snapshot yet
    const contract::Assignment b = r.intake.AcquireWith("second#1", request).value();
    EXPECT_EQ(b.work.group_id, a.work.group_id) << why;
    EXPECT_TRUE(b.prefix.empty()) << why;
    EXPECT_EQ(r.dispatcher.counts().resumed, 0u);
    EXPECT_EQ(r.dispatcher.counts().tokens_preempted, kept);
  }
}

// A worker that stops (a preemption notice) hands its lease back: the group goes, with what it
// reported, to the next worker at once, not when the lease would have ended.
TEST(ResumableGroupsTest, AReleasedGroupIsContinuedAtOnce) {
  Resumable r;
  const contract::Assignment a = r.intake.AcquireWith("leaving#1", kResumes).value();
  const std::vector<data::Turn> full = r.Draw(a);
  ASSERT_TRUE(r.intake.ReportPrefix("leaving#1", a.work, Resumable::Prefix(full, Cuts(full))));
  r.intake.Release("other#1", a.work);  // not its lease: nothing happens
  EXPECT_EQ(r.dispatcher.counts().outstanding, 1u);
  r.intake.Release("leaving#1", a.work);
  const contract::Assignment b = r.intake.AcquireWith("next#1", kResumes).value();
  EXPECT_EQ(b.work.group_id, a.work.group_id);
  size_t kept = 0;
  for (size_t c : Cuts(full)) kept += c;
  EXPECT_EQ(Tokens(b.prefix), kept);
  EXPECT_EQ(r.dispatcher.counts().resumed, 1u);
  EXPECT_EQ(r.dispatcher.counts().tokens_preempted, 0u);
}

}  // namespace
}  // namespace echelon::learn
