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

}  // namespace
}  // namespace echelon::net
