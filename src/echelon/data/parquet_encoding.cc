#include "echelon/data/parquet_encoding.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "echelon/data/parquet_thrift.h"
#include "echelon/tokenizer/unicode.h"

namespace echelon::data::parquet {
namespace {

using nlohmann::json;

std::string Num(uint64_t v) { return std::to_string(v); }

// `w` bits (w <= 64) starting at bit `bit` of d[0, size), least significant bit first.
// Callers check that the bits lie inside; bytes past `size` read as zero all the same.
uint64_t ReadBits(const uint8_t* d, size_t size, uint64_t bit, int w) {
  if (w == 0) return 0;
  size_t byte = bit >> 3;
  int shift = static_cast<int>(bit & 7);
  if (w <= 56 && byte + 8 <= size) {
    uint64_t v = 0;
    std::memcpy(&v, d + byte, 8);
    return (v >> shift) & ((uint64_t{1} << w) - 1);
  }
  uint64_t v = 0;
  int got = 0;
  while (got < w) {
    const uint64_t b = (byte < size ? d[byte] : 0) >> shift;
    const int take = std::min(8 - shift, w - got);
    v |= (b & ((uint64_t{1} << take) - 1)) << got;
    got += take;
    shift = 0;
    ++byte;
  }
  return v;
}

Status ReadUleb(const uint8_t* d, size_t size, size_t* pos, uint64_t* out, const char* what) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= size) return DataLoss(std::string(what) + " varint runs past the end of the page");
    const uint8_t b = d[(*pos)++];
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      return Status::Ok();
    }
  }
  return DataLoss(std::string(what) + " varint longer than 10 bytes");
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v = 0;
  std::memcpy(&v, p, 4);
  return v;
}

double HalfToDouble(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(mant, -24)
             : exp == 31 ? (mant ? NAN : INFINITY)
                         : std::ldexp(mant + 1024, exp - 25);
  return (h & 0x8000) ? -v : v;
}

