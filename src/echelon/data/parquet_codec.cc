#include "echelon/data/parquet_codec.h"

#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <cstring>

#include "echelon/data/parquet_thrift.h"

namespace echelon::data::parquet {
namespace {

std::string Num(uint64_t v) { return std::to_string(v); }

Status SizeMismatch(const char* codec, uint64_t got, size_t expected) {
  return DataLoss(std::string(codec) + " data decompresses to " + Num(got) + " bytes, the page header says " +
                  Num(expected));
}

// Copies `length` bytes from `offset` back in out[0, *op) to *op; the ranges may overlap
// (offset < length repeats a pattern), so byte by byte there.
Status BackReference(const char* codec, std::string* out, size_t* op, size_t offset, size_t length) {
  if (offset == 0 || offset > *op)
    return DataLoss(std::string(codec) + " copy at output byte " + Num(*op) + " reaches back " + Num(offset) +
                    " bytes, before the start");
  if (length > out->size() - *op)
    return DataLoss(std::string(codec) + " copy of " + Num(length) + " bytes at output byte " + Num(*op) +
                    " runs past the " + Num(out->size()) + " bytes the page header says");
  char* dst = out->data() + *op;
  const char* src = dst - offset;
  if (offset >= length) {
    std::memcpy(dst, src, length);
  } else {
    for (size_t i = 0; i < length; ++i) dst[i] = src[i];
  }
  *op += length;
  return Status::Ok();
}

Status Literal(const char* codec, const uint8_t* in, size_t size, size_t* ip, std::string* out, size_t* op,
               size_t length) {
  if (length > size - *ip)
    return DataLoss(std::string(codec) + " literal of " + Num(length) + " bytes at input byte " + Num(*ip) +
                    " runs past the end of the " + Num(size) + "-byte page");
  if (length > out->size() - *op)
    return DataLoss(std::string(codec) + " literal of " + Num(length) + " bytes at output byte " + Num(*op) +
                    " runs past the " + Num(out->size()) + " bytes the page header says");
  std::memcpy(out->data() + *op, in + *ip, length);
  *ip += length;
  *op += length;
  return Status::Ok();
}

Status ZstdUncompress(const uint8_t* in, size_t size, size_t expected, std::string* out) {
  out->resize(expected);
  if (size == 0 && expected == 0) return Status::Ok();
  const size_t n = ZSTD_decompress(out->data(), expected, in, size);
  if (ZSTD_isError(n)) {
    if (ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall)
      return DataLoss("ZSTD data decompresses past the " + Num(expected) + " bytes the page header says");
    return DataLoss(std::string("ZSTD data is corrupt: ") + ZSTD_getErrorName(n));
  }
  if (n != expected) return SizeMismatch("ZSTD", n, expected);
  return Status::Ok();
}

// gzip (and zlib) members, one after another; one spare output byte shows a stream that is
// longer than the header says.
Status GzipUncompress(const uint8_t* in, size_t size, size_t expected, std::string* out) {
  out->resize(expected + 1);
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) return Internal("zlib inflateInit2 failed");
  zs.next_in = const_cast<Bytef*>(in);
  zs.avail_in = static_cast<uInt>(size);
  zs.next_out = reinterpret_cast<Bytef*>(out->data());
  zs.avail_out = static_cast<uInt>(expected + 1);
  Status st;
  for (;;) {
    const int rc = inflate(&zs, Z_FINISH);
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0 || zs.avail_out == 0) break;
      if (inflateReset(&zs) != Z_OK) {
        st = Internal("zlib inflateReset failed");
        break;
      }
      continue;
    }
    if (rc == Z_BUF_ERROR && zs.avail_out == 0) break;  // too long: reported below
    st = DataLoss(std::string("GZIP data is corrupt: ") + (zs.msg ? zs.msg : "truncated stream"));
    break;
  }
  const size_t produced = expected + 1 - zs.avail_out;
  inflateEnd(&zs);
  ECHELON_RETURN_IF_ERROR(st);
  if (produced != expected) {
    if (produced > expected) return DataLoss("GZIP data decompresses past the " + Num(expected) + " bytes the page header says");
    return SizeMismatch("GZIP", produced, expected);
  }
  out->resize(expected);
  return Status::Ok();
}

}  // namespace

