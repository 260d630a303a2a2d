#include "echelon/broadcast/delta.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "echelon/broadcast/chunk_store.h"
#include "echelon/broadcast/ed25519.h"
#include "echelon/broadcast/manifest.h"
#include "echelon/common/sha256.h"

namespace echelon::broadcast {
namespace {

constexpr uint32_t kChunk = 64 << 10;

std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// A safetensors blob built by hand: one tensor per (dtype, element count), the data from
// `data` (which must hold the sum of their sizes). The header is left unpadded on purpose, so
// the tensor data starts at an odd offset and the planes must be phased to line up.
std::string Safetensors(const std::vector<std::pair<std::string, size_t>>& tensors, const std::string& data) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0, k = 0;
  for (const auto& [dtype, elements] : tensors) {
    const size_t bytes = elements * (dtype == "BF16" ? 2 : dtype == "F32" ? 4 : dtype == "F64" ? 8 : 1);
    header["t" + std::to_string(k++)] = {{"dtype", dtype},
                                         {"shape", {elements}},
                                         {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  if ((8 + text.size()) % 2 == 0) text += ' ';
  EXPECT_EQ(offset, data.size());
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text + data;
}

// Changes `fraction` of the elements of width `element` in data: only the low byte when
// `low_bits_only` (a small bf16 update), else the whole element.
std::string Perturb(std::string data, size_t element, double fraction, bool low_bits_only, std::mt19937_64& rng) {
  std::bernoulli_distribution change(fraction);
  for (size_t e = 0; e + element <= data.size(); e += element) {
    if (!change(rng)) continue;
    if (low_bits_only) {
      data[e] = static_cast<char>(data[e] ^ (1 + rng() % 255));
    } else {
      for (size_t b = 0; b < element; ++b) data[e + b] = static_cast<char>(rng() & 0xff);
      data[e] = static_cast<char>(data[e] ^ 1);  // never all unchanged
    }
  }
  return data;
}

// The origin side: base published whole, target with deltas against it; returns the target's
// manifest and its deltas.
struct Published {
  Manifest base, target;
  std::vector<std::string> deltas;
};
Published Publish(const std::string& base, const std::string& target) {
  Published p;
  p.base = BuildManifest(1, base, kChunk).value();
  p.target = BuildManifest(2, target, kChunk).value();
  p.deltas = AddDeltas(&p.target, target, base).value();
  EXPECT_TRUE(p.target.Validate().ok()) << p.target.Validate().message();
  return p;
}

// A receiver holding the base whole.
void HoldWhole(ChunkStore& store, const Manifest& m, const std::string& blob) {
  ASSERT_TRUE(store.AddVersion(m).ok());
  for (size_t i = 0; i < m.num_chunks(); ++i) ASSERT_TRUE(store.PutChunk(m.version, i, std::string(ChunkView(m, blob, i))).ok());
}

TEST(DeltaTest, ChunkRoundTripIsBitExactForEveryStridePhaseAndChangeMask) {
  std::mt19937_64 rng(7);
  for (int stride : {1, 2, 4, 8}) {
    for (int phase = 0; phase < stride; ++phase) {
      for (double fraction : {0.0, 0.02, 0.5, 1.0}) {
        for (size_t base_size : {size_t{0}, size_t{1000}, size_t{4099}, size_t{9000}}) {
          const std::string base = RandomBytes(base_size, rng);
          std::string target = base;
          target.resize(4099, '\x5a');
          target = Perturb(target, 1, fraction, false, rng);
          const std::string delta = EncodeChunkDelta(target, base, stride, phase).value();
          Result<std::string> back = DecodeChunkDelta(delta, base, target.size());
          ASSERT_TRUE(back.ok()) << back.status().message();
          EXPECT_EQ(back.value(), target) << "stride " << stride << " phase " << phase << " fraction " << fraction
                                          << " base " << base_size;
        }
      }
    }
  }
}

TEST(DeltaTest, EmptyChunkAndUnchangedChunk) {
  EXPECT_EQ(DecodeChunkDelta(EncodeChunkDelta("", "", 2, 0).value(), "", 0).value(), "");
  std::mt19937_64 rng(1);
  const std::string same = RandomBytes(kChunk, rng);
  const std::string delta = EncodeChunkDelta(same, same, 2, 1).value();
  EXPECT_LT(delta.size(), 64u);  // all zero bytes: a few bytes of zstd
  EXPECT_EQ(DecodeChunkDelta(delta, same, same.size()).value(), same);
}

TEST(DeltaTest, PlaneLayoutFollowsTheDominantDtypeAndTheDataStart) {
  std::mt19937_64 rng(2);
  const std::string blob = Safetensors({{"F32", 10}, {"BF16", 100}}, RandomBytes(240, rng));
  Manifest m = BuildManifest(1, blob, kChunk).value();
  PlaneLayout layout = PlaneLayoutOf(m);
  EXPECT_EQ(layout.stride, 2);  // 200 bytes of BF16 against 40 of F32
  EXPECT_EQ(layout.data_start, blob.size() - 240);
  EXPECT_EQ(layout.data_start % 2, 1u);  // odd: the planes need their phase
  EXPECT_EQ(PlaneLayoutOf(BuildManifest(1, std::string(5000, 'x'), kChunk).value()).stride, 1);  // not safetensors
}

// Bit-exact reconstruction of whole snapshots through a receiver's store, for every dtype and
// change pattern; the SHA-256 of the assembled blob is the target manifest's (signed) digest.
TEST(DeltaTest, ReceiverReconstructsEveryDtypeBitExactly) {
  std::mt19937_64 rng(3);
  for (const char* dtype : {"BF16", "F32", "F64", "U8"}) {
    const size_t element = std::string(dtype) == "BF16" ? 2 : std::string(dtype) == "F32" ? 4 : std::string(dtype) == "F64" ? 8 : 1;
    for (double fraction : {0.0, 0.02, 0.3, 1.0}) {
      const size_t elements = (3 * kChunk + 777) / element;
      const std::string data = RandomBytes(elements * element, rng);
      const std::string base = Safetensors({{dtype, elements}}, data);
      const std::string target = Safetensors({{dtype, elements}}, Perturb(data, element, fraction, fraction < 0.5, rng));
      Published p = Publish(base, target);
      ChunkStore receiver(4);
      HoldWhole(receiver, p.base, base);
      ASSERT_TRUE(receiver.AddVersion(p.target).ok());
      EXPECT_EQ(receiver.DeltaBase(2), std::optional<uint64_t>(1));
      for (size_t i = 0; i < p.target.num_chunks(); ++i) {
        if (p.target.HasDelta(i)) {
          Status st = receiver.PutDeltaChunk(2, i, p.deltas[i]);
          ASSERT_TRUE(st.ok()) << dtype << " " << fraction << " chunk " << i << ": " << st.message();
        } else {
          ASSERT_TRUE(receiver.PutChunk(2, i, std::string(ChunkView(p.target, target, i))).ok());
        }
      }
      Result<std::string> got = receiver.Assemble(2);
      ASSERT_TRUE(got.ok()) << got.status().message();
      EXPECT_EQ(Sha256Hex(got.value()), p.target.file_sha256);
      EXPECT_EQ(got.value(), target);
      // The relay side: every delta this receiver decoded is stored and served as received.
      for (size_t i = 0; i < p.target.num_chunks(); ++i) {
        if (p.target.HasDelta(i)) {
          EXPECT_EQ(*receiver.GetDelta(2, i).value(), p.deltas[i]);
        }
      }
    }
  }
}

// A peer's base (`--have`) is cut with its own chunk size; the bytes at each chunk's offset are
// gathered from whichever base chunks hold them. The base here is also shorter than the target.
TEST(DeltaTest, BaseCutIntoAnotherChunkSizeStillDecodes) {
  std::mt19937_64 rng(13);
  const std::string base = RandomBytes(3 * kChunk, rng);
  std::string target = Perturb(base, 1, 0.02, false, rng);
  target += RandomBytes(kChunk / 2, rng);
  Published p = Publish(base, target);
  ChunkStore receiver(4);
  HoldWhole(receiver, BuildManifest(1, base, 21504).value(), base);  // 21 KiB chunks, not 64 KiB
  ASSERT_TRUE(receiver.AddVersion(p.target).ok());
  for (size_t i = 0; i < p.target.num_chunks(); ++i) {
    if (!p.target.HasDelta(i)) {
      ASSERT_TRUE(receiver.PutChunk(2, i, std::string(ChunkView(p.target, target, i))).ok());
      continue;
    }
    Status st = receiver.PutDeltaChunk(2, i, p.deltas[i]);
    ASSERT_TRUE(st.ok()) << i << ": " << st.message();
  }
  EXPECT_EQ(receiver.Assemble(2).value(), target);
  EXPECT_GE(receiver.stats().delta_puts, 3u);
}

TEST(DeltaTest, BaseHeldAsPiecesReadsLikeTheWholeBlob) {
  std::mt19937_64 rng(17);
  const std::string blob = RandomBytes(10007, rng);
  for (uint64_t piece : {uint64_t{1}, uint64_t{333}, uint64_t{4096}, uint64_t{10007}, uint64_t{20000}}) {
    std::vector<std::shared_ptr<const std::string>> pieces;
    for (uint64_t at = 0; at < blob.size(); at += piece) pieces.push_back(std::make_shared<const std::string>(blob.substr(at, piece)));
    const BaseBytes held = BaseBytes::Pieces(std::move(pieces), piece), whole = BaseBytes::Whole(blob);
    ASSERT_EQ(held.size(), blob.size());
    std::string scratch_a, scratch_b;
    for (int k = 0; k < 200; ++k) {
      const uint64_t begin = rng() % (blob.size() + 50), length = rng() % 5000;
      const std::string want = begin < blob.size() ? blob.substr(begin, length) : "";
      EXPECT_EQ(held.Range(begin, length, &scratch_a), want) << "piece " << piece << " begin " << begin;
      EXPECT_EQ(whole.Range(begin, length, &scratch_b), want);
    }
  }
}

TEST(DeltaTest, ThreadsAndAHeldBaseGiveTheSameDeltasAsOneThreadOnAWholeBase) {
  std::mt19937_64 rng(19);
  const std::string base = RandomBytes(9 * kChunk + 123, rng);
  const std::string target = Perturb(base, 2, 0.05, true, rng) + RandomBytes(kChunk, rng);
  Manifest serial = BuildManifest(2, target, kChunk, 1).value();
  const std::vector<std::string> one = AddDeltas(&serial, target, base, 1).value();
  ChunkStore store(4);
  const Manifest held = BuildManifest(1, base, 21504, 4).value();  // cut differently from the target
  ASSERT_TRUE(store.AddBlob(held, base, 4).ok());
  Manifest parallel = BuildManifest(2, target, kChunk, 4).value();
  EXPECT_EQ(parallel.chunk_sha256, BuildManifest(2, target, kChunk, 1).value().chunk_sha256);
  const std::vector<std::string> many =
      AddDeltas(&parallel, target, store.Bytes(1).value(), held.file_sha256, 4).value();
  EXPECT_EQ(parallel, serial);
  EXPECT_EQ(many, one);
  EXPECT_EQ(parallel.base_sha256, Sha256Hex(base));
}

TEST(DeltaTest, ReusedScratchAcrossChunkSizesStaysBitExact) {
  // One thread encodes and decodes a large chunk, then smaller ones: the per-thread buffers
  // are longer than the chunk from then on and must not leak into it. 17 MiB is past what a
  // thread keeps (its buffers are the call's own).
  std::mt19937_64 rng(23);
  for (size_t n : {size_t{300000}, size_t{5}, size_t{17} << 20, size_t{4099}, size_t{0}, size_t{70000}}) {
    const std::string base = RandomBytes(n / 2, rng), target = RandomBytes(n, rng);
    const std::string delta = EncodeChunkDelta(target, base, 2, 1).value();
    EXPECT_EQ(DecodeChunkDelta(delta, base, n).value(), target) << n;
  }
}

TEST(DeltaTest, IncompleteVersionHasNoBytes) {
  std::mt19937_64 rng(29);
  const std::string blob = RandomBytes(3 * kChunk, rng);
  ChunkStore store(2);
  const Manifest m = BuildManifest(1, blob, kChunk).value();
  ASSERT_TRUE(store.AddVersion(m).ok());
  ASSERT_TRUE(store.PutChunk(1, 0, std::string(ChunkView(m, blob, 0))).ok());
  EXPECT_EQ(store.Bytes(1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Bytes(7).status().code(), StatusCode::kNotFound);
}

TEST(DeltaTest, SmallBf16UpdateIsAFewPercentOfTheSnapshot) {
  std::mt19937_64 rng(4);
  const size_t elements = 8 * kChunk / 2;
  const std::string data = RandomBytes(elements * 2, rng);
  const std::string base = Safetensors({{"BF16", elements}}, data);
  const std::string target = Safetensors({{"BF16", elements}}, Perturb(data, 2, 0.02, true, rng));
  Published p = Publish(base, target);
  uint64_t delta_bytes = 0;
  for (size_t i = 0; i < p.target.num_chunks(); ++i) {
    ASSERT_TRUE(p.target.HasDelta(i));
    delta_bytes += p.target.delta_bytes[i];
  }
  const double fraction = static_cast<double>(delta_bytes) / target.size();
  // 2% of elements changed: one low byte each (1% of the bytes) plus their positions.
  EXPECT_LT(fraction, 0.05) << delta_bytes << " of " << target.size();
  EXPECT_GT(fraction, 0.01);
}

TEST(DeltaTest, ChunkWhoseDeltaIsNotSmallerIsOnlySentWhole) {
  std::mt19937_64 rng(5);
  const std::string base = RandomBytes(2 * kChunk, rng);
  std::string target = base;
  const std::string fresh = RandomBytes(kChunk, rng);
  target.replace(kChunk, kChunk, fresh);  // chunk 1 is all new random bytes: incompressible
  Published p = Publish(base, target);
  EXPECT_TRUE(p.target.HasDelta(0));
  EXPECT_FALSE(p.target.HasDelta(1));
  EXPECT_EQ(p.deltas[1], "");
  ChunkStore receiver(4);
  HoldWhole(receiver, p.base, base);
  ASSERT_TRUE(receiver.AddVersion(p.target).ok());
  EXPECT_EQ(receiver.PutDeltaChunk(2, 1, "anything").code(), StatusCode::kNotFound);
}

TEST(DeltaTest, DeltaAgainstTheWrongBaseIsRefused) {
  std::mt19937_64 rng(6);
  const std::string base = RandomBytes(2 * kChunk, rng);
  const std::string other = RandomBytes(2 * kChunk, rng);
  const std::string target = Perturb(base, 1, 0.02, false, rng);
  Published p = Publish(base, target);
  ChunkStore receiver(4);
  Manifest other_m = BuildManifest(1, other, kChunk).value();
  HoldWhole(receiver, other_m, other);  // holds version 1, but not the blob the deltas are against
  ASSERT_TRUE(receiver.AddVersion(p.target).ok());
  EXPECT_FALSE(receiver.DeltaBase(2).has_value());
  Status st = receiver.PutDeltaChunk(2, 0, p.deltas[0]);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.message();
  EXPECT_NE(st.message().find("base"), std::string::npos);
  EXPECT_EQ(receiver.State(2, 0).value(), ChunkState::kMissing);
  // A base held only in part is no base either.
  ChunkStore partial(4);
  ASSERT_TRUE(partial.AddVersion(p.base).ok());
  ASSERT_TRUE(partial.PutChunk(1, 0, std::string(ChunkView(p.base, base, 0))).ok());
  ASSERT_TRUE(partial.AddVersion(p.target).ok());
  EXPECT_EQ(partial.PutDeltaChunk(2, 0, p.deltas[0]).code(), StatusCode::kFailedPrecondition);
}

TEST(DeltaTest, TamperedDeltaIsRefusedWithoutStateChange) {
  std::mt19937_64 rng(8);
  const std::string base = RandomBytes(2 * kChunk, rng);
  const std::string target = Perturb(base, 1, 0.02, false, rng);
  Published p = Publish(base, target);
  ChunkStore receiver(4);
  HoldWhole(receiver, p.base, base);
  ASSERT_TRUE(receiver.AddVersion(p.target).ok());
  std::string bad = p.deltas[0];
  bad[bad.size() / 2] ^= 0x10;
  EXPECT_EQ(receiver.PutDeltaChunk(2, 0, bad).code(), StatusCode::kDataLoss);
  EXPECT_EQ(receiver.PutDeltaChunk(2, 0, p.deltas[0].substr(1)).code(), StatusCode::kDataLoss);
  EXPECT_EQ(receiver.State(2, 0).value(), ChunkState::kMissing);
  EXPECT_EQ(receiver.GetDelta(2, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(receiver.stats().rejected_puts, 2u);
  EXPECT_TRUE(receiver.PutDeltaChunk(2, 0, p.deltas[0]).ok());
}

// An origin that signs a delta (its hash matches) whose result is not the signed chunk: the
// receiver checks what it decodes against the chunk's SHA-256 and refuses it.
TEST(DeltaTest, DeltaWhoseResultDoesNotMatchTheSignedChunkIsRefused) {
  std::mt19937_64 rng(9);
  const std::string base = RandomBytes(2 * kChunk, rng);
  const std::string target = Perturb(base, 1, 0.02, false, rng);
  Published p = Publish(base, target);
  const std::string wrong = Perturb(base, 1, 0.02, false, rng);  // another update
  const std::string lie = EncodeChunkDelta(std::string_view(wrong).substr(0, kChunk),
                                           std::string_view(base).substr(0, kChunk), 1, 0).value();
  p.target.delta_sha256[0] = Sha256Hex(lie);
  p.target.delta_bytes[0] = lie.size();
  ChunkStore receiver(4);
  HoldWhole(receiver, p.base, base);
  ASSERT_TRUE(receiver.AddVersion(p.target).ok());
  Status st = receiver.PutDeltaChunk(2, 0, lie);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.message();
  EXPECT_NE(st.message().find("decoded from its delta"), std::string::npos) << st.message();
  EXPECT_EQ(receiver.State(2, 0).value(), ChunkState::kMissing);
}

TEST(DeltaTest, MalformedDeltasAreRefusedByName) {
  std::mt19937_64 rng(10);
  const std::string base = RandomBytes(5000, rng);
  const std::string target = Perturb(base, 1, 0.1, false, rng);
  const std::string good = EncodeChunkDelta(target, base, 4, 3).value();
  auto refused = [&](std::string delta, uint64_t size, const std::string& words) {
    Result<std::string> r = DecodeChunkDelta(delta, base, size);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
  };
  refused("", 5000, "ECD1");
  refused("XCD1" + good.substr(4), 5000, "ECD1");
  std::string bad_stride = good;
  bad_stride[4] = 3;
  refused(bad_stride, 5000, "malformed");
  std::string bad_phase = good;
  bad_phase[5] = 4;
  refused(bad_phase, 5000, "malformed");
  refused(good, 4999, "content size of 4999");     // a frame for another size (no larger allocation)
  refused(good + "x", 5000, "one zstd frame");       // trailing bytes
  refused(good + good.substr(8), 5000, "one zstd frame");
  refused(good.substr(0, good.size() - 3), 5000, "");  // truncated
  EXPECT_EQ(EncodeChunkDelta(target, base, 3, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeChunkDelta(target, base, 2, 2).status().code(), StatusCode::kInvalidArgument);
}

TEST(DeltaTest, DeltaFieldsAreSignedAndChecked) {
  std::mt19937_64 rng(11);
  const std::string base = RandomBytes(2 * kChunk + 100, rng);
  const std::string target = Perturb(base, 1, 0.02, false, rng);
  Published p = Publish(base, target);
  SigningKey key = SigningKey::Generate().value();
  const std::string envelope = SignManifest(p.target, key).value();
  Result<Manifest> back = VerifySignedManifest(envelope, key.public_key());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back.value(), p.target);
  // Changing a delta's hash or the base invalidates the signature.
  nlohmann::json j = nlohmann::json::parse(envelope);
  j["manifest"]["deltas"][0][1] = j["manifest"]["deltas"][0][1].get<uint64_t>() + 1;
  EXPECT_EQ(VerifySignedManifest(j.dump(), key.public_key()).status().code(), StatusCode::kDataLoss);
  // A manifest without deltas serialises without the delta keys (signed as before).
  EXPECT_EQ(p.base.CanonicalJson().find("base_sha256"), std::string::npos);
  EXPECT_EQ(p.base.CanonicalJson().find("deltas"), std::string::npos);
  // Structural checks name the field.
  Manifest m = p.target;
  m.delta_bytes[0] = m.ChunkSize(0);
  EXPECT_NE(m.Validate().message().find("deltas[0]"), std::string::npos) << m.Validate().message();
  m = p.target;
  m.delta_sha256.pop_back();
  EXPECT_NE(m.Validate().message().find("delta entries"), std::string::npos);
  m = p.target;
  m.base_sha256 = "zz";
  EXPECT_NE(m.Validate().message().find("base_sha256"), std::string::npos);
  m = p.target;
  m.base_sha256.clear();
  EXPECT_FALSE(m.Validate().ok());
}

TEST(DeltaTest, OriginStoresItsDeltasAndCollectsThemWithTheirVersion) {
  std::mt19937_64 rng(12);
  const std::string base = RandomBytes(2 * kChunk, rng);
  const std::string target = Perturb(base, 1, 0.02, false, rng);
  Published p = Publish(base, target);
  ChunkStore origin(1);
  HoldWhole(origin, p.target, target);
  EXPECT_EQ(origin.PutDelta(2, 0, "not it").code(), StatusCode::kDataLoss);
  ASSERT_TRUE(origin.PutDelta(2, 0, p.deltas[0]).ok());
  EXPECT_EQ(*origin.GetDelta(2, 0).value(), p.deltas[0]);
  const uint64_t with_delta = origin.stored_bytes();
  ASSERT_TRUE(origin.AddVersion(BuildManifest(3, RandomBytes(100, rng), kChunk).value()).ok());  // drops version 2
  EXPECT_EQ(origin.GetDelta(2, 0).status().code(), StatusCode::kNotFound);
  EXPECT_LT(origin.stored_bytes(), with_delta - p.deltas[0].size() + 1);
}

}  // namespace
}  // namespace echelon::broadcast
