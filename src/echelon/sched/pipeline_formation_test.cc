#include "echelon/sched/pipeline_formation.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace echelon::sched {
namespace {

using Ids = std::vector<std::string>;

TEST(PipelineFormation, ANewPipelineTakesTheFirstRegisteredProcessOfEachStage) {
  const StageMembers m = ChooseStageMembers(2, {}, {{"head#1", 0, 1.0}, {"late#2", 1, 3.0}, {"early#3", 1, 2.0}});
  EXPECT_EQ(m.active, (Ids{"head#1", "early#3"}));
  EXPECT_TRUE(m.changed);
  EXPECT_TRUE(m.complete);
  EXPECT_EQ(m.reissue_head, "");
}

TEST(PipelineFormation, EqualRegistrationTimesGoToTheSmallerId) {
  const StageMembers m = ChooseStageMembers(2, {}, {{"h#1", 0, 1.0}, {"s#b", 1, 2.0}, {"s#a", 1, 2.0}});
  EXPECT_EQ(m.active, (Ids{"h#1", "s#a"}));
}

TEST(PipelineFormation, APipelineMissingAStageIsNotComplete) {
  const StageMembers m = ChooseStageMembers(3, {}, {{"h#1", 0, 1.0}, {"c#2", 2, 2.0}});
  EXPECT_EQ(m.active, (Ids{"h#1", "", "c#2"}));
  EXPECT_TRUE(m.changed) << "a new pipeline is a new epoch even while incomplete";
  EXPECT_FALSE(m.complete);
}

TEST(PipelineFormation, ALiveMemberKeepsItsPlaceAgainstAnEarlierSpare) {
  // Whatever the registration times, a spare waits while the member lives.
  const StageMembers m =
      ChooseStageMembers(2, {"h#1", "s#2"}, {{"h#1", 0, 1.0}, {"s#2", 1, 5.0}, {"spare#3", 1, 0.5}});
  EXPECT_EQ(m.active, (Ids{"h#1", "s#2"}));
  EXPECT_FALSE(m.changed);
  EXPECT_EQ(m.reissue_head, "");
}

TEST(PipelineFormation, ALaterStageLeavingReissuesTheHeadsGroupsAndASpareTakesOver) {
  StageMembers m = ChooseStageMembers(2, {"h#1", "s#2"}, {{"h#1", 0, 1.0}, {"spare#3", 1, 4.0}});
  EXPECT_EQ(m.active, (Ids{"h#1", "spare#3"}));
  EXPECT_TRUE(m.changed);
  EXPECT_TRUE(m.complete);
  EXPECT_EQ(m.reissue_head, "h#1");
  // With no spare the pipeline waits, and the head's groups are re-issued all the same.
  m = ChooseStageMembers(3, {"h#1", "s#2", "t#3"}, {{"h#1", 0, 1.0}, {"s#2", 1, 2.0}});
  EXPECT_EQ(m.active, (Ids{"h#1", "s#2", ""}));
  EXPECT_FALSE(m.complete);
  EXPECT_EQ(m.reissue_head, "h#1");
}

TEST(PipelineFormation, TheHeadLeavingReissuesNothingHere) {
  // An evicted head's groups are re-issued as any evicted actor's.
  const StageMembers m = ChooseStageMembers(2, {"h#1", "s#2"}, {{"s#2", 1, 2.0}, {"h2#3", 0, 3.0}});
  EXPECT_EQ(m.active, (Ids{"h2#3", "s#2"}));
  EXPECT_TRUE(m.changed);
  EXPECT_EQ(m.reissue_head, "");
}

TEST(PipelineFormation, AStageFilledForTheFirstTimeReissuesNothing) {
  const StageMembers m = ChooseStageMembers(2, {"h#1", ""}, {{"h#1", 0, 1.0}, {"s#2", 1, 2.0}});
  EXPECT_EQ(m.active, (Ids{"h#1", "s#2"}));
  EXPECT_TRUE(m.changed);
  EXPECT_TRUE(m.complete);
  EXPECT_EQ(m.reissue_head, "");
}

TEST(PipelineFormation, CandidatesOfNoSuchStageAreIgnored) {
  const StageMembers m = ChooseStageMembers(2, {}, {{"h#1", 0, 1.0}, {"x#2", 2, 0.0}, {"y#3", -1, 0.0}});
  EXPECT_EQ(m.active, (Ids{"h#1", ""}));
  EXPECT_FALSE(m.complete);
}

}  // namespace
}  // namespace echelon::sched
