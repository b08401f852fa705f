// flexh2o._flexh2o: the job layer (engine/job/) for the Python API (python/flexh2o/). A job's
// options come by name as the Python API's keyword arguments name them; its requests as OpenAI
// batch lines built by the package; each finished request goes back to Python as it ends. The
// engine runs with the GIL released.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/job/job.h"
#include "engine/job/plan_job.h"
#include "engine/serving/interrupts.h"
#include "kernels/option_error.h"
#include "policy/policy_text.h"

#include <nlohmann/json.hpp>

namespace py = pybind11;
using namespace flexh2o;
using kernels::Option;

namespace {

// How the Python API names each option (LLM's and plan's keyword arguments).
std::string python_name(Option o) {
  switch (o) {
    case Option::GenLen: return "max_tokens";
    case Option::KvPolicy: return "kv";
    case Option::CompressWeight: return "compress_weight";
    case Option::ChatTemplate: return "chat_template";
    case Option::TemplateName: return "chat_template_name";
    case Option::Tokenizer: return "tokenizer";
    case Option::ComputeDtype: return "compute_dtype";
    case Option::Model: return "model";
    case Option::DummyWeights: return "dummy";
    case Option::GpuMem: return "gpu_mem";
    case Option::CpuMem: return "cpu_mem";
    case Option::DiskMem: return "disk_mem";
    case Option::OffloadDir: return "offload_dir";
    case Option::CpuCacheCompute: return "cpu_cache_compute";
    case Option::EvalPrefill: return "prefill";
    case Option::Placement: return "percent";
    case Option::Policy: return "policy";
    case Option::GpuBatchSize: return "gpu_batch_size";
    case Option::Resume: return "resume";
    case Option::Results: return "out";
    case Option::Pipeline: return "pipeline";
    case Option::MicroBatches: return "micro_batches";
    case Option::Hardware: return "hardware";
    case Option::Prompts: return "prompts";
    case Option::Metrics: return "metrics";
    case Option::Trace: return "trace";
    case Option::Batching: return "batching";
    case Option::PromptLen: return "prompt_len";
    case Option::MeanPromptLen: return "mean_prompt_len";
    case Option::MeanGenLen: return "mean_gen_len";
    case Option::SharedPrefix: return "shared_prefix";
    case Option::PrefixFamilies: return "prefix_families";
  }
  return std::string(kernels::option_meaning(o));
}

template <class T>
const char* kind_of() {
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_same_v<T, bool>) return "a bool";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else return "a list of numbers";
}

// An option's value from Python, or a ValueError naming the option.
template <class T>
T value_of(const std::string& name, const py::handle& v) {
  // No conversions: a str is no list, a float no integer, an int no bool.
  const bool exact = std::is_same_v<T, bool> ? py::isinstance<py::bool_>(v)
                     : std::is_integral_v<T> ? py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v)
                     : std::is_same_v<T, std::string> ? py::isinstance<py::str>(v)
                                                      : py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v);
  try {
    if (exact) return v.cast<T>();
  } catch (const py::cast_error&) {
  }
  throw py::value_error(name + ": " + std::string(py::str(py::repr(v))) + " is not " + kind_of<T>());
}

using Setter = std::function<void(job::JobOptions&, const std::string&, const py::handle&)>;

template <class T, class Field>
Setter set(Field field) {
  return [field](job::JobOptions& o, const std::string& name, const py::handle& v) { o.*field = value_of<T>(name, v); };
}

