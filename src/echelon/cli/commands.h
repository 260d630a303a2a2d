// Subcommands of the `echelon` binary; one file each. Each Add*Command registers its options
// and a callback that stores the process exit code in *exit_code.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace echelon::cli {

void AddTrainCommand(CLI::App& app, int* exit_code);
void AddEvalCommand(CLI::App& app, int* exit_code);
void AddPlanCommand(CLI::App& app, int* exit_code);
void AddSimulateCommand(CLI::App& app, int* exit_code);
void AddLearnerCommand(CLI::App& app, int* exit_code);
void AddLearnerRankCommand(CLI::App& app, int* exit_code);
void AddActorCommand(CLI::App& app, int* exit_code);
void AddBroadcastCommand(CLI::App& app, int* exit_code);
void AddReportCommand(CLI::App& app, int* exit_code);
void AddTokenizeCommand(CLI::App& app, int* exit_code);
void AddTokensCommand(CLI::App& app, int* exit_code);
void AddServeCommand(CLI::App& app, int* exit_code);
void AddInitModelCommand(CLI::App& app, int* exit_code);
void AddStageCommand(CLI::App& app, int* exit_code);
void AddGenerateCommand(CLI::App& app, int* exit_code);

// "echelon 0.3.0 (git 91ba92d, LibTorch 1.13.0)": `echelon --version`, the first line of a run's
// learner.log and the head of its config.yaml.
std::string VersionLine();

// "A<sep>B" with A and B whole integers and nothing else; nullopt otherwise (`--stage I/K`,
// `--layers A:B`).
std::optional<std::pair<int64_t, int64_t>> ParseIntPair(const std::string& text, char sep);

}  // namespace echelon::cli
