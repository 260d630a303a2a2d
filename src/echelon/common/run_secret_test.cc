#include "echelon/common/run_secret.h"

#include <gtest/gtest.h>

#include <set>

namespace echelon {
namespace {

// Draw is HMAC-SHA256 as Python's hmac module computes it: key bytes 0..31, message
// "group seed" NUL and the index as 8 little-endian bytes, the digest's first 8 bytes read
// little-endian.
TEST(RunSecretTest, DrawIsHmacSha256AsAnIndependentImplementationComputesIt) {
  Result<RunSecret> s =
      RunSecret::FromHex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", "test");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->Draw("group seed", 5), 0x82766e879139daa7ULL);
  EXPECT_EQ(s->Hex(), "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");
}

TEST(RunSecretTest, DrawsDependOnKeyPurposeAndIndex) {
  const RunSecret a = RunSecret::FromSeed(1);
  EXPECT_EQ(a, RunSecret::FromSeed(1));
  const RunSecret b = RunSecret::FromSeed(2);
  EXPECT_NE(a.Draw("group seed", 0), b.Draw("group seed", 0));
  EXPECT_NE(a.Draw("group seed", 0), a.Draw("group seed", 1));
  EXPECT_NE(a.Draw("group seed", 0), a.Draw("poker deal", 0));
  Result<RunSecret> r1 = RunSecret::Random();
  Result<RunSecret> r2 = RunSecret::Random();
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_NE(r1.value(), r2.value());
  EXPECT_EQ(RunSecret::FromHex(r1->Hex(), "x").value(), r1.value());
  std::set<uint64_t> seen;
  for (uint64_t g = 0; g < 1000; ++g) seen.insert(r1->Draw("group seed", g));
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(RunSecretTest, AMalformedSecretIsNamed) {
  for (const char* bad : {"", "abc", "zz0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"}) {
    Result<RunSecret> s = RunSecret::FromHex(bad, "run/secret");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("run/secret: a run secret is 64 hex characters"), std::string::npos)
        << s.status().message();
  }
}

}  // namespace
}  // namespace echelon
