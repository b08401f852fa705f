// flexh2o run under mpirun (CPU backend, one machine, ranks oversubscribed on its cores): data
// parallel and pipeline runs write the lines a one-process run writes (our own format and
// OpenAI batch files); a job whose rank is killed or interrupted resumes to those lines; a bad
// prompt ends every rank with one error line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/json_near.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int code;
  std::string out, err;
};

// The launcher as CI runs it: as root in a container, more ranks than cores, no binding.
std::string mpirun(int ranks) {
  return std::string(FLEXH2O_MPIEXEC) + " --allow-run-as-root --oversubscribe --bind-to none -np " +
         std::to_string(ranks) + " ";
}

// Starts `mpirun -np 2 flexh2o ARGS` in the background (output in spawn.out/spawn.err of `dir`);
// its pid, for the signals a test sends.
pid_t spawn_mpirun(const testing::TempDir& dir, const std::string& args) {
  const std::string cmd = "exec " + mpirun(2) + FLEXH2O_BINARY + " " + args + " >" + dir.file("spawn.out") + " 2>" +
                          dir.file("spawn.err") + " </dev/null";
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return launcher;
}

// `timeout` turns a hang into a failure instead of a stuck CI job.
Result run(const std::string& launcher, const std::string& args, const testing::TempDir& dir) {
  const std::string cmd = "timeout 120 " + launcher + FLEXH2O_BINARY + " " + args + " >" + dir.file("stdout") + " 2>" +
                          dir.file("stderr") + " </dev/null";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), testing::read_file(dir.file("stdout")),
          testing::read_file(dir.file("stderr"))};
}

std::size_t line_count(const std::string& text) { return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')); }

// A small OPT with dummy weights: several layers to split, quick to run.
std::string write_opt(const testing::TempDir& dir, int layers, int hidden) {
  const std::string path = dir.file("opt.yaml");
  testing::write_file(path, "name: small-opt\nfamily: opt\nnum_layers: " + std::to_string(layers) +
                                "\nhidden_size: " + std::to_string(hidden) + "\nffn_size: " + std::to_string(4 * hidden) +
                                "\nnum_heads: 4\nvocab_size: 2000\nmax_positions: 128\ndtype: f16\n"
                                "tie_embeddings: true\nbos_token_id: 2\neos_token_id: []\n");
  return path;
}

// Token prompts of different lengths (the dealing balances tokens, not counts).
std::string token_prompts(int count) {
  std::string in;
  for (int i = 0; i < count; ++i) {
    in += "{\"id\": \"p" + std::to_string(i) + "\", \"tokens\": [2";
    for (int t = 0; t <= i % 5; ++t) in += ", " + std::to_string(100 + 37 * i + t);
    in += "]}\n";
  }
  return in;
}

const char* kStoryPrompts =
    "{\"id\": \"a\", \"prompt\": \"Once upon a time\"}\n"
    "{\"id\": 2, \"prompt\": \"The dog ran\"}\n"
    "{\"id\": \"c\", \"prompt\": \"Lily and Tom went to the park. They saw\"}\n"
    "{\"id\": \"d\", \"prompt\": \"One day\"}\n"
    "{\"id\": \"e\", \"prompt\": \"The sun\"}\n"
    "{\"id\": \"f\", \"prompt\": \"A little bird\"}\n"
    "{\"id\": \"g\", \"prompt\": \"Mom said\"}\n";

// The lines of a results file, sorted: every run writes each line as its request ends.
std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::ranges::sort(lines);
  return lines;
}

// A cut run's file: each of its lines is one of the whole run's (none twice).
void expect_part_of(const std::string& partial, const std::string& whole) {
  const std::vector<std::string> all = sorted_lines(whole);
  std::vector<std::string> part = sorted_lines(partial);
  EXPECT_EQ(std::ranges::adjacent_find(part), part.end()) << "a line written twice";
  for (const std::string& l : part) EXPECT_TRUE(std::ranges::binary_search(all, l)) << "not in the whole run: " << l;
}

// Runs `job` (flags after `run`, before --out) as one process, then under each launcher form,
// and expects the same out.jsonl lines from every one.
void expect_same_output(const std::string& job, const std::vector<std::pair<int, std::string>>& forms,
                        const testing::TempDir& dir, std::size_t lines) {
  const Result one = run("", "run " + job + " --out " + dir.file("one.jsonl"), dir);
  ASSERT_EQ(one.code, 0) << one.err;
  const std::string expected = testing::read_file(dir.file("one.jsonl"));
  ASSERT_EQ(line_count(expected), lines);
  for (const auto& [ranks, extra] : forms) {
    SCOPED_TRACE("mpirun -np " + std::to_string(ranks) + " " + extra);
    const std::string out = dir.file("np" + std::to_string(ranks) + ".jsonl");
    std::filesystem::remove(out);
    const Result r = run(mpirun(ranks), "run " + job + extra + " --out " + out, dir);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(sorted_lines(testing::read_file(out)), sorted_lines(expected));
  }
}

