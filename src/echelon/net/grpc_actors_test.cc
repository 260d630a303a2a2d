// GrpcActors: the learning plane's transport over real loopback gRPC.
#include "echelon/net/grpc_actors.h"

#include <gtest/gtest.h>

#include <atomic>
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

}  // namespace
}  // namespace echelon::net
