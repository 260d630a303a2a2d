#include "echelon/data/parquet.h"

#include <algorithm>
#include <cstring>

#include "echelon/common/fs.h"
#include "echelon/data/parquet_codec.h"
#include "echelon/data/parquet_column.h"
#include "echelon/data/parquet_thrift.h"
#include "echelon/tokenizer/unicode.h"

namespace echelon::data {
namespace {

using nlohmann::json;
using namespace parquet;  // NOLINT(build/namespaces): this file is the reader's top

std::string Num(uint64_t v) { return std::to_string(v); }

// A name from the file as it may appear in a one-line UTF-8 message: control bytes (and every
// byte >= 0x80 when the name is not UTF-8) as \xNN.
std::string Printable(const std::string& name) {
  static const char kHex[] = "0123456789abcdef";
  const bool utf8 = tokenizer::IsValidUtf8(name);
  std::string out;
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f || (c >= 0x80 && !utf8)) out += std::string("\\x") + kHex[c >> 4] + kHex[c & 15];
    else out += static_cast<char>(c);
  }
  return out;
}

std::string Dotted(const std::vector<std::string>& path) {
  std::string dotted;
  for (const std::string& p : path) dotted += (dotted.empty() ? "" : ".") + Printable(p);
  return dotted;
}

// A schema element with the levels at which it is present and repeats (counting itself),
// and the leaves under it: [first_leaf, end_leaf), contiguous in pre-order.
struct Node {
  std::string name;
  std::string dotted;
  int repetition = kRequired;
  int converted = -1;
  int logical = kLtNone;
  std::vector<int> children;
  int def = 0;
  int rep = 0;
  int first_leaf = 0;
  int end_leaf = 0;
  int leaf = -1;  // index into Schema::leaves when a leaf
};

struct Schema {
  std::vector<Node> nodes;  // nodes[0] is the root
  std::vector<LeafColumn> leaves;
};

// A schema failure naming the column; `unsupported`: a refusal, not corruption.
Status ColumnError(bool unsupported, const std::string& what, const std::string& column) {
  const std::string m = what + " (column " + column + ")";
  return unsupported ? InvalidArgument(m) : DataLoss(m);
}

// What a leaf's values become, or the refusal naming the feature.
Status LeafValueType(const SchemaElement& e, const std::string& column, ValueType* t) {
  const int cv = e.converted_type.value_or(-1), lt = e.logical.kind;
  t->physical = *e.type;
  t->type_length = e.type_length;
  const bool decimal = lt == kLtDecimal || cv == kCvDecimal;
  if (decimal && *e.type != kBoolean && *e.type != kFloat && *e.type != kDouble)
    return ColumnError(true, "DECIMAL values are not supported; store them as DOUBLE or as strings", column);
  switch (*e.type) {
    case kBoolean: t->kind = ValueKind::kBool; return Status::Ok();
    case kInt32:
      t->kind = (lt == kLtInteger && !e.logical.is_signed) || cv == kCvUint32 ? ValueKind::kUInt32 : ValueKind::kInt32;
      return Status::Ok();
    case kInt64:
      t->kind = (lt == kLtInteger && !e.logical.is_signed) || cv == kCvUint64 ? ValueKind::kUInt64 : ValueKind::kInt64;
      return Status::Ok();
    case kInt96:
      return ColumnError(true, "INT96 (legacy timestamps) is not supported; write timestamps as INT64", column);
    case kFloat: t->kind = ValueKind::kFloat; return Status::Ok();
    case kDouble: t->kind = ValueKind::kDouble; return Status::Ok();
    case kByteArray:
      t->kind = ValueKind::kString;
      t->text = lt == kLtString || lt == kLtEnum || lt == kLtJson || cv == kCvUtf8 || cv == kCvEnum || cv == kCvJson;
      return Status::Ok();
    case kFixedLenByteArray:
      if (lt == kLtUuid && e.type_length == 16) t->kind = ValueKind::kUuid;
      else if (lt == kLtFloat16 && e.type_length == 2) t->kind = ValueKind::kFloat16;
      else if (cv == kCvInterval) return ColumnError(true, "INTERVAL values are not supported", column);
      else
        return ColumnError(true, "FIXED_LEN_BYTE_ARRAY of " + std::to_string(e.type_length) +
                                     " bytes without a UUID or FLOAT16 annotation is not supported", column);
      return Status::Ok();
    default: return ColumnError(false, "unknown physical type " + std::to_string(*e.type), column);
  }
}