std::string UuidText(const uint8_t* p) {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

// A BYTE_ARRAY or FIXED_LEN_BYTE_ARRAY value.
Status AddBytes(const ValueType& t, const uint8_t* p, size_t len, TextBudget* budget, std::vector<json>* out) {
  if (t.kind == ValueKind::kUuid) {
    if (len != 16) return DataLoss("a UUID value has " + Num(len) + " bytes, not 16");
    out->emplace_back(UuidText(p));
    return Status::Ok();
  }
  if (t.kind == ValueKind::kFloat16) {
    if (len != 2) return DataLoss("a FLOAT16 value has " + Num(len) + " bytes, not 2");
    out->emplace_back(HalfToDouble(static_cast<uint16_t>(p[0] | (p[1] << 8))));
    return Status::Ok();
  }
  if (len > budget->bytes_left) return FailedPrecondition("the decoded text is larger than the reader's limit");
  budget->bytes_left -= len;
  if (!tokenizer::IsValidUtf8(std::string_view(reinterpret_cast<const char*>(p), len))) {
    if (t.text) return DataLoss("a string value of " + Num(len) + " bytes is not valid UTF-8");
    return InvalidArgument("a binary value of " + Num(len) +
                           " bytes is not valid UTF-8 text (a BYTE_ARRAY without a string annotation is read as text)");
  }
  out->emplace_back(std::string(reinterpret_cast<const char*>(p), len));
  return Status::Ok();
}

// One value of a fixed-width physical type at p.
Status AddFixed(const ValueType& t, const uint8_t* p, TextBudget* budget, std::vector<json>* out) {
  switch (t.physical) {
    case kInt32: {
      int32_t v = 0;
      std::memcpy(&v, p, 4);
      if (t.kind == ValueKind::kUInt32) out->emplace_back(static_cast<uint32_t>(v));
      else out->emplace_back(v);
      return Status::Ok();
    }
    case kInt64: {
      int64_t v = 0;
      std::memcpy(&v, p, 8);
      if (t.kind == ValueKind::kUInt64) out->emplace_back(static_cast<uint64_t>(v));
      else out->emplace_back(v);
      return Status::Ok();
    }
    case kFloat: {
      float v = 0;
      std::memcpy(&v, p, 4);
      out->emplace_back(static_cast<double>(v));
      return Status::Ok();
    }
    case kDouble: {
      double v = 0;
      std::memcpy(&v, p, 8);
      out->emplace_back(v);
      return Status::Ok();
    }
    case kFixedLenByteArray: return AddBytes(t, p, static_cast<size_t>(t.type_length), budget, out);
    default: return Internal("no fixed width for " + PhysicalTypeName(t.physical));
  }
}

size_t FixedWidth(const ValueType& t) {
  switch (t.physical) {
    case kInt32:
    case kFloat: return 4;
    case kInt64:
    case kDouble: return 8;
    case kFixedLenByteArray: return t.type_length > 0 ? static_cast<size_t>(t.type_length) : 0;
    default: return 0;
  }
}

Status DecodePlain(const ValueType& t, const uint8_t* d, size_t size, size_t n, TextBudget* budget,
                   std::vector<json>* out) {
  if (t.physical == kBoolean) {
    if (n > size * 8) return DataLoss("PLAIN booleans: " + Num(n) + " values in " + Num(size) + " bytes");
    for (size_t i = 0; i < n; ++i) out->emplace_back(((d[i >> 3] >> (i & 7)) & 1) != 0);
    return Status::Ok();
  }
  if (t.physical == kByteArray) {
    size_t pos = 0;
    for (size_t i = 0; i < n; ++i) {
      if (size - pos < 4) return DataLoss("PLAIN value " + Num(i) + " of " + Num(n) + ": length runs past the page");
      const uint32_t len = LoadU32(d + pos);
      pos += 4;
      if (len > size - pos)
        return DataLoss("PLAIN value " + Num(i) + " of " + Num(n) + ": " + Num(len) + " bytes run past the page");
      ECHELON_RETURN_IF_ERROR(AddBytes(t, d + pos, len, budget, out));
      pos += len;
    }
    return Status::Ok();
  }
  const size_t w = FixedWidth(t);
  if (w == 0) return InvalidArgument("PLAIN " + PhysicalTypeName(t.physical) + " is not supported");
  if (n > size / w)
    return DataLoss("PLAIN " + PhysicalTypeName(t.physical) + ": " + Num(n) + " values need " + Num(n) + " x " + Num(w) +
                    " bytes, the page has " + Num(size));
  for (size_t i = 0; i < n; ++i) ECHELON_RETURN_IF_ERROR(AddFixed(t, d + i * w, budget, out));
  return Status::Ok();
}

Status DecodeDictionaryIndices(const uint8_t* d, size_t size, size_t n, const std::vector<json>& dict,
                               TextBudget* budget, std::vector<json>* out) {
  if (n == 0) return Status::Ok();
  if (size < 1) return DataLoss("dictionary indices: the page has no bit width");
  const int width = d[0];
  if (width > 32) return DataLoss("dictionary indices of " + Num(width) + " bits");
  RleDecoder rle(d + 1, size - 1, width);
  std::vector<uint32_t> idx;
  for (size_t done = 0; done < n;) {
    const size_t k = std::min<size_t>(n - done, 4096);
    idx.resize(k);
    ECHELON_RETURN_IF_ERROR(rle.Decode(k, idx.data()));
    for (uint32_t i : idx) {
      if (i >= dict.size())
        return DataLoss("dictionary index " + Num(i) + " is out of range (the dictionary has " + Num(dict.size()) + " values)");
      const json& v = dict[i];
      if (v.is_string()) {
        const size_t len = v.get_ref<const std::string&>().size();
        if (len > budget->bytes_left) return FailedPrecondition("the decoded text is larger than the reader's limit");
        budget->bytes_left -= len;
      }
      out->push_back(v);
    }
    done += k;
  }
  return Status::Ok();
}

// DELTA_LENGTH_BYTE_ARRAY's suffix data: n strings of lengths[i] bytes, one after another.
Status ConcatenatedStrings(const ValueType& t, const uint8_t* d, size_t size, const std::vector<int64_t>& lengths,
                           const std::vector<int64_t>* prefixes, TextBudget* budget, std::vector<json>* out) {
  size_t pos = 0;
  std::string prev, cur;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t len = lengths[i];
    if (len < 0 || static_cast<uint64_t>(len) > size - pos)
      return DataLoss("value " + Num(i) + ": length " + std::to_string(len) + " runs past the page");
    if (prefixes == nullptr) {
      ECHELON_RETURN_IF_ERROR(AddBytes(t, d + pos, static_cast<size_t>(len), budget, out));
    } else {
      const int64_t pre = (*prefixes)[i];
      if (pre < 0 || static_cast<uint64_t>(pre) > prev.size())
        return DataLoss("DELTA_BYTE_ARRAY value " + Num(i) + ": prefix of " + std::to_string(pre) +
                        " bytes, the previous value has " + Num(prev.size()));
      // Prefixes repeat bytes at no cost in the file: charge them before building the value.
      if (static_cast<uint64_t>(pre) > budget->bytes_left)
        return FailedPrecondition("the decoded text is larger than the reader's limit");
      cur.assign(prev, 0, static_cast<size_t>(pre));
      cur.append(reinterpret_cast<const char*>(d + pos), static_cast<size_t>(len));
      if (t.physical == kFixedLenByteArray && cur.size() != static_cast<size_t>(t.type_length))
        return DataLoss("DELTA_BYTE_ARRAY value " + Num(i) + " has " + Num(cur.size()) + " bytes, the column's width is " +
                        Num(t.type_length));
      ECHELON_RETURN_IF_ERROR(AddBytes(t, reinterpret_cast<const uint8_t*>(cur.data()), cur.size(), budget, out));
      prev.swap(cur);
    }
    pos += static_cast<size_t>(len);
  }
  return Status::Ok();
}

