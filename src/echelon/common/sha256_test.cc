#include "echelon/common/sha256.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace echelon {
namespace {

TEST(Sha256Test, PartsHashLikeTheirConcatenation) {
  // FIPS 180-2's "abc" vector, whole and in parts (empty parts included).
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  EXPECT_EQ(Sha256Hex("abc"), abc);
  EXPECT_EQ(Sha256Hex(std::vector<std::string_view>{"a", "", "bc"}), abc);
  EXPECT_EQ(Sha256Hex(std::vector<std::string_view>{}), Sha256Hex(""));
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 9));
  const std::string_view v(big);
  EXPECT_EQ(Sha256Hex(std::vector<std::string_view>{v.substr(0, 1000003), v.substr(1000003)}), Sha256Hex(big));
}

}  // namespace
}  // namespace echelon