class SchemaBuilder {
 public:
  SchemaBuilder(const std::vector<SchemaElement>& elements, const ParquetLimits& limits)
      : elements_(elements), limits_(limits) {}

  Status Build(Schema* out) {
    out_ = out;
    if (elements_.size() > limits_.max_schema_elements)
      return FailedPrecondition("schema of " + Num(elements_.size()) + " elements is over the reader's limit");
    const SchemaElement& root = elements_[0];
    if (!root.num_children || *root.num_children <= 0) return DataLoss("the schema's root has no columns");
    out->nodes.emplace_back();
    next_ = 1;
    ECHELON_RETURN_IF_ERROR(Children(0, *root.num_children, 1, {}));
    out->nodes[0].end_leaf = static_cast<int>(out->leaves.size());
    if (next_ != elements_.size())
      return DataLoss("the schema has " + Num(elements_.size() - next_) + " elements past its root's columns");
    return Status::Ok();
  }

 private:
  std::string GroupName(int node) const {
    return node == 0 ? "the schema's root" : "schema element " + out_->nodes[node].dotted;
  }

  Status Children(int parent, int count, int depth, const std::vector<std::string>& path) {
    if (static_cast<uint64_t>(count) > elements_.size() - next_)
      return DataLoss(GroupName(parent) + " claims " + Num(count) + " children, the schema has " +
                      Num(elements_.size() - next_) + " elements left");
    for (int i = 0; i < count; ++i) ECHELON_RETURN_IF_ERROR(Add(parent, depth, path));
    return Status::Ok();
  }

  Status Add(int parent, int depth, std::vector<std::string> path) {
    // Earlier siblings' descendants may have used up the elements a group's count promised.
    if (next_ >= elements_.size())
      return DataLoss(GroupName(parent) + " claims more children than the schema holds");
    const SchemaElement& e = elements_[next_++];
    path.push_back(e.name);
    const std::string dotted = Dotted(path);
    // Names become the rows' keys, and JSON text must be UTF-8.
    if (!tokenizer::IsValidUtf8(e.name))
      return ColumnError(false, "the column name is not valid UTF-8", dotted);
    if (depth > limits_.max_depth) return ColumnError(true, "nested deeper than " + Num(limits_.max_depth), dotted);
    Node n;
    n.name = e.name;
    n.dotted = dotted;
    n.repetition = e.repetition.value_or(kRequired);
    if (n.repetition < kRequired || n.repetition > kRepeated)
      return ColumnError(false, "unknown repetition type " + std::to_string(n.repetition), dotted);
    n.converted = e.converted_type.value_or(-1);
    n.logical = e.logical.kind;
    const Node& p = out_->nodes[parent];
    n.def = p.def + (n.repetition != kRequired);
    n.rep = p.rep + (n.repetition == kRepeated);
    n.first_leaf = static_cast<int>(out_->leaves.size());
    const int index = static_cast<int>(out_->nodes.size());
    out_->nodes.push_back(n);
    out_->nodes[parent].children.push_back(index);
    if (e.num_children && *e.num_children > 0) {
      ECHELON_RETURN_IF_ERROR(Children(index, *e.num_children, depth + 1, path));
    } else if (e.type) {
      LeafColumn leaf;
      leaf.path = path;
      leaf.dotted = dotted;
      leaf.max_def = n.def;
      leaf.max_rep = n.rep;
      ECHELON_RETURN_IF_ERROR(LeafValueType(e, dotted, &leaf.type));
      out_->nodes[index].leaf = static_cast<int>(out_->leaves.size());
      out_->leaves.push_back(std::move(leaf));
    } else {
      return ColumnError(false, "a group without children", dotted);
    }
    out_->nodes[index].end_leaf = static_cast<int>(out_->leaves.size());
    return Status::Ok();
  }

  const std::vector<SchemaElement>& elements_;
  const ParquetLimits& limits_;
  Schema* out_ = nullptr;
  size_t next_ = 0;
};

