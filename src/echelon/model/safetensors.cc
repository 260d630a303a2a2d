#include "echelon/model/safetensors.h"

#include <ATen/ATen.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "echelon/common/fs.h"

namespace echelon::model {
namespace {

using nlohmann::json;

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  size_t itemsize;
};

// LibTorch 1.13 has no unsigned types wider than a byte, so U16/U32/U64 are refused.
constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},  {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},   {"I32", at::kInt, 4},   {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1},
};

const DtypeInfo* DtypeByName(const std::string& name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DtypeInfo* DtypeByType(at::ScalarType type) {
  for (const DtypeInfo& d : kDtypes) {
    if (type == d.type) return &d;
  }
  return nullptr;
}

// One header entry, validated on its own; placement against the others is checked later.
struct Entry {
  std::string name;
  const DtypeInfo* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

Result<Entry> ParseEntry(const std::string& name, const json& v, const std::string& where) {
  const std::string at_name = where + ": tensor \"" + name + "\": ";
  if (!v.is_object()) return DataLoss(at_name + "header entry is not an object");
  Entry e;
  e.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) return DataLoss(at_name + "missing dtype");
  e.dtype = DtypeByName(dt->get<std::string>());
  if (e.dtype == nullptr) return DataLoss(at_name + "unsupported dtype " + dt->dump());
  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) return DataLoss(at_name + "missing shape");
  uint64_t bytes = e.dtype->itemsize;
  for (const json& d : *shape) {
    if (!d.is_number_unsigned()) return DataLoss(at_name + "bad shape " + shape->dump());
    uint64_t n = d.get<uint64_t>();
    if (n > (uint64_t{1} << 62) || __builtin_mul_overflow(bytes, n, &bytes)) {
      return DataLoss(at_name + "shape " + shape->dump() + " is too large");
    }
    e.shape.push_back(static_cast<int64_t>(n));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    return DataLoss(at_name + "data_offsets must be [begin, end]");
  }
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.end < e.begin) return DataLoss(at_name + "data_offsets " + off->dump() + " end before they begin");
  if (e.end - e.begin != bytes) {
    return DataLoss(at_name + "data_offsets " + off->dump() + " hold " + std::to_string(e.end - e.begin) +
                    " bytes but " + dt->get<std::string>() + shape->dump() + " needs " + std::to_string(bytes));
  }
  return e;
}

// The entries must tile the data section exactly: no overlap, no gap, nothing past the end.
Status CheckLayout(std::vector<Entry>* entries, uint64_t data_size, const std::string& where) {
  std::sort(entries->begin(), entries->end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t expected = 0;
  for (const Entry& e : *entries) {
    if (e.end > data_size) {
      return DataLoss(where + ": tensor \"" + e.name + "\" data_offsets end " + std::to_string(e.end) +
                      " is past the data section (" + std::to_string(data_size) + " bytes); file truncated?");
    }
    if (e.begin < expected) return DataLoss(where + ": tensor \"" + e.name + "\" overlaps the previous tensor");
    if (e.begin > expected) {
      return DataLoss(where + ": gap of " + std::to_string(e.begin - expected) + " bytes before tensor \"" + e.name +
                      "\"");
    }
    expected = e.end;
  }
  if (expected != data_size) {
    return DataLoss(where + ": " + std::to_string(data_size - expected) + " bytes after the last tensor");
  }
  return Status::Ok();
}

Result<std::map<std::string, std::string>> ParseMetadata(const json& m, const std::string& where) {
  if (!m.is_object()) return DataLoss(where + ": __metadata__ must be an object of strings");
  std::map<std::string, std::string> out;
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it.value().is_string())
      return DataLoss(where + ": __metadata__ value of \"" + it.key() + "\" is not a string");
    out[it.key()] = it.value().get<std::string>();
  }
  return out;
}

// A bool byte other than 0/1 is undefined behaviour once read as bool.
Status CheckBools(const Entry& e, const at::Tensor& t, const std::string& where) {
  if (e.dtype->type != at::kBool) return Status::Ok();
  const auto* b = static_cast<const unsigned char*>(t.data_ptr());
  if (std::any_of(b, b + t.numel(), [](unsigned char c) { return c > 1; }))
    return DataLoss(where + ": tensor \"" + e.name + "\" has BOOL bytes other than 0 and 1");
  return Status::Ok();
}

