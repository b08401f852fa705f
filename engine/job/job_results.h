// Where a job's results go: the results file (checked and locked before anything loads), an
// OpenAI batch file's error lines for its bad lines, and each finished request's line.
#pragma once
#include <cstdint>
#include <optional>
#include <span>

#include "engine/job/job_options.h"
#include "engine/job/job_setup.h"
#include "engine/serving/openai_job.h"
#include "engine/serving/openai_results.h"
#include "engine/serving/request.h"
#include "engine/serving/result_file.h"

namespace flexh2o::job {

// Opens the results file into `out` (nothing without one), checked before anything loads
// (serving/result_file.h).
void open_out(const JobOptions& o, std::optional<serving::ResultFile>& out,
              serving::ResultFormat format = serving::ResultFormat::Simple);

// Whether the job's requests are OpenAI batch lines: given in memory, or a prompts file of them
// (serving/openai_batch.h).
bool is_openai_job(const JobOptions& o);

// An OpenAI batch job (is_openai_job): its lines read and prepared, and the error lines of its
// bad lines not in `out` yet written first (`bad_lines`: how many). Lines given in memory have
// none: a bad one fails the job.
serving::OpenAiJob open_openai_run(const JobOptions& o, const JobSetup& s, const FrontEnd& front,
                                   std::optional<serving::ResultFile>& out, std::size_t& bad_lines);

// What the job writes for one finished request, newline included: its results line with a
// results file or a prompts file, else the prompt and its continuation (or the token ids
// without a tokenizer). `error`: why its generation failed ("": it did not); the line then
// says so (an "error" field; the text output a line "error: ...").
std::string result_line(const JobOptions& o, const engine::ModelSource& m, const serving::Request& r,
                        std::span<const std::int32_t> new_tokens, const std::string& error = {});

// Where a job's finished requests go, as they finish (in any order): their result lines (an
// OpenAI line's once its n choices are done) appended to the results file and fsynced, and handed
// to the front end (FrontEnd::request_done) or else printed.
class JobResults {
 public:
  JobResults(const JobOptions& o, const JobSetup& s, const FrontEnd& front, std::optional<serving::ResultFile>& out,
             const serving::OpenAiJob* openai);
  void add(std::span<const serving::Request> done, const engine::GenerationResult& r);

 private:
  const JobOptions& o_;
  const JobSetup& s_;
  const FrontEnd& front_;
  std::optional<serving::ResultFile>& out_;
  const serving::OpenAiJob* openai_;
  std::optional<serving::OpenAiCollector> collector_;
};

}  // namespace flexh2o::job
