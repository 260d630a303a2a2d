#include "echelon/data/parquet_thrift.h"

#include <cstring>

namespace echelon::data::parquet {
namespace {

const char* WireTypeName(uint8_t type) {
  static const char* const kNames[] = {"stop", "bool", "bool", "byte", "i16", "i32", "i64",
                                       "double", "binary", "list", "set", "map", "struct"};
  return type <= kCtStruct ? kNames[type] : "unknown";
}

// Reads the fields of one struct up to its stop byte, calling on_field(id, type) for each;
// on_field reads the field's value or skips it.
template <typename F>
Status ReadStruct(CompactReader* r, int depth, F on_field) {
  if (depth > kMaxThriftDepth) return r->Error("structs nested deeper than " + std::to_string(kMaxThriftDepth));
  int16_t last = 0;
  for (;;) {
    int16_t id = 0;
    uint8_t type = 0;
    ECHELON_RETURN_IF_ERROR(r->ReadFieldHeader(last, &id, &type));
    if (type == kCtStop) return Status::Ok();
    ECHELON_RETURN_IF_ERROR(on_field(id, type));
    last = id;
  }
}

Status WrongType(CompactReader* r, const char* field, uint8_t type) {
  return r->Error(std::string("field ") + field + " has wire type " + WireTypeName(type));
}

Status FieldI32(CompactReader* r, uint8_t type, const char* field, int32_t* out) {
  if (type != kCtI32) return WrongType(r, field, type);
  return r->ReadI32(out);
}

Status FieldInt(CompactReader* r, uint8_t type, const char* field, int* out) {
  int32_t v = 0;
  ECHELON_RETURN_IF_ERROR(FieldI32(r, type, field, &v));
  *out = v;
  return Status::Ok();
}

Status FieldI64(CompactReader* r, uint8_t type, const char* field, int64_t* out) {
  if (type != kCtI64) return WrongType(r, field, type);
  return r->ReadI64(out);
}

Status FieldBool(CompactReader* r, uint8_t type, const char* field, bool* out) {
  if (type != kCtBoolTrue && type != kCtBoolFalse) return WrongType(r, field, type);
  *out = type == kCtBoolTrue;
  return Status::Ok();
}

Status FieldString(CompactReader* r, uint8_t type, const char* field, std::string* out) {
  if (type != kCtBinary) return WrongType(r, field, type);
  return r->ReadBinary(out);
}

// A list field: each element is read by on_elem (which is told nothing: the element type
// was checked to be `elem_type`).
template <typename F>
Status FieldList(CompactReader* r, uint8_t type, const char* field, uint8_t elem_type, F on_elem) {
  if (type != kCtList) return WrongType(r, field, type);
  uint8_t got = 0;
  uint32_t count = 0;
  ECHELON_RETURN_IF_ERROR(r->ReadListHeader(&got, &count));
  if (count > 0 && got != elem_type)
    return r->Error(std::string("list ") + field + " holds " + WireTypeName(got) + ", not " + WireTypeName(elem_type));
  for (uint32_t i = 0; i < count; ++i) ECHELON_RETURN_IF_ERROR(on_elem());
  return Status::Ok();
}

Status ParseLogicalType(CompactReader* r, int depth, LogicalType* out) {
  return ReadStruct(r, depth, [&](int16_t id, uint8_t type) -> Status {
    if (type != kCtStruct) return r->Skip(type, depth + 1);
    out->kind = id;  // a union: the member's number says which
    if (id != kLtInteger) return r->Skip(type, depth + 1);
    return ReadStruct(r, depth + 1, [&](int16_t fid, uint8_t ftype) -> Status {
      if (fid == 1) {
        if (ftype != kCtByte) return WrongType(r, "IntType.bitWidth", ftype);
        uint8_t b = 0;
        ECHELON_RETURN_IF_ERROR(r->ReadByte(&b));
        out->bit_width = static_cast<int8_t>(b);
        return Status::Ok();
      }
      if (fid == 2) return FieldBool(r, ftype, "IntType.isSigned", &out->is_signed);
      return r->Skip(ftype, depth + 2);
    });
  });
}

Status ParseSchemaElement(CompactReader* r, int depth, SchemaElement* out) {
  return ReadStruct(r, depth, [&](int16_t id, uint8_t type) -> Status {
    int v = 0;
    switch (id) {
      case 1: ECHELON_RETURN_IF_ERROR(FieldInt(r, type, "SchemaElement.type", &v)); out->type = v; return Status::Ok();
      case 2: return FieldInt(r, type, "SchemaElement.type_length", &out->type_length);
      case 3:
        ECHELON_RETURN_IF_ERROR(FieldInt(r, type, "SchemaElement.repetition_type", &v));
        out->repetition = v;
        return Status::Ok();
      case 4: return FieldString(r, type, "SchemaElement.name", &out->name);
      case 5:
        ECHELON_RETURN_IF_ERROR(FieldInt(r, type, "SchemaElement.num_children", &v));
        out->num_children = v;
        return Status::Ok();
      case 6:
        ECHELON_RETURN_IF_ERROR(FieldInt(r, type, "SchemaElement.converted_type", &v));
        out->converted_type = v;
        return Status::Ok();
      case 10:
        if (type != kCtStruct) return WrongType(r, "SchemaElement.logicalType", type);
        return ParseLogicalType(r, depth + 1, &out->logical);
      default: return r->Skip(type, depth + 1);
    }
  });
}

Status ParseColumnMetaData(CompactReader* r, int depth, ColumnMetaData* out) {
  return ReadStruct(r, depth, [&](int16_t id, uint8_t type) -> Status {
    switch (id) {
      case 1: return FieldInt(r, type, "ColumnMetaData.type", &out->type);
      case 3:
        return FieldList(r, type, "ColumnMetaData.path_in_schema", kCtBinary, [&]() -> Status {
          out->path_in_schema.emplace_back();
          return r->ReadBinary(&out->path_in_schema.back());
        });
      case 4: return FieldInt(r, type, "ColumnMetaData.codec", &out->codec);
      case 5: return FieldI64(r, type, "ColumnMetaData.num_values", &out->num_values);
      case 7: return FieldI64(r, type, "ColumnMetaData.total_compressed_size", &out->total_compressed_size);
      case 9: return FieldI64(r, type, "ColumnMetaData.data_page_offset", &out->data_page_offset);
      case 11: {
        int64_t v = 0;
        ECHELON_RETURN_IF_ERROR(FieldI64(r, type, "ColumnMetaData.dictionary_page_offset", &v));
        out->dictionary_page_offset = v;
        return Status::Ok();
      }
      default: return r->Skip(type, depth + 1);
    }
  });
}

Status ParseColumnChunk(CompactReader* r, int depth, ColumnChunk* out) {
  return ReadStruct(r, depth, [&](int16_t id, uint8_t type) -> Status {
    switch (id) {
      case 1: out->file_path.emplace(); return FieldString(r, type, "ColumnChunk.file_path", &*out->file_path);
      case 3:
        if (type != kCtStruct) return WrongType(r, "ColumnChunk.meta_data", type);
        out->meta_data.emplace();
        return ParseColumnMetaData(r, depth + 1, &*out->meta_data);
      case 8:
      case 9: out->encrypted = true; return r->Skip(type, depth + 1);
      default: return r->Skip(type, depth + 1);
    }
  });
}

Status ParseRowGroup(CompactReader* r, int depth, RowGroup* out) {
  return ReadStruct(r, depth, [&](int16_t id, uint8_t type) -> Status {
    switch (id) {
      case 1:
        return FieldList(r, type, "RowGroup.columns", kCtStruct, [&]() -> Status {
          out->columns.emplace_back();
          return ParseColumnChunk(r, depth + 1, &out->columns.back());
        });
      case 3: return FieldI64(r, type, "RowGroup.num_rows", &out->num_rows);
      default: return r->Skip(type, depth + 1);
    }
  });
}

// DataPageHeader, DictionaryPageHeader and DataPageHeaderV2 into one PageHeader.
Status ParsePageKind(CompactReader* r, int depth, int kind, PageHeader* out) {
  out->has_page_kind = true;
  return ReadStruct(r, depth, [&](int16_t id, uint8_t type) -> Status {
    if (id == 1) return FieldI32(r, type, "num_values", &out->num_values);
    if (kind == kDataPage) {
      if (id == 2) return FieldInt(r, type, "DataPageHeader.encoding", &out->encoding);
      if (id == 3) return FieldInt(r, type, "DataPageHeader.definition_level_encoding", &out->definition_level_encoding);
      if (id == 4) return FieldInt(r, type, "DataPageHeader.repetition_level_encoding", &out->repetition_level_encoding);
    } else if (kind == kDictionaryPage) {
      if (id == 2) return FieldInt(r, type, "DictionaryPageHeader.encoding", &out->encoding);
    } else {
      if (id == 2) return FieldI32(r, type, "DataPageHeaderV2.num_nulls", &out->num_nulls);
      if (id == 4) return FieldInt(r, type, "DataPageHeaderV2.encoding", &out->encoding);
      if (id == 5)
        return FieldI32(r, type, "DataPageHeaderV2.definition_levels_byte_length", &out->definition_levels_byte_length);
      if (id == 6)
        return FieldI32(r, type, "DataPageHeaderV2.repetition_levels_byte_length", &out->repetition_levels_byte_length);
      if (id == 7) return FieldBool(r, type, "DataPageHeaderV2.is_compressed", &out->is_compressed);
    }
    return r->Skip(type, depth + 1);
  });
}

}  // namespace

Status CompactReader::Error(const std::string& what) const {
  return DataLoss("Thrift " + what + " (byte " + std::to_string(pos_) + " of " + std::to_string(size_) + ")");
}

Status CompactReader::ReadByte(uint8_t* out) {
  if (pos_ >= size_) return Error("data ends early");
  *out = data_[pos_++];
  return Status::Ok();
}

Status CompactReader::ReadVarint(uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (pos_ >= size_) return Error("varint runs past the end");
    const uint8_t b = data_[pos_++];
    if (shift == 63 && (b & 0x7e) != 0) return Error("varint overflows 64 bits");
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      return Status::Ok();
    }
  }
  return Error("varint longer than 10 bytes");
}

