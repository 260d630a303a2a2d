// SnapshotPublisher: the intake knows a version before any actor can hold it.
#include "echelon/learn/snapshot_publisher.h"

#include <gtest/gtest.h>

#include "echelon/common/clock.h"
#include "echelon/data/adapter.h"
#include "echelon/learn/testing.h"
#include "echelon/model/vocabulary.h"

namespace echelon::learn {
namespace {

// A transport whose broadcast reaches an actor at once: it records the newest version the
// intake would accept a group for at the moment the snapshot goes out.
class InstantTransport : public ActorTransport {
 public:
  explicit InstantTransport(TrajectoryIntake* intake) : intake_(intake) {}
  Status Start(TrajectoryIntake*, const std::string&, std::ostream&) override { return Status::Ok(); }
  int64_t live_actors() const override { return 1; }
  std::vector<std::string> EvictSilent() override { return {}; }
  std::map<std::string, int64_t> Refusals() const override { return {}; }
  Status Broadcast(int64_t version, const std::string&) override {
    broadcast.push_back(version);
    known_at_broadcast.push_back(intake_->Latest().version);
    return Status::Ok();
  }
  std::optional<BroadcastCompletion> TakeCompletedBroadcast() override { return std::nullopt; }
  void StopWork() override {}
  void Finish() override {}
  std::vector<int64_t> broadcast, known_at_broadcast;

 private:
  TrajectoryIntake* intake_;
};

// An actor on a fast link used to receive version v, sample and submit before the intake had
// been told of v, and its honest group was refused as bad_version (a strike: three such
// quarantined honest workers on a loaded host). The intake now learns of v first.
TEST(SnapshotPublisherTest, TheIntakeKnowsAVersionBeforeItsBroadcastGoesOut) {
  SimulatedClock clock;
  sched::Dispatcher dispatcher({/*max_staleness=*/1, /*batch_groups=*/2, /*lease_seconds=*/10}, &clock);
  std::unique_ptr<data::TaskAdapter> task = data::CreateAdapter("math", {{"seed", "1"}, {"eval_size", "10"}}).value();
  const model::Vocabulary vocab = model::Vocabulary::Characters(task->Alphabet());
  TrajectoryIntake intake(&dispatcher, task.get(), &vocab, {vocab.id_end(), /*group_size=*/2, /*max_new_tokens=*/8});
  InstantTransport transport(&intake);
  SnapshotPublisher publisher(&intake, &transport);
  model::Qwen3Model m(TinyConfig());
  m->InitWeights(1);
  for (int64_t v : {0, 1, 2}) ASSERT_TRUE(publisher.Publish(m, v).ok());
  EXPECT_EQ(transport.broadcast, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(transport.known_at_broadcast, (std::vector<int64_t>{0, 1, 2}));
}

}  // namespace
}  // namespace echelon::learn
