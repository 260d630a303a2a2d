// Fuzzes what a learner does with a submission from the network: protobuf parsing of a
// SubmitRequest, decoding into a GroupRollout, validation, reward re-checking and the
// dispatcher's lease check (LocalHub::Submit). Nothing may crash, hang or leak.
#include <cstddef>
#include <cstdint>

#include "echelon/cli/runtime.h"
#include "echelon/net/codec.h"

namespace {

struct Learner {
  Learner()
      : dispatcher({2, 4, 60}, &clock),
        task(echelon::data::CreateAdapter("math", {{"eval_size", "4"}}).value()),
        tok(echelon::model::CharTokenizer::ForAlphabet(task->Alphabet())),
        hub(&dispatcher, task.get(), &tok, 8) {}
  echelon::SimulatedClock clock;
  echelon::sched::Dispatcher dispatcher;
  std::unique_ptr<echelon::data::TaskAdapter> task;
  echelon::model::CharTokenizer tok;
  echelon::cli::LocalHub hub;
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