// The job options LLM takes, by their Python names (the CLI's `run` flags with underscores).
const std::map<std::string, Setter>& job_setters() {
  using O = job::JobOptions;
  static const std::map<std::string, Setter> setters = {
      {"model", set<std::string>(&O::model)},
      {"tokenizer", set<std::string>(&O::tokenizer)},
      {"out", set<std::string>(&O::out_file)},
      {"resume", set<bool>(&O::resume)},
      {"max_tokens", set<std::int64_t>(&O::gen_len)},
      {"seed", set<std::uint64_t>(&O::seed)},
      {"dummy", set<bool>(&O::dummy)},
      {"dtype", set<std::string>(&O::dtype)},
      {"backend", set<std::string>(&O::backend)},
      {"compute_dtype", set<std::string>(&O::compute_dtype)},
      {"policy", set<std::string>(&O::policy_file)},
      {"hardware", set<std::string>(&O::hardware)},
      {"percent", set<std::vector<double>>(&O::percent)},
      {"resident_embeddings", set<int>(&O::resident_embeddings)},
      {"gpu_batch_size", set<std::int64_t>(&O::gpu_batch_size)},
      {"num_gpu_batches", set<std::int64_t>(&O::num_gpu_batches)},
      {"overlap", set<int>(&O::overlap)},
      {"sep_layer", set<int>(&O::sep_layer)},
      {"pin_weight", set<int>(&O::pin_weight)},
      {"cpu_cache_compute", set<bool>(&O::cpu_cache_compute)},
      {"kv", set<std::string>(&O::kv)},
      {"expert_loading", set<std::string>(&O::expert_loading)},
      {"prefix_pool", set<std::string>(&O::prefix_pool)},
      {"expert_slots", set<std::int64_t>(&O::expert_slots)},
      {"compress_weight", [](O& o, const std::string& n, const py::handle& v) { o.compress.weight = value_of<bool>(n, v); }},
      {"compress_cache", [](O& o, const std::string& n, const py::handle& v) { o.compress.cache = value_of<bool>(n, v); }},
      {"compress_bits", [](O& o, const std::string& n, const py::handle& v) { o.compress.bits = value_of<int>(n, v); }},
      {"cache_dtype", [](O& o, const std::string& n, const py::handle& v) { o.compress.cache_dtype = value_of<std::string>(n, v); }},
      {"batching", set<std::string>(&O::batching)},
      {"prefill_budget", set<std::int64_t>(&O::prefill_budget)},
      {"share_prefill", set<int>(&O::share_prefill)},
      {"cuda_graphs", set<std::string>(&O::cuda_graphs)},
      {"prefix_sharing", set<std::string>(&O::prefix_sharing)},
      {"gpu_mem", set<std::string>(&O::gpu_mem)},
      {"cpu_mem", set<std::string>(&O::cpu_mem)},
      {"disk_mem", set<std::string>(&O::disk_mem)},
      {"offload_dir", set<std::string>(&O::offload_dir)},
      {"metrics", set<std::string>(&O::metrics_file)},
      {"trace", set<std::string>(&O::trace_file)},
  };
  return setters;
}

std::vector<std::string> job_option_names() {
  std::vector<std::string> names;
  for (const auto& [name, setter] : job_setters()) names.push_back(name);
  return names;
}

job::JobOptions job_options(const py::dict& options) {
  job::JobOptions o;
  for (const auto& [key, value] : options) {
    const std::string name = py::str(key);
    const auto it = job_setters().find(name);
    if (it == job_setters().end()) throw py::type_error("unknown option '" + name + "'");
    if (!value.is_none()) it->second(o, name, value);
  }
  return o;
}

// A finished request as Python gets it: (key, prompt ids, a choice each, result line); a
// choice is (token ids, each one's log-probability, each one's top alternatives as (id,
// log-probability)), the log-probabilities empty unless asked for.
py::tuple request_tuple(const job::RequestDone& d) {
  py::list choices;
  for (const serving::ChoiceOutcome& c : d.choices) {
    py::list top;
    for (const auto& alternatives : c.top_logprobs) {
      py::list entry;
      for (const kernels::TokenLogprob& a : alternatives) entry.append(py::make_tuple(a.token, a.logprob));
      top.append(entry);
    }
    choices.append(py::make_tuple(py::cast(c.tokens), py::cast(c.logprobs), top));
  }
  return py::make_tuple(d.line.key, py::cast(std::vector<std::int32_t>(d.prompt.begin(), d.prompt.end())), choices,
                        d.result_line);
}

