// `echelon report RUN_DIR [RUN_DIR ...] --out report.html`: one self-contained HTML file with
// the charts and tables of obs/report.h, several runs overlaid on the same axes.
// Exit codes: 0 written; 2 bad input (missing directory, malformed metrics line: the message
// names file:line); 1 the report could not be written.
#include <iostream>

#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/obs/report.h"
#include "echelon/obs/report_data.h"

namespace echelon::cli {
namespace {

struct ReportArgs {
  std::vector<std::string> run_dirs;
  std::string out = "report.html";
};

int RunReport(const ReportArgs& args) {
  std::vector<obs::RunData> runs;
  for (const std::string& dir : args.run_dirs) {
    Result<obs::RunData> run = obs::LoadRun(dir);
    if (!run.ok()) {
      spdlog::error("{}", run.status().message());
      return 2;
    }
    runs.push_back(std::move(run).value());
  }
  obs::AssignLabels(&runs);
  Status s = obs::WriteReport(runs, args.out);
  if (!s.ok()) {
    spdlog::error("{}", s.message());
    return 1;
  }
  std::cout << "wrote " << args.out << " (" << runs.size() << " run" << (runs.size() == 1 ? "" : "s") << ")" << std::endl;
  return 0;
}

}  // namespace

void AddReportCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand("report", "self-contained HTML report (inline SVG charts) of one or more run directories");
  cmd->add_option("run_dirs", args->run_dirs, "run directories written by `echelon train` (metrics.jsonl, config.yaml)")
      ->required();
  cmd->add_option("--out", args->out, "HTML file to write")->capture_default_str();
  cmd->callback([args, exit_code] { *exit_code = RunReport(*args); });
}

}  // namespace echelon::cli