Status CompactReader::ReadI64(int64_t* out) {
  uint64_t v = 0;
  ECHELON_RETURN_IF_ERROR(ReadVarint(&v));
  *out = static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
  return Status::Ok();
}

Status CompactReader::ReadI32(int32_t* out) {
  int64_t v = 0;
  ECHELON_RETURN_IF_ERROR(ReadI64(&v));
  if (v < INT32_MIN || v > INT32_MAX) return Error("i32 out of range: " + std::to_string(v));
  *out = static_cast<int32_t>(v);
  return Status::Ok();
}

Status CompactReader::ReadI16(int16_t* out) {
  int64_t v = 0;
  ECHELON_RETURN_IF_ERROR(ReadI64(&v));
  if (v < INT16_MIN || v > INT16_MAX) return Error("i16 out of range: " + std::to_string(v));
  *out = static_cast<int16_t>(v);
  return Status::Ok();
}

Status CompactReader::ReadDouble(double* out) {
  if (remaining() < 8) return Error("double runs past the end");
  std::memcpy(out, data_ + pos_, 8);  // little-endian on the wire and on every target we build
  pos_ += 8;
  return Status::Ok();
}

Status CompactReader::ReadBinary(std::string* out) {
  uint64_t n = 0;
  ECHELON_RETURN_IF_ERROR(ReadVarint(&n));
  if (n > remaining()) return Error("string of " + std::to_string(n) + " bytes runs past the end");
  out->assign(reinterpret_cast<const char*>(data_ + pos_), n);
  pos_ += n;
  return Status::Ok();
}