Status SnappyUncompress(const uint8_t* in, size_t size, size_t expected, std::string* out) {
  size_t ip = 0;
  uint64_t length = 0;
  for (int shift = 0;; shift += 7) {
    if (ip >= size || shift > 28) return DataLoss("Snappy length preamble is truncated or too long");
    const uint8_t b = in[ip++];
    length |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) break;
  }
  if (length != expected) return SizeMismatch("Snappy", length, expected);
  out->assign(expected, '\0');
  size_t op = 0;
  while (ip < size) {
    const uint8_t tag = in[ip++];
    const int kind = tag & 3;
    if (kind == 0) {  // literal: length-1 in the tag, or in the 1-4 bytes after it
      size_t len = tag >> 2;
      if (len >= 60) {
        const size_t extra = len - 59;
        if (extra > size - ip) return DataLoss("Snappy literal length at input byte " + Num(ip) + " is truncated");
        len = 0;
        for (size_t i = 0; i < extra; ++i) len |= static_cast<size_t>(in[ip + i]) << (8 * i);
        ip += extra;
      }
      ECHELON_RETURN_IF_ERROR(Literal("Snappy", in, size, &ip, out, &op, len + 1));
      continue;
    }
    size_t len = 0, offset = 0;
    const size_t extra = kind == 1 ? 1 : kind == 2 ? 2 : 4;
    if (extra > size - ip) return DataLoss("Snappy copy at input byte " + Num(ip) + " is truncated");
    for (size_t i = 0; i < extra; ++i) offset |= static_cast<size_t>(in[ip + i]) << (8 * i);
    ip += extra;
    if (kind == 1) {
      len = 4 + ((tag >> 2) & 7);
      offset |= static_cast<size_t>(tag >> 5) << 8;
    } else {
      len = 1 + (tag >> 2);
    }
    ECHELON_RETURN_IF_ERROR(BackReference("Snappy", out, &op, offset, len));
  }
  if (op != expected) return SizeMismatch("Snappy", op, expected);
  return Status::Ok();
}

Status Lz4RawUncompress(const uint8_t* in, size_t size, size_t expected, std::string* out) {
  out->assign(expected, '\0');
  size_t ip = 0, op = 0;
  // A length nibble of 15 continues in bytes of 255; capped so that a run of 255s stops.
  auto extend = [&](size_t* len) -> Status {
    for (;;) {
      if (ip >= size) return DataLoss("LZ4 length at input byte " + Num(ip) + " is truncated");
      const uint8_t b = in[ip++];
      *len += b;
      if (*len > expected + size) return DataLoss("LZ4 length at input byte " + Num(ip) + " is larger than the page");
      if (b != 255) return Status::Ok();
    }
  };
  while (ip < size) {
    const uint8_t token = in[ip++];
    size_t lit = token >> 4;
    if (lit == 15) ECHELON_RETURN_IF_ERROR(extend(&lit));
    ECHELON_RETURN_IF_ERROR(Literal("LZ4", in, size, &ip, out, &op, lit));
    if (ip == size) break;  // the last sequence has literals only
    if (size - ip < 2) return DataLoss("LZ4 match offset at input byte " + Num(ip) + " is truncated");
    const size_t offset = in[ip] | (static_cast<size_t>(in[ip + 1]) << 8);
    ip += 2;
    size_t len = token & 15;
    if (len == 15) ECHELON_RETURN_IF_ERROR(extend(&len));
    ECHELON_RETURN_IF_ERROR(BackReference("LZ4", out, &op, offset, len + 4));
  }
  if (op != expected) return SizeMismatch("LZ4", op, expected);
  return Status::Ok();
}

bool CodecSupported(int codec) {
  return codec == kUncompressed || codec == kSnappy || codec == kGzip || codec == kZstd || codec == kLz4Raw;
}

Status Decompress(int codec, const uint8_t* in, size_t size, size_t expected, std::string* out) {
  switch (codec) {
    case kUncompressed:
      if (size != expected) return SizeMismatch("UNCOMPRESSED", size, expected);
      out->assign(reinterpret_cast<const char*>(in), size);
      return Status::Ok();
    case kSnappy: return SnappyUncompress(in, size, expected, out);
    case kGzip: return GzipUncompress(in, size, expected, out);
    case kZstd: return ZstdUncompress(in, size, expected, out);
    case kLz4Raw: return Lz4RawUncompress(in, size, expected, out);
    default:
      return InvalidArgument("codec " + CodecName(codec) + " is not supported; rewrite the file with snappy or zstd");
  }
}

}  // namespace echelon::data::parquet
