#include "echelon/serve/text_stream.h"

#include <gtest/gtest.h>

namespace echelon::serve {
namespace {

constexpr int64_t kEos = 1000;

// Token id b < 256 is the byte b; bytes are read as UTF-8 with ill-formed or incomplete
// sequences as U+FFFD (as the byte-level BPE decoder does); kEos decodes to "<eos>".
std::string DecodeBytes(const std::vector<int64_t>& ids) {
  std::string bytes;
  for (int64_t id : ids) bytes += id == kEos ? std::string("<eos>") : std::string(1, static_cast<char>(id));
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= bytes.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    if (ok) {
      out += bytes.substr(i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

std::vector<int64_t> Ids(const std::string& s) {
  std::vector<int64_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

struct Streamed {
  std::vector<std::string> deltas;
  std::string all;
  bool stopped = false;
};

Streamed Stream(const std::vector<int64_t>& ids, std::vector<std::string> stop) {
  TextStream ts(DecodeBytes, std::move(stop), {kEos});
  Streamed s;
  for (int64_t id : ids) {
    s.deltas.push_back(ts.Push(id));
    s.all += s.deltas.back();
    if (ts.stopped()) break;
  }
  s.all += ts.Finish();
  s.stopped = ts.stopped();
  EXPECT_EQ(s.all, ts.text());
  return s;
}

TEST(TextStream, MultiByteCharactersWaitUntilComplete) {
  const std::string euro = "\xE2\x82\xAC";  // 3 bytes, one token each
  Streamed s = Stream(Ids("a" + euro + "b"), {});
  ASSERT_EQ(s.deltas.size(), 5u);
  EXPECT_EQ(s.deltas[0], "a");
  EXPECT_EQ(s.deltas[1], "");
  EXPECT_EQ(s.deltas[2], "");
  EXPECT_EQ(s.deltas[3], euro);
  EXPECT_EQ(s.deltas[4], "b");
  EXPECT_EQ(s.all, "a" + euro + "b");
}

TEST(TextStream, IncompleteTailIsFlushedAtTheEnd) {
  Streamed s = Stream(Ids("ok\xE2\x82"), {});
  EXPECT_EQ(s.all, "ok\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TextStream, StopStringAcrossTokensIsCutWithWhatFollows) {
  Streamed s = Stream(Ids("12 END tail"), {"END"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.all, "12 ");
  // "E" and "N" were held back: they could have started the stop string.
  EXPECT_EQ(s.deltas[3], "");
  EXPECT_EQ(s.deltas[4], "");
  EXPECT_EQ(s.deltas.size(), 6u);  // nothing is pushed after the stop
}

TEST(TextStream, HeldTextIsReleasedWhenItStopsMatching) {
  Streamed s = Stream(Ids("ENx"), {"END"});
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(s.deltas[0], "");
  EXPECT_EQ(s.deltas[1], "");
  EXPECT_EQ(s.deltas[2], "ENx");
  EXPECT_EQ(s.all, "ENx");
  // At the end a held prefix is text like any other.
  EXPECT_EQ(Stream(Ids("xEN"), {"END"}).all, "xEN");
}

TEST(TextStream, EarliestOfSeveralStopStringsWins) {
  Streamed s = Stream(Ids("ab\n\ncd;"), {";", "\n\n"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.all, "ab");
}

TEST(TextStream, StopStringAtTheStartGivesEmptyText) {
  Streamed s = Stream(Ids("ENDx"), {"END"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.all, "");
}

TEST(TextStream, HiddenIdsAddNoText) {
  std::vector<int64_t> ids = Ids("hi");
  ids.push_back(kEos);
  EXPECT_EQ(Stream(ids, {}).all, "hi");
}

TEST(TextStream, DeltasConcatenateToTheWholeDecode) {
  // Random bytes: ASCII, multi-byte sequences, stray continuation bytes.
  uint64_t x = 12345;
  for (int round = 0; round < 200; ++round) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 40; ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const int r = static_cast<int>((x >> 33) % 10);
      const std::string pieces[] = {"a", " ", "\xC3\xA9", "\xE4\xBD\xA0", "\xF0\x9F\x98\x80", "\x80", "\n", "z"};
      const std::string& p = pieces[r % 8];
      for (unsigned char c : p) ids.push_back(c);
    }
    EXPECT_EQ(Stream(ids, {}).all, DecodeBytes(ids)) << "round " << round;
  }
}

}  // namespace
}  // namespace echelon::serve
