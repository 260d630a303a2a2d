// GrpcActors: the learning plane's transport over real loopback gRPC.
#include "echelon/net/grpc_actors.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "echelon/contract/group_seed.h"
#include "echelon/learn/trajectory_intake.h"
#include "echelon/net/remote_learner.h"

namespace echelon::net {
namespace {

// A task's learning plane: its dispatcher and intake, with version 0 published.
struct Plane {
  Plane(const std::string& task_name, const data::AdapterOptions& options, int64_t max_new_tokens,
        const RunSecret& secret = RunSecret())
      : dispatcher({1, 2, 60}, &clock),
        task(data::CreateAdapter(task_name, options).value()),
        vocab(model::Vocabulary::Characters(task->Alphabet())),
        intake(&dispatcher, task.get(), &vocab, learn::IntakeLimits{vocab.id_end(), 2, max_new_tokens, secret}) {
    intake.Publish({0, std::make_shared<const std::string>("weights")});
  }
  RealClock clock;
  sched::Dispatcher dispatcher;
  std::unique_ptr<data::TaskAdapter> task;
  model::Vocabulary vocab;
  learn::TrajectoryIntake intake;
};

// A worker of the learner at `port` on loopback, without the broadcast.
RemoteLearnerOptions Worker(int port, const std::string& token, const std::string& name) {
  RemoteLearnerOptions ro;
  ro.address = "127.0.0.1:" + std::to_string(port);
  ro.token = token;
  ro.name = name;
  ro.broadcast = false;
  return ro;
}

// Starts the transport; the port it serves actors on, or 0.
int Serve(GrpcActors& transport, learn::TrajectoryIntake* intake) {
  std::ostringstream progress;
  int port = 0;
  if (!transport.Start(intake, "{}", progress).ok() ||
      std::sscanf(progress.str().c_str(), "learner serving actors on port %d", &port) != 1)
    return 0;
  return port;
}

// `plane` served by a GrpcActors transport (one shared token, no broadcast) and one worker
// connected to it; the worker and the transport stop when it goes.
struct Served {
  explicit Served(Plane& plane) : transport(Options(), &plane.clock) {
    const int port = Serve(transport, &plane.intake);
    if (port == 0) return;
    learner.emplace(Worker(port, kToken, "a"));
    connected = learner->Connect(stop).ok();
  }
  ~Served() {
    stop = true;
    if (learner) learner->Close();
    transport.StopWork();
    transport.Finish();
  }
  static GrpcActorsOptions Options() {
    GrpcActorsOptions o;
    o.tokens = TokenTable::Shared(kToken);
    o.broadcast = false;
    return o;
  }
  static constexpr const char* kToken = "tok-0123456789abcdef";
  GrpcActors transport;
  std::atomic<bool> stop{false};
  std::optional<RemoteLearner> learner;
  bool connected = false;
};

// Regression: the run (and with it the intake) ended while the gRPC server went on serving
// until the transport was destroyed later, so an actor's call landed in a freed intake
// (a segfault in LearnerServer::Service::Acquire, seen at the end of a resumed run). Finish
// now stops the server: after it, the intake may go while actors keep calling.
TEST(GrpcActorsTest, IntakeMayGoAfterFinishWhileActorsKeepCalling) {
  RealClock clock;
  sched::Dispatcher dispatcher({1, 2, 60}, &clock);
  std::unique_ptr<data::TaskAdapter> task = data::CreateAdapter("math", {{"eval_size", "10"}}).value();
  const model::Vocabulary vocab = model::Vocabulary::Characters(task->Alphabet());
  auto intake = std::make_unique<learn::TrajectoryIntake>(&dispatcher, task.get(), &vocab, learn::IntakeLimits{vocab.id_end(), 2, 64});
  intake->Publish({0, std::make_shared<const std::string>("weights")});
  GrpcActorsOptions o;
  o.tokens = TokenTable::Shared("tok");
  o.broadcast = false;
  GrpcActors transport(o, &clock);
  const int port = Serve(transport, intake.get());
  ASSERT_GT(port, 0);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> calls{0};
  std::thread actor([&] {
    RemoteLearner learner(Worker(port, "tok", "a"));
    if (!learner.Connect(stop).ok()) return;
    while (!stop.load()) {
      (void)learner.Acquire("a");
      (void)learner.Latest();
      ++calls;
    }
  });
  while (calls.load() < 20) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  transport.StopWork();
  transport.Finish();
  intake.reset();
  const int64_t before = calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the actor keeps calling
  stop = true;
  actor.join();
  EXPECT_GT(calls.load(), before);  // it did call, and nothing served it from a freed intake
}

// Poker's work went out with its deal (the prompt's reference: every hand at the table). Now
// the learner plays multi-turn groups itself: the work comes without any prompt, and the actor
// only answers each turn's prompts over Play.
TEST(GrpcActorsTest, TheLearnerPlaysMultiTurnGroupsAndTheDealStaysThere) {
  Plane plane("poker", {{"seed", "3"}}, 8);
  const model::Vocabulary& vocab = plane.vocab;
  Served served(plane);
  ASSERT_TRUE(served.connected);
  RemoteLearner& learner = *served.learner;
  std::optional<contract::Assignment> a = learner.Acquire("a");
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(a->played_by_learner);
  EXPECT_EQ(a->prompt.text, "");
  EXPECT_EQ(a->prompt.reference, "") << "the deal left the learner";
  std::vector<data::Turn> turns;
  int rounds = 0;
  std::optional<contract::SubmitOutcome> outcome;
  while (!outcome && rounds < 64) {
    Result<contract::PlayStep> step = learner.Play("a", a->work, 0, std::move(turns), 0.01);
    ASSERT_TRUE(step.ok()) << step.status().message();
    outcome = step->outcome;
    turns.clear();
    for (const data::PolicyPrompt& p : step->prompts) {
      data::Turn t;
      t.prompt_ids = vocab.EncodePrompt(p.system, p.user).value();
      t.tokens = {vocab.Encode("c").value()[0], vocab.stop_ids().front()};
      t.logprobs = {-0.7f, -0.1f};
      turns.push_back(std::move(t));
    }
    ++rounds;
  }
  ASSERT_TRUE(outcome.has_value());
  EXPECT_TRUE(outcome->accepted) << outcome->reason;
  EXPECT_GE(rounds, 2);
  EXPECT_EQ(plane.intake.Drain(0.0).size(), 1u);
}

// A worker handed in a played group itself, skipping the environment (a one-action hand
// collected the pot): such a group reaches the intake only from the learner's own table.
TEST(GrpcActorsTest, AWorkerCannotSubmitAGroupTheLearnerPlays) {
  Plane plane("poker", {{"seed", "3"}}, 8);
  Served served(plane);
  ASSERT_TRUE(served.connected);
  std::optional<contract::Assignment> a = served.learner->Acquire("a");
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(a->played_by_learner);
  contract::GroupRollout g;
  g.group_id = a->work.group_id;
  g.lease_id = a->work.lease_id;
  data::Episode e;
  e.turns.push_back({{1, 2}, {plane.vocab.Encode("r").value()[0], plane.vocab.stop_ids().front()}, {-0.1f, -0.1f}, "r"});
  e.reward = 1.5;
  g.episodes = {e, e};
  const contract::SubmitOutcome out = served.learner->Submit(g);
  EXPECT_FALSE(out.accepted);
  EXPECT_EQ(out.reason, "played_group_submitted");
  EXPECT_TRUE(plane.intake.Drain(0.0).empty());
}

// Each assignment carries its group's seed, drawn from the learner's secret: a worker samples
// with it and learns nothing of another group's.
TEST(GrpcActorsTest, AnAssignmentCarriesTheSeedItsGroupIsDrawnWith) {
  const RunSecret secret = RunSecret::Random().value();
  Plane plane("math", {{"eval_size", "10"}}, 8, secret);
  Served served(plane);
  ASSERT_TRUE(served.connected);
  for (int i = 0; i < 2; ++i) {
    std::optional<contract::Assignment> a = served.learner->Acquire("a");
    ASSERT_TRUE(a.has_value());
    EXPECT_EQ(a->seed, contract::GroupSeed(secret, a->work.group_id));
    EXPECT_NE(a->seed, contract::GroupSeed(RunSecret(), a->work.group_id));
  }
}

// The snapshot broadcast had one token for the run: a worker removed from the token file (or
// quarantined, or evicted) kept its place on the broadcast, receiving every snapshot and
// relaying. Each registration now joins with its own token, revoked with the registration.
TEST(GrpcActorsTest, ARevokedWorkerLeavesTheBroadcast) {
  Plane plane("math", {{"eval_size", "10"}}, 64);
  const std::string path = ::testing::TempDir() + "/workers-" + std::to_string(::getpid());
  const std::string alice = "alice-0123456789abcdef", bob = "bob-0123456789abcdef00";
  std::ofstream(path) << "alice " << alice << "\nbob " << bob << "\n";
  std::atomic<bool> reload{false};
  GrpcActorsOptions o;
  o.tokens = TokenTable::Load(path).value();
  o.token_file = path;
  o.reload_tokens = &reload;
  GrpcActors transport(o, &plane.clock);
  const int port = Serve(transport, &plane.intake);
  ASSERT_GT(port, 0);
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<RemoteLearner>> workers;
  for (const auto& [name, token] : {std::pair{"alice", alice}, std::pair{"bob", bob}}) {
    RemoteLearnerOptions ro = Worker(port, token, name);
    ro.broadcast = true;
    ro.broadcast_listen = "127.0.0.1:0";
    workers.push_back(std::make_unique<RemoteLearner>(ro));
    ASSERT_TRUE(workers.back()->Connect(stop).ok());
  }
  // A peer is counted once the origin has sent its Welcome, just after Start returns.
  for (int i = 0; i < 200 && transport.broadcast_peers() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(transport.broadcast_peers(), 2);
  std::ofstream(path) << "alice " << alice << "\n";
  reload = true;
  const std::vector<std::string> gone = transport.EvictSilent();
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].substr(0, 4), "bob#");
  EXPECT_EQ(transport.broadcast_peers(), 1) << "bob's broadcast peer stayed";
  stop = true;
  for (auto& w : workers) w->Close();
  transport.StopWork();
  transport.Finish();
}

}  // namespace
}  // namespace echelon::net