TEST(Mpi, DataParallelWritesTheOneProcessFileStories260K) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), kStoryPrompts);
  const std::string job = "--prompts " + dir.file("in.jsonl") + " --gen-len 24 --temperature 0.8 --seed 5";
  expect_same_output(job, {{2, ""}, {3, ""}}, dir, 7);
}

TEST(Mpi, DataParallelWritesTheOneProcessFileDummyOpt) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), token_prompts(9));
  const std::string job = "--model " + write_opt(dir, 4, 128) + " --dummy --prompts " + dir.file("in.jsonl") +
                          " --gen-len 8 --gpu-batch-size 2";
  expect_same_output(job, {{2, ""}, {3, ""}}, dir, 9);
}

// More ranks than requests: a rank that is dealt none runs nothing, and the job still ends.
TEST(Mpi, DataParallelWithMoreRanksThanRequests) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), token_prompts(2));
  const std::string job = "--model " + write_opt(dir, 2, 64) + " --dummy --prompts " + dir.file("in.jsonl") +
                          " --gen-len 6 --gpu-batch-size 1";
  expect_same_output(job, {{3, ""}, {3, " --batching fixed"}}, dir, 2);
}

// Ten prompts of 1-7 tokens, each with its own max_tokens (1-19).
std::string mixed_limit_prompts() {
  std::string in;
  for (int i = 0; i < 10; ++i) {
    in += "{\"id\": \"m" + std::to_string(i) + "\", \"tokens\": [1";
    for (int t = 0; t <= (i * 3) % 7; ++t) in += ", " + std::to_string(20 + (41 * i + 13 * t) % 480);
    in += "], \"max_tokens\": " + std::to_string(1 + (i * 7) % 19) + "}\n";
  }
  return in;
}

const char* const kMixedLimitsJob = " --gen-len 20 --gpu-batch-size 2 --num-gpu-batches 2 --prefill-budget 6 "
                                    "--temperature 0.7 --seed 3";

// Requests with their own max_tokens under continuous batching (each rank's share through its
// own slots; each pipeline micro-batch refilling its slots from the job's queue): the lines of
// the one-process run, and of that run with fixed blocks.
TEST(Mpi, DataParallelContinuousBatchingWithMixedLimits) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), mixed_limit_prompts());
  const std::string job = "--prompts " + dir.file("in.jsonl") + kMixedLimitsJob;
  expect_same_output(job, {{2, ""}, {2, " --batching fixed"}, {2, " --pipeline 2"}, {3, " --pipeline 3 --micro-batches 3"}},
                     dir, 10);
}

// The sequence rows a pipeline run says it computed ("slot utilisation U (N sequence rows").
long rows_computed(const std::string& err) {
  static const std::regex said(R"(slot utilisation [0-9.]+ \((\d+) sequence rows computed\))");
  std::smatch m;
  return std::regex_search(err, m, said) ? std::stol(m[1]) : -1;
}

// A pipeline's micro-batches refill their slots under continuous batching: on requests of
// mixed lengths they compute fewer sequence rows than fixed blocks, which run each block until
// its longest request ends.
TEST(Mpi, PipelineRefillComputesFewerRowsThanFixedBlocks) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), mixed_limit_prompts());
  const std::string job = "run --prompts " + dir.file("in.jsonl") + kMixedLimitsJob + " --pipeline 2";
  const Result continuous = run(mpirun(2), job, dir);
  const Result fixed = run(mpirun(2), job + " --batching fixed", dir);
  ASSERT_EQ(continuous.code, 0) << continuous.err;
  ASSERT_EQ(fixed.code, 0) << fixed.err;
  EXPECT_THAT(continuous.err, HasSubstr("(continuous batching)"));
  const long refilled = rows_computed(continuous.err), blocks = rows_computed(fixed.err);
  ASSERT_GT(refilled, 0) << continuous.err;
  EXPECT_LT(refilled, blocks) << fixed.err;
}

TEST(Mpi, PipelineWritesTheOneProcessFileStories260K) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), kStoryPrompts);
  const std::string job = "--prompts " + dir.file("in.jsonl") + " --gen-len 24 --temperature 0.8 --seed 5";
  expect_same_output(
      job, {{2, " --pipeline 2"}, {3, " --pipeline 3 --micro-batches 2"}, {2, " --pipeline 2 --batching fixed"}}, dir, 7);
}

