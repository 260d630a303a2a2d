// Fuzzes what a learner does with a submission from the network: protobuf parsing of a
// SubmitRequest, decoding into a GroupRollout, validation, reward re-checking and the
// dispatcher's lease check (learn::TrajectoryIntake::Submit). Nothing may crash, hang or leak.
#include <cstddef>
#include <cstdint>

#include "echelon/learn/trajectory_intake.h"
#include "echelon/net/codec.h"

namespace {

struct Learner {
  Learner()
      : dispatcher({2, 4, 60}, &clock),
        task(echelon::data::CreateAdapter("math", {{"eval_size", "4"}}).value()),
        vocab(echelon::model::Vocabulary::Characters(task->Alphabet())),
        hub(&dispatcher, task.get(), &vocab, {vocab.id_end(), 8, 64}) {
    hub.Publish({0, std::make_shared<const std::string>()});  // version 0 exists, as in a run
  }
  echelon::SimulatedClock clock;
  echelon::sched::Dispatcher dispatcher;
  std::unique_ptr<echelon::data::TaskAdapter> task;
  echelon::model::Vocabulary vocab;
  echelon::learn::TrajectoryIntake hub;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Learner* learner = new Learner();
  // Keep some groups handed out so that lease checks see real leases.
  while (learner->hub.Acquire("fuzz#1")) {
  }
  echelon::v1::SubmitRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  learner->hub.Submit(echelon::net::DecodeRollout(req, req.actor_id()));
  learner->hub.Drain(0.0);
  return 0;
}
