#include <gtest/gtest.h>

#include <algorithm>

#include "echelon/data/adapter.h"

namespace echelon::data {
namespace {

TEST(AdapterRegistry, ListsAndCreatesMath) {
  const std::vector<std::string> names = AdapterNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "math"), names.end());
  Result<std::unique_ptr<TaskAdapter>> task = CreateAdapter("math", {{"eval_size", "7"}});
  ASSERT_TRUE(task.ok()) << task.status().message();
  EXPECT_EQ(task.value()->name(), "math");
  EXPECT_EQ(task.value()->HeldOut().size(), 7u);  // options reach the adapter
}

TEST(AdapterRegistry, UnknownNameListsTheKnownOnes) {
  Result<std::unique_ptr<TaskAdapter>> task = CreateAdapter("maths", {});
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(task.status().message().find("unknown task adapter \"maths\""), std::string::npos);
  EXPECT_NE(task.status().message().find("known adapters: http-env, math, poker, prompts"), std::string::npos)
      << task.status().message();
}

TEST(AdapterRegistry, AdapterOptionErrorsPassThrough) {
  Result<std::unique_ptr<TaskAdapter>> task = CreateAdapter("math", {{"bogus", "1"}});
  ASSERT_FALSE(task.ok());
  EXPECT_NE(task.status().message().find("unknown option \"bogus\""), std::string::npos)
      << task.status().message();
}

}  // namespace
}  // namespace echelon::data
