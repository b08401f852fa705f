#include "engine/job/job_results.h"

#include <fmt/format.h>

#include <ctime>

#include "kernels/option_error.h"

namespace flexh2o::job {

using kernels::Option;

void open_out(const JobOptions& o, std::optional<serving::ResultFile>& out, serving::ResultFormat format) {
  if (o.resume && o.out_file.empty()) throw kernels::OptionError{Option::Resume, " needs ", Option::Results, " (the results to resume from)"};
  if (!o.out_file.empty()) out.emplace(o.out_file, o.resume, o.prompts_file, format);
}

bool is_openai_job(const JobOptions& o) {
  return !o.request_lines.empty() || (!o.prompts_file.empty() && serving::is_openai_batch_file(o.prompts_file));
}

std::string result_line(const JobOptions& o, const engine::ModelSource& m, const serving::Request& r,
                        std::span<const std::int32_t> new_tokens, const std::string& error) {
  std::string text;
  if (m.tokenizer) {
    std::vector<std::int32_t> all = r.prompt;
    const std::size_t prompt_bytes = m.tokenizer->decode(all).size();
    all.insert(all.end(), new_tokens.begin(), new_tokens.end());
    text = m.tokenizer->decode(all).substr(prompt_bytes);
  }
  // A prompts file's results are JSONL wherever they go (stdout without a results file): their ids say
  // which is which, as they come in the order requests end.
  if (!o.out_file.empty() || !o.prompts_file.empty())
    return serving::ResultFile::line(r.id_json, text, new_tokens, error);
  if (!error.empty()) return "error: " + error + "\n";
  if (m.tokenizer) return r.text.value_or("") + text + "\n";
  return fmt::format("[{}]\n", fmt::join(new_tokens, ", "));
}

namespace {

// Requests given in memory are checked as a whole, as a function's arguments are: the first bad
// one fails the job before it runs, naming the request and, where one is at fault, its field.
serving::OpenAiJob requests_in_memory(const JobOptions& o, const serving::OpenAiPromptContext& ctx) {
  serving::OpenAiJob oj = serving::open_openai_job(serving::read_openai_batch(o.request_lines), ctx);
  for (const serving::OpenAiLine& l : oj.lines)
    if (!l.error.empty())
      throw std::invalid_argument("request " + l.key + (l.error_param.empty() ? "" : " (" + l.error_param + ")") + ": " +
                                  l.error);
  return oj;
}

}  // namespace

serving::OpenAiJob open_openai_run(const JobOptions& o, const JobSetup& s, const FrontEnd& front,
                                   std::optional<serving::ResultFile>& out, std::size_t& bad_lines) {
  const serving::OpenAiPromptContext ctx = openai_prompt_context(o, s, front);
  if (!o.request_lines.empty()) return requests_in_memory(o, ctx);
  serving::OpenAiJob oj = serving::open_openai_job(o.prompts_file, ctx);
  std::vector<std::string> errors;
  for (const serving::OpenAiLine& l : oj.lines)
    if (!l.error.empty() && !(out && out->done_ids().count(l.key))) errors.push_back(serving::openai_error_line(l));
  serving::write_results(out, errors);
  bad_lines = errors.size();
  return oj;
}

JobResults::JobResults(const JobOptions& o, const JobSetup& s, const FrontEnd& front,
                       std::optional<serving::ResultFile>& out, const serving::OpenAiJob* openai)
    : o_(o), s_(s), front_(front), out_(out), openai_(openai) {
  if (openai)
    collector_.emplace(*openai, serving::ResultContext{.tok = s.model.tokenizer.get(),
                                                   .model = o.model.empty() ? s.model.config.name : o.model,
                                                   .created = static_cast<std::int64_t>(std::time(nullptr))});
}

void JobResults::add(std::span<const serving::Request> done, const engine::GenerationResult& r) {
  std::vector<std::string> lines;
  if (collector_) {
    for (serving::FinishedLine& f : collector_->add(done, r)) {
      if (front_.request_done)
        front_.request_done({openai_->lines[f.index], openai_->prompts[f.index], f.choices, f.text});
      lines.push_back(std::move(f.text));
    }
    if (front_.request_done && !out_) return;  // the front end took them
  } else {
    for (std::size_t t = 0; t < done.size(); ++t)
      lines.push_back(result_line(o_, s_.model, done[t], r.tokens[t], t < r.errors.size() ? r.errors[t] : ""));
  }
  serving::write_results(out_, lines);
}

}  // namespace flexh2o::job
