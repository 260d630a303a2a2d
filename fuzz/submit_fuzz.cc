// Fuzzes what a learner does with a submission from the network: protobuf parsing of a
// SubmitRequest, decoding into a GroupRollout, validation, the dispatcher's lease check,
// prompt and reward verification (learn::TrajectoryIntake::Submit). Nothing may crash, hang
// or leak. The corpus' seed_valid.pb is a submission this learner accepts (it holds group 0,
// lease 1 as actor "fuzz#1"), so mutations start past every check; `echelon_testkit
// fuzz-replay submit` confirms that it still is, and `echelon_testkit fuzz-seed submit FILE`
// writes it again after a wire or task change.
#include <cstddef>
#include <cstdint>

#include "echelon/learn/trajectory_intake.h"
#include "echelon/model/tokenizer.h"
#include "echelon/net/codec.h"
#include "fuzz/submit_fuzz.h"

namespace {

struct Learner {
  Learner()
      : dispatcher({2, 4, 60}, &clock),
        task(echelon::data::CreateAdapter("math", {{"eval_size", "4"}}).value()),
        vocab(echelon::model::Vocabulary::Characters(task->Alphabet())),
        hub(&dispatcher, task.get(), &vocab, {vocab.id_end(), 8, 64}) {
    hub.Publish({0, std::make_shared<const std::string>()});  // version 0 exists, as in a run
    // Hand out everything admission allows, so lease checks see real leases.
    while (hub.Acquire(kActor)) {
    }
  }
  static constexpr char kActor[] = "fuzz#1";
  echelon::SimulatedClock clock;
  echelon::sched::Dispatcher dispatcher;
  std::unique_ptr<echelon::data::TaskAdapter> task;
  echelon::model::Vocabulary vocab;
  echelon::learn::TrajectoryIntake hub;
};

Learner& TheLearner() {
  static Learner* learner = new Learner();
  return *learner;
}

int64_t g_accepted = 0;

}  // namespace

int64_t SubmitFuzzAccepted() { return g_accepted; }

std::string SubmitFuzzValidSeed() {
  Learner& l = TheLearner();
  const echelon::data::Prompt p = l.task->TrainPrompt(0);
  const echelon::model::CharTokenizer tok = echelon::model::CharTokenizer::ForAlphabet(l.task->Alphabet());
  echelon::contract::GroupRollout g;
  g.group_id = 0;
  g.lease_id = 1;
  g.behavior_version = 0;
  for (int i = 0; i < 8; ++i) {
    echelon::data::Turn t;
    t.prompt_ids = l.vocab.EncodePrompt(p.text).value();
    t.tokens = tok.Encode(p.reference).value();
    t.tokens.push_back(echelon::model::CharTokenizer::kEos);
    t.logprobs.assign(t.tokens.size(), -0.1f);
    echelon::data::Episode e;
    e.turns.push_back(t);
    e.reward = 1.0;
    g.episodes.push_back(e);
  }
  echelon::v1::SubmitRequest req;
  echelon::net::EncodeRollout(g, Learner::kActor, &req);
  return req.SerializeAsString();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Learner& learner = TheLearner();
  echelon::v1::SubmitRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (learner.hub.Submit(echelon::net::DecodeRollout(req, req.actor_id())).accepted) ++g_accepted;
  learner.hub.Drain(0.0);
  return 0;
}
