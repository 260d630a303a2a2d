// `echelon_testkit hostile-actor`: an authenticated attacker for the hostile-actor system test
// (tests/hostile_actor_test.sh) and the chaos run (bench/chaos.sh). It holds valid worker
// tokens and real copies of the run's model (the first snapshot, and the newest), samples
// real groups, and forges them. Each worker first lies while it is not yet suspect (fresh):
// the newest version claimed for a group sampled from the first snapshot (fresh_version),
// every behaviour log-prob of a group sampled from the newest snapshot lowered by 19.9 nats,
// inside the loss's clamp (in_clamp), a group whose samples it chose (cherry_pick: it draws 2G
// samples with the group's seed and submits the second G, with their true log-probs), a
// completion of its own writing with its true log-probs (teacher_forced), one token's
// log-prob lowered by 2.5 nats in a real group (sparse_liar: under the group-mean tolerance
// on a long group), a completion of rollout.max_new_tokens tokens of its own writing
// (length: to weigh more of the update), and,
// with PUBLISH_PERIOD > 1, a version that was never published (unpublished_version). Then: a
// log-prob of -1e30, prompt ids of another prompt, zero- and two-turn episodes claiming reward
// 1, another actor's lease, a 50,000-token completion, the version lie and the cherry-pick
// again (now suspect: always checked), and an accepted group sent again. With CRASH_TEXT, each worker also submits a real group with one completion replaced
// by that text, which the run's reward raises on (reward_crash: refused, no strike), and the
// first worker opens with a burst of kRewardFailuresToStop such groups in a row, as fast as it
// gets work (reward_burst: each refused, a strike every 8, and the run goes on). The last
// token hoards under 12 names: it takes as many leases as it is given, heartbeats for them
// between attacks and never submits. When a worker is quarantined the next token
// takes over. The first worker also asks for a layer-ranged snapshot of every layer range, as
// only a pipeline stage may. Every submission is logged as one JSON line {"kind", "worker",
// "accepted", "reason"}; the hoard as {"kind": "hoard", "worker", "names", "leases"}, the ranged asks as
// {"kind": "ranged_flood", "worker", "asked", "served"}.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "echelon/common/fs.h"
#include "echelon/contract/run_spec.h"
#include "echelon/data/adapter_kit.h"
#include "echelon/learn/trajectory_intake.h"
#include "echelon/model/generate.h"
#include "echelon/net/auth.h"
#include "echelon/net/codec.h"
#include "echelon/net/protocol.h"
#include "echelon/rollout/model_policy.h"
#include "echelon/sched/tunables.h"
#include "echelon/v1/learner.grpc.pb.h"
#include "tests/tools/workers.h"

namespace echelon::testkit {
namespace {

constexpr int kHoardNames = 12;

class Attacker {
 public:
  Attacker(const std::string& address, std::vector<Worker> workers, std::ostream& log, double pace,
           int64_t publish_period, std::string crash_text)
      : stub_(v1::Learner::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        workers_(std::move(workers)),
        log_(log),
        pace_(pace),
        publish_period_(publish_period),
        crash_text_(std::move(crash_text)) {}

  int Run(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    if (workers_.size() > 1) {
      hoarder_ = workers_.back();
      workers_.pop_back();
    }
    if (!NextWorker()) return 1;
    Hoard();
    RangedFlood();
    if (!crash_text_.empty())
      for (int64_t i = 0; i < learn::kRewardFailuresToStop && !done_; ++i)
        if (!Attack("reward_burst")) break;  // quarantined: the burst's strikes and others'
    const std::vector<std::string> structural = {"bad_logprob", "swapped_prompt", "zero_turns",
                                                 "two_turns",   "too_long",       "foreign_lease"};
    std::vector<std::string> fresh = {"in_clamp", "fresh_version", "cherry_pick", "teacher_forced", "sparse_liar",
                                      "length"};
    if (publish_period_ > 1) fresh.push_back("unpublished_version");
    size_t k = 0, f = 0;
    bool replayed = false;
    while (std::chrono::steady_clock::now() < deadline && !done_) {
      // Each worker: three lies while it is not suspect (fresh, until one is caught), a
      // structural forgery, then (now suspect) the version lie, then another structural one.
      std::vector<std::string> plan;
      if (!replayed) plan.push_back("replay");
      if (!crash_text_.empty()) plan.push_back("reward_crash");
      plan.insert(plan.end(), {"fresh", "fresh", "fresh", "structural", "stale_version", "cherry_pick", "structural"});
      replayed = true;
      for (const std::string& step : plan) {
        // The kinds rotate as they are tried, so a worker quarantined early skips none.
        size_t* next = step == "fresh" ? &f : step == "structural" ? &k : nullptr;
        const std::string kind = step == "fresh"        ? fresh[f % fresh.size()]
                                 : step == "structural" ? structural[k % structural.size()]
                                                        : step;
        if (!Attack(kind)) break;  // quarantined or evicted (or the run is over)
        if (next != nullptr) ++*next;
        if (!Pause()) break;
      }
      if (done_ || !NextWorker()) break;
    }
    std::cerr << "hostile actor: " << submissions_ << " submissions, " << accepted_ << " accepted" << std::endl;
    return 0;
  }

 private:
  // Waits `pace_` seconds between attacks while heartbeating as a real actor does, so that a
  // pause as long as the eviction time does not end this worker before its strikes are in
  // (under load a bare sleep of pace_ = kEvictAfterSeconds got a worker evicted after two
  // strikes, never quarantined). False when the learner no longer knows the actor.
  bool Pause() {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point end =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(pace_));
    while (Clock::now() < end) {
      std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(500), end - Clock::now()));
      HeartbeatHoard(hoarder_);  // the hoard stays alive
      if (!Heartbeat(worker_, actor_)) return false;
    }
    return true;
  }