TEST(Mpi, PipelineWritesTheOneProcessFileDummyOpt) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), token_prompts(9));
  // Blocks of 2 x 1 prompts, some of the KV cache and weights on disk on every stage.
  const std::string offload = dir.file("offload");
  std::filesystem::create_directory(offload);
  const std::string job = "--model " + write_opt(dir, 4, 128) + " --dummy --prompts " + dir.file("in.jsonl") +
                          " --gen-len 8 --gpu-batch-size 2 --percent 50 25 50 25 100 0 --offload-dir " + offload;
  expect_same_output(job, {{2, " --pipeline 2"}, {3, " --pipeline 3"}, {2, " --pipeline 2 --batching fixed"}}, dir, 9);
  EXPECT_TRUE(std::filesystem::is_empty(offload)) << "offload files left behind";
}

using Json = nlohmann::json;

std::string completion(const std::string& id, const Json& body) {
  return Json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}}.dump() + "\n";
}

// Log-probabilities are the log-softmax of fp32 logits whose summation order follows the rows
// of a step (the CPU GEMM's path), so runs that batch a request otherwise differ in their last
// bits (~1e-6 here).
constexpr double kReorderedLogprob = 1e-4;

// An OpenAI results file's lines by custom_id (a bad line's by its id), each once, without
// their time stamps (`created`).
std::map<std::string, Json> results_by_id(const std::string& text) {
  std::map<std::string, Json> by_id;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    Json j = Json::parse(l);
    if (j["response"].is_object()) j["response"]["body"].erase("created");
    const std::string id = j["custom_id"].is_string() ? j["custom_id"].get<std::string>() : j["id"].get<std::string>();
    EXPECT_FALSE(by_id.count(id)) << id << " twice";
    by_id[id] = std::move(j);
  }
  return by_id;
}

void expect_same_results(const std::string& got, const std::string& want) {
  const auto g = results_by_id(got), w = results_by_id(want);
  EXPECT_EQ(g.size(), w.size());
  for (const auto& [id, j] : w) {
    if (g.count(id)) testing::expect_json_near(g.at(id), j, kReorderedLogprob, id);
    else ADD_FAILURE() << id << " has no result";
  }
}

// Runs `job` under mpirun -np 2 as data-parallel ranks and as a pipeline, each with fixed and
// continuous batching: every out file holds the `want` results; `check` sees each run's stderr.
void expect_every_two_rank_form_gives(const std::string& job, const std::string& want, const testing::TempDir& dir,
                                      const std::function<void(const std::string& err)>& check = {}) {
  for (const std::string form : {"", " --batching fixed", " --pipeline 2", " --pipeline 2 --batching fixed"}) {
    SCOPED_TRACE("mpirun -np 2" + form);
    const std::string out = dir.file("np2.jsonl");
    std::filesystem::remove(out);
    const Result r = run(mpirun(2), "run " + job + form + " --out " + out, dir);
    ASSERT_EQ(r.code, 0) << r.err;
    if (check) check(r.err);
    expect_same_results(testing::read_file(out), want);
  }
}

Json result_of(const std::string& text, const std::string& custom_id) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (Json j = Json::parse(l); j["custom_id"] == custom_id) return j;
  ADD_FAILURE() << custom_id << " has no result";
  return {};
}

