// `echelon tokens --out DIR [--workers N] [--prefix worker]`: a token of its own for each worker
// of a run whose workers are not all trusted (rollout.untrusted_workers). Adds N workers to
// DIR/tokens, the learner's --token-file, and writes DIR/NAME.token for each, the token file
// that worker's actors are started with; both owner-only. Run again to add workers (names go
// on from the highest issued), then send the learner SIGHUP; delete a worker's line and send
// SIGHUP to revoke it.
// Exit codes: 0 written; 2 bad arguments, or a DIR/tokens that is not a per-worker token file.
#include <spdlog/spdlog.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "echelon/cli/commands.h"
#include "echelon/net/auth.h"

namespace echelon::cli {

struct TokensArgs {
  std::string out;
  int workers = 1;
  std::string prefix = "worker";
};

void AddTokensCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TokensArgs>();
  CLI::App* cmd = app.add_subcommand("tokens", "issue per-worker tokens: DIR/tokens for the learner, DIR/NAME.token for each worker");
  cmd->add_option("--out", args->out, "directory of the token files (created; an existing DIR/tokens is added to)")->required();
  cmd->add_option("--workers", args->workers, "workers to add")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--prefix", args->prefix, "worker names are PREFIX-0, PREFIX-1, ...")->capture_default_str();
  cmd->callback([args, exit_code] {
    Result<std::vector<std::string>> issued = net::IssueWorkerTokens(args->out, args->workers, args->prefix);
    if (!issued.ok()) {
      spdlog::error("{}", issued.status().message());
      *exit_code = 2;
      return;
    }
    std::cout << issued->size() << " worker tokens added to " << args->out << "/tokens (" << issued->front() << " .. "
              << issued->back() << "). Start the learner with --token-file " << args->out
              << "/tokens (a running one takes them on SIGHUP); give each worker its own " << args->out
              << "/NAME.token (`echelon actor --token-file NAME.token`) and no other." << std::endl;
    *exit_code = 0;
  });
}

}  // namespace echelon::cli
