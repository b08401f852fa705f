// What a job needs of the front end that runs it (the CLI, the Python API): where its notices
// go, how it names options in errors, and, where it takes results itself, each finished request.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "engine/serving/openai_batch.h"
#include "engine/serving/openai_results.h"
#include "kernels/option_error.h"

namespace flexh2o::job {

// A request of in-memory lines (JobOptions::request_lines) whose choices have all finished.
struct RequestDone {
  const serving::OpenAiLine& line;
  std::span<const std::int32_t> prompt;
  std::span<const serving::ChoiceOutcome> choices;
  const std::string& result_line;  // what the results file gets, newline included
};

struct FrontEnd {
  // A notice for the user while the job opens and runs, one or more whole lines without the
  // final newline ("planned for ...").
  std::function<void(const std::string&)> say;
  // How the front end names an option in an error's text (the CLI: its flag).
  std::function<std::string(kernels::Option)> option_name;
  // Takes each finished request of in-memory lines (else their lines go to stdout); the
  // results file, when there is one, gets them too.
  std::function<void(const RequestDone&)> request_done;
};

}  // namespace flexh2o::job
