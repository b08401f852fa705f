// The flexh2o command line. Errors inside are exceptions; here they become one line on
// stderr and a non-zero exit.
#include <CLI/CLI.hpp>
#include <csignal>
#include <exception>
#include <new>
#include <fmt/format.h>

#include "engine/cli/bench_command.h"
#include "engine/cli/calibrate_command.h"
#include "engine/cli/chat_template_command.h"
#include "engine/cli/eval_command.h"
#include "engine/cli/option_flags.h"
#include "engine/serving/interrupts.h"
#include "engine/cli/plan_command.h"
#include "engine/cli/run_command.h"
#include "engine/cli/tokenize_command.h"

int main(int argc, char** argv) {
  // A closed stdout pipe is a write error the run reports (and cleans up after), not a kill.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"flexh2o: throughput-oriented offline LLM inference with offloading and KV eviction"};
  app.require_subcommand(0, 1);
  flexh2o::job::JobOptions run;
  CLI::App* run_cmd = flexh2o::cli::add_run_command(app, run);
  flexh2o::cli::EvalCliOptions eval;
  CLI::App* eval_cmd = flexh2o::cli::add_eval_command(app, eval);
  flexh2o::cli::PlanCliOptions plan;
  CLI::App* plan_cmd = flexh2o::cli::add_plan_command(app, plan);
  flexh2o::cli::CalibrateCliOptions calibrate;
  CLI::App* calibrate_cmd = flexh2o::cli::add_calibrate_command(app, calibrate);
  flexh2o::cli::BenchCliOptions bench;
  CLI::App* bench_cmd = flexh2o::cli::add_bench_command(app, bench);
  flexh2o::cli::TokenizeOptions tokenize;
  CLI::App* tokenize_cmd = flexh2o::cli::add_tokenize_command(app, tokenize);
  flexh2o::cli::ChatTemplateOptions chat_template;
  CLI::App* chat_template_cmd = flexh2o::cli::add_chat_template_command(app, chat_template);
  try {
    app.parse(argc, argv);
    // No subcommand runs the embedded default model.
    if (eval_cmd->parsed()) return flexh2o::cli::eval_command(eval);
    if (plan_cmd->parsed()) return flexh2o::cli::plan_command(plan);
    if (calibrate_cmd->parsed()) return flexh2o::cli::calibrate_command(calibrate);
    if (bench_cmd->parsed()) return flexh2o::cli::bench_command(bench);
    if (tokenize_cmd->parsed()) return flexh2o::cli::tokenize_command(tokenize);
    if (chat_template_cmd->parsed()) return flexh2o::cli::chat_template_command(chat_template);
    if (run_cmd->parsed() || app.get_subcommands().empty()) return flexh2o::cli::run_command(run);
    return 0;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const flexh2o::serving::Interrupted& e) {
    fmt::print(stderr, "flexh2o: {}\n", e.what());
    return 130;
  } catch (const std::bad_alloc&) {
    // An allocation the tier budgets did not cover (they count the tiers, not every buffer).
    fmt::print(stderr,
               "flexh2o: error: out of memory (an allocation failed). Lower the memory the run needs: a smaller "
               "--batch or --gpu-batch-size, shorter --prompt-len/--gen-len, more of the weights on disk (--percent), "
               "--compress-weight; or let the planner fit it (leave out --percent and --policy), within --cpu-mem\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "flexh2o: error: {}\n", flexh2o::cli::error_text(e));
    return 1;
  }
}