bool IsList(const Node& n) { return n.repetition != kRepeated && (n.logical == kLtList || n.converted == kCvList); }
bool IsMap(const Node& n) {
  return n.repetition != kRepeated && (n.logical == kLtMap || n.converted == kCvMap || n.converted == kCvMapKeyValue);
}

// Rebuilds a row group's rows from its columns' levels (Dremel's record assembly): each leaf
// has a cursor; a node is null when its first leaf's definition level is below the node's,
// and a repeated node goes on while that leaf's next repetition level is the node's own.
// Every step is checked, so columns that disagree are an error, not a wrong row.
class RowAssembler {
 public:
  RowAssembler(const Schema& schema, std::vector<ColumnData>* cols)
      : s_(schema), cols_(*cols), pos_(cols->size(), 0), vpos_(cols->size(), 0) {}

  Status Row(json* row) {
    for (size_t l = 0; l < cols_.size(); ++l)
      if (pos_[l] >= cols_[l].def.size() || cols_[l].rep[pos_[l]] != 0)
        return Disagree(static_cast<int>(l), "has no entry starting the row");
    return Struct(s_.nodes[0], row);
  }

  // After the last row: every entry and value was used.
  Status Done() {
    for (size_t l = 0; l < cols_.size(); ++l)
      if (pos_[l] != cols_[l].def.size() || vpos_[l] != cols_[l].values.size())
        return Disagree(static_cast<int>(l), "has entries left after the last row");
    return Status::Ok();
  }

 private:
  Status Disagree(int leaf, const std::string& what) {
    return DataLoss("column " + s_.leaves[leaf].dotted + " " + what +
                    " (its levels disagree with the schema or the other columns)");
  }

  bool AtEnd(int leaf) const { return pos_[leaf] >= cols_[leaf].def.size(); }

  // A non-repeated node: null, or an instance.
  Status Value(int index, json* out) {
    const Node& n = s_.nodes[index];
    if (n.repetition == kRepeated) return Repeated(index, false, out);
    if (AtEnd(n.first_leaf)) return Disagree(n.first_leaf, "ends inside a row");
    if (n.repetition == kOptional && cols_[n.first_leaf].def[pos_[n.first_leaf]] < n.def) {
      *out = nullptr;
      return Absent(n);
    }
    return Instance(index, out);
  }

  // One entry from each leaf under n, each saying that n is absent (null or an empty list).
  Status Absent(const Node& n) {
    for (int l = n.first_leaf; l < n.end_leaf; ++l) {
      if (AtEnd(l)) return Disagree(l, "ends inside a row");
      if (cols_[l].def[pos_[l]] >= n.def) return Disagree(l, "holds a value where " + n.dotted + " is absent");
      ++pos_[l];
    }
    return Status::Ok();
  }

  // A node that is present.
  Status Instance(int index, json* out) {
    const Node& n = s_.nodes[index];
    if (n.leaf >= 0) {
      const int l = n.leaf;
      if (AtEnd(l)) return Disagree(l, "ends inside a row");
      if (cols_[l].def[pos_[l]] != s_.leaves[l].max_def) return Disagree(l, "is null where it is required");
      if (vpos_[l] >= cols_[l].values.size()) return Disagree(l, "runs out of values");
      *out = std::move(cols_[l].values[vpos_[l]++]);
      ++pos_[l];
      return Status::Ok();
    }
    if (IsList(n)) return List(n, out);
    if (IsMap(n)) return Map(n, out);
    return Struct(n, out);
  }

  Status Struct(const Node& n, json* out) {
    *out = json::object();
    for (int c : n.children) {
      json v;
      ECHELON_RETURN_IF_ERROR(Value(c, &v));
      (*out)[s_.nodes[c].name] = std::move(v);
    }
    return Status::Ok();
  }

  // The array of a repeated node's instances (or, `of_child`, of its one child's values: the
  // 3-level LIST form, where the repeated group only carries the repetition).
  Status Repeated(int index, bool of_child, json* out) {
    const Node& r = s_.nodes[index];
    const int l0 = r.first_leaf;
    *out = json::array();
    if (AtEnd(l0)) return Disagree(l0, "ends inside a row");
    if (cols_[l0].def[pos_[l0]] < r.def) return Absent(r);
    for (;;) {
      json e;
      ECHELON_RETURN_IF_ERROR(of_child ? Value(r.children[0], &e) : Instance(index, &e));
      out->push_back(std::move(e));
      if (AtEnd(l0) || cols_[l0].rep[pos_[l0]] != r.rep) break;
      for (int l = r.first_leaf + 1; l < r.end_leaf; ++l)
        if (AtEnd(l) || cols_[l].rep[pos_[l]] != r.rep) return Disagree(l, "ends " + r.dotted + " early");
    }
    return Status::Ok();
  }