// OpenAI batch files under mpirun: data-parallel ranks (continuous and fixed blocks) and a
// 2-stage pipeline write the one-process run's result lines (`created` aside): n choices,
// seeds, stop strings and log-probabilities (sampled on the last stage) included, and error
// lines for bad lines. A cut data-parallel run resumes by custom_id to the same lines.
TEST(Mpi, OpenAiBatchFileGivesTheOneProcessResults) {
  testing::TempDir dir;
  // A stop string from the middle of a greedy text, so that it ends that request early.
  const Json greedy = {{"prompt", "Once upon a time"}, {"max_tokens", 30}, {"temperature", 0}, {"ignore_eos", true}};
  testing::write_file(dir.file("greedy.jsonl"), completion("g", greedy));
  ASSERT_EQ(run("", "run --prompts " + dir.file("greedy.jsonl") + " --out " + dir.file("greedy.out"), dir).code, 0);
  const auto whole = result_of(testing::read_file(dir.file("greedy.out")), "g")["response"]["body"]["choices"][0]["text"]
                         .get<std::string>();
  const std::size_t space = whole.find(' ', whole.size() / 2);
  ASSERT_NE(space, std::string::npos) << whole;

  const char* prompts[] = {"The dog", "Lily and Tom", "One day", "The sun", "A little bird", "Mom said"};
  Json stopped = greedy, logprobs = greedy, n3 = greedy;
  stopped["stop"] = {whole.substr(space, 3)};
  logprobs["logprobs"] = 2;
  n3["temperature"] = 1.0;
  n3["n"] = 3;
  n3["logprobs"] = 1;
  std::string file = completion("stopped", stopped) + completion("logprobs", logprobs) + completion("n3", n3) +
                     "{\"custom_id\": \"broken\", oops\n" +
                     Json{{"custom_id", "embed"}, {"method", "POST"}, {"url", "/v1/embeddings"}, {"body", Json::object()}}.dump() +
                     "\n";
  for (int i = 0; i < 12; ++i) {
    Json body = {{"prompt", prompts[i % 6]}, {"max_tokens", 3 + (i * 7) % 17}, {"temperature", i % 3 ? 0.8 : 0.0}};
    if (i % 2) body["seed"] = i;
    if (i % 4 == 1) body["n"] = 2;
    file += completion("r" + std::to_string(i), body);
  }
  testing::write_file(dir.file("batch.jsonl"), file);
  const std::string job = "--prompts " + dir.file("batch.jsonl") + " --gpu-batch-size 2 --num-gpu-batches 2";

  const Result one = run("", "run " + job + " --out " + dir.file("one.jsonl"), dir);
  ASSERT_EQ(one.code, 0) << one.err;
  const std::string expected = testing::read_file(dir.file("one.jsonl"));
  ASSERT_EQ(line_count(expected), 17u);
  const Json cut = result_of(expected, "stopped")["response"]["body"]["choices"][0];
  EXPECT_EQ(cut["finish_reason"], "stop");
  EXPECT_EQ(cut["text"], whole.substr(0, space));
  EXPECT_FALSE(result_of(expected, "logprobs")["response"]["body"]["choices"][0]["logprobs"].is_null());
  expect_every_two_rank_form_gives(job, expected, dir,
                                   [](const std::string& err) { EXPECT_THAT(err, HasSubstr("2 bad request lines")); });

  // Cut to its first 6 lines and half of the 7th, as a kill would: --resume under mpirun
  // writes the rest, each request once.
  std::istringstream lines(testing::read_file(dir.file("np2.jsonl")));
  std::string kept, line;
  for (int i = 0; i < 6 && std::getline(lines, line); ++i) kept += line + "\n";
  std::getline(lines, line);
  testing::write_file(dir.file("np2.jsonl"), kept + line.substr(0, line.size() / 2));
  const Result resumed = run(mpirun(2), "run " + job + " --out " + dir.file("np2.jsonl") + " --resume", dir);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  expect_same_results(testing::read_file(dir.file("np2.jsonl")), expected);
}

// Structured output under mpirun: each rank compiles the constraints its requests carry (the
// spec travels with the request), and every pipeline stage walks them so that all end a
// sequence at the same step (the last stage masks): the one-process run's result lines. The
// report counts the distinct constraints compiled as the one-process run does.
TEST(Mpi, StructuredOutputGivesTheOneProcessResults) {
  testing::TempDir dir;
  const std::string job = "--prompts " + std::string(FLEXH2O_TEST_DATA_DIR) +
                          "/grammar/structured_batch.jsonl --gpu-batch-size 2 --num-gpu-batches 2";
  const Result one = run("", "run " + job + " --out " + dir.file("one.jsonl"), dir);
  ASSERT_EQ(one.code, 0) << one.err;
  const std::string compiled = "structured output: 12 distinct constraints compiled";
  ASSERT_THAT(one.err, HasSubstr(compiled));
  const std::string expected = testing::read_file(dir.file("one.jsonl"));
  expect_every_two_rank_form_gives(job, expected, dir, [&](const std::string& err) { EXPECT_THAT(err, HasSubstr(compiled)); });
}

