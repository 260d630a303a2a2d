// Page decompression for the Parquet reader (src/echelon/data/parquet.h): Snappy's and LZ4's
// raw block formats decoded here (each is a page of code; no library in Debian 12 is worth
// a dependency for them), ZSTD through libzstd, GZIP through zlib. The page header says how
// many bytes a page holds uncompressed; every decoder writes into a buffer of exactly that
// size (the caller caps it) and refuses a stream that would write past it or stops short,
// so a corrupt or hostile page is one error and never a large or unbounded allocation.
//
//   std::string page;
//   Status st = Decompress(kSnappy, data, size, header.uncompressed_page_size, &page);
//   // "Snappy copy at output byte 12 reaches back 70000 bytes, before the start"
//
// Thread contract: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "echelon/common/status.h"

namespace echelon::data::parquet {

// Snappy's block format (a varint length, then literals and back-references), as Parquet's
// SNAPPY codec stores it (no framing). `expected`: the size the page header gives.
Status SnappyUncompress(const uint8_t* in, size_t size, size_t expected, std::string* out);

// LZ4's block format, Parquet's LZ4_RAW codec.
Status Lz4RawUncompress(const uint8_t* in, size_t size, size_t expected, std::string* out);

// Whether Decompress() handles `codec` (a Codec from parquet_thrift.h).
bool CodecSupported(int codec);

// `in` compressed with `codec`, into exactly `expected` bytes in *out.
Status Decompress(int codec, const uint8_t* in, size_t size, size_t expected, std::string* out);

}  // namespace echelon::data::parquet
