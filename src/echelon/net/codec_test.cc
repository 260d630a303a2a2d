#include "echelon/net/codec.h"

#include <gtest/gtest.h>

namespace echelon::net {
namespace {

TEST(CodecTest, RoutesTravelWholeAndAHostileStepCannotWrapAPosition) {
  data::Turn t;
  t.prompt_ids = {1, 2, 3};
  t.tokens = {4, 5};
  t.logprobs = {-0.5f, -1.0f};
  const int64_t a[] = {3, 1}, b[] = {0, 2}, c[] = {127, 5};
  t.routes.Add(0, 1, a, 2);
  t.routes.Add(0, 3, b, 2);
  t.routes.Add(3, 1, c, 2);
  v1::Turn wire;
  EncodeTurn(t, &wire);
  EXPECT_EQ(wire.routes().position_steps_size(), 3);
  EXPECT_EQ(wire.routes().position_steps(2), 3u) << "positions travel as steps";
  EXPECT_TRUE(DecodeTurn(wire).routes == t.routes);

  // Steps summing past int32, and numbers past int16, decode as -1, which intake refuses.
  v1::Turn hostile;
  hostile.mutable_routes()->add_position_steps(0xffffffffu);
  hostile.mutable_routes()->add_position_steps(0xffffffffu);
  hostile.mutable_routes()->add_layers(70000);
  hostile.mutable_routes()->add_experts(1);
  const Routes r = DecodeTurn(hostile).routes;
  ASSERT_EQ(r.positions.size(), 2u);
  EXPECT_EQ(r.positions[0], -1);
  EXPECT_EQ(r.positions[1], -1);
  EXPECT_EQ(r.layers[0], -1);
  EXPECT_EQ(r.experts[0], 1);
  EXPECT_TRUE(DecodeTurn(v1::Turn()).routes.empty());
}

// Routes are optional: a group that would pass the message limit loses the largest turns'
// routes first, its tokens never.
TEST(CodecTest, RoutesPastTheMessageLimitGoLargestFirstAndTokensStay) {
  contract::GroupRollout g;
  for (int i = 0; i < 3; ++i) {
    data::Turn t;
    t.prompt_ids = {1, 2};
    t.tokens = std::vector<int64_t>(100, 7);
    t.logprobs = std::vector<float>(100, -0.5f);
    const int64_t chosen[] = {3, 1};
    for (int32_t p = 0; p < 100 * (i + 1); ++p) t.routes.Add(p, 1, chosen, 2);  // turn 2 has the most
    g.episodes.emplace_back().turns.push_back(t);
  }
  v1::SubmitRequest req;
  EncodeRollout(g, "a", &req);
  const size_t whole = req.ByteSizeLong();
  EXPECT_EQ(FitRoutes(&req, whole), 0) << "it fits: nothing dropped";
  const size_t turn2 = req.episodes(2).turns(0).routes().ByteSizeLong();
  EXPECT_EQ(FitRoutes(&req, whole - turn2 / 2), 1);
  EXPECT_FALSE(req.episodes(2).turns(0).has_routes()) << "the largest went first";
  EXPECT_TRUE(req.episodes(0).turns(0).has_routes());
  EXPECT_EQ(FitRoutes(&req, 1), 2) << "every route goes when even that is too much";
  for (const v1::Episode& e : req.episodes()) EXPECT_EQ(e.turns(0).tokens_size(), 100);
}

}  // namespace
}  // namespace echelon::net