Status CompactReader::ReadFieldHeader(int16_t last_id, int16_t* id, uint8_t* type) {
  uint8_t b = 0;
  ECHELON_RETURN_IF_ERROR(ReadByte(&b));
  *type = b & 0x0f;
  if (*type == kCtStop) {
    *id = 0;
    return Status::Ok();
  }
  if (*type > kCtStruct) return Error("unknown wire type " + std::to_string(*type));
  const int delta = b >> 4;
  if (delta != 0) {
    if (last_id > INT16_MAX - delta) return Error("field id overflows");
    *id = static_cast<int16_t>(last_id + delta);
    return Status::Ok();
  }
  return ReadI16(id);
}

Status CompactReader::ReadListHeader(uint8_t* elem_type, uint32_t* count) {
  uint8_t b = 0;
  ECHELON_RETURN_IF_ERROR(ReadByte(&b));
  *elem_type = b & 0x0f;
  uint64_t n = b >> 4;
  if (n == 15) ECHELON_RETURN_IF_ERROR(ReadVarint(&n));
  // Every element takes at least one byte, so a count above the bytes left is a lie that
  // would otherwise size an allocation or a loop.
  if (n > remaining()) return Error("list of " + std::to_string(n) + " elements in " + std::to_string(remaining()) + " bytes");
  if (n > 0 && (*elem_type == kCtStop || *elem_type > kCtStruct))
    return Error("list of unknown wire type " + std::to_string(*elem_type));
  *count = static_cast<uint32_t>(n);
  return Status::Ok();
}

