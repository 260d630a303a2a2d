// `echelon tokenize --tokenizer DIR [--json-input] [--decode] [--skip-special-tokens]`: a
// Hugging Face tokenizer (DIR/tokenizer.json, DIR/tokenizer_config.json if present) over stdin.
//   encode: one string per line (the bytes between newlines, nothing stripped; with
//           --json-input one JSON string per line, so a string may hold newlines) -> one JSON
//           array of ids per line; nothing is added (no BOS/EOS).
//   decode: one JSON array of ids per line -> one JSON string per line.
// Exit codes: 0 done; 2 the tokenizer could not be loaded or an input line is bad (the message
// names the line; the lines before it have been answered).
#include <iostream>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/tokenizer/tokenizer.h"

namespace echelon::cli {
namespace {

struct TokenizeArgs {
  std::string dir;
  bool json_input = false;
  bool decode = false;
  bool skip_special = false;
};

Result<std::string> EncodeLine(const tokenizer::Tokenizer& tok, const std::string& line, bool json_input) {
  std::string text;
  if (json_input) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument(std::string("not valid JSON: ") + e.what());
    }
    if (!j.is_string()) return InvalidArgument("expected a JSON string, got " + std::string(j.type_name()));
    text = j.get<std::string>();
  } else {
    text = line;
  }
  ECHELON_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text));
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  out += ']';
  return out;
}

Result<std::string> DecodeLine(const tokenizer::Tokenizer& tok, const std::string& line, bool skip_special) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_array()) return InvalidArgument("expected a JSON array of token ids, got " + std::string(j.type_name()));
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (const nlohmann::json& id : j) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return InvalidArgument("token ids must be non-negative integers, got " + id.dump());
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  ECHELON_ASSIGN_OR_RETURN(std::string text, tok.Decode(ids, skip_special));
  return nlohmann::json(text).dump();
}

int RunTokenize(const TokenizeArgs& args) {
  Result<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::Load(args.dir);
  if (!tok.ok()) {
    spdlog::error("{}", tok.status().message());
    return 2;
  }
  std::ios::sync_with_stdio(false);
  std::string line;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    Result<std::string> out =
        args.decode ? DecodeLine(tok.value(), line, args.skip_special) : EncodeLine(tok.value(), line, args.json_input);
    if (!out.ok()) {
      std::cout.flush();
      spdlog::error("stdin line {}: {}", line_no, out.status().message());
      return 2;
    }
    std::cout << out.value() << '\n';
  }
  std::cout.flush();
  return 0;
}

}  // namespace

void AddTokenizeCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "encode stdin lines to token ids (or decode ids) with a Hugging Face tokenizer.json");
  cmd->add_option("--tokenizer", args->dir, "directory with tokenizer.json (and optionally tokenizer_config.json)")
      ->required();
  cmd->add_flag("--json-input", args->json_input, "encode: each line is a JSON string");
  cmd->add_flag("--decode", args->decode, "each line is a JSON array of ids; print the decoded text as a JSON string");
  cmd->add_flag("--skip-special-tokens", args->skip_special, "decode: drop special tokens");
  cmd->callback([args, exit_code] { *exit_code = RunTokenize(*args); });
}

}  // namespace echelon::cli