Status DecodeDeltaInts(const ValueType& t, const uint8_t* d, size_t size, size_t n, std::vector<json>* out) {
  if (t.physical != kInt32 && t.physical != kInt64)
    return InvalidArgument("DELTA_BINARY_PACKED for " + PhysicalTypeName(t.physical) + " is not supported");
  std::vector<int64_t> v;
  size_t used = 0;
  ECHELON_RETURN_IF_ERROR(DecodeDeltaBinaryPacked(d, size, n, &v, &used));
  for (int64_t x : v) {
    if (t.physical == kInt32) {
      const int32_t y = static_cast<int32_t>(static_cast<uint32_t>(x));
      if (t.kind == ValueKind::kUInt32) out->emplace_back(static_cast<uint32_t>(y));
      else out->emplace_back(y);
    } else if (t.kind == ValueKind::kUInt64) {
      out->emplace_back(static_cast<uint64_t>(x));
    } else {
      out->emplace_back(x);
    }
  }
  return Status::Ok();
}

Status DecodeDeltaStrings(int encoding, const ValueType& t, const uint8_t* d, size_t size, size_t n, TextBudget* budget,
                          std::vector<json>* out) {
  if (t.physical != kByteArray && !(encoding == kDeltaByteArray && t.physical == kFixedLenByteArray))
    return InvalidArgument(EncodingName(encoding) + " for " + PhysicalTypeName(t.physical) + " is not supported");
  std::vector<int64_t> prefixes, lengths;
  size_t used = 0, used2 = 0;
  if (encoding == kDeltaByteArray) ECHELON_RETURN_IF_ERROR(DecodeDeltaBinaryPacked(d, size, n, &prefixes, &used));
  ECHELON_RETURN_IF_ERROR(DecodeDeltaBinaryPacked(d + used, size - used, n, &lengths, &used2));
  used += used2;
  return ConcatenatedStrings(t, d + used, size - used, lengths, encoding == kDeltaByteArray ? &prefixes : nullptr,
                             budget, out);
}

Status DecodeByteStreamSplit(const ValueType& t, const uint8_t* d, size_t size, size_t n, TextBudget* budget,
                             std::vector<json>* out) {
  const size_t w = FixedWidth(t);
  if (w == 0) return InvalidArgument("BYTE_STREAM_SPLIT for " + PhysicalTypeName(t.physical) + " is not supported");
  if (n > size / w) return DataLoss("BYTE_STREAM_SPLIT: " + Num(n) + " values of " + Num(w) + " bytes in " + Num(size));
  // The streams span the whole value section: its size says how many values it holds.
  const size_t stride = size / w;
  std::vector<uint8_t> one(w);
  for (size_t i = 0; i < n; ++i) {
    for (size_t b = 0; b < w; ++b) one[b] = d[b * stride + i];
    ECHELON_RETURN_IF_ERROR(AddFixed(t, one.data(), budget, out));
  }
  return Status::Ok();
}

}  // namespace

