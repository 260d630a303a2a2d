#include "echelon/common/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace echelon {

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return DataLoss("read error on " + path);
  return ss.str();
}

Status WriteFileAtomic(const std::string& path, const std::string& bytes, unsigned mode) {
  return WriteFileAtomic(path, std::vector<std::string_view>{bytes}, mode);
}

Status WriteFileAtomic(const std::string& path, const std::vector<std::string_view>& parts, unsigned mode) {
  return WriteFileAtomic(
      path,
      [&parts](const ByteSink& sink) {
        for (std::string_view bytes : parts) ECHELON_RETURN_IF_ERROR(sink(bytes));
        return Status::Ok();
      },
      mode);
}

Status WriteFileAtomic(const std::string& path, const std::function<Status(const ByteSink&)>& produce, unsigned mode) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());  // a leftover keeps its own mode: O_CREAT applies `mode` only to a new file
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) return Internal("cannot create " + tmp + ": " + std::strerror(errno));
  const ByteSink sink = [&](std::string_view bytes) -> Status {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Internal("write to " + tmp + " failed: " + std::strerror(errno));
      }
      off += static_cast<size_t>(n);
    }
    return Status::Ok();
  };
  if (Status st = produce(sink); !st.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return Internal("fsync/close of " + tmp + " failed: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Internal("rename " + tmp + " -> " + path + " failed: " + std::strerror(errno));
  }
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return SyncDir(parent.empty() ? "." : parent.string());
}

Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Internal("cannot open directory " + dir + ": " + std::strerror(errno));
  ::fsync(fd);
  ::close(fd);
  return Status::Ok();
}

Result<nlohmann::json> ParseJson(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(where + ": not valid JSON: " + e.what());
  }
}

Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseJson(text, path);
}

}  // namespace echelon
