#include "echelon/broadcast/chunk_store.h"

#include <unistd.h>

#include <filesystem>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "echelon/common/sha256.h"
#include "echelon/common/fs.h"

namespace echelon::broadcast {
namespace {

constexpr uint32_t kChunk = 1024;

// `chunks` chunks of kChunk bytes; chunk i's content depends on (i, seed[i]).
std::string Blob(const std::vector<int>& seeds) {
  std::string s;
  for (size_t i = 0; i < seeds.size(); ++i) {
    for (uint32_t b = 0; b < kChunk; ++b) s.push_back(static_cast<char>((b * 31 + i * 7 + seeds[i] * 101) & 0xff));
  }
  return s;
}

Manifest Make(uint64_t v, const std::string& blob) { return BuildManifest(v, blob, kChunk).value(); }

std::string ChunkOf(const Manifest& m, const std::string& blob, size_t i) { return std::string(ChunkView(m, blob, i)); }

void PutAll(ChunkStore& store, const Manifest& m, const std::string& blob) {
  const std::vector<size_t> missing = store.MissingChunks(m.version).value();  // not a temporary's member
  for (size_t i : missing) ASSERT_TRUE(store.PutChunk(m.version, i, ChunkOf(m, blob, i)).ok());
}

TEST(ChunkStoreTest, ChunkGoesFromMissingToVerifiedOnlyWithTheRightBytes) {
  const std::string blob = Blob({0, 0, 0, 0});
  Manifest m = Make(1, blob);
  ChunkStore store;
  ASSERT_TRUE(store.AddVersion(m).ok());
  EXPECT_EQ(store.MissingChunks(1).value(), (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(store.State(1, 2).value(), ChunkState::kMissing);

  std::string bad = ChunkOf(m, blob, 2);
  bad[5] ^= 0x40;
  Status st = store.PutChunk(1, 2, bad);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(store.State(1, 2).value(), ChunkState::kMissing);
  EXPECT_EQ(store.GetChunk(1, 2).status().code(), StatusCode::kNotFound);

  ASSERT_TRUE(store.PutChunk(1, 2, ChunkOf(m, blob, 2)).ok());
  EXPECT_EQ(store.State(1, 2).value(), ChunkState::kVerified);
  EXPECT_EQ(*store.GetChunk(1, 2).value(), ChunkOf(m, blob, 2));
  EXPECT_EQ(store.MissingChunks(1).value(), (std::vector<size_t>{0, 1, 3}));
  EXPECT_EQ(store.HeldMask(1).value(), (std::vector<bool>{false, false, true, false}));
  ASSERT_TRUE(store.PutChunk(1, 2, ChunkOf(m, blob, 2)).ok());  // idempotent
  EXPECT_EQ(store.stats().verified_puts, 1u);
  EXPECT_EQ(store.stats().rejected_puts, 1u);
  EXPECT_EQ(store.stats().duplicate_puts, 1u);
  EXPECT_EQ(store.PutChunk(9, 0, "x").code(), StatusCode::kNotFound);
  EXPECT_FALSE(store.IsComplete(1));
}

TEST(ChunkStoreTest, DeltaFetchesOnlyChangedChunks) {
  const std::string v1 = Blob({0, 0, 0, 0, 0, 0, 0, 0});
  const std::string v2 = Blob({0, 1, 0, 2, 0, 0, 0, 0});  // chunks 1 and 3 changed
  Manifest m1 = Make(1, v1), m2 = Make(2, v2);
  ChunkStore store;
  ASSERT_TRUE(store.AddVersion(m1).ok());
  PutAll(store, m1, v1);
  ASSERT_TRUE(store.IsComplete(1));
  ASSERT_TRUE(store.AddVersion(m2).ok());
  EXPECT_EQ(store.MissingChunks(2).value(), (std::vector<size_t>{1, 3}));
  EXPECT_EQ(store.stats().reused_chunks, 6u);
  PutAll(store, m2, v2);
  EXPECT_EQ(store.stats().verified_puts, 8u + 2u);
  EXPECT_EQ(store.Assemble(2).value(), v2);
  EXPECT_EQ(store.num_stored_chunks(), 10u);
  EXPECT_EQ(store.stored_bytes(), 10u * kChunk);
  EXPECT_EQ(store.NewestComplete().value(), 2u);
}

TEST(ChunkStoreTest, RepeatedChunkInOneVersionIsFetchedOnce) {
  const std::string blob = Blob({3, 3, 3, 3});
  std::string same = blob.substr(0, kChunk) + blob.substr(0, kChunk) + blob.substr(2 * kChunk);
  Manifest m = Make(1, same);
  ASSERT_EQ(m.chunk_sha256[0], m.chunk_sha256[1]);
  ChunkStore store;
  ASSERT_TRUE(store.AddVersion(m).ok());
  ASSERT_TRUE(store.PutChunk(1, 1, ChunkOf(m, same, 1)).ok());
  EXPECT_EQ(store.MissingChunks(1).value(), (std::vector<size_t>{2, 3}));
  EXPECT_EQ(store.State(1, 0).value(), ChunkState::kVerified);
}

TEST(ChunkStoreTest, KeepsLastKVersionsAndCollectsUnreferencedChunks) {
  ChunkStore store(/*keep_versions=*/2);
  const std::string b1 = Blob({1, 0, 1, 0}), b2 = Blob({2, 0, 2, 0}), b3 = Blob({3, 0, 3, 0});
  for (auto [v, blob] : {std::pair<uint64_t, std::string>{1, b1}, {2, b2}, {3, b3}}) {
    Manifest m = Make(v, blob);
    ASSERT_TRUE(store.AddVersion(m).ok());
    PutAll(store, m, blob);
  }
  // Chunks 1 and 3 never changed (shared by all versions); 0 and 2 are per version.
  EXPECT_EQ(store.Versions(), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(store.num_stored_chunks(), 2u + 2u + 2u);  // shared, v2's own, v3's own
  EXPECT_EQ(store.stats().collected_chunks, 2u);       // v1's own two
  EXPECT_EQ(store.Assemble(2).value(), b2);
  EXPECT_EQ(store.GetManifest(1).status().code(), StatusCode::kNotFound);
  // An older version than everything kept is refused; an immutable version can't change.
  EXPECT_EQ(store.AddVersion(Make(1, b1)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.AddVersion(Make(3, b2)).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store.AddVersion(Make(3, b3)).ok());
  // Version 4 drops version 2 and its own chunks; shared ones survive.
  ASSERT_TRUE(store.AddVersion(Make(4, b1)).ok());
  EXPECT_EQ(store.Versions(), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(store.num_stored_chunks(), 2u + 2u);
  EXPECT_EQ(store.MissingChunks(4).value(), (std::vector<size_t>{0, 2}));
}

TEST(ChunkStoreTest, WritesAssembledVersionAtomically) {
  const std::string blob = Blob({1, 2, 3}) + "tail";
  Manifest m = Make(5, blob);
  ChunkStore store;
  ASSERT_TRUE(store.AddVersion(m).ok());
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("echelon_chunkstore_" + std::to_string(::getpid()) + ".bin")).string();
  EXPECT_EQ(store.WriteVersion(5, path).code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(std::filesystem::exists(path));
  PutAll(store, m, blob);
  ASSERT_TRUE(store.WriteVersion(5, path).ok());
  EXPECT_EQ(ReadFile(path).value(), blob);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::filesystem::remove(path);
}

TEST(ChunkStoreTest, ConcurrentReceiversStoreEachChunkOnce) {
  std::vector<int> seeds(64);
  for (int i = 0; i < 64; ++i) seeds[i] = i;
  const std::string blob = Blob(seeds);
  Manifest m = Make(1, blob);
  ChunkStore store;
  ASSERT_TRUE(store.AddVersion(m).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < 64; ++i) {
        std::string bytes = ChunkOf(m, blob, (i + t * 16) % 64);
        if (t == 3 && i % 8 == 0) bytes[0] ^= 1;  // one thread sometimes corrupts
        (void)store.PutChunk(1, (i + t * 16) % 64, bytes);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(store.IsComplete(1));
  ChunkStore::Stats s = store.stats();
  EXPECT_EQ(s.verified_puts, 64u);
  EXPECT_EQ(s.rejected_puts, 8u);
  EXPECT_EQ(s.verified_puts + s.duplicate_puts + s.rejected_puts, 4u * 64u);
  EXPECT_EQ(Sha256Hex(store.Assemble(1).value()), m.file_sha256);
}

}  // namespace
}  // namespace echelon::broadcast