Result<at::Tensor> MakeTensor(const Entry& e, const char* data, const std::string& where, bool view) {
  const size_t n = e.end - e.begin;
  const auto address = reinterpret_cast<uintptr_t>(data + e.begin);
  if (view && n > 0 && e.dtype->type != at::kBool && address % e.dtype->itemsize == 0) {
    // Never written through: the bytes are the caller's (ViewSafetensors' contract).
    return at::from_blob(const_cast<char*>(data + e.begin), e.shape, at::TensorOptions().dtype(e.dtype->type));
  }
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype->type));
  if (n > 0) std::memcpy(t.data_ptr(), data + e.begin, n);
  ECHELON_RETURN_IF_ERROR(CheckBools(e, t, where));
  return t;
}

// The header length N from the first 8 bytes, checked against the file's size.
Result<uint64_t> HeaderLength(std::string_view bytes, uint64_t file_size, const std::string& where) {
  if (file_size < 8 || bytes.size() < 8) {
    return DataLoss(where + ": " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > file_size - 8) {
    return DataLoss(where + ": header length " + std::to_string(n) + " runs past the end of the file (" +
                    std::to_string(file_size) + " bytes); file truncated?");
  }
  return n;
}

struct Header {
  std::vector<Entry> entries;  // tiling the data section, in file order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;     // 8 + N
};

// `head`: the file's first 8 + N bytes (at least); `file_size`: all of it.
Result<Header> ParseHeader(std::string_view head, uint64_t file_size, const std::string& where) {
  ECHELON_ASSIGN_OR_RETURN(const uint64_t n, HeaderLength(head, file_size, where));
  json header = json::parse(head.begin() + 8, head.begin() + 8 + static_cast<std::ptrdiff_t>(n), nullptr, false);
  if (header.is_discarded() || !header.is_object()) return DataLoss(where + ": header is not a valid JSON object");
  Header out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      ECHELON_ASSIGN_OR_RETURN(out.metadata, ParseMetadata(it.value(), where));
      continue;
    }
    ECHELON_ASSIGN_OR_RETURN(Entry e, ParseEntry(it.key(), it.value(), where));
    out.entries.push_back(std::move(e));
  }
  out.data_start = 8 + n;
  ECHELON_RETURN_IF_ERROR(CheckLayout(&out.entries, file_size - out.data_start, where));
  return out;
}

Result<SafetensorsFile> Parse(std::string_view bytes, const std::string& where, bool view) {
  ECHELON_ASSIGN_OR_RETURN(Header header, ParseHeader(bytes, bytes.size(), where));
  SafetensorsFile out;
  out.metadata = std::move(header.metadata);
  const char* data = bytes.data() + header.data_start;
  for (const Entry& e : header.entries) {
    ECHELON_ASSIGN_OR_RETURN(out.tensors[e.name], MakeTensor(e, data, where, view));
  }
  return out;
}

// `n` bytes at `offset` of `fd` into `into`.
Status ReadAt(int fd, char* into, uint64_t n, uint64_t offset, const std::string& where) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, into, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return DataLoss(where + ": read failed at byte " + std::to_string(offset) + ": " +
                                  (got < 0 ? std::strerror(errno) : "unexpected end of file"));
    into += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return Status::Ok();
}

// A file mapped by MapSafetensors: the storage its tensors view owns it, and unmaps it with the
// last of them.
struct MappedRegion {
  void* base;
  size_t size;
};
void UnmapRegion(void* context) {
  auto* region = static_cast<MappedRegion*>(context);
  ::munmap(region->base, region->size);
  delete region;
}

}  // namespace

Result<SafetensorsFile> ParseSafetensors(std::string_view bytes, const std::string& where) {
  return Parse(bytes, where, /*view=*/false);
}

Result<SafetensorsFile> ViewSafetensors(std::string_view bytes, const std::string& where) {
  return Parse(bytes, where, /*view=*/true);
}

Result<SafetensorsFile> ReadSafetensors(const std::string& path) {
  // Each tensor is read straight into its own memory: the file is never held whole besides it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot open " + path + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return DataLoss("cannot stat " + path + ": " + std::strerror(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::string head(std::min<uint64_t>(size, 8), '\0');
  ECHELON_RETURN_IF_ERROR(ReadAt(fd, head.data(), head.size(), 0, path));
  ECHELON_ASSIGN_OR_RETURN(const uint64_t n, HeaderLength(head, size, path));
  head.resize(8 + n);
  ECHELON_RETURN_IF_ERROR(ReadAt(fd, head.data() + 8, n, 8, path));
  ECHELON_ASSIGN_OR_RETURN(Header header, ParseHeader(head, size, path));
  SafetensorsFile out;
  out.metadata = std::move(header.metadata);
  for (const Entry& e : header.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype->type));
    ECHELON_RETURN_IF_ERROR(ReadAt(fd, static_cast<char*>(t.data_ptr()), e.end - e.begin, header.data_start + e.begin, path));
    ECHELON_RETURN_IF_ERROR(CheckBools(e, t, path));
    out.tensors[e.name] = std::move(t);
  }
  return out;
}

