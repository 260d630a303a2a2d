#include "echelon/net/pipeline_stage.h"

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "echelon/model/testing.h"
#include "echelon/net/auth.h"
#include "echelon/v1/pipeline.grpc.pb.h"

namespace echelon::net {
namespace {

using model::Completion;
using model::LayerRange;
using model::Qwen3Model;

const std::string kToken = "0123456789abcdef0123";

const std::vector<std::vector<int64_t>> kPrompts = {{5, 17, 30, 3}, {5, 17, 30, 3}, {9}, {1, 2, 3, 4, 5, 6},
                                                    {1, 2, 3, 4, 5, 6}, {40, 41}};

model::SamplingParams Params() {
  model::SamplingParams p;
  p.max_new_tokens = 8;
  p.eos_token_id = 7;
  p.seed = 5;
  p.slots = 2;
  return p;
}

// Stages [1, 3) and [3, 4) served over loopback, chained by RemoteStage.
struct RemoteChain {
  explicit RemoteChain(const Qwen3Model& whole) {
    last = std::make_unique<model::StageServer>(model::StageOf(whole, LayerRange{3, 4}), nullptr);
    last_service = StageService::Start(last.get(), whole->config(), {"127.0.0.1:0", kToken}).value();
    to_last = RemoteStage::Connect("127.0.0.1:" + std::to_string(last_service->port()), kToken, 30).value();
    middle = std::make_unique<model::StageServer>(model::StageOf(whole, LayerRange{1, 3}), to_last.get());
    middle_service = StageService::Start(middle.get(), whole->config(), {"127.0.0.1:0", kToken}).value();
    address = "127.0.0.1:" + std::to_string(middle_service->port());
    to_middle = RemoteStage::Connect(address, kToken, 30).value();
  }
  std::unique_ptr<model::StageServer> last, middle;
  std::unique_ptr<StageService> last_service, middle_service;
  std::unique_ptr<RemoteStage> to_last, to_middle;
  std::string address;
};

TEST(PipelineStageTest, ThreeStagesOverGrpcGenerateWhatTheyGenerateInOneProcess) {
  Qwen3Model whole = model::PeakedModel(model::FourLayerConfig());
  RemoteChain chain(whole);
  Qwen3Model first = model::StageOf(whole, LayerRange{0, 1});
  for (int64_t lanes : {1, 2}) {
    Result<std::vector<Completion>> got = model::PipelineGenerate(first, *chain.to_middle, kPrompts, Params(), lanes);
    ASSERT_TRUE(got.ok()) << got.status().message();
    model::StageServer last(model::StageOf(whole, LayerRange{3, 4}), nullptr);
    model::StageServer middle(model::StageOf(whole, LayerRange{1, 3}), &last);
    Result<std::vector<Completion>> local = model::PipelineGenerate(first, middle, kPrompts, Params(), lanes);
    ASSERT_TRUE(local.ok()) << local.status().message();
    for (size_t r = 0; r < kPrompts.size(); ++r) {
      EXPECT_EQ(got.value()[r].tokens, local.value()[r].tokens) << r;
      EXPECT_EQ(got.value()[r].logprobs, local.value()[r].logprobs) << r;
    }
    if (lanes == 1) {  // one lane: the whole model's own batches
      const std::vector<Completion> want = model::Generate(whole, kPrompts, Params());
      for (size_t r = 0; r < kPrompts.size(); ++r) EXPECT_EQ(got.value()[r].tokens, want[r].tokens) << r;
    }
  }
  EXPECT_EQ(chain.middle->open_lanes(), 0);
  EXPECT_EQ(chain.last->open_lanes(), 0);
}

// Calls as an attacker with the token could make them.
class HostileCalls : public ::testing::Test {
 protected:
  HostileCalls() : whole_(model::PeakedModel(model::FourLayerConfig())), chain_(whole_) {
    stub_ = v1::PipelineStage::NewStub(grpc::CreateChannel(chain_.address, grpc::InsecureChannelCredentials()));
  }
  grpc::Status Open(const v1::OpenLaneRequest& req, const std::string& token = kToken) {
    grpc::ClientContext ctx;
    AttachToken(ctx, token);
    v1::OpenLaneReply reply;
    return stub_->Open(&ctx, req, &reply);
  }
  grpc::Status Forward(const v1::StageForwardRequest& req) {
    grpc::ClientContext ctx;
    AttachToken(ctx, kToken);
    v1::StageForwardReply reply;
    return stub_->Forward(&ctx, req, &reply);
  }
  static v1::OpenLaneRequest GoodOpen(uint64_t lane) {
    v1::OpenLaneRequest req;
    req.set_lane(lane);
    req.add_prompts()->add_ids(5);
    req.mutable_control()->set_max_new_tokens(4);
    return req;
  }
  Qwen3Model whole_;
  RemoteChain chain_;
  std::unique_ptr<v1::PipelineStage::Stub> stub_;
};

TEST_F(HostileCalls, AWrongTokenIsRefused) {
  const grpc::Status s = Open(GoodOpen(1), "not-the-token-at-all");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(chain_.middle->open_lanes(), 0);
}

TEST_F(HostileCalls, LanesThatWouldSizeAHugeCacheAreRefused) {
  v1::OpenLaneRequest big = GoodOpen(2);
  big.mutable_control()->set_max_new_tokens(1'000'000);
  EXPECT_EQ(Open(big).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::OpenLaneRequest slots = GoodOpen(3);
  slots.mutable_control()->set_slots(int64_t{1} << 40);
  EXPECT_EQ(Open(slots).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::OpenLaneRequest none = GoodOpen(4);
  none.clear_prompts();
  EXPECT_EQ(Open(none).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::OpenLaneRequest vocab = GoodOpen(5);
  vocab.mutable_prompts(0)->add_ids(48);
  const grpc::Status s = Open(vocab);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("out of vocab"), std::string::npos) << s.error_message();
  EXPECT_EQ(chain_.middle->open_lanes(), 0);
  EXPECT_EQ(chain_.last->open_lanes(), 0);
}

TEST_F(HostileCalls, TensorsWhoseShapeBytesOrValuesLieAreRefusedAndTheLaneStaysUsable) {
  ASSERT_TRUE(Open(GoodOpen(7)).ok());
  v1::StageForwardRequest req;
  req.set_lane(7);
  v1::Tensor* t = req.mutable_hidden();
  t->set_dtype("float32");
  for (int64_t d : {1, 1, 32}) t->add_shape(d);
  t->set_data(std::string(31 * 4, '\0'));  // one float short
  grpc::Status s = Forward(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("bytes for a tensor of"), std::string::npos) << s.error_message();
  t->set_shape(2, 33);
  EXPECT_EQ(Forward(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  t->set_shape(2, 32);
  t->set_dtype("int64");
  EXPECT_EQ(Forward(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  t->set_dtype("float32");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::string data(32 * 4, '\0');
  std::memcpy(data.data(), &nan, 4);
  t->set_data(data);
  s = Forward(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("not finite"), std::string::npos) << s.error_message();
  req.mutable_hidden()->set_data(std::string(32 * 4, '\0'));
  req.set_lane(8);
  EXPECT_EQ(Forward(req).error_code(), grpc::StatusCode::NOT_FOUND);  // no such lane
  // The lane refused nothing it computed: a whole generation through it still works.
  Qwen3Model first = model::StageOf(whole_, LayerRange{0, 1});
  EXPECT_TRUE(model::PipelineGenerate(first, *chain_.to_middle, kPrompts, Params(), 2).ok());
}

}  // namespace
}  // namespace echelon::net
