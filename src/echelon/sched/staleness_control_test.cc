#include "echelon/sched/staleness_control.h"

#include <gtest/gtest.h>

namespace echelon::sched {
namespace {

StalenessObservation Healthy(double busy) { return {0.98, busy, 1.0 - busy}; }

// A starved learner with healthy data: S grows by one per full window, up to max; a busy one
// leaves S alone.
TEST(StalenessControl, RaisesOneAtATimeWhileTheLearnerWaitsAndTheDataIsHealthy) {
  StalenessControl c({.start = 2, .min = 0, .max = 4, .window = 3});
  EXPECT_FALSE(c.Observe(Healthy(0.5)));
  EXPECT_FALSE(c.Observe(Healthy(0.5)));
  const auto up = c.Observe(Healthy(0.5));
  ASSERT_TRUE(up);
  EXPECT_EQ(up->from, 2);
  EXPECT_EQ(up->to, 3);
  EXPECT_NE(up->reason.find("learner busy 0.500 < 0.950"), std::string::npos) << up->reason;
  for (int i = 0; i < 3; ++i) c.Observe(Healthy(0.5));
  EXPECT_EQ(c.staleness(), 4);
  for (int i = 0; i < 6; ++i) EXPECT_FALSE(c.Observe(Healthy(0.5)));  // at max
  StalenessControl busy({.start = 2, .window = 2});
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(busy.Observe(Healthy(0.99)));
  EXPECT_EQ(busy.staleness(), 2);
}

// Hurting data: S halves at the end of a window whose mean ESS fraction is low, down to min;
// the learner's starving does not raise it then.
TEST(StalenessControl, HalvesWhenTheWindowsEssIsLow) {
  StalenessControl c({.start = 16, .min = 3, .max = 64, .ess_min = 0.9, .window = 2});
  EXPECT_FALSE(c.Observe({0.95, 0.5, 0.5}));
  const auto down = c.Observe({0.80, 0.5, 0.5});  // mean 0.875
  ASSERT_TRUE(down);
  EXPECT_EQ(down->to, 8);
  EXPECT_NE(down->reason.find("ess_frac 0.875 < 0.900 over 2 updates"), std::string::npos) << down->reason;
  c.Observe({0.5, 1, 0});
  c.Observe({0.5, 1, 0});
  EXPECT_EQ(c.staleness(), 4);
  c.Observe({0.5, 1, 0});
  c.Observe({0.5, 1, 0});
  EXPECT_EQ(c.staleness(), 3);  // min
  c.Observe({0.5, 1, 0});
  EXPECT_FALSE(c.Observe({0.5, 1, 0}));
}

// lr x S held at its starting value above the start, the configured lr at or below it.
TEST(StalenessControl, LearningRateScalesAsStartOverS) {
  StalenessControl c({.start = 4, .max = 64, .window = 1});
  EXPECT_EQ(c.LrScale(), 1.0);
  for (int i = 0; i < 4; ++i) c.Observe(Healthy(0.5));
  EXPECT_EQ(c.staleness(), 8);
  EXPECT_DOUBLE_EQ(c.LrScale(), 0.5);
  c.Observe({0.1, 1, 0});
  c.Observe({0.1, 1, 0});
  EXPECT_EQ(c.staleness(), 2);
  EXPECT_EQ(c.LrScale(), 1.0);
  StalenessControl uncoupled({.start = 4, .max = 64, .window = 1, .couple_lr = false});
  for (int i = 0; i < 4; ++i) uncoupled.Observe(Healthy(0.5));
  EXPECT_EQ(uncoupled.LrScale(), 1.0);
}

// A resumed controller decides as an unbroken one; bad state is refused by name.
TEST(StalenessControl, ExportRestoreContinuesTheWindow) {
  StalenessControl a({.start = 2, .max = 8, .window = 3});
  a.Observe(Healthy(0.5));
  StalenessControl b({.start = 2, .max = 8, .window = 3});
  ASSERT_TRUE(b.Restore(a.Export(), "state.json").ok());
  a.Observe(Healthy(0.5));
  b.Observe(Healthy(0.5));
  EXPECT_EQ(a.Observe(Healthy(0.5))->to, 3);
  EXPECT_EQ(b.Observe(Healthy(0.5))->to, 3);
  nlohmann::json bad = a.Export();
  bad["staleness"] = 9;
  const Status s = b.Restore(bad, "state.json");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("state.json: staleness 9 is outside [0, 8]"), std::string::npos) << s.message();
  EXPECT_FALSE(b.Restore(nlohmann::json{{"staleness", 2}}, "state.json").ok());
  EXPECT_EQ(b.staleness(), 3);  // unchanged by the refusals
}

}  // namespace
}  // namespace echelon::sched
