#include "echelon/data/parquet_column.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "echelon/data/parquet_codec.h"

namespace echelon::data::parquet {
namespace {

using nlohmann::json;

std::string Num(uint64_t v) { return std::to_string(v); }

// A page's bytes after decompression: either the file's own bytes (UNCOMPRESSED) or `owned`.
struct PageBytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::string owned;
};

Status Uncompress(int codec, const uint8_t* in, size_t size, size_t expected, PageBytes* out) {
  if (codec == kUncompressed) {
    if (size != expected)
      return DataLoss("UNCOMPRESSED page has " + Num(size) + " bytes, the page header says " + Num(expected));
    out->data = in;
    out->size = size;
    return Status::Ok();
  }
  ECHELON_RETURN_IF_ERROR(Decompress(codec, in, size, expected, &out->owned));
  out->data = reinterpret_cast<const uint8_t*>(out->owned.data());
  out->size = out->owned.size();
  return Status::Ok();
}

// V1 levels: a 4-byte length, then the RLE hybrid. *pos moves past them.
Status LevelsV1(int encoding, const PageBytes& page, size_t* pos, int max_level, size_t n, const char* which,
                std::vector<uint8_t>* out) {
  if (encoding != kRle)
    return InvalidArgument(std::string(which) + " levels in encoding " + EncodingName(encoding) + " are not supported");
  if (page.size - *pos < 4) return DataLoss(std::string(which) + " levels: the length runs past the page");
  uint32_t len = 0;
  std::memcpy(&len, page.data + *pos, 4);
  *pos += 4;
  if (len > page.size - *pos)
    return DataLoss(std::string(which) + " levels of " + Num(len) + " bytes run past the page");
  Status st = DecodeLevels(page.data + *pos, len, max_level, n, out);
  if (!st.ok()) return st.WithContext(std::string(which) + " levels");
  *pos += len;
  return Status::Ok();
}

class ChunkReader {
 public:
  ChunkReader(const ChunkInput& in, ColumnData* out) : in_(in), meta_(*in.meta), leaf_(*in.leaf), out_(out) {}

  Status Page(const PageHeader& h, const uint8_t* body) {
    switch (h.type) {
      case kDictionaryPage: return Dictionary(h, body);
      case kDataPage:
      case kDataPageV2: return Data(h, body);
      default: return Status::Ok();  // index pages and kinds from the future carry no rows
    }
  }

  int64_t values_seen() const { return values_seen_; }

 private:
  Status Dictionary(const PageHeader& h, const uint8_t* body) {
    if (!h.has_page_kind) return DataLoss("dictionary page without its DictionaryPageHeader");
    if (has_dict_) return DataLoss("a second dictionary page");
    if (values_seen_ > 0) return DataLoss("a dictionary page after data pages");
    if (h.encoding != kPlain && h.encoding != kPlainDictionary)
      return InvalidArgument("dictionary page in encoding " + EncodingName(h.encoding) + " is not supported");
    if (h.num_values < 0) return DataLoss("dictionary page of " + std::to_string(h.num_values) + " values");
    PageBytes page;
    ECHELON_RETURN_IF_ERROR(Uncompress(meta_.codec, body, h.compressed_page_size, h.uncompressed_page_size, &page));
    ECHELON_RETURN_IF_ERROR(DecodeValues(kPlain, leaf_.type, page.data, page.size, h.num_values, nullptr, in_.text, &dict_));
    has_dict_ = true;
    return Status::Ok();
  }

  Status Data(const PageHeader& h, const uint8_t* body) {
    if (!h.has_page_kind) return DataLoss("data page without its DataPageHeader");
    if (h.num_values < 0) return DataLoss("data page of " + std::to_string(h.num_values) + " values");
    const uint64_t n = static_cast<uint64_t>(h.num_values);
    if (n > static_cast<uint64_t>(meta_.num_values - values_seen_))
      return DataLoss("the pages hold more than the column chunk's " + Num(meta_.num_values) + " values");
    if (n > *in_.values_left)
      return FailedPrecondition("the file holds more than " + Num(in_.values_budget) +
                                " values and nulls, the reader's limit for its size");
    *in_.values_left -= n;
    const size_t before = out_->def.size();
    PageBytes page;  // the page's value section is page.data[vpos, page.size)
    size_t vpos = 0;
    if (h.type == kDataPage) {
      ECHELON_RETURN_IF_ERROR(Uncompress(meta_.codec, body, h.compressed_page_size, h.uncompressed_page_size, &page));
      if (leaf_.max_rep > 0)
        ECHELON_RETURN_IF_ERROR(LevelsV1(h.repetition_level_encoding, page, &vpos, leaf_.max_rep, n, "repetition", &out_->rep));
      if (leaf_.max_def > 0)
        ECHELON_RETURN_IF_ERROR(LevelsV1(h.definition_level_encoding, page, &vpos, leaf_.max_def, n, "definition", &out_->def));
    } else {
      // v2: the levels stand uncompressed before the (maybe compressed) values.
      const int64_t rl = h.repetition_levels_byte_length, dl = h.definition_levels_byte_length;
      if (rl < 0 || dl < 0 || rl + dl > h.compressed_page_size || rl + dl > h.uncompressed_page_size)
        return DataLoss("levels of " + std::to_string(rl) + " + " + std::to_string(dl) + " bytes do not fit the page");
      if (leaf_.max_rep > 0) {
        Status st = DecodeLevels(body, rl, leaf_.max_rep, n, &out_->rep);
        if (!st.ok()) return st.WithContext("repetition levels");
      }
      if (leaf_.max_def > 0) {
        Status st = DecodeLevels(body + rl, dl, leaf_.max_def, n, &out_->def);
        if (!st.ok()) return st.WithContext("definition levels");
      }
      const int codec = h.is_compressed ? meta_.codec : kUncompressed;
      ECHELON_RETURN_IF_ERROR(Uncompress(codec, body + rl + dl, h.compressed_page_size - rl - dl,
                                         h.uncompressed_page_size - rl - dl, &page));
    }
    if (leaf_.max_rep == 0) out_->rep.resize(before + n, 0);
    if (leaf_.max_def == 0) out_->def.resize(before + n, 0);
    size_t non_null = 0;
    for (size_t i = before; i < out_->def.size(); ++i) non_null += out_->def[i] == leaf_.max_def;
    Status st = DecodeValues(h.encoding, leaf_.type, page.data + vpos, page.size - vpos, non_null, has_dict_ ? &dict_ : nullptr,
                             in_.text, &out_->values);
    if (!st.ok()) return st.WithContext(EncodingName(h.encoding) + " values");
    values_seen_ += static_cast<int64_t>(n);
    return Status::Ok();
  }