// The progress line in every run mode: a log (stderr is a file here) gets plain lines and ends
// with the whole job done, once, as the one-process run's does; --quiet writes none.
TEST(Mpi, ProgressLinesAsOneProcess) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), kStoryPrompts);
  const std::string job = "--prompts " + dir.file("in.jsonl") + " --gen-len 24";
  const Result one = run("", "run " + job + " --out " + dir.file("one.jsonl"), dir);
  ASSERT_EQ(one.code, 0) << one.err;
  const std::string done = "requests 7/7 (100%)";
  const auto count = [](const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  ASSERT_EQ(count(one.err, done), 1u) << one.err;
  const std::vector<std::string> want = sorted_lines(testing::read_file(dir.file("one.jsonl")));
  for (const std::string form : {"", " --batching fixed", " --pipeline 2", " --pipeline 2 --batching fixed"}) {
    SCOPED_TRACE("mpirun -np 2" + form);
    std::filesystem::remove(dir.file("np2.jsonl"));
    const Result r = run(mpirun(2), "run " + job + form + " --out " + dir.file("np2.jsonl"), dir);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(sorted_lines(testing::read_file(dir.file("np2.jsonl"))), want);
    EXPECT_EQ(count(r.err, done), 1u) << r.err;
    EXPECT_THAT(r.err, HasSubstr("generated"));
  }
  for (const std::string form : {"", " --pipeline 2"}) {
    const Result quiet = run(mpirun(2), "run " + job + form + " --quiet --out " + dir.file("q.jsonl"), dir);
    ASSERT_EQ(quiet.code, 0) << quiet.err;
    EXPECT_EQ(count(quiet.err, "requests "), 0u) << quiet.err;
    std::filesystem::remove(dir.file("q.jsonl"));
  }
}