  Status List(const Node& g, json* out) {
    if (g.children.size() != 1 || s_.nodes[g.children[0]].repetition != kRepeated)
      return DataLoss("LIST " + g.dotted + " does not hold exactly one repeated field");
    const Node& r = s_.nodes[g.children[0]];
    // The element is the repeated field itself in the legacy 2-level forms: a repeated leaf,
    // a repeated group of several fields, or one named "array" or "<list>_tuple".
    const bool of_child = r.leaf < 0 && r.children.size() == 1 && r.name != "array" && r.name != g.name + "_tuple";
    return Repeated(g.children[0], of_child, out);
  }

  Status Map(const Node& g, json* out) {
    if (g.children.size() != 1 || s_.nodes[g.children[0]].repetition != kRepeated ||
        s_.nodes[g.children[0]].leaf >= 0 || s_.nodes[g.children[0]].children.empty() ||
        s_.nodes[g.children[0]].children.size() > 2)
      return DataLoss("MAP " + g.dotted + " does not hold one repeated group of a key and a value");
    const Node& kv = s_.nodes[g.children[0]];
    json pairs;
    ECHELON_RETURN_IF_ERROR(Repeated(g.children[0], false, &pairs));
    const std::string& key = s_.nodes[kv.children[0]].name;
    const std::string value = kv.children.size() > 1 ? s_.nodes[kv.children[1]].name : "";
    bool string_keys = true;
    for (const json& p : pairs) {
      const auto k = p.find(key);
      string_keys = string_keys && k != p.end() && k->is_string();
    }
    if (!string_keys) {
      *out = json::array();
      for (json& p : pairs) out->push_back({{"key", std::move(p[key])}, {"value", value.empty() ? json() : std::move(p[value])}});
      return Status::Ok();
    }
    *out = json::object();
    for (json& p : pairs) (*out)[p[key].get<std::string>()] = value.empty() ? json() : std::move(p[value]);
    return Status::Ok();
  }

  const Schema& s_;
  std::vector<ColumnData>& cols_;
  std::vector<size_t> pos_;   // per leaf: the next entry
  std::vector<size_t> vpos_;  // per leaf: the next value
};

// Where an error happened, for "PATH: what (column c, row group g, page p)".
std::string Where(const std::string& column, int64_t row_group, int page) {
  std::string w = " (";
  if (!column.empty()) w += "column " + column + ", ";
  w += "row group " + std::to_string(row_group);
  if (page >= 0) w += ", page " + std::to_string(page);
  return w + ")";
}

// The checks of one column chunk's metadata before its pages are read.
Status CheckChunk(const ColumnChunk& c, const LeafColumn& leaf) {
  if (c.encrypted) return InvalidArgument("encrypted columns are not supported");
  if (c.file_path)
    return InvalidArgument("column data in another file (\"" + Printable(*c.file_path) + "\") is not supported");
  if (!c.meta_data) return DataLoss("the column chunk has no metadata");
  const ColumnMetaData& m = *c.meta_data;
  if (!m.path_in_schema.empty() && m.path_in_schema != leaf.path) {
    return DataLoss("the column chunk is for column " + Dotted(m.path_in_schema) + ", the schema's column here is " +
                    leaf.dotted);
  }
  if (m.type != leaf.type.physical)
    return DataLoss("the column chunk holds " + PhysicalTypeName(m.type) + ", the schema says " +
                    PhysicalTypeName(leaf.type.physical));
  if (!CodecSupported(m.codec))
    return InvalidArgument("codec " + CodecName(m.codec) + " is not supported; rewrite the file with snappy or zstd");
  return Status::Ok();
}

}  // namespace