int BitWidth(uint64_t max_value) {
  int w = 0;
  while (max_value != 0) {
    ++w;
    max_value >>= 1;
  }
  return w;
}

Status RleDecoder::NextRun() {
  uint64_t header = 0;
  ECHELON_RETURN_IF_ERROR(ReadUleb(data_, size_, &pos_, &header, "RLE run header"));
  const uint64_t count = header >> 1;
  if (header & 1) {  // count groups of 8 bit-packed values
    packed_ = true;
    bit_ = static_cast<uint64_t>(pos_) * 8;
    if (bit_width_ == 0) {
      left_ = std::min<uint64_t>(count, uint64_t{1} << 40) * 8;
    } else {
      // The last run may be cut short of its groups; it gives what its bytes hold.
      const uint64_t avail = size_ - pos_;
      const uint64_t used = count > avail / bit_width_ ? avail : count * bit_width_;
      left_ = used * 8 / bit_width_;
      pos_ += used;
    }
    if (count > 0 && left_ == 0) return DataLoss("RLE bit-packed run at byte " + Num(pos_) + " is truncated");
    return Status::Ok();
  }
  packed_ = false;
  const size_t nbytes = (bit_width_ + 7) / 8;
  if (nbytes > size_ - pos_) return DataLoss("RLE run value at byte " + Num(pos_) + " runs past the end");
  uint64_t v = 0;
  for (size_t i = 0; i < nbytes; ++i) v |= static_cast<uint64_t>(data_[pos_ + i]) << (8 * i);
  pos_ += nbytes;
  if (bit_width_ < 32 && (v >> bit_width_) != 0)
    return DataLoss("RLE run value " + Num(v) + " does not fit in " + Num(bit_width_) + " bits");
  value_ = static_cast<uint32_t>(v);
  left_ = count;
  return Status::Ok();
}

Status RleDecoder::Decode(size_t n, uint32_t* out) {
  if (bit_width_ < 0 || bit_width_ > 32) return DataLoss("RLE bit width " + Num(bit_width_) + " is over 32");
  size_t i = 0;
  while (i < n) {
    if (left_ == 0) {
      if (pos_ >= size_) return DataLoss("RLE data ends after " + Num(i) + " of " + Num(n) + " values");
      ECHELON_RETURN_IF_ERROR(NextRun());
      continue;
    }
    const size_t take = static_cast<size_t>(std::min<uint64_t>(left_, n - i));
    if (!packed_) {
      std::fill(out + i, out + i + take, value_);
    } else {
      for (size_t k = 0; k < take; ++k, bit_ += bit_width_)
        out[i + k] = static_cast<uint32_t>(ReadBits(data_, size_, bit_, bit_width_));
    }
    left_ -= take;
    i += take;
  }
  return Status::Ok();
}

Status DecodeLevels(const uint8_t* data, size_t size, int max_level, size_t n, std::vector<uint8_t>* out) {
  RleDecoder rle(data, size, BitWidth(static_cast<uint64_t>(max_level)));
  std::vector<uint32_t> buf;
  for (size_t done = 0; done < n;) {
    const size_t k = std::min<size_t>(n - done, 4096);
    buf.resize(k);
    ECHELON_RETURN_IF_ERROR(rle.Decode(k, buf.data()));
    for (uint32_t v : buf) {
      if (v > static_cast<uint32_t>(max_level))
        return DataLoss("level " + Num(v) + " is above the column's maximum " + Num(max_level));
      out->push_back(static_cast<uint8_t>(v));
    }
    done += k;
  }
  return Status::Ok();
}