// The pid of `rank` among the processes mpirun (pid `launcher`) started, or -1.
pid_t rank_pid(pid_t launcher, int rank) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(text.substr(close + 2));
    char state = 0;
    pid_t parent = 0;
    fields >> state >> parent;
    if (parent != launcher) continue;
    std::ifstream env(e.path() / "environ");
    const std::string vars((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    if (vars.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') != std::string::npos)
      return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

// A job for the tests that signal its ranks, up to its --out path: blocks of one prompt, each a
// few tens of ms, so the job is under way when the signal comes.
std::string signalled_job(const testing::TempDir& dir) {
  testing::write_file(dir.file("in.jsonl"), token_prompts(16));
  return "run --model " + write_opt(dir, 6, 512) + " --dummy --prompts " + dir.file("in.jsonl") +
         " --gen-len 16 --gpu-batch-size 1 --out ";
}

// --share-prefill in every run mode, which drive one engine: a request's n choices share one
// prefill on the data-parallel rank that takes them (rank 0 deals a line's choices together)
// and on every pipeline stage (each stage forks the prefilled slot's KV rows of its own
// layers), as in one process. The out file is the one-process run's, and so is the count of
// prompt tokens computed, which is below the prompt tokens (with --share-prefill 0 every
// choice prefills its own), under continuous batching and fixed blocks (a block boundary cuts
// a request's choices apart; a data-parallel rank's blocks are those it is dealt, so there
// only the sharing is checked).
TEST(Mpi, SharesPrefillsAsOneProcess) {
  testing::TempDir dir;
  const char* prompts[] = {"Once upon a time", "The dog ran", "Lily and Tom went to the park", "One day"};
  std::string file;
  for (int i = 0; i < 7; ++i)
    file += completion("r" + std::to_string(i), {{"prompt", prompts[i % 4]}, {"max_tokens", 4 + (i * 5) % 9},
                                                {"temperature", 1.0}, {"n", 1 + i % 4}, {"seed", i}});
  testing::write_file(dir.file("batch.jsonl"), file);
  const std::string job = "run --prompts " + dir.file("batch.jsonl") + " --gpu-batch-size 2 --num-gpu-batches 2";
  // The prompt tokens and those computed, from --metrics.
  const auto counts = [&](const std::string& metrics) {
    const Json m = Json::parse(testing::read_file(metrics));
    return std::pair{m["prompt_tokens"].get<std::int64_t>(), m["prompt_tokens_computed"].get<std::int64_t>()};
  };
  for (const std::string batching : {"", " --batching fixed"}) {
    SCOPED_TRACE("batching:" + batching);
    const Result one = run("", job + batching + " --out " + dir.file("one.jsonl") + " --metrics " + dir.file("one.json"), dir);
    ASSERT_EQ(one.code, 0) << one.err;
    const auto [prompt_tokens, one_computed] = counts(dir.file("one.json"));
    ASSERT_LT(one_computed, prompt_tokens) << "the one-process run shares no prefill";
    for (const std::string form : {" --pipeline 2", ""}) {
      for (const int share : {1, 0}) {
        SCOPED_TRACE("mpirun -np 2" + form + " --share-prefill " + std::to_string(share));
        const std::string out = dir.file("np2-" + std::to_string(share) + ".jsonl");
        std::filesystem::remove(out);
        const Result r = run(mpirun(2), job + batching + form + " --share-prefill " + std::to_string(share) +
                                            " --out " + out + " --metrics " + dir.file("np2.json"), dir);
        ASSERT_EQ(r.code, 0) << r.err;
        expect_same_results(testing::read_file(out), testing::read_file(dir.file("one.jsonl")));
        const auto [np2_prompt_tokens, np2_computed] = counts(dir.file("np2.json"));
        EXPECT_EQ(np2_prompt_tokens, prompt_tokens);
        if (!share) EXPECT_EQ(np2_computed, prompt_tokens);
        else if (form.empty() && !batching.empty()) EXPECT_LT(np2_computed, prompt_tokens);
        else EXPECT_EQ(np2_computed, one_computed);
      }
    }
  }
}

// Requests behind four different 48-token prefixes, interleaved (A B C D A B C D ...), each
// with its own item of 3-7 tokens; the items' tokens in all.
constexpr int kDealtPrefixes = 4, kDealtPrefixTokens = 48, kDealtRequests = 40;
std::string interleaved_prefix_prompts(std::int64_t& item_tokens) {
  std::string in;
  item_tokens = 0;
  for (int i = 0; i < kDealtRequests; ++i) {
    const int prefix = i % kDealtPrefixes;
    in += "{\"id\": \"q" + std::to_string(i) + "\", \"tokens\": [1";
    for (int t = 1; t < kDealtPrefixTokens; ++t) in += ", " + std::to_string(5 + (150 * prefix + 7 * t) % 480);
    const int item = 3 + i % 5;
    for (int t = 0; t < item; ++t) in += ", " + std::to_string(5 + (31 * i + 17 * t) % 480);
    in += "]}\n";
    item_tokens += item;
  }
  return in;
}

// The job of interleaved_prefix_prompts (written to `dir`), 6 new tokens each, in `block`.
std::string interleaved_prefix_job(const testing::TempDir& dir, const std::string& block, std::int64_t& item_tokens) {
  testing::write_file(dir.file("in.jsonl"), interleaved_prefix_prompts(item_tokens));
  return "--prompts " + dir.file("in.jsonl") + " --gen-len 6" + block;
}

// `job` as one process and in `form`, the same file; the form's --metrics.
Json metrics_as_one_process(const std::string& job, const std::pair<int, std::string>& form,
                            const testing::TempDir& dir) {
  expect_same_output(job + " --metrics " + dir.file("m.json"), {form}, dir, kDealtRequests);
  return Json::parse(testing::read_file(dir.file("m.json")));
}

// Data-parallel ranks deal requests sharing a prefix to the rank that took it: over two ranks
// each prefix is computed about once, where dealing in the job's order gives each rank every
// prefix (rank 1's first deal, requests 0-4, holds all four, and so do rank 0's next four),
// so at least ranks x prefixes prefix computations. A prompt computes its whole prefix or none
// of it (48 tokens shared; the items differ from their first token). The out file is the
// one-process run's.
TEST(Mpi, DataParallelDealsSharedPrefixesToOneRank) {
  testing::TempDir dir;
  std::int64_t item_tokens = 0;
  const std::string job = interleaved_prefix_job(dir, " --gpu-batch-size 2 --num-gpu-batches 2", item_tokens);
  const Json m = metrics_as_one_process(job, {2, ""}, dir);  // the two ranks' run
  ASSERT_EQ(m["mode"], "data_parallel");
  const std::int64_t computed = m["prompt_tokens_computed"].get<std::int64_t>();
  const std::int64_t in_order_least = item_tokens + 2 * kDealtPrefixes * (kDealtPrefixTokens - 1);
  // Each prefix once, and twice more where one rank took the four first requests of one prefix
  // (its first deal) and the other all the rest before them, then a prefix of the other's.
  EXPECT_LE(computed, item_tokens + (kDealtPrefixes + 2) * kDealtPrefixTokens) << m.dump(2);
  EXPECT_LT(item_tokens + (kDealtPrefixes + 2) * kDealtPrefixTokens, in_order_least);
  // The KV the ranks' attention read: each request's decode step i (1 .. n - 1 of its n new
  // tokens) reads prompt + i - 1 slots, and each that took a prefix reads it in its extend
  // step, less what the members of a shared prefix's group after its first did not read (the
  // CPU reads a group's prefix once a call); stories260K keeps 5 layers x 2 x 4 kv heads x 8
  // f32 values = 1280 bytes a slot.
  std::int64_t slots = m["prefix_shared_tokens"].get<std::int64_t>();
  std::istringstream lines(testing::read_file(dir.file("np2.jsonl")));
  for (std::string l; std::getline(lines, l);) {
    const Json line = Json::parse(l);
    const std::int64_t i = std::stoll(line["id"].get<std::string>().substr(1));
    const std::int64_t prompt = kDealtPrefixTokens + 3 + i % 5, n = static_cast<std::int64_t>(line["tokens"].size());
    slots += (n - 1) * prompt + (n - 1) * (n - 2) / 2;
  }
  const std::int64_t saved = m["kv_read_bytes"]["shared_prefix_saved"].get<std::int64_t>();
  EXPECT_EQ(saved % 1280, 0);
  EXPECT_EQ(m["kv_read_bytes"]["total"].get<std::int64_t>() + saved, 1280 * slots);
  EXPECT_EQ(m["kv_read_bytes"]["by_tier"]["gpu"]["in_place"].get<std::int64_t>() + saved, 1280 * slots);
  // Without prefix sharing the ranks deal in order and compute every prompt token.
  const Result off = run(mpirun(2), "run " + job + " --prefix-sharing off --out " + dir.file("off.jsonl") +
                                        " --metrics " + dir.file("off.json"), dir);
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_EQ(sorted_lines(testing::read_file(dir.file("off.jsonl"))), sorted_lines(testing::read_file(dir.file("one.jsonl"))));
  const Json o = Json::parse(testing::read_file(dir.file("off.json")));
  EXPECT_EQ(o["prompt_tokens_computed"], o["prompt_tokens"]);
}

// A pipeline's stages copy shared prefixes (a pool held on some stages only would admit
// requests apart), where one process holds them once (4 families in 8 slots): the same file.
TEST(Mpi, PipelineSharesPrefixesAsOneProcess) {
  testing::TempDir dir;
  std::int64_t item_tokens = 0;
  const std::string job = interleaved_prefix_job(dir, " --gpu-batch-size 4 --num-gpu-batches 2", item_tokens);
  const Json pipeline = metrics_as_one_process(job, {2, " --pipeline 2"}, dir);
  ASSERT_EQ(pipeline["mode"], "pipeline");
  EXPECT_EQ(pipeline["kv_held"]["prefixes"], 0);
  EXPECT_GT(pipeline["prefix_shared_tokens"].get<std::int64_t>(), 0);
  const Result one = run("", "run " + job + " --out " + dir.file("held.jsonl") + " --metrics " + dir.file("one.json"), dir);
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(Json::parse(testing::read_file(dir.file("one.json")))["kv_held"]["prefixes"], kDealtPrefixes);
}

TEST(Mpi, JobWithAKilledRankResumesToTheSameFile) {
  testing::TempDir dir;
  const std::string job = signalled_job(dir);
  ASSERT_EQ(run("", job + dir.file("full.jsonl"), dir).code, 0);
  const std::string full = testing::read_file(dir.file("full.jsonl"));
  ASSERT_EQ(line_count(full), 16u);

  for (const std::string& form : {std::string(), std::string(" --pipeline 2")}) {
    SCOPED_TRACE("mpirun -np 2" + form);
    const std::string out = dir.file("part" + std::to_string(form.size()) + ".jsonl");
    const pid_t launcher = spawn_mpirun(dir, job + out + form);
    // Once rank 0 wrote a line (pipeline: rank 1 is the last stage), kill rank 1.
    pid_t victim = -1;
    for (int tries = 0; tries < 3000; ++tries) {
      if (victim < 0) victim = rank_pid(launcher, 1);
      if (victim > 0 && std::filesystem::exists(out) && std::filesystem::file_size(out) > 0) break;
      ::usleep(10000);
    }
    ASSERT_GT(victim, 0) << "rank 1 not found";
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    int status = 0;
    ::waitpid(launcher, &status, 0);
    EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a job with a killed rank succeeded";
    const std::string partial = testing::read_file(out);
    ASSERT_LT(line_count(partial), 16u) << "the job ended before the kill";
    expect_part_of(partial, full);

    const Result resumed = run(mpirun(2), job + out + form + " --resume", dir);
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    EXPECT_THAT(resumed.err, HasSubstr("resuming:"));
    EXPECT_EQ(sorted_lines(testing::read_file(out)), sorted_lines(full));
  }
}

// SIGINT to every rank (as a batch system's scancel --signal=INT delivers it): data parallel,
// each rank takes no further request and finishes those it is running; pipeline, the stages
// stop taking blocks (the ones in flight finish). Rank 0 writes what was finished and says so,
// the job exits 130, and --resume completes the file.
TEST(Mpi, InterruptedJobStopsAfterTheRunningBlocksAndResumes) {
  testing::TempDir dir;
  const std::string job = signalled_job(dir);
  ASSERT_EQ(run("", job + dir.file("full.jsonl"), dir).code, 0);
  const std::string full = testing::read_file(dir.file("full.jsonl"));
  for (const auto& [form, said] : {std::pair<std::string, std::string>{"", "the ranks stopped after"},
                                   {" --pipeline 2", "the pipeline stopped after"}}) {
    SCOPED_TRACE("mpirun -np 2" + form);
    const std::string out = dir.file("part" + std::to_string(form.size()) + ".jsonl");
    const pid_t launcher = spawn_mpirun(dir, job + out + form);
    pid_t ranks[2] = {-1, -1};
    for (int tries = 0; tries < 3000; ++tries) {
      for (int r = 0; r < 2; ++r)
        if (ranks[r] < 0) ranks[r] = rank_pid(launcher, r);
      if (ranks[0] > 0 && ranks[1] > 0 && std::filesystem::exists(out) && std::filesystem::file_size(out) > 0) break;
      ::usleep(10000);
    }
    ASSERT_TRUE(ranks[0] > 0 && ranks[1] > 0) << "ranks not found";
    for (const pid_t rank : ranks) ASSERT_EQ(::kill(rank, SIGINT), 0);
    int status = 0;
    ::waitpid(launcher, &status, 0);
    const std::string err = testing::read_file(dir.file("spawn.err"));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 130) << "status " << status << ": " << err;
    EXPECT_THAT(err, HasSubstr("flexh2o: interrupted: " + said));
    EXPECT_THAT(err, Not(HasSubstr("flexh2o: error")));
    const std::string partial = testing::read_file(out);
    ASSERT_LT(line_count(partial), 16u) << "the job ended before the interrupt";
    expect_part_of(partial, full);

    const Result resumed = run(mpirun(2), job + out + form + " --resume", dir);
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    EXPECT_EQ(sorted_lines(testing::read_file(out)), sorted_lines(full));
  }
}

// A failed run's one "flexh2o: error:" line (a failure when it exits 0, hangs, or prints none
// or several: every rank must end with one message between them).
std::string one_error_line(const Result& r) {
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.code, 124) << "hung or killed: " << r.err;
  std::vector<std::string> errors;
  std::istringstream lines(r.err);
  for (std::string l; std::getline(lines, l);)
    if (l.rfind("flexh2o: error: ", 0) == 0) errors.push_back(l);
  EXPECT_EQ(errors.size(), 1u) << r.err;
  return errors.empty() ? std::string() : errors.front();
}

// A given placement is checked on every data-parallel rank against its share of the memory
// before any weight loads: one "does not fit" line, no budget error from the loading.
TEST(Mpi, DataParallelPlacementBeyondARanksMemoryIsOneClearError) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"), token_prompts(4));
  const Result r = run(mpirun(2),
                       "run --model " + write_opt(dir, 4, 128) + " --dummy --prompts " + dir.file("in.jsonl") +
                           " --gen-len 4 --gpu-batch-size 1 --percent 100 0 100 0 100 0 --gpu-mem 64KiB --out " +
                           dir.file("out.jsonl"),
                       dir);
  const std::string error = one_error_line(r);
  EXPECT_THAT(error, HasSubstr("the placement given"));
  EXPECT_THAT(error, HasSubstr("gpu tier"));
}

