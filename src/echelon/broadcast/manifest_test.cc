#include "echelon/broadcast/manifest.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "echelon/broadcast/ed25519.h"
#include "echelon/common/sha256.h"
#include "echelon/common/fs.h"

namespace echelon::broadcast {
namespace {

using nlohmann::json;

std::string PatternBlob(size_t n, int seed = 0) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  return s;
}

// A two-tensor safetensors file built by hand (independent of the model/ reader).
std::string SafetensorsBlob() {
  std::string header = R"({"b":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},)"
                       R"("a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})";
  std::string out;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + PatternBlob(32);
}

SigningKey NewKey() { return SigningKey::Generate().value(); }

TEST(ManifestTest, Sha256MatchesFipsVector) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(ManifestTest, SplitsIntoFixedChunksNamedBySha256) {
  const std::string blob = PatternBlob(10000);
  Manifest m = BuildManifest(3, blob, 4096).value();
  EXPECT_EQ(m.version, 3u);
  EXPECT_EQ(m.total_bytes, 10000u);
  ASSERT_EQ(m.num_chunks(), 3u);
  EXPECT_EQ(m.ChunkSize(0), 4096u);
  EXPECT_EQ(m.ChunkSize(2), 10000u - 8192u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(m.chunk_sha256[i], Sha256Hex(blob.substr(i * 4096, 4096)));
  EXPECT_EQ(m.file_sha256, Sha256Hex(blob));
  EXPECT_TRUE(m.tensors.empty());  // not safetensors
  EXPECT_EQ(BuildManifest(1, std::string(), 4096).value().num_chunks(), 0u);
  EXPECT_EQ(BuildManifest(1, PatternBlob(8192), 4096).value().num_chunks(), 2u);  // exact multiple
}

TEST(ManifestTest, DefaultChunkIsFourMiBAndTinyChunksAreRefused) {
  Manifest m = BuildManifest(1, PatternBlob((4u << 20) + 1)).value();
  EXPECT_EQ(m.chunk_bytes, 4u << 20);
  EXPECT_EQ(m.num_chunks(), 2u);
  Result<Manifest> tiny = BuildManifest(1, PatternBlob(100), 16);
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.status().code(), StatusCode::kInvalidArgument);
}

TEST(ManifestTest, TensorIndexFromSafetensorsHeader) {
  const std::string blob = SafetensorsBlob();
  Manifest m = BuildManifest(1, blob, 1024).value();
  ASSERT_EQ(m.tensors.size(), 2u);
  const uint64_t data = blob.size() - 32;
  EXPECT_EQ(m.tensors[0], (TensorEntry{"a", "I64", {1}, data, data + 8}));
  EXPECT_EQ(m.tensors[1], (TensorEntry{"b", "F32", {2, 3}, data + 8, data + 32}));
  EXPECT_EQ(m.ChunksOfTensor("b"), std::vector<size_t>{0});
  EXPECT_TRUE(m.ChunksOfTensor("missing").empty());
}

TEST(ManifestTest, SignedManifestRoundTrips) {
  SigningKey key = NewKey();
  Manifest m = BuildManifest(42, SafetensorsBlob(), 1024).value();
  std::string envelope = SignManifest(m, key).value();
  Result<Manifest> got = VerifySignedManifest(envelope, key.public_key());
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got.value(), m);
  EXPECT_EQ(json::parse(envelope)["signature"].get<std::string>().size(), 128u);
  // Canonical: the same manifest always serialises to the same bytes.
  EXPECT_EQ(m.CanonicalJson(), BuildManifest(42, SafetensorsBlob(), 1024).value().CanonicalJson());
}

