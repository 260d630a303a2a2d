// `echelon learner CONFIG`: the learning plane alone, serving rollout actors that run anywhere
// (`echelon actor --learner HOST:PORT`). Leaves the same run directory as `echelon train`.
#include "echelon/cli/commands.h"
#include "echelon/cli/launch.h"
#include "echelon/cli/train_config.h"

namespace echelon::cli {

void AddLearnerCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand("learner", "learning plane: serves remote actors over gRPC and trains");
  AddRunOptions(cmd, args.get());
  cmd->add_option("--listen", args->listen, "address to serve actors on, HOST:PORT (0.0.0.0:PORT for every interface)")
      ->capture_default_str();
  cmd->add_option("--broadcast-listen", args->broadcast_listen,
                  "address of the snapshot broadcast origin, HOST:PORT (default: --listen's host, any port)");
  cmd->add_option("--broadcast-peer-hosts", args->broadcast_peer_hosts,
                  "IP addresses an actor may advertise for its snapshot chunks besides the one it calls from "
                  "(comma-separated; e.g. a relay seen here by its LAN address and by others by its public one)")
      ->delimiter(',');
  cmd->add_option("--token-file", args->token_file,
                  "the token every actor presents, or one \"NAME TOKEN\" line per worker (re-read on SIGHUP; "
                  "see docs/DEPLOY.md)");
  cmd->add_flag("--insecure", args->insecure, "serve actors without a token (anyone who reaches --listen joins)");
  cmd->add_option("--tls-cert", args->tls_cert, "PEM certificate chain (with --tls-key enables TLS)");
  cmd->add_option("--tls-key", args->tls_key, "PEM private key of --tls-cert");
  cmd->footer("Config keys: see `echelon train --help`.");
  cmd->callback([args, exit_code] { *exit_code = Launch(*args, LaunchMode::kLearnerOnly); });
}

}  // namespace echelon::cli
