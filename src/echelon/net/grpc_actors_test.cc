// GrpcActors: the learning plane's transport over real loopback gRPC.
#include "echelon/net/grpc_actors.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "echelon/learn/trajectory_intake.h"
#include "echelon/net/remote_learner.h"

namespace echelon::net {
namespace {

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
  int port = 0;
  std::ostringstream progress;
  ASSERT_TRUE(transport.Start(intake.get(), "{}", progress).ok());
  ASSERT_TRUE(std::sscanf(progress.str().c_str(), "learner serving actors on port %d", &port) == 1);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> calls{0};
  std::thread actor([&] {
    RemoteLearnerOptions ro;
    ro.address = "127.0.0.1:" + std::to_string(port);
    ro.token = "tok";
    ro.name = "a";
    ro.broadcast = false;
    RemoteLearner learner(ro);
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

// The snapshot broadcast had one token for the run: a worker removed from the token file (or
// quarantined, or evicted) kept its place on the broadcast, receiving every snapshot and
// relaying. Each registration now joins with its own token, revoked with the registration.
TEST(GrpcActorsTest, ARevokedWorkerLeavesTheBroadcast) {
  RealClock clock;
  sched::Dispatcher dispatcher({1, 2, 60}, &clock);
  std::unique_ptr<data::TaskAdapter> task = data::CreateAdapter("math", {{"eval_size", "10"}}).value();
  const model::Vocabulary vocab = model::Vocabulary::Characters(task->Alphabet());
  learn::TrajectoryIntake intake(&dispatcher, task.get(), &vocab, learn::IntakeLimits{vocab.id_end(), 2, 64});
  intake.Publish({0, std::make_shared<const std::string>("weights")});
  const std::string path = ::testing::TempDir() + "/workers-" + std::to_string(::getpid());
  const std::string alice = "alice-0123456789abcdef", bob = "bob-0123456789abcdef00";
  std::ofstream(path) << "alice " << alice << "\nbob " << bob << "\n";
  std::atomic<bool> reload{false};
  GrpcActorsOptions o;
  o.tokens = TokenTable::Load(path).value();
  o.token_file = path;
  o.reload_tokens = &reload;
  GrpcActors transport(o, &clock);
  std::ostringstream progress;
  ASSERT_TRUE(transport.Start(&intake, "{}", progress).ok());
  int port = 0;
  ASSERT_TRUE(std::sscanf(progress.str().c_str(), "learner serving actors on port %d", &port) == 1);
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<RemoteLearner>> workers;
  for (const auto& [name, token] : {std::pair{"alice", alice}, std::pair{"bob", bob}}) {
    RemoteLearnerOptions ro;
    ro.address = "127.0.0.1:" + std::to_string(port);
    ro.token = token;
    ro.name = name;
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