Status CompactReader::Skip(uint8_t type, int depth, bool in_collection) {
  if (depth > kMaxThriftDepth) return Error("values nested deeper than " + std::to_string(kMaxThriftDepth));
  uint8_t b = 0;
  uint64_t v = 0;
  switch (type) {
    case kCtBoolTrue:
    case kCtBoolFalse:
      if (in_collection) return ReadByte(&b);
      return Status::Ok();
    case kCtByte: return ReadByte(&b);
    case kCtI16:
    case kCtI32:
    case kCtI64: return ReadVarint(&v);
    case kCtDouble:
      if (remaining() < 8) return Error("double runs past the end");
      pos_ += 8;
      return Status::Ok();
    case kCtBinary:
      ECHELON_RETURN_IF_ERROR(ReadVarint(&v));
      if (v > remaining()) return Error("string of " + std::to_string(v) + " bytes runs past the end");
      pos_ += v;
      return Status::Ok();
    case kCtList:
    case kCtSet: {
      uint8_t elem = 0;
      uint32_t count = 0;
      ECHELON_RETURN_IF_ERROR(ReadListHeader(&elem, &count));
      for (uint32_t i = 0; i < count; ++i) ECHELON_RETURN_IF_ERROR(Skip(elem, depth + 1, true));
      return Status::Ok();
    }
    case kCtMap: {
      ECHELON_RETURN_IF_ERROR(ReadVarint(&v));
      if (v == 0) return Status::Ok();
      if (v > remaining()) return Error("map of " + std::to_string(v) + " entries runs past the end");
      ECHELON_RETURN_IF_ERROR(ReadByte(&b));
      const uint8_t key = b >> 4, value = b & 0x0f;
      if (key == kCtStop || key > kCtStruct || value == kCtStop || value > kCtStruct)
        return Error("map of unknown wire types");
      for (uint64_t i = 0; i < v; ++i) {
        ECHELON_RETURN_IF_ERROR(Skip(key, depth + 1, true));
        ECHELON_RETURN_IF_ERROR(Skip(value, depth + 1, true));
      }
      return Status::Ok();
    }
    case kCtStruct:
      return ReadStruct(this, depth, [&](int16_t, uint8_t t) { return Skip(t, depth + 1); });
    default: return Error("cannot skip wire type " + std::to_string(type));
  }
}