TEST(ManifestTest, RejectsTamperedManifest) {
  SigningKey key = NewKey();
  const std::string blob = PatternBlob(10000);
  std::string envelope = SignManifest(BuildManifest(7, blob, 4096).value(), key).value();
  json j = json::parse(envelope);

  json changed_hash = j;
  changed_hash["manifest"]["chunks"][1] = Sha256Hex("evil");
  json changed_version = j;
  changed_version["manifest"]["version"] = 8;
  json extra_field = j;
  extra_field["manifest"]["note"] = "unsigned";
  for (const json& bad : {changed_hash, changed_version, extra_field}) {
    Result<Manifest> got = VerifySignedManifest(bad.dump(), key.public_key());
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(got.status().message().find("does not verify"), std::string::npos) << got.status().message();
  }
  json flipped_sig = j;
  std::string sig = j["signature"];
  sig[0] = sig[0] == '0' ? '1' : '0';
  flipped_sig["signature"] = sig;
  EXPECT_EQ(VerifySignedManifest(flipped_sig.dump(), key.public_key()).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(VerifySignedManifest("not json", key.public_key()).status().code(), StatusCode::kInvalidArgument);
}

TEST(ManifestTest, RejectsWrongKey) {
  SigningKey origin = NewKey();
  SigningKey other = NewKey();
  std::string envelope = SignManifest(BuildManifest(1, PatternBlob(5000), 1024).value(), origin).value();
  Result<Manifest> got = VerifySignedManifest(envelope, other.public_key());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find(origin.public_key().key_id()), std::string::npos);
  // Without the (unsigned) key_id hint the signature itself still fails.
  json j = json::parse(envelope);
  j.erase("key_id");
  EXPECT_EQ(VerifySignedManifest(j.dump(), other.public_key()).status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(VerifySignedManifest(j.dump(), origin.public_key()).ok());
}

TEST(ManifestTest, VerifyChunkRejectsTamperedChunk) {
  const std::string blob = PatternBlob(10000);
  Manifest m = BuildManifest(1, blob, 4096).value();
  EXPECT_TRUE(VerifyChunk(m, 1, ChunkView(m, blob, 1)).ok());
  std::string tampered(ChunkView(m, blob, 1));
  tampered[100] ^= 1;
  Status st = VerifyChunk(m, 1, tampered);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("SHA-256"), std::string::npos);
  EXPECT_EQ(VerifyChunk(m, 1, tampered.substr(0, 4095)).code(), StatusCode::kDataLoss);  // short
  EXPECT_EQ(VerifyChunk(m, 0, ChunkView(m, blob, 1)).code(), StatusCode::kDataLoss);      // wrong index
  EXPECT_EQ(VerifyChunk(m, 3, "x").code(), StatusCode::kInvalidArgument);
  std::string bad_blob = blob;
  bad_blob[9999] ^= 1;
  EXPECT_TRUE(VerifyBlob(m, blob).ok());
  EXPECT_EQ(VerifyBlob(m, bad_blob).code(), StatusCode::kDataLoss);
}

class ManifestKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("echelon_keys_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(ManifestKeysTest, SaveAndLoadPemRoundTrip) {
  SigningKey key = NewKey();
  ASSERT_TRUE(key.SavePem(Path("origin.key")).ok());
  ASSERT_TRUE(key.public_key().SavePem(Path("origin.pub")).ok());
  struct stat st;
  ASSERT_EQ(::stat(Path("origin.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  SigningKey loaded = SigningKey::LoadPem(Path("origin.key")).value();
  VerifyKey pub = VerifyKey::LoadPem(Path("origin.pub")).value();
  EXPECT_EQ(pub.key_id(), key.public_key().key_id());
  EXPECT_EQ(loaded.public_key().raw(), key.public_key().raw());
  std::string sig = loaded.Sign("hello").value();
  EXPECT_TRUE(pub.Verify("hello", sig).ok());
  EXPECT_EQ(pub.Verify("hellO", sig).code(), StatusCode::kDataLoss);
  EXPECT_EQ(VerifyKey::FromRaw(pub.raw()).value().key_id(), pub.key_id());
}

TEST_F(ManifestKeysTest, ClearErrorsForBadKeyFiles) {
  Result<SigningKey> missing = SigningKey::LoadPem(Path("nope.key"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.key"), std::string::npos);

  ASSERT_TRUE(WriteFileAtomic(Path("garbage.pem"), "hello").ok());
  Result<VerifyKey> garbage = VerifyKey::LoadPem(Path("garbage.pem"));
  EXPECT_EQ(garbage.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.status().message().find("garbage.pem"), std::string::npos);
  EXPECT_NE(garbage.status().message().find("BEGIN PUBLIC KEY"), std::string::npos);

  // A public key where a private key belongs, and the other way round.
  SigningKey key = NewKey();
  ASSERT_TRUE(key.public_key().SavePem(Path("k.pub")).ok());
  EXPECT_EQ(SigningKey::LoadPem(Path("k.pub")).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(VerifyKey::FromRaw("short").status().code(), StatusCode::kInvalidArgument);
}

// Without a chunk size a snapshot is cut into about kTargetChunks chunks, 1 to 64 MiB.
TEST(ChunkBytesForTest, AboutOneThousandChunksBetweenOneAndSixtyFourMebibytes) {
  EXPECT_EQ(ChunkBytesFor(0), 1u << 20);
  EXPECT_EQ(ChunkBytesFor(700'000), 1u << 20);          // the default job's model: one chunk
  EXPECT_EQ(ChunkBytesFor(128ull << 20), 1u << 20);     // 128 chunks
  EXPECT_EQ(ChunkBytesFor(1ull << 30), 1u << 20);       // 1,024
  EXPECT_EQ(ChunkBytesFor((1ull << 30) + 1), 2u << 20);  // 513
  EXPECT_EQ(ChunkBytesFor(16'000'000'000ull), 16u << 20);  // 954
  EXPECT_EQ(ChunkBytesFor(1ull << 40), 64u << 20);      // the cap: 16,384
}

}  // namespace
}  // namespace echelon::broadcast
