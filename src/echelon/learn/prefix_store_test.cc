// PrefixStore: a report from a lease older than the entry's never touches it (the race where a
// preempted holder's last report arrives after its group was handed on), a refused submission
// loses only what its own lease reported, and the authors of a prefix are kept in order.
#include "echelon/learn/prefix_store.h"

#include <gtest/gtest.h>

namespace echelon::learn {
namespace {

contract::PrefixPart Part(int64_t sample, int64_t from, std::vector<int64_t> tokens, int64_t version) {
  contract::PrefixPart p{sample, from, std::move(tokens)};
  p.logprobs.assign(p.tokens.size(), -0.5f);
  p.versions.assign(p.tokens.size(), version);
  return p;
}

const auto kHolds = [] { return true; };
const auto kUsable = [](int64_t, int64_t) { return true; };

// The holder's `holds` was true when its report was checked, but the group was handed on to a
// newer lease before the report took the store's lock: the report is not kept, and the newer
// lease's prefix stays as it was (before, the entry was reset to the old lease's).
TEST(PrefixStoreTest, AReportFromAnOlderLeaseNeverResetsANewerLeasesPrefix) {
  PrefixStore store({/*group_size=*/2, /*max_tokens=*/16});
  ASSERT_TRUE(store.Report("a#1", 7, /*lease=*/1, {Part(0, 0, {3, 4, 5}, 0)}, kHolds).kept);
  ASSERT_TRUE(store.Hand(7, /*lease=*/2, "b#1", kUsable));
  // Its whole prefix again with one more token (a resend whose first reply was lost).
  const PrefixStore::ReportResult late = store.Report("a#1", 7, /*lease=*/1, {Part(0, 0, {3, 4, 5, 6}, 0)}, kHolds);
  EXPECT_FALSE(late.kept);
  EXPECT_EQ(late.refusal, "");  // late, not forged
  EXPECT_TRUE(store.WasHanded(7, 2));
  std::optional<PrefixStore::Handed> next = store.Hand(7, /*lease=*/3, "c#1", kUsable);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->samples[0].tokens, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(next->tokens, 3);
}

// A resumed lease reports two more tokens and its submission is refused: they are dropped, the
// three it was handed stay for the next holder; the authors are the two holders in order.
TEST(PrefixStoreTest, ARefusedSubmissionLosesOnlyWhatItsLeaseReported) {
  PrefixStore store({2, 16});
  ASSERT_TRUE(store.Report("a#1", 7, 1, {Part(1, 0, {3, 4, 5}, 0)}, kHolds).kept);
  ASSERT_TRUE(store.Hand(7, 2, "b#1", kUsable));
  ASSERT_TRUE(store.Report("b#1", 7, 2, {Part(1, 3, {6, 7}, 1)}, kHolds).kept);
  store.Refused(7, 2);
  std::optional<PrefixStore::Handed> next = store.Hand(7, 3, "c#1", kUsable);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->samples[1].tokens, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(next->tokens, 3);
  ASSERT_TRUE(store.Report("c#1", 7, 3, {Part(1, 3, {8}, 1)}, kHolds).kept);
  ASSERT_TRUE(store.Hand(7, 4, "d#1", kUsable));
  const auto authors = store.Authors(7, 4);
  ASSERT_EQ(authors.size(), 2u);
  EXPECT_EQ(authors[0].first, "a#1");
  EXPECT_EQ(authors[0].second[1].tokens, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(authors[1].first, "c#1");
  EXPECT_EQ(authors[1].second[1].tokens, (std::vector<int64_t>{3, 4, 5, 8}));
  EXPECT_TRUE(store.Authors(7, 3).empty()) << "only the current lease's";
}

}  // namespace
}  // namespace echelon::learn