  const ChunkInput& in_;
  const ColumnMetaData& meta_;
  const LeafColumn& leaf_;
  ColumnData* out_;
  std::vector<json> dict_;
  bool has_dict_ = false;
  int64_t values_seen_ = 0;
};

}  // namespace

Status ReadColumnChunk(const ChunkInput& in, ColumnData* out, int* page) {
  const ColumnMetaData& meta = *in.meta;
  *page = -1;
  uint64_t start = static_cast<uint64_t>(meta.data_page_offset);
  // Some writers store 0 for "no dictionary"; a dictionary page precedes the data pages.
  if (meta.dictionary_page_offset && *meta.dictionary_page_offset > 0 &&
      static_cast<uint64_t>(*meta.dictionary_page_offset) < start)
    start = static_cast<uint64_t>(*meta.dictionary_page_offset);
  const uint64_t size = static_cast<uint64_t>(meta.total_compressed_size);
  if (start < 4 || start > in.data_end || size > in.data_end - start)
    return DataLoss("column chunk at bytes " + Num(start) + ".." + Num(start + size) +
                    " lies outside the file's data (bytes 4.." + Num(in.data_end) + ")");
  if (meta.num_values > 0 && static_cast<uint64_t>(meta.num_values) > in.values_budget)
    return FailedPrecondition("column chunk of " + Num(meta.num_values) + " values is over the reader's limit of " +
                              Num(in.values_budget) + " for a file of this size");
  ChunkReader reader(in, out);
  uint64_t pos = start;
  const uint64_t end = start + size;
  for (int p = 0; reader.values_seen() < meta.num_values; ++p) {
    *page = p;
    if (pos >= end)
      return DataLoss("the column chunk ends after " + Num(reader.values_seen()) + " of its " + Num(meta.num_values) +
                      " values");
    CompactReader r(in.file + pos, end - pos);
    PageHeader h;
    Status st = ParsePageHeader(&r, &h);
    if (!st.ok()) return st.WithContext("corrupt page header");
    pos += r.pos();
    if (static_cast<uint64_t>(h.compressed_page_size) > end - pos)
      return DataLoss("page of " + Num(h.compressed_page_size) + " bytes runs past the column chunk's end (" +
                      Num(end - pos) + " bytes left)");
    if (static_cast<uint64_t>(h.uncompressed_page_size) > in.limits->max_page_bytes ||
        static_cast<uint64_t>(h.compressed_page_size) > in.limits->max_page_bytes)
      return FailedPrecondition("page of " + Num(h.uncompressed_page_size) + " bytes is over the reader's limit of " +
                                Num(in.limits->max_page_bytes));
    const uint8_t* body = in.file + pos;
    if (h.crc) {
      const uint32_t got = static_cast<uint32_t>(crc32(0L, body, static_cast<uInt>(h.compressed_page_size)));
      if (got != static_cast<uint32_t>(*h.crc)) return DataLoss("page checksum (CRC32) does not match its bytes");
    }
    ECHELON_RETURN_IF_ERROR(reader.Page(h, body));
    pos += static_cast<uint64_t>(h.compressed_page_size);
  }
  *page = -1;
  if (out->values.size() != static_cast<size_t>(std::count(out->def.begin(), out->def.end(), in.leaf->max_def)))
    return Internal("values and definition levels disagree");
  const uint64_t rows = in.leaf->max_rep == 0 ? out->rep.size()
                                              : static_cast<uint64_t>(std::count(out->rep.begin(), out->rep.end(), 0));
  if (rows != static_cast<uint64_t>(in.num_rows))
    return DataLoss("the column chunk holds " + Num(rows) + " rows, the row group " + Num(in.num_rows));
  if (!out->rep.empty() && out->rep[0] != 0) return DataLoss("the column chunk starts inside a row");
  return Status::Ok();
}

}  // namespace echelon::data::parquet