// A job's front end for Python: notices to `notice`, finished requests to `done` (when given),
// the GIL taken for each; errors name options as Python does.
job::FrontEnd python_front_end(const py::function& notice, const py::function* done) {
  job::FrontEnd front{.say =
                          [&notice](const std::string& text) {
                            py::gil_scoped_acquire gil;
                            notice(text);
                          },
                      .option_name = python_name,
                      .request_done = {}};
  if (done)
    front.request_done = [done](const job::RequestDone& d) {
      py::gil_scoped_acquire gil;
      (*done)(request_tuple(d));
    };
  return front;
}

// Runs the requests (OpenAI batch lines) with the options; `done(request)` is called with each
// as it finishes and `notice(text)` with the job's notices ("planned for ..."), the GIL held;
// errors name options as Python does. Returns (exit status, the report as JSON text or "", the
// closing text, per-request timings).
py::tuple run(const py::dict& options, std::vector<std::string> lines, bool quiet, const py::function& done,
              const py::function& notice) {
  job::JobOptions o = job_options(options);
  o.request_lines = std::move(lines);
  o.quiet = quiet;
  const job::FrontEnd front = python_front_end(notice, &done);
  job::JobEnd end;
  {
    py::gil_scoped_release released;
    end = job::run_job(o, front);
  }
  py::list timings;
  if (end.report)
    for (const serving::RequestTiming& t : end.report->timings)
      timings.append(py::make_tuple(t.id_json, t.prompt_tokens, t.generated_tokens, t.first_token, t.finished));
  return py::make_tuple(end.status, end.report ? end.report->to_json().dump() : std::string(), end.text, timings);
}

// What a job of these requests would run with (job::plan_job_run), as JSON text: the policy,
// the profile planned on, the estimate (null when none), the compute dtype's reason.
std::string plan(const py::dict& options, std::vector<std::string> lines, const py::function& notice) {
  job::JobOptions o = job_options(options);
  o.request_lines = std::move(lines);
  const job::FrontEnd front = python_front_end(notice, nullptr);
  job::JobPlan p;
  {
    py::gil_scoped_release released;
    p = job::plan_job_run(o, front);
  }
  nlohmann::json j = {{"policy", policy::to_json(p.policy, p.experts, p.top_k)},
                      {"hardware", {{"name", p.hw.name}, {"source", p.hw.source}}},
                      {"compute", p.compute_why},
                      {"predicted", nullptr}};
  if (const std::optional<policy::Estimate>& e = p.estimate)
    j["predicted"] = {{"continuous", e->continuous},
                      // continuous batching: decode and total are the generated tokens' rate
                      {"prefill_tokens_per_second", e->prefill_throughput},
                      {"decode_tokens_per_second", e->decode_throughput},
                      {"total_tokens_per_second", e->total_throughput},
                      {"step_seconds", e->decode_step_seconds},
                      {"memory_bytes", {{"gpu", e->peak_bytes[0]}, {"cpu", e->peak_bytes[1]}, {"disk", e->peak_bytes[2]}}},
                      {"bottleneck", e->bottleneck}};
  return j.dump();
}

// Translates the job layer's errors: an option error names the option as Python does.
void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const serving::Interrupted& e) {
    PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
  } catch (const kernels::OptionError& e) {
    PyErr_SetString(PyExc_ValueError, e.text(python_name).c_str());
  } catch (const kernels::OptionRuntimeError& e) {
    PyErr_SetString(PyExc_RuntimeError, e.text(python_name).c_str());
  }
}

}  // namespace

PYBIND11_MODULE(_flexh2o, m) {
  m.doc() = "flexh2o's job layer (use the flexh2o package: LLM, SamplingParams)";
  py::register_exception_translator(translate);
  m.def("job_option_names", &job_option_names, "the options LLM takes");
  m.def("check_options", [](const py::dict& options) { job_options(options); }, py::arg("options"),
        "a ValueError naming the first option whose value has the wrong type");
  m.def("plan", &plan, py::arg("options"), py::arg("lines"), py::arg("notice"));
  m.def("run", &run, py::arg("options"), py::arg("lines"), py::arg("quiet"), py::arg("done"), py::arg("notice"));
}