TEST(Mpi, BadPromptOnOneRankEndsEveryRankWithOneError) {
  testing::TempDir dir;
  // Rank 0 checks every prompt before it deals any (data parallel) or plans the stages
  // (pipeline), while the others wait.
  testing::write_file(dir.file("in.jsonl"),
                      "{\"id\": \"ok1\", \"tokens\": [2, 5, 6]}\n{\"id\": \"bad\", \"tokens\": [2, 99999, 6]}\n"
                      "{\"id\": \"ok2\", \"tokens\": [2, 7, 8]}\n{\"id\": \"ok3\", \"tokens\": [2, 9, 10]}\n");
  const std::string offload = dir.file("offload");
  std::filesystem::create_directory(offload);
  const std::string job = "run --model " + write_opt(dir, 4, 128) + " --dummy --prompts " + dir.file("in.jsonl") +
                          " --gen-len 8 --gpu-batch-size 1 --percent 50 0 50 0 100 0 --offload-dir " + offload +
                          " --out " + dir.file("out.jsonl");
  for (const std::string& form : {std::string(), std::string(" --pipeline 2")}) {
    SCOPED_TRACE("mpirun -np 2" + form);
    const Result r = run(mpirun(2), job + form, dir);
    const std::string error = one_error_line(r);
    EXPECT_THAT(error, HasSubstr("\"bad\""));
    EXPECT_THAT(error, HasSubstr("99999"));
    EXPECT_TRUE(std::filesystem::is_empty(offload)) << "offload files left behind";
  }
}

}  // namespace
}  // namespace flexh2o