Result<std::vector<json>> ParseParquetRows(std::string_view bytes, const std::string& name, const ParquetLimits& limits) {
  auto fail = [&](const Status& st) { return Status(st.code(), name + ": " + st.message()); };
  const auto* file = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint64_t size = bytes.size();
  if (size < 12) return fail(DataLoss("not a Parquet file: " + Num(size) + " bytes, too short"));
  if (std::memcmp(file, "PAR1", 4) != 0) return fail(DataLoss("not a Parquet file: it does not start with PAR1"));
  if (std::memcmp(file + size - 4, "PARE", 4) == 0)
    return fail(InvalidArgument("encrypted Parquet files (PARE footer) are not supported"));
  if (std::memcmp(file + size - 4, "PAR1", 4) != 0)
    return fail(DataLoss("truncated or not a Parquet file: it does not end with PAR1"));
  uint32_t footer_len = 0;
  std::memcpy(&footer_len, file + size - 8, 4);
  if (footer_len > size - 12)
    return fail(DataLoss("footer length " + Num(footer_len) + " runs past the start of the " + Num(size) + "-byte file"));
  const uint64_t data_end = size - 8 - footer_len;
  FileMetaData meta;
  CompactReader r(file + data_end, footer_len);
  Status st = ParseFileMetaData(&r, &meta);
  if (!st.ok()) return fail(st.WithContext("corrupt footer"));
  if (meta.encrypted) return fail(InvalidArgument("encrypted Parquet files are not supported"));
  Schema schema;
  st = SchemaBuilder(meta.schema, limits).Build(&schema);
  if (!st.ok()) return fail(st.WithContext("schema"));

  // What this file may expand to: absolute caps, and caps that grow with its size.
  const uint64_t values_budget = std::min(limits.max_values, limits.max_values_per_byte * size + (uint64_t{1} << 20));
  const uint64_t text_budget = std::min(limits.max_text_bytes, limits.max_text_per_byte * size + (uint64_t{1} << 26));
  uint64_t total_rows = 0;
  for (const RowGroup& rg : meta.row_groups) {
    if (static_cast<uint64_t>(rg.num_rows) > values_budget - total_rows)
      return fail(FailedPrecondition("the row groups hold more than " + Num(values_budget) +
                                     " rows, the reader's limit for a file of " + Num(size) + " bytes"));
    total_rows += static_cast<uint64_t>(rg.num_rows);
  }
  if (total_rows != static_cast<uint64_t>(meta.num_rows))
    return fail(DataLoss("the footer says " + Num(meta.num_rows) + " rows, its row groups hold " + Num(total_rows)));

  std::vector<json> rows;
  uint64_t values_left = values_budget;
  TextBudget text{text_budget};
  for (size_t g = 0; g < meta.row_groups.size(); ++g) {
    const RowGroup& rg = meta.row_groups[g];
    if (rg.columns.size() != schema.leaves.size())
      return fail(DataLoss("row group " + Num(g) + " has " + Num(rg.columns.size()) + " column chunks, the schema " +
                           Num(schema.leaves.size()) + " columns"));
    std::vector<ColumnData> cols(schema.leaves.size());
    for (size_t c = 0; c < schema.leaves.size(); ++c) {
      const LeafColumn& leaf = schema.leaves[c];
      st = CheckChunk(rg.columns[c], leaf);
      if (!st.ok()) return fail(Status(st.code(), st.message() + Where(leaf.dotted, g, -1)));
      ChunkInput in;
      in.file = file;
      in.data_end = data_end;
      in.meta = &*rg.columns[c].meta_data;
      in.leaf = &leaf;
      in.num_rows = rg.num_rows;
      in.limits = &limits;
      in.values_budget = values_budget;
      in.values_left = &values_left;
      in.text = &text;
      int page = -1;
      st = ReadColumnChunk(in, &cols[c], &page);
      if (!st.ok()) return fail(Status(st.code(), st.message() + Where(leaf.dotted, g, page)));
    }
    RowAssembler assembler(schema, &cols);
    for (int64_t i = 0; i < rg.num_rows; ++i) {
      json row;
      st = assembler.Row(&row);
      if (!st.ok()) return fail(Status(st.code(), st.message() + Where("", g, -1)));
      rows.push_back(std::move(row));
    }
    st = assembler.Done();
    if (!st.ok()) return fail(Status(st.code(), st.message() + Where("", g, -1)));
  }
  return rows;
}

Result<std::vector<json>> ReadParquetRows(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path));
  return ParseParquetRows(bytes, path);
}

}  // namespace echelon::data