Status DecodeDeltaBinaryPacked(const uint8_t* d, size_t size, size_t n, std::vector<int64_t>* out, size_t* consumed) {
  size_t pos = 0;
  uint64_t block = 0, miniblocks = 0, total = 0, zz = 0;
  ECHELON_RETURN_IF_ERROR(ReadUleb(d, size, &pos, &block, "DELTA_BINARY_PACKED header"));
  ECHELON_RETURN_IF_ERROR(ReadUleb(d, size, &pos, &miniblocks, "DELTA_BINARY_PACKED header"));
  ECHELON_RETURN_IF_ERROR(ReadUleb(d, size, &pos, &total, "DELTA_BINARY_PACKED header"));
  ECHELON_RETURN_IF_ERROR(ReadUleb(d, size, &pos, &zz, "DELTA_BINARY_PACKED header"));
  if (block == 0 || block % 128 != 0 || block > (1u << 20) || miniblocks == 0 || block % miniblocks != 0 ||
      (block / miniblocks) % 32 != 0)
    return DataLoss("DELTA_BINARY_PACKED header: block of " + Num(block) + " values in " + Num(miniblocks) +
                    " miniblocks is malformed");
  if (total != n) return DataLoss("DELTA_BINARY_PACKED header says " + Num(total) + " values, the page has " + Num(n));
  const uint64_t per_miniblock = block / miniblocks;
  uint64_t last = (zz >> 1) ^ (~(zz & 1) + 1);
  out->reserve(out->size() + n);
  if (n > 0) out->push_back(static_cast<int64_t>(last));
  uint64_t left = n > 0 ? n - 1 : 0;
  while (left > 0) {
    uint64_t min_zz = 0;
    ECHELON_RETURN_IF_ERROR(ReadUleb(d, size, &pos, &min_zz, "DELTA_BINARY_PACKED block"));
    const uint64_t min_delta = (min_zz >> 1) ^ (~(min_zz & 1) + 1);
    if (miniblocks > size - pos) return DataLoss("DELTA_BINARY_PACKED bit widths run past the page");
    const uint8_t* widths = d + pos;
    pos += miniblocks;
    for (uint64_t m = 0; m < miniblocks && left > 0; ++m) {
      const int w = widths[m];
      if (w > 64) return DataLoss("DELTA_BINARY_PACKED miniblock of " + Num(w) + " bits");
      const uint64_t bytes = per_miniblock * w / 8;
      if (bytes > size - pos) return DataLoss("DELTA_BINARY_PACKED miniblock runs past the page");
      const uint64_t take = std::min(per_miniblock, left);
      for (uint64_t j = 0; j < take; ++j) {
        last += min_delta + ReadBits(d + pos, bytes, j * w, w);  // wraps, as the format intends
        out->push_back(static_cast<int64_t>(last));
      }
      pos += bytes;
      left -= take;
    }
  }
  *consumed = pos;
  return Status::Ok();
}

Status DecodeValues(int encoding, const ValueType& type, const uint8_t* data, size_t size, size_t n,
                    const std::vector<json>* dict, TextBudget* budget, std::vector<json>* out) {
  switch (encoding) {
    case kPlain: return DecodePlain(type, data, size, n, budget, out);
    case kPlainDictionary:
    case kRleDictionary:
      if (dict == nullptr) return DataLoss("a dictionary-encoded page, but the column chunk has no dictionary page");
      return DecodeDictionaryIndices(data, size, n, *dict, budget, out);
    case kRle: {
      if (type.physical != kBoolean) return InvalidArgument("RLE values of " + PhysicalTypeName(type.physical) + " are not supported");
      if (size < 4) return DataLoss("RLE booleans: the length prefix runs past the page");
      const uint32_t len = LoadU32(data);
      if (len > size - 4) return DataLoss("RLE booleans: " + Num(len) + " bytes run past the page");
      RleDecoder rle(data + 4, len, 1);
      std::vector<uint32_t> bits(std::min<size_t>(n, 4096));
      for (size_t done = 0; done < n;) {
        const size_t k = std::min<size_t>(n - done, bits.size());
        ECHELON_RETURN_IF_ERROR(rle.Decode(k, bits.data()));
        for (size_t i = 0; i < k; ++i) out->emplace_back(bits[i] != 0);
        done += k;
      }
      return Status::Ok();
    }
    case kDeltaBinaryPacked: return DecodeDeltaInts(type, data, size, n, out);
    case kDeltaLengthByteArray:
    case kDeltaByteArray: return DecodeDeltaStrings(encoding, type, data, size, n, budget, out);
    case kByteStreamSplit: return DecodeByteStreamSplit(type, data, size, n, budget, out);
    default: return InvalidArgument("encoding " + EncodingName(encoding) + " is not supported");
  }
}

}  // namespace echelon::data::parquet
