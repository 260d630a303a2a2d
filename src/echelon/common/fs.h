// Small filesystem helpers. Files that others may read are written atomically: the bytes go
// to "<path>.tmp", are fsync'd, then renamed over <path>, so a reader sees the old file or
// the whole new one, never half of it.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"

namespace echelon {

Result<std::string> ReadFile(const std::string& path);
// `mode`: the file's permissions (0600: its owner's alone, from the first byte on).
Status WriteFileAtomic(const std::string& path, const std::string& bytes, unsigned mode = 0644);
// The same for the concatenation of `parts`, written one after another (no joined copy).
Status WriteFileAtomic(const std::string& path, const std::vector<std::string_view>& parts, unsigned mode = 0644);
// Appends bytes to a file being written; an error stops the write.
using ByteSink = std::function<Status(std::string_view)>;
// The same for bytes made while they are written: `produce` hands them to the sink in order. A
// failed `produce` (its error returned) leaves no file.
Status WriteFileAtomic(const std::string& path, const std::function<Status(const ByteSink&)>& produce,
                       unsigned mode = 0644);
// Fsyncs a directory so that a rename inside it survives a power cut.
Status SyncDir(const std::string& dir);
// JSON text, or one error "<where>: not valid JSON: <the parser's reason>".
Result<nlohmann::json> ParseJson(const std::string& text, const std::string& where);
// A file's JSON; errors name the path.
Result<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace echelon