  bool Heartbeat(const Worker& worker, const std::string& actor) {
    grpc::ClientContext ctx;
    net::AttachToken(ctx, worker.token);
    v1::HeartbeatRequest req;
    req.set_actor_id(actor);
    v1::HeartbeatReply reply;
    return stub_->Heartbeat(&ctx, req, &reply).ok() && reply.known();
  }

  // The hoarding worker registers under kHoardNames names with its one token, as a shared
  // token's actors could (each name had its own lease cap: 12 names x 8 leases stalled a run),
  // takes every lease it is given on each in turn and never submits; Pause keeps them alive.
  // It asks until it holds the cap and then 8 times more (each refused as lease_capped),
  // waiting while the admission window has nothing to give (honest actors may hold it at first:
  // asking only then, 64 times at once, sometimes never reached the cap), for 20 s at most.
  void Hoard() {
    if (hoarder_.name.empty()) return;
    std::swap(worker_, hoarder_);
    for (int i = 0; i < kHoardNames; ++i) {
      Result<std::string> id = Register("hoard-" + std::to_string(i));
      if (id.ok()) hoarder_actors_.push_back(id.value());
    }
    int leases = 0;
    if (!hoarder_actors_.empty()) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      int past_cap = 0;
      for (size_t i = 0; past_cap < 8 && std::chrono::steady_clock::now() < until; ++i) {
        std::optional<v1::AcquireReply> reply = AcquireOnce(hoarder_actors_[i % hoarder_actors_.size()]);
        if (reply && reply->has_work()) {
          ++leases;
        } else if (leases >= sched::kMaxLeasesPerWorker) {
          ++past_cap;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          HeartbeatHoard(worker_);
          if (!actor_.empty()) Heartbeat(hoarder_, actor_);  // the attacker, swapped out meanwhile
        }
      }
    }
    log_ << nlohmann::json{{"kind", "hoard"},
                           {"worker", worker_.name},
                           {"names", hoarder_actors_.size()},
                           {"leases", leases}}
                .dump()
         << std::endl;
    std::swap(worker_, hoarder_);
  }

  // Keeps the hoard's registrations alive (`hoarder`: whichever of worker_ and hoarder_ now
  // holds the hoarding token).
  void HeartbeatHoard(const Worker& hoarder) {
    for (const std::string& id : hoarder_actors_) Heartbeat(hoarder, id);
  }

  // Asks for a layer-ranged snapshot of every (first, last) pair, as a pipeline stage would
  // for its own layers, without being one: each was cut and cached (a 28-layer model: 406
  // ranges, ~145 x its layer weights). Logs how many the learner served (none, now).
  void RangedFlood() {
    const int64_t layers = setup_ ? setup_->model.num_hidden_layers : 0;
    int asked = 0, served = 0;
    for (int64_t first = 0; first < layers; ++first)
      for (int64_t last = first + 1; last <= layers; ++last) {
        grpc::ClientContext ctx;
        net::AttachToken(ctx, worker_.token);
        v1::SnapshotRequest req;
        req.set_actor_id(actor_);
        req.set_ranged(true);
        req.set_first_layer(first);
        req.set_last_layer(last);
        auto reader = stub_->GetSnapshot(&ctx, req);
        v1::SnapshotPiece piece;
        bool got = false;
        while (reader->Read(&piece)) got = true;
        ++asked;
        served += reader->Finish().ok() && got;
      }
    log_ << nlohmann::json{{"kind", "ranged_flood"}, {"worker", worker_.name}, {"asked", asked}, {"served", served}}.dump()
         << std::endl;
  }

  // Registers with the next token; false when none is left (every worker quarantined). While
  // the learner is not serving (a resumed learner warming up) it waits, up to two minutes,
  // instead of spending its tokens on connection errors.
  bool NextWorker() {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (next_worker_ < workers_.size()) {
      worker_ = workers_[next_worker_];
      Result<std::string> id = Register();
      if (id.ok()) {
        ++next_worker_;
        actor_ = id.value();
        return true;
      }
      if (id.status().code() == StatusCode::kUnavailable && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        continue;
      }
      ++next_worker_;
      std::cerr << "hostile actor: " << id.status().message() << std::endl;
    }
    return false;
  }

  Result<std::string> Register(const std::string& name = "honest-looking") {
    grpc::ClientContext ctx;
    net::AttachToken(ctx, worker_.token);
    v1::RegisterRequest req;
    req.set_protocol_version(net::kProtocolVersion);
    req.set_actor_name(name);
    v1::RegisterReply reply;
    grpc::Status st = stub_->Register(&ctx, req, &reply);
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) return Unavailable(worker_.name + ": " + st.error_message());
    if (!st.ok()) return FailedPrecondition(worker_.name + ": " + st.error_message());
    if (!setup_) {
      ECHELON_ASSIGN_OR_RETURN(contract::ActorSetup s, contract::ParseRunSpec(reply.run_spec_json()));
      setup_ = std::make_unique<contract::ActorSetup>(std::move(s));
      policy_ = std::make_unique<rollout::ModelPolicy>(model::Qwen3Model(setup_->model), setup_->vocab, setup_->sampling);
      newest_ = std::make_unique<rollout::ModelPolicy>(model::Qwen3Model(setup_->model), setup_->vocab, setup_->sampling);
      ECHELON_ASSIGN_OR_RETURN(held_version_, FetchSnapshot(reply.actor_id(), *policy_));
    }
    return reply.actor_id();
  }

  // Loads the newest snapshot into `policy`; its version.
  Result<int64_t> FetchSnapshot(const std::string& actor, rollout::ModelPolicy& policy) {
    for (int attempt = 0; attempt < 600; ++attempt) {
      grpc::ClientContext ctx;
      net::AttachToken(ctx, worker_.token);
      v1::SnapshotRequest req;
      req.set_actor_id(actor);
      auto reader = stub_->GetSnapshot(&ctx, req);
      v1::SnapshotPiece piece;
      std::string bytes;
      int64_t version = -1;
      while (reader->Read(&piece)) {
        version = piece.version();
        bytes += piece.data();
      }
      if (reader->Finish().ok() && version >= 0) {
        ECHELON_RETURN_IF_ERROR(policy.LoadSnapshot(bytes, version));
        return version;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return Unavailable("no snapshot from the learner");
  }

  // One Acquire call for `actor` with the current worker's token; nullopt when it fails.
  std::optional<v1::AcquireReply> AcquireOnce(const std::string& actor) {
    grpc::ClientContext ctx;
    net::AttachToken(ctx, worker_.token);
    v1::AcquireRequest req;
    req.set_actor_id(actor);
    v1::AcquireReply reply;
    if (!stub_->Acquire(&ctx, req, &reply).ok()) return std::nullopt;
    return reply;
  }

  // Work for `actor`; nullopt when quarantined or evicted (or the run is over).
  std::optional<v1::AcquireReply> Acquire(const std::string& actor) {
    for (int attempt = 0; attempt < 5000; ++attempt) {
      std::optional<v1::AcquireReply> got = AcquireOnce(actor);
      if (!got) return std::nullopt;
      const v1::AcquireReply& reply = *got;
      if (reply.done()) {
        done_ = true;
        return std::nullopt;
      }
      if (reply.has_work()) return reply;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::nullopt;
  }

  // A real group for the work, sampled with `policy` (of `version`), claiming that version.
  Result<contract::GroupRollout> Sample(const v1::AcquireReply& w, rollout::ModelPolicy& policy, int64_t version,
                                        bool cherry_pick = false) {
    data::Prompt p;
    p.id = w.prompt_id();
    p.text = w.prompt_text();
    p.reference = w.prompt_reference();
    p.system = w.prompt_system();
    // Seeded as an actor seeds a group, so that its tokens are the draws a verifier recomputes.
    // The cherry-picker draws four times the group and puts, in each sample's place, a later
    // draw whose tokens differ from that sample's where one does (true log-probs throughout);
    // with none differing there is nothing to choose and the group goes unsent (empty).
    const uint64_t seed = w.seed();
    const int rows = w.group_size() * (cherry_pick ? 4 : 1);
    ECHELON_ASSIGN_OR_RETURN(std::vector<data::Episode> episodes,
                             w.scored_by_learner() ? data::SampleSingleTurnGroup(p, rows, policy, seed)
                                                   : setup_->task->RunGroup(p, rows, policy, seed));
    if (cherry_pick) {
      bool chose = false;
      for (int j = 0; j < w.group_size(); ++j)
        for (size_t k = static_cast<size_t>(w.group_size()); k < episodes.size(); ++k)
          if (!episodes[k].turns.empty() && episodes[k].turns[0].tokens != episodes[j].turns[0].tokens) {
            episodes[j] = episodes[k];
            episodes[k].turns.clear();  // used
            chose = true;
            break;
          }
      episodes.resize(chose ? static_cast<size_t>(w.group_size()) : 0);
    }
    contract::GroupRollout g;
    g.group_id = w.group_id();
    g.lease_id = w.lease_id();
    g.behavior_version = version;
    g.episodes = std::move(episodes);
    return g;
  }

  std::optional<v1::SubmitReply> Submit(const contract::GroupRollout& g, const std::string& actor) {
    grpc::ClientContext ctx;
    net::AttachToken(ctx, worker_.token);
    v1::SubmitRequest req;
    net::EncodeRollout(g, actor, &req);
    v1::SubmitReply reply;
    if (!stub_->Submit(&ctx, req, &reply).ok()) return std::nullopt;
    return reply;
  }

  void Log(const std::string& kind, const v1::SubmitReply& r) {
    ++submissions_;
    if (r.accepted()) ++accepted_;
    log_ << nlohmann::json{{"kind", kind}, {"worker", worker_.name}, {"accepted", r.accepted()}, {"reason", r.reason()}}.dump()
         << std::endl;
  }

  bool Attack(const std::string& kind) {
    std::optional<v1::AcquireReply> w = Acquire(actor_);
    if (!w) return false;
    int64_t version = held_version_;
    rollout::ModelPolicy* policy = policy_.get();
    const bool on_newest = kind == "in_clamp" || kind == "cherry_pick" || kind == "teacher_forced" ||
                           kind == "sparse_liar" || kind == "length";
    if (on_newest) {  // sampled from (or scored under) the newest snapshot, one the verifier keeps
      Result<int64_t> newest = FetchSnapshot(actor_, *newest_);
      if (!newest.ok()) return false;
      version = newest.value();
      policy = newest_.get();
    }
    Result<contract::GroupRollout> sampled = Sample(*w, *policy, version, kind == "cherry_pick");
    if (!sampled.ok()) {
      std::cerr << "hostile actor: " << sampled.status().message() << std::endl;
      return false;
    }
    contract::GroupRollout g = std::move(sampled).value();
    if (g.episodes.empty()) return true;  // a cherry-pick with nothing to choose
    data::Turn& t = g.episodes[0].turns[0];
    std::string actor = actor_;
    if (kind == "replay") {
      std::optional<v1::SubmitReply> first = Submit(g, actor);  // honest: accepted
      if (!first) return false;
      Log("honest", *first);
    } else if (kind == "bad_logprob") {
      t.logprobs[0] = -1e30f;
    } else if (kind == "swapped_prompt") {
      t.prompt_ids = setup_->vocab.EncodePrompt("12+34=").value();
    } else if (kind == "zero_turns") {
      g.episodes[0].turns.clear();
      g.episodes[0].reward = 1;
    } else if (kind == "two_turns") {
      g.episodes[0].turns.push_back(t);
      for (data::Episode& e : g.episodes) e.reward = 1;
    } else if (kind == "too_long") {
      t.tokens.assign(50000, t.tokens[0]);
      t.logprobs.assign(50000, -0.5f);
    } else if (kind == "stale_version" || kind == "fresh_version") {
      g.behavior_version = w->snapshot_version();  // never fetched: sampled with the first
      if (g.behavior_version == held_version_) return true;  // nothing to lie about yet
    } else if (kind == "in_clamp") {
      // 19.9 nats below the truth: inside the loss's log-ratio clamp (20) and above the
      // intake's floor (-110); with A < 0 it multiplied a token's gradient by e^19.9.
      for (data::Episode& e : g.episodes)
        for (data::Turn& turn : e.turns)
          for (float& lp : turn.logprobs) lp = std::max(lp - 19.9f, -109.0f);
    } else if (kind == "teacher_forced" || kind == "length") {
      // Text of its own writing, with its true log-probs under the snapshot it claims: every
      // check but the seeded draws passes. `length` makes it as long as a completion may be.
      const std::vector<int64_t> stop = setup_->vocab.stop_ids();
      std::vector<int64_t> written = setup_->vocab.Encode(kind == "length" ? "9" : "99").value();
      if (kind == "length") written.assign(static_cast<size_t>(setup_->sampling.max_new_tokens) - 1, written[0]);
      if (!stop.empty()) written.push_back(stop[0]);
      if (written == t.tokens) return true;  // the draw itself: nothing to lie about
      t.tokens = written;
      t.logprobs = model::ScoreCompletion(policy->model(), t.prompt_ids, t.tokens, setup_->sampling.temperature);
    } else if (kind == "sparse_liar") {
      // One token 2.5 nats low: a tenth of a nat spread over a 25-token group passes a check of
      // the group's mean gap alone; the per-token check (rollout.verify_token_tolerance) does not.
      t.logprobs[0] = std::max(t.logprobs[0] - 2.5f, -109.0f);
    } else if (kind == "reward_crash" || kind == "reward_burst") {
      Result<std::vector<int64_t>> ids = setup_->vocab.Encode(crash_text_);
      if (!ids.ok() || ids->empty()) return false;
      t.tokens = ids.value();
      if (!setup_->vocab.stop_ids().empty()) t.tokens.push_back(setup_->vocab.stop_ids()[0]);
      t.logprobs.assign(t.tokens.size(), -0.5f);
    } else if (kind == "unpublished_version") {
      // Published versions are multiples of the period; the one before the newest is not.
      g.behavior_version = w->snapshot_version() - 1;
      if (g.behavior_version <= held_version_ || w->snapshot_version() % publish_period_ != 0) return true;
    } else if (kind == "foreign_lease") {
      // A second actor of this worker takes a group; the first submits under its lease.
      Result<std::string> other = Register();
      if (!other.ok()) return false;
      std::optional<v1::AcquireReply> theirs = Acquire(other.value());
      if (!theirs) return false;
      g.group_id = theirs->group_id();
      g.lease_id = theirs->lease_id();
    }
    std::optional<v1::SubmitReply> r = Submit(g, actor);
    if (!r) return false;
    Log(kind, *r);
    return true;
  }

  std::unique_ptr<v1::Learner::Stub> stub_;
  std::vector<Worker> workers_;
  std::ostream& log_;
  const double pace_;
  const int64_t publish_period_;
  const std::string crash_text_;
  size_t next_worker_ = 0;
  Worker worker_;
  std::string actor_;
  Worker hoarder_;
  std::vector<std::string> hoarder_actors_;
  std::unique_ptr<contract::ActorSetup> setup_;
  std::unique_ptr<rollout::ModelPolicy> policy_;  // the first snapshot
  std::unique_ptr<rollout::ModelPolicy> newest_;  // the newest, fetched for each in_clamp lie and cherry-pick
  int64_t held_version_ = -1;
  bool done_ = false;
  int64_t submissions_ = 0, accepted_ = 0;
};

}  // namespace

// hostile-actor LEARNER_ADDR WORKERS_FILE LOG_FILE SECONDS PACE_SECONDS [PUBLISH_PERIOD [CRASH_TEXT]]
int HostileActorMain(int argc, char** argv) {
  if (argc < 6 || argc > 8) {
    std::cerr << "usage: echelon_testkit hostile-actor LEARNER WORKERS_FILE LOG SECONDS PACE [PUBLISH_PERIOD "
                 "[CRASH_TEXT]]"
              << std::endl;
    return 2;
  }
  std::optional<std::vector<Worker>> workers = ReadWorkers(argv[2]);
  if (!workers) return 2;
  std::ofstream log(argv[3]);
  Attacker a(argv[1], std::move(*workers), log, std::stod(argv[5]), argc >= 7 ? std::stoll(argv[6]) : 1,
             argc == 8 ? argv[7] : "");
  return a.Run(std::stod(argv[4]));
}

}  // namespace echelon::testkit