std::string PhysicalTypeName(int type) {
  static const char* const kNames[] = {"BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE",
                                       "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
  return type >= 0 && type <= kFixedLenByteArray ? kNames[type] : "physical type " + std::to_string(type);
}

std::string EncodingName(int encoding) {
  static const char* const kNames[] = {"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED",
                                       "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
                                       "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  return encoding >= 0 && encoding <= kByteStreamSplit ? kNames[encoding] : "encoding " + std::to_string(encoding);
}

std::string CodecName(int codec) {
  static const char* const kNames[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
  return codec >= 0 && codec <= kLz4Raw ? kNames[codec] : "codec " + std::to_string(codec);
}

Status ParseFileMetaData(CompactReader* r, FileMetaData* out) {
  bool has_schema = false, has_row_groups = false;
  ECHELON_RETURN_IF_ERROR(ReadStruct(r, 0, [&](int16_t id, uint8_t type) -> Status {
    switch (id) {
      case 2:
        has_schema = true;
        return FieldList(r, type, "FileMetaData.schema", kCtStruct, [&]() -> Status {
          out->schema.emplace_back();
          return ParseSchemaElement(r, 1, &out->schema.back());
        });
      case 3: return FieldI64(r, type, "FileMetaData.num_rows", &out->num_rows);
      case 4:
        has_row_groups = true;
        return FieldList(r, type, "FileMetaData.row_groups", kCtStruct, [&]() -> Status {
          out->row_groups.emplace_back();
          return ParseRowGroup(r, 1, &out->row_groups.back());
        });
      case 8: out->encrypted = true; return r->Skip(type, 1);
      default: return r->Skip(type, 1);
    }
  }));
  if (!has_schema || out->schema.empty()) return r->Error("FileMetaData has no schema");
  if (!has_row_groups) return r->Error("FileMetaData has no row_groups");
  if (out->num_rows < 0) return r->Error("FileMetaData has no num_rows");
  for (const RowGroup& rg : out->row_groups) {
    if (rg.num_rows < 0) return r->Error("a RowGroup has no num_rows");
    for (const ColumnChunk& c : rg.columns) {
      if (c.encrypted || !c.meta_data) continue;  // refused by the reader with the column named
      const ColumnMetaData& m = *c.meta_data;
      if (m.type < 0 || m.codec < 0 || m.num_values < 0 || m.total_compressed_size < 0 || m.data_page_offset < 0)
        return r->Error("a ColumnMetaData lacks type, codec, num_values, total_compressed_size or data_page_offset");
    }
  }
  return Status::Ok();
}

Status ParsePageHeader(CompactReader* r, PageHeader* out) {
  ECHELON_RETURN_IF_ERROR(ReadStruct(r, 0, [&](int16_t id, uint8_t type) -> Status {
    switch (id) {
      case 1: return FieldInt(r, type, "PageHeader.type", &out->type);
      case 2: return FieldI32(r, type, "PageHeader.uncompressed_page_size", &out->uncompressed_page_size);
      case 3: return FieldI32(r, type, "PageHeader.compressed_page_size", &out->compressed_page_size);
      case 4: {
        int32_t crc = 0;
        ECHELON_RETURN_IF_ERROR(FieldI32(r, type, "PageHeader.crc", &crc));
        out->crc = crc;
        return Status::Ok();
      }
      case 5:
      case 7:
      case 8: {
        const int kind = id == 5 ? kDataPage : id == 7 ? kDictionaryPage : kDataPageV2;
        if (type != kCtStruct) return WrongType(r, "PageHeader's page header", type);
        if (out->type != kind) return r->Skip(type, 1);  // a header for another kind of page
        return ParsePageKind(r, 1, kind, out);
      }
      default: return r->Skip(type, 1);
    }
  }));
  if (out->type < 0 || out->uncompressed_page_size < 0 || out->compressed_page_size < 0)
    return r->Error("PageHeader lacks type or sizes, or has a negative size");
  return Status::Ok();
}

}  // namespace echelon::data::parquet