Result<SafetensorsFile> MapSafetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  const bool stated = ::fstat(fd, &st) == 0;
  const size_t size = stated ? static_cast<size_t>(st.st_size) : 0;
  void* base = stated && size > 0 ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  const int error = errno;
  ::close(fd);
  if (!stated) return DataLoss("cannot stat " + path + ": " + std::strerror(error));
  if (size == 0) return DataLoss(path + ": 0 bytes, shorter than the 8-byte header length");
  if (base == MAP_FAILED) return DataLoss("cannot map " + path + ": " + std::strerror(error));
  // From here the storage owns the mapping, whatever is returned.
  const at::Storage storage(at::Storage::use_byte_size_t(), size,
                            at::DataPtr(base, new MappedRegion{base, size}, &UnmapRegion, at::kCPU),
                            /*allocator=*/nullptr, /*resizable=*/false);
  const std::string_view bytes(static_cast<const char*>(base), size);
  ECHELON_ASSIGN_OR_RETURN(Header header, ParseHeader(bytes, size, path));
  SafetensorsFile out;
  out.metadata = std::move(header.metadata);
  for (const Entry& e : header.entries) {
    const uint64_t offset = header.data_start + e.begin;
    const uint64_t item = static_cast<uint64_t>(e.dtype->itemsize);
    if (e.end > e.begin && e.dtype->type != at::kBool && offset % item == 0) {
      out.tensors[e.name] = at::empty({0}, at::TensorOptions().dtype(e.dtype->type))
                                .set_(storage, static_cast<int64_t>(offset / item), e.shape);
    } else {  // misaligned, BOOL (checked) or empty: a copy
      ECHELON_ASSIGN_OR_RETURN(out.tensors[e.name], MakeTensor(e, bytes.data() + header.data_start, path, false));
    }
  }
  return out;
}

void ReleaseMappedPages(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.storage().data_ptr().get_deleter() != &UnmapRegion) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t begin = (first + page - 1) / page * page, end = (first + t.nbytes()) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

Result<std::string> SafetensorsHeader(const std::vector<SafetensorsEntry>& entries,
                                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    if (e.name == "__metadata__" || e.name.empty() || header.contains(e.name))
      return InvalidArgument("invalid or repeated tensor name \"" + e.name + "\"");
    const DtypeInfo* d = DtypeByType(e.dtype);
    if (d == nullptr) {
      return InvalidArgument("tensor \"" + e.name + "\": dtype " + std::string(c10::toString(e.dtype)) +
                             " cannot be stored in safetensors");
    }
    const uint64_t n = static_cast<uint64_t>(c10::multiply_integers(e.shape)) * d->itemsize;
    header[e.name] = {{"dtype", d->name}, {"shape", e.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  std::string out;
  const uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  return out + text;
}

Result<SafetensorsParts> SafetensorsLayout(const std::map<std::string, at::Tensor>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  SafetensorsParts parts;
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) return InvalidArgument("tensor \"" + name + "\" is undefined");
    if (DtypeByType(t.scalar_type()) == nullptr) {
      return InvalidArgument("tensor \"" + name + "\": dtype " + std::string(c10::toString(t.scalar_type())) +
                             " cannot be stored in safetensors");
    }
    parts.tensors.push_back(t.detach().to(at::kCPU).contiguous());
    entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  ECHELON_ASSIGN_OR_RETURN(parts.header, SafetensorsHeader(entries, metadata));
  return parts;
}

std::vector<std::string_view> SafetensorsParts::Views() const {
  std::vector<std::string_view> out = {header};
  for (const at::Tensor& c : tensors)
    if (c.numel() > 0) out.emplace_back(static_cast<const char*>(c.data_ptr()), c.nbytes());
  return out;
}

uint64_t SafetensorsParts::size() const {
  uint64_t n = header.size();
  for (const at::Tensor& c : tensors) n += c.nbytes();
  return n;
}

Result<std::string> SerializeSafetensors(const std::map<std::string, at::Tensor>& tensors,
                                         const std::map<std::string, std::string>& metadata) {
  ECHELON_ASSIGN_OR_RETURN(const SafetensorsParts parts, SafetensorsLayout(tensors, metadata));
  std::string out;
  out.reserve(parts.size());
  for (std::string_view v : parts.Views()) out.append(v);
  return out;
}

Status WriteSafetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  ECHELON_ASSIGN_OR_RETURN(const SafetensorsParts parts, SafetensorsLayout(tensors, metadata));
  return WriteFileAtomic(path, parts.Views()).WithContext("writing " + path);
}

}  // namespace echelon::model
