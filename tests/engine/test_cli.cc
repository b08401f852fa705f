// The flexh2o binary end to end: outputs, exit codes and error lines.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <regex>
#include <set>
#include <nlohmann/json.hpp>
#include <map>
#include <sstream>

#include "engine/loaders/dummy_weights.h"
#include "engine/loaders/model_source.h"
#include "engine/model/weights.h"
#include "kernels/backend.h"
#include "tests/support/cli_run.h"
#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr std::string_view kCpuFallbackNotice = "flexh2o: no usable CUDA device (";

struct Result {
  int code;
  std::string out, err;
  std::string notice;  // the CPU-fallback notice, taken off the front of err
};

// `launcher`, when given, runs before the binary (e.g. a shell that moves itself into a cgroup).
Result run(const std::string& args, const std::string& launcher = "") {
  testing::TempDir dir;
  const std::string cmd = launcher + std::string(FLEXH2O_BINARY) + " " + args + " >" + dir.file("out") + " 2>" + dir.file("err") + " </dev/null";
  const int status = std::system(cmd.c_str());
  Result r{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), testing::read_file(dir.file("out")),
           testing::read_file(dir.file("err")), {}};
  // A CUDA build on a machine without a GPU says once that it uses the CPU (tested below).
  if (r.err.starts_with(kCpuFallbackNotice)) {
    r.notice = r.err.substr(0, r.err.find('\n') + 1);
    r.err.erase(0, r.notice.size());
  }
  return r;
}

using testing::expect_clean_error;

TEST(Cli, NoArgumentsRunsTheEmbeddedModel) {
  const Result r = run("");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("Once upon a time, there was a little girl named Lily."));
  EXPECT_THAT(r.err, HasSubstr("tok/s"));
}

TEST(Cli, BatchJobWritesOneLinePerPrompt) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"),
                      "{\"id\": \"a\", \"prompt\": \"Once upon a time\"}\n\n"
                      "{\"id\": 7, \"tokens\": [1, 403, 407]}\n"
                      "{\"id\": \"c\", \"prompt\": \"The dog\"}\n");
  const Result r = run("run --prompts " + dir.file("in.jsonl") + " --out " + dir.file("out.jsonl") +
                       " --batch 2 --gen-len 20");
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream lines(testing::read_file(dir.file("out.jsonl")));
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["id"], "a");
  EXPECT_EQ(rows[1]["id"], 7);
  EXPECT_EQ(rows[2]["id"], "c");
  for (const auto& row : rows) {
    EXPECT_FALSE(row["text"].get<std::string>().empty());
    EXPECT_GE(row["tokens"].size(), 1u);
    EXPECT_LE(row["tokens"].size(), 20u);
  }
}

// A prompts line's max_tokens is that request's limit; the others get --gen-len. A field the
// reader does not know is an error naming it, never ignored.
TEST(Cli, APromptsLineCarriesItsOwnMaxTokens) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"),
                      "{\"id\": 1, \"tokens\": [1, 403], \"max_tokens\": 3}\n"
                      "{\"id\": 2, \"tokens\": [1, 407]}\n"
                      "{\"id\": 3, \"prompt\": \"The dog\", \"max_tokens\": 1}\n");
  const Result r = run("run --prompts " + dir.file("in.jsonl") + " --out " + dir.file("out.jsonl") +
                       " --batch 3 --gen-len 9 --ignore-eos");
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream lines(testing::read_file(dir.file("out.jsonl")));
  std::map<int, std::size_t> tokens_of;
  for (std::string line; std::getline(lines, line);) {
    const auto row = nlohmann::json::parse(line);
    tokens_of[row["id"].get<int>()] = row["tokens"].size();
  }
  EXPECT_EQ(tokens_of, (std::map<int, std::size_t>{{1, 3}, {2, 9}, {3, 1}}));

  testing::write_file(dir.file("bad.jsonl"), "{\"id\": 1, \"tokens\": [1], \"temperature\": 0.5}\n");
  expect_clean_error(run("run --prompts " + dir.file("bad.jsonl") + " --gen-len 2"), "unknown field 'temperature'");
  testing::write_file(dir.file("zero.jsonl"), "{\"id\": 1, \"tokens\": [1], \"max_tokens\": 0}\n");
  expect_clean_error(run("run --prompts " + dir.file("zero.jsonl") + " --gen-len 2"), "'max_tokens' must be an integer");
}

TEST(Cli, BackendChoiceWithoutAGpu) {
  const std::string why = kernels::cuda_unavailable_reason();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is usable here";
  const Result r = run("run --gen-len 2 --batch 2");
  ASSERT_EQ(r.code, 0) << r.err;
  // auto: the CPU, said once when CUDA is compiled in, not at all otherwise.
  EXPECT_EQ(r.notice.empty(), !kernels::cuda_compiled()) << r.notice;
  EXPECT_EQ(r.err.find(kCpuFallbackNotice), std::string::npos) << r.err;
  expect_clean_error(run("run --backend cuda --gen-len 2"), "cuda");
  EXPECT_EQ(run("run --backend cpu --gen-len 2").code, 0);
}

TEST(Cli, DummyModelOfAnyConfiguredShape) {
  const Result r = run("run --model opt-125m --dummy --batch 2 --prompt-len 5 --gen-len 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("dummy weights"));
}

TEST(Cli, BadInputGivesOneClearError) {
  testing::TempDir dir;
  testing::write_file(dir.file("bad.jsonl"), "{\"id\": 1, \"prompt\": \"ok\"}\n{\"id\": 2, \"prompt\": \n");
  expect_clean_error(run("run --prompts " + dir.file("bad.jsonl")), "bad.jsonl:2");
  testing::write_file(dir.file("noid.jsonl"), "{\"prompt\": \"x\"}\n");
  expect_clean_error(run("run --prompts " + dir.file("noid.jsonl")), "'id'");
  expect_clean_error(run("run --gen-len 600"), "positions");
  expect_clean_error(run("run --model /nonexistent/model"), "/nonexistent/model");
  expect_clean_error(run("run --model opt-125m"), "--dummy");
  testing::write_file(dir.file("config.json"), "{\"model_type\": \"bloom\"}");
  expect_clean_error(run("run --model " + dir.path()), "bloom");
  expect_clean_error(run("run --out /nonexistent-dir/out.jsonl --gen-len 2"), "/nonexistent-dir/out.jsonl");
  const Result unknown = run("run --no-such-flag");
  EXPECT_NE(unknown.code, 0);
  EXPECT_LT(unknown.code, 128);
}

TEST(Cli, TieredRunGeneratesWhatTheInMemoryRunDoes) {
  testing::TempDir dir;
  const std::string offload = dir.file("offload");
  ASSERT_EQ(std::system(("mkdir " + offload).c_str()), 0);
  const Result plain = run("run --gen-len 40");
  const Result tiered = run("run --gen-len 40 --percent 30 30 30 30 100 0 --offload-dir " + offload + " --metrics " +
                            dir.file("m.json") + " --trace " + dir.file("t.json"));
  ASSERT_EQ(tiered.code, 0) << tiered.err;
  EXPECT_EQ(tiered.out, plain.out);
  EXPECT_TRUE(std::filesystem::is_empty(offload)) << "offload files left behind";
  const auto m = nlohmann::json::parse(testing::read_file(dir.file("m.json")));
  for (const char* key : {"prefill_throughput", "decode_throughput", "total_throughput", "time_by_primitive"})
    EXPECT_TRUE(m.contains(key)) << key;
  EXPECT_GT(m["peak_bytes"]["disk"].get<std::int64_t>(), 0);
  EXPECT_GT(m["peak_bytes"]["cpu"].get<std::int64_t>(), 0);
  EXPECT_GT(m["time_by_primitive"]["load_weight"].get<double>(), 0.0);
  const auto t = nlohmann::json::parse(testing::read_file(dir.file("t.json")));
  std::set<std::string> tracks;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "M") tracks.insert(e["args"]["name"].get<std::string>());
  EXPECT_TRUE(tracks.count("compute") && tracks.count("copy: weights in")) << t.dump().substr(0, 400);
}

// --resident-embeddings 1: the embedding and head (tied in stories260K) stay wholly in memory
// while --percent puts the layers on disk; same text as the in-memory run, and the report and
// --metrics say the placement.
TEST(Cli, ResidentEmbeddingsGenerateWhatTheInMemoryRunDoes) {
  testing::TempDir dir;
  const Result plain = run("run --gen-len 24");
  const Result r = run("run --gen-len 24 --resident-embeddings 1 --percent 0 0 100 0 100 0 --offload-dir " +
                       dir.path() + " --metrics " + dir.file("m.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, plain.out);
  EXPECT_THAT(r.err, HasSubstr("(embeddings and head resident)"));
  const auto m = nlohmann::json::parse(testing::read_file(dir.file("m.json")));
  EXPECT_TRUE(m["policy"]["resident_embeddings"].get<bool>());
  EXPECT_GT(m["peak_bytes"]["gpu"].get<std::int64_t>(), 0);
  EXPECT_GT(m["peak_bytes"]["disk"].get<std::int64_t>(), 0);
}

// A dummy Mixtral-shaped model with its weights on cpu and disk: loading only the routed
// experts generates what loading all of them does, and --metrics and --trace tell how many
// experts each step fetched and their bytes (one sequence: at most top-2 per layer and step).
TEST(Cli, RoutedExpertLoadingIsReportedAndGeneratesWhatAllExpertsDo) {
  testing::TempDir dir;
  testing::write_file(dir.file("moe.yaml"),
                      "name: tiny-mixtral\nfamily: mixtral\nnum_layers: 2\nhidden_size: 64\nffn_size: 96\n"
                      "num_heads: 4\nnum_kv_heads: 2\nvocab_size: 97\nmax_positions: 128\ndtype: f32\n"
                      "num_experts: 8\nexperts_per_token: 2\nexpert_ffn_size: 96\n");
  const std::string common = "run --model " + dir.file("moe.yaml") + " --dummy --batch 1 --prompt-len 4 --gen-len 5 " +
                             "--percent 0 50 100 0 100 0 --offload-dir " + dir.path();
  const Result all = run(common + " --expert-loading all --metrics " + dir.file("all.json"));
  const Result routed = run(common + " --expert-loading routed --metrics " + dir.file("routed.json") + " --trace " +
                            dir.file("t.json"));
  ASSERT_EQ(routed.code, 0) << routed.err;
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_EQ(routed.out, all.out);
  // One sequence routes to top-2 experts a decode step: the staging slots hold 2 of 8.
  EXPECT_THAT(routed.err, HasSubstr("experts: routed loading, 2 per staging slot; per step"));
  EXPECT_EQ(nlohmann::json::parse(testing::read_file(dir.file("routed.json")))["policy"]["expert_slots"], 2);
  const std::int64_t expert_bytes = 3 * 96 * 64 * 4;
  const auto a = nlohmann::json::parse(testing::read_file(dir.file("all.json")))["experts"];
  const auto r = nlohmann::json::parse(testing::read_file(dir.file("routed.json")))["experts"];
  EXPECT_EQ(a["loaded_by_step"], nlohmann::json({16, 16, 16, 16, 16}));
  EXPECT_EQ(a["decode_bytes_per_token"].get<std::int64_t>(), 16 * expert_bytes);
  const std::vector<std::int64_t> loaded = r["loaded_by_step"];
  ASSERT_EQ(loaded.size(), 5u);
  for (std::size_t s = 1; s < loaded.size(); ++s) EXPECT_EQ(loaded[s], 4) << "step " << s;
  EXPECT_EQ(r["bytes"].get<std::int64_t>(), std::accumulate(loaded.begin(), loaded.end(), std::int64_t{0}) * expert_bytes);
  std::int64_t traced = 0;
  const auto trace = nlohmann::json::parse(testing::read_file(dir.file("t.json")));
  for (const auto& e : trace["traceEvents"])
    if (e.value("cat", "") == "load_experts") traced += e["args"]["bytes"].get<std::int64_t>();
  EXPECT_EQ(traced, r["bytes"].get<std::int64_t>());
}

// 4-bit weights and KV with eviction: lossy against fp32, but the tiered run with the same
// compression generates exactly what the all-in-memory one does, and leaves no files.
TEST(Cli, CompressedTieredRunGeneratesWhatTheCompressedInMemoryRunDoes) {
  testing::TempDir dir;
  const std::string offload = dir.file("offload");
  ASSERT_EQ(std::system(("mkdir " + offload).c_str()), 0);
  const std::string common = "run --gen-len 40 --batch 3 --compress-weight --compress-cache --kv h2o:0.5";
  const Result plain = run(common);
  const Result tiered = run(common + " --gpu-batch-size 2 --num-gpu-batches 2 --percent 20 40 30 30 100 0 "
                            "--offload-dir " + offload + " --metrics " + dir.file("m.json"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(tiered.code, 0) << tiered.err;
  EXPECT_EQ(tiered.out, plain.out);
  EXPECT_THAT(plain.err, HasSubstr("q4 weights"));
  EXPECT_THAT(plain.err, HasSubstr("cache q4"));
  EXPECT_TRUE(std::filesystem::is_empty(offload)) << "offload files left behind";
  const auto m = nlohmann::json::parse(testing::read_file(dir.file("m.json")));
  EXPECT_TRUE(m["policy"]["compress_weight"].get<bool>());
  // Compression changes the text of the tiny model, but it still generates 40 tokens a prompt.
  const Result full = run("run --gen-len 40 --batch 3");
  EXPECT_NE(full.out, plain.out);
  const Result bits = run("run --compress-bits 3");
  EXPECT_NE(bits.code, 0);
  EXPECT_THAT(bits.err, HasSubstr("--compress-bits: 3 not in {4,8}"));
}

// Under a KV policy the report's cache size is what the rows hold: the budget's slots (h2o:8
// keeps 8 tokens and a slot for the newest), not every token of the longest sequence.
TEST(Cli, CacheSizeUnderEvictionIsTheBudgets) {
  testing::TempDir dir;
  const std::string common = "run --gen-len 16 --batch 2 --gpu-batch-size 2 --num-gpu-batches 1 --metrics ";
  const Result full = run(common + dir.file("full.json"));
  const Result evicting = run(common + dir.file("kv.json") + " --kv h2o:8");
  ASSERT_EQ(full.code, 0) << full.err;
  ASSERT_EQ(evicting.code, 0) << evicting.err;
  const auto f = nlohmann::json::parse(testing::read_file(dir.file("full.json")));
  const auto e = nlohmann::json::parse(testing::read_file(dir.file("kv.json")));
  const std::int64_t longest = f["prompt_tokens"].get<std::int64_t>() / 2 + 16;  // one prompt, twice
  ASSERT_GT(longest, 9);
  EXPECT_EQ(e["cache_bytes"].get<std::int64_t>() * longest, f["cache_bytes"].get<std::int64_t>() * 9);
}

// A planned job measures the machine's GEMMs at start (tens of GFLOP on the CPU backend); the
// report's kernels are the job's own: at most 2 x parameters FLOPs a token (the f32 embedded
// model: model_bytes / 4 parameters).
TEST(Cli, KernelsReportedAreTheJobsNotTheMeasurementsAtStart) {
  testing::TempDir dir;
  const Result r = run("run --batch 2 --gen-len 8 --metrics " + dir.file("m.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("GEMMs measured now"));
  const auto m = nlohmann::json::parse(testing::read_file(dir.file("m.json")));
  std::int64_t flops = 0;
  for (const auto& path : m["kernels"]["gemm"]) flops += path["flops"].get<std::int64_t>();
  const std::int64_t tokens = m["prompt_tokens"].get<std::int64_t>() + m["generated_tokens"].get<std::int64_t>();
  EXPECT_GT(flops, 0);
  EXPECT_LE(flops, 2 * m["model_bytes"].get<std::int64_t>() / 4 * tokens);
}

TEST(Cli, ZigZagBlocksGenerateWhatOneBatchDoes) {
  const std::string common = "run --prompt 'The dog' --temperature 0.8 --gen-len 30 --batch 5";
  const Result plain = run(common);
  const Result zigzag = run(common + " --gpu-batch-size 2 --num-gpu-batches 2 --percent 50 20 40 30 60 20 --overlap 1");
  const Result inline_ = run(common + " --gpu-batch-size 3 --num-gpu-batches 1 --percent 0 100 0 100 0 100 --overlap 0 "
                                      "--sep-layer 0 --cpu-cache-compute");
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(zigzag.out, plain.out) << zigzag.err;
  EXPECT_EQ(inline_.out, plain.out) << inline_.err;
  EXPECT_THAT(zigzag.err, HasSubstr("gpu batch 2 x 2 batches"));
}

TEST(Cli, BadPlacementGivesOneClearError) {
  testing::TempDir dir;
  expect_clean_error(run("run --gpu-mem 10KiB"), "gpu tier");
  expect_clean_error(run("run --percent 0 10 100 0 100 0 --cpu-mem 20KiB"), "cpu tier");
  expect_clean_error(run("run --percent 80 30 100 0 100 0"), "percent");
  expect_clean_error(run("run --gpu-mem 12XB"), "--gpu-mem");
  testing::write_file(dir.file("typo.yaml"), "gpu_batch_size: 4\nnum_gpu_batchs: 2\n");
  expect_clean_error(run("run --policy " + dir.file("typo.yaml")), "num_gpu_batchs");
  testing::write_file(dir.file("compress.yaml"), "compress_weight: true\ncompress_bits: 2\n");
  expect_clean_error(run("run --policy " + dir.file("compress.yaml")), "compress_bits");
  testing::write_file(dir.file("file"), "x");
  expect_clean_error(run("run --percent 0 0 100 0 100 0 --offload-dir " + dir.file("file") + "/sub"), dir.file("file"));
}

TEST(Cli, EvalComparesPoliciesWithTheFullCache) {
  testing::TempDir dir;
  testing::write_file(dir.file("text.txt"),
                      "Once upon a time, there was a little dog named Max. Max liked to run in the park with his "
                      "friend Tom. One day they found a big red ball under a tree.\n\n  \n"
                      "Lily had a cat. The cat was very soft and liked to sleep in the sun all day long.\n");
  const Result r = run("eval --text " + dir.file("text.txt") + " --kv full,h2o:0.5,local:8 --csv " + dir.file("q.csv"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 chunks"));
  EXPECT_THAT(r.out, HasSubstr("| full | "));
  EXPECT_THAT(r.out, HasSubstr("| 1.0000 | 0.00000 |"));  // full against itself
  EXPECT_THAT(r.out, HasSubstr("| h2o:0.5 | "));
  const std::string csv = testing::read_file(dir.file("q.csv"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4) << csv;
  // Each policy under each compression mode; the reference stays the uncompressed full cache.
  const Result c = run("eval --text " + dir.file("text.txt") + " --kv full,h2o:0.5 --compress none,cache,both");
  ASSERT_EQ(c.code, 0) << c.err;
  for (const char* row : {"| full | ", "| full + 4-bit cache | ", "| full + 4-bit both | ", "| h2o:0.5 + 4-bit cache | "})
    EXPECT_THAT(c.out, HasSubstr(row));
  expect_clean_error(run("eval --text " + dir.file("text.txt") + " --compress zip"), "zip");
  expect_clean_error(run("eval --text " + dir.file("text.txt") + " --kv h2o:fast"), "h2o:fast");
  expect_clean_error(run("eval --text " + dir.file("missing.txt")), "missing.txt");
}

TEST(Cli, PlanIsADryRunWhosePolicyRunAccepts) {
  testing::TempDir dir;
  const std::string t4 = std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/t4-gcp.yaml";
  const Result r = run("plan --model opt-30b --hardware " + t4 + " --prompt-len 512 --gen-len 32 --explain --out " +
                       dir.file("p.yaml"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("policy: gpu batch"));
  EXPECT_THAT(r.out, HasSubstr("predicted:"));
  EXPECT_THAT(r.out, HasSubstr("bottleneck:"));
  // The written policy is what run --policy reads (on a small model here).
  const Result ran = run("run --policy " + dir.file("p.yaml") + " --batch 2 --gen-len 4");
  EXPECT_EQ(ran.code, 0) << ran.err;
  const Result again = run("plan --model opt-30b --hardware " + t4 + " --policy " + dir.file("p.yaml"));
  EXPECT_EQ(again.code, 0) << again.err;
  expect_clean_error(run("plan --model opt-175b --hardware " + t4 + " --cpu-mem 16GB --disk-mem 100GB"), "--disk-mem >=");
  // Compressed: the plan says so, and writes it into the policy.
  const Result q4 = run("plan --model opt-30b --hardware " + t4 + " --compress-weight --compress-cache --out " +
                        dir.file("q4.yaml"));
  ASSERT_EQ(q4.code, 0) << q4.err;
  EXPECT_THAT(q4.out, HasSubstr("weights q4, cache q4"));
  EXPECT_THAT(testing::read_file(dir.file("q4.yaml")), HasSubstr("compress_weight: true"));
  expect_clean_error(run("plan --model opt-30b --hardware " + dir.file("nope.yaml")), "nope.yaml");
}

// Without --hardware the first run (or plan) of a model on a machine measures that model's
// layer, head and decode attention rates (and that attention's read share) and keeps them per machine and model shape in
// $XDG_CACHE_HOME/flexh2o/calibration; the next one reads them; a cache that cannot be written
// is measured around, and the run goes on.
TEST(Cli, FirstRunMeasuresTheModelsRatesAndLaterRunsReuseThem) {
  testing::TempDir dir;
  const std::string cache = "XDG_CACHE_HOME=" + dir.file("cache") + " ";
  const std::string kept = dir.file("cache") + "/flexh2o/calibration";
  const Result first = run("plan --model stories260k --prompt-len 16 --gen-len 8", cache);
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_THAT(first.out, HasSubstr("decode attention and host rates measured now in"));
  EXPECT_THAT(first.out, HasSubstr("kept in " + kept + "/"));
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(kept)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  const std::string rates = testing::read_file(files[0].string());
  EXPECT_THAT(rates, HasSubstr("hidden 64 "));
  EXPECT_THAT(rates, HasSubstr("\"attn_decode_by_len\""));
  // The share of decode attention's time that reads the K/V, this model's (a shared prefix read
  // once saves it), not the built-in profile's.
  const double read_share = nlohmann::json::parse(rates).at("attn_decode_read_share").get<double>();
  EXPECT_GE(read_share, 0.0);
  EXPECT_LE(read_share, 1.0);
  const Result ran = run("run --batch 2 --gen-len 4", cache);
  ASSERT_EQ(ran.code, 0) << ran.err;
  EXPECT_THAT(ran.err, HasSubstr("partly calibrated"));
  EXPECT_EQ(testing::read_file(files[0].string()), rates) << "read, not measured again";
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(kept), std::filesystem::directory_iterator()), 1)
      << "the embedded model and the built-in config of its shape share their rates";
  const Result again = run("plan --model stories260k --prompt-len 16 --gen-len 8", cache);
  EXPECT_THAT(again.out, HasSubstr("measured on this machine before (" + files[0].string() + ")"));
  // A cache where no directory can be made: measured, said, and the run goes on.
  testing::write_file(dir.file("a-file"), "");
  const Result unwritable = run("run --batch 2 --gen-len 4 --metrics " + dir.file("m.json"),
                                "XDG_CACHE_HOME=" + dir.file("a-file") + " ");
  ASSERT_EQ(unwritable.code, 0) << unwritable.err;
  const Result plan = run("plan --model stories260k --prompt-len 16 --gen-len 8",
                          "XDG_CACHE_HOME=" + dir.file("a-file") + " ");
  EXPECT_THAT(plan.out, HasSubstr("could not be written: they are measured again next run"));
}

// Under continuous batching the report's prefill is every step that prefilled (a newcomer's
// prompt rows, the other slots' decode rows beside them), not the first step alone: 12 prompts
// of 40 tokens in 4 slots at 40 prompt tokens a step join one a step, each in a step of its own.
TEST(Cli, ContinuousReportCountsEveryPrefillStep) {
  testing::TempDir dir;
  std::string prompts;
  for (int i = 0; i < 12; ++i) {
    std::string tokens = "1";
    for (int t = 1; t < 40; ++t) tokens += ", " + std::to_string(3 + (i * 7 + t * 13) % 500);
    prompts += "{\"id\": " + std::to_string(i) + ", \"tokens\": [" + tokens + "]}\n";
  }
  testing::write_file(dir.file("in.jsonl"), prompts);
  const Result r = run("run --prompts " + dir.file("in.jsonl") + " --gen-len 6 --ignore-eos --gpu-batch-size 4 " +
                       "--batching continuous --prefill-budget 40 --metrics " + dir.file("m.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("prefill (12 steps with prompt rows): "));
  const auto m = nlohmann::json::parse(testing::read_file(dir.file("m.json")));
  EXPECT_EQ(m.at("prompt_tokens"), 12 * 40);
  EXPECT_EQ(m.at("generated_tokens"), 12 * 6);
  EXPECT_EQ(m.at("prefill_steps"), 12);
  // Requests 0-3 join in steps 0-3, 4-7 in steps 6-9 (each the step after one ends: 6 steps
  // each), 8-11 in steps 12-15; the last ends with step 20. Decode-only: 4, 5, 10, 11, 16-20.
  EXPECT_EQ(m.at("decode_steps"), 9);
  const double prefill = m.at("prefill_seconds").get<double>(), decode = m.at("decode_seconds").get<double>();
  ASSERT_GT(prefill, 0);
  ASSERT_GT(decode, 0);
  EXPECT_NEAR(m.at("prefill_throughput").get<double>(), 12 * 40 / prefill, 1e-9 * 12 * 40 / prefill);
  // The decode-only steps' tokens: one per busy slot (4 in each but the last three: 3, 2, 1).
  const auto decode_tokens = m.at("decode_tokens").get<std::int64_t>();
  EXPECT_EQ(decode_tokens, 6 * 4 + 3 + 2 + 1);
  EXPECT_NEAR(m.at("decode_throughput").get<double>(), static_cast<double>(decode_tokens) / decode,
              1e-9 * static_cast<double>(decode_tokens) / decode);
  EXPECT_LE(prefill + decode, m.at("wall_seconds").get<double>() * 1.001 + 1e-3);
}

// The planner plans a continuous job for its requests' lengths, and run --explain sets its
// prediction (tok/s, step time, memory per tier) beside what the run measured; --metrics
// carries both. plan takes the means on the command line, checked.
TEST(Cli, RunExplainSetsThePredictionBesideTheMeasurement) {
  testing::TempDir dir;
  std::string prompts;
  for (int i = 0; i < 12; ++i)
    prompts += "{\"id\": " + std::to_string(i) + ", \"tokens\": [1, " + std::to_string(7 + i) + ", 9], \"max_tokens\": " +
               std::to_string(4 + (i * 5) % 17) + "}\n";
  testing::write_file(dir.file("in.jsonl"), prompts);
  const Result r = run("run --prompts " + dir.file("in.jsonl") + " --gen-len 24 --explain --metrics " + dir.file("m.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("predicted generated"));
  EXPECT_THAT(r.err, HasSubstr("predicted vs measured (measured / predicted):"));
  EXPECT_THAT(r.err, HasSubstr("  generated tok/s: "));
  EXPECT_THAT(r.err, HasSubstr("  mean step: "));
  EXPECT_THAT(r.err, HasSubstr("  of the job: steps that prefilled "));
  EXPECT_THAT(r.err, HasSubstr("  peak memory: gpu "));
  const auto m = nlohmann::json::parse(testing::read_file(dir.file("m.json")));
  EXPECT_EQ(m.at("predicted").at("batching"), "continuous");
  for (const char* side : {"predicted", "measured"}) {
    EXPECT_GT(m.at(side).at("throughput").get<double>(), 0) << side;
    EXPECT_GT(m.at(side).at("step_seconds").get<double>(), 0) << side;
    EXPECT_GT(m.at(side).at("peak_bytes").at("gpu").get<std::int64_t>(), 0) << side;
  }
  EXPECT_GT(m.at("measured").at("prefill_seconds").get<double>(), 0);  // the steps that prefilled
  EXPECT_GT(m.at("measured").at("decode_seconds").get<double>(), 0);
  // The plan again at the lengths the requests generated: no more than their limits take.
  EXPECT_THAT(r.err, HasSubstr("  at the lengths the requests generated (the plan counts each to its max_tokens): "));
  const auto& at_lengths = m.at("predicted_at_lengths");
  EXPECT_GT(at_lengths.at("throughput").get<double>(), 0);
  EXPECT_LE(at_lengths.at("job_seconds").get<double>(), m.at("predicted").at("job_seconds").get<double>() * (1 + 1e-9));
  const Result fixed = run("run --prompts " + dir.file("in.jsonl") + " --gen-len 24 --batching fixed --explain");
  ASSERT_EQ(fixed.code, 0) << fixed.err;
  EXPECT_THAT(fixed.err, HasSubstr("  total tok/s: "));
  EXPECT_THAT(fixed.err, HasSubstr("  per block: prefill "));
  EXPECT_THAT(fixed.err, HasSubstr("  decode step: "));

  const std::string plan = "plan --model opt-1.3b --hardware ci-cpu --cpu-mem 4GiB --gpu-mem 4GiB --prompt-len 512 --gen-len 512";
  const Result means = run(plan + " --mean-prompt-len 70 --mean-gen-len 250 --explain");
  ASSERT_EQ(means.code, 0) << means.err;
  EXPECT_THAT(means.out, HasSubstr("prompt 512 (mean 70.0) + gen 512 (mean 250.0), continuous batching"));
  EXPECT_THAT(means.out, HasSubstr("tok/s generated (continuous batching), mean step"));
  expect_clean_error(run(plan + " --mean-prompt-len 600"), "--mean-prompt-len 600 is above --prompt-len 512");
  expect_clean_error(run(plan + " --mean-gen-len 100 --batching fixed"), "--mean-gen-len is for continuous batching");
  // A job behind one shared 400-token prefix: computed once, held once (blocks of 12 fit, not 4);
  // faster than without.
  const std::string job = "plan --model opt-1.3b --hardware ci-cpu --cpu-mem 5GiB --gpu-mem 5GiB --prompt-len 512 "
                          "--gen-len 512 --mean-prompt-len 480 --mean-gen-len 250";
  const Result shared = run(job + " --shared-prefix 400 --explain"), whole = run(job);
  ASSERT_EQ(shared.code, 0) << shared.err;
  ASSERT_EQ(whole.code, 0) << whole.err;
  EXPECT_THAT(shared.out, HasSubstr("400 tokens of each from 1 shared prefix held once, continuous batching"));
  EXPECT_THAT(shared.out, HasSubstr("prefixes held once"));
  EXPECT_THAT(shared.out, HasSubstr(", prefix pool on "));  // the plan names the pool's tier
  EXPECT_THAT(shared.out, HasSubstr("| ccc | prefix pool |"));
  EXPECT_THAT(whole.out, Not(HasSubstr("prefix pool")));
  auto predicted = [](const std::string& out) {
    const auto at = out.find("predicted: ");
    return at == std::string::npos ? 0.0 : std::stod(out.substr(at + 11));
  };
  EXPECT_GT(predicted(shared.out), predicted(whole.out));
  expect_clean_error(run(plan + " --prefix-families 2"), "--prefix-families needs --shared-prefix");
  expect_clean_error(run(job + " --shared-prefix 480"), "--shared-prefix 480 must be below the mean prompt (480.0");
  expect_clean_error(run(plan + " --shared-prefix 100 --batching fixed"), "--shared-prefix is for continuous batching");
  expect_clean_error(run(job + " --shared-prefix 100 --kv h2o:0.2"), "--shared-prefix: prefix sharing is off here");
  const Result zero = run(plan + " --mean-gen-len zero");
  EXPECT_NE(zero.code, 0);
  EXPECT_THAT(zero.err, HasSubstr("--mean-gen-len: Value zero not in range"));
}

TEST(Cli, CalibrateWritesAProfilePlanReads) {
  testing::TempDir dir;
  // With --model it times that model's decoder layer and head as the engine runs them.
  testing::write_file(dir.file("model.yaml"),
                      "name: tiny-opt\nfamily: opt\nnum_layers: 2\nhidden_size: 128\nffn_size: 512\n"
                      "num_heads: 4\nvocab_size: 1000\nmax_positions: 128\ndtype: f16\ntie_embeddings: true\n"
                      "bos_token_id: 2\neos_token_id: []\n");
  const Result c = run("calibrate --quick --model " + dir.file("model.yaml") + " --offload-dir " + dir.path() +
                       " --out " + dir.file("hw.yaml"));
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string profile = testing::read_file(dir.file("hw.yaml"));
  // Every GEMM in the compute dtype a run of those rows computes in (--compute-dtype auto for
  // the model's f16 matrices on this CPU), as the unit curves are.
  auto cpu = kernels::make_cpu_backend();
  const engine::Bf16Speed bf16 = engine::bf16_speed(*cpu, kernels::DType::F16);
  std::string by_rows;
  for (const std::int64_t rows : {1, 4, 16, 64, 256}) {
    const std::string dtype(kernels::dtype_name(engine::job_compute_dtype("auto", kernels::DType::F16, bf16, rows).dtype));
    const std::string m = std::to_string(rows);
    EXPECT_THAT(c.err, HasSubstr("gemm curve m=" + m + " n=k=128 f16 weights, " + dtype + " compute"));
    by_rows += (by_rows.empty() ? "" : ", ") + m + " " + dtype;
  }
  EXPECT_THAT(profile, HasSubstr("GEMMs of f16 weights in the compute dtype --compute-dtype auto gives each row count (" +
                                 by_rows + ")"));
  EXPECT_THAT(c.err, HasSubstr("decoder layer, 64 rows, "));
  // Decode attention over as many sequences as the quick plan's 128 MiB copy size holds the K and
  // V of (4 kv heads x 32 values in f16), read from memory as a job's batch reads them: 8
  // sequences' fit a last-level cache, which reads them 2-3x faster.
  const std::regex decode_line(R"(attention decode (\d+) seqs x (\d+) cached, 4 heads x 32, f16 cache)");
  int decode_lines = 0;
  for (std::sregex_iterator m(c.err.begin(), c.err.end(), decode_line), end; m != end; ++m, ++decode_lines)
    EXPECT_GE(2 * std::stoll((*m)[1]) * std::stoll((*m)[2]) * 4 * 32 * 2, std::int64_t{128} << 20) << m->str();
  EXPECT_GT(decode_lines, 0) << c.err;
  // The read share of decode attention, from 32 sequences reading one prefix once and plainly.
  EXPECT_THAT(c.err, HasSubstr("attention decode 32 seqs x 256 cached over "));
  EXPECT_THAT(c.err, HasSubstr("255 shared read once"));
  EXPECT_THAT(profile, HasSubstr("layer_tflops_by_rows: {1: "));
  EXPECT_THAT(profile, HasSubstr("head_tflops_by_rows: {1: "));
  const Result p = run("plan --model opt-125m --hardware " + dir.file("hw.yaml") + " --prompt-len 64 --gen-len 8");
  EXPECT_EQ(p.code, 0) << p.err;
  const Result a = run("run --policy auto --hardware " + dir.file("hw.yaml") + " --gen-len 8");
  EXPECT_EQ(a.code, 0) << a.err;
  EXPECT_THAT(a.err, HasSubstr("planned for"));
}

TEST(Cli, BenchComparesSystemsOnOneWorkload) {
  testing::TempDir dir;
  testing::write_file(dir.file("model.yaml"),
                      "name: bench-opt\nfamily: opt\nnum_layers: 2\nhidden_size: 128\nffn_size: 512\n"
                      "num_heads: 4\nvocab_size: 1000\nmax_positions: 128\ndtype: f16\ntie_embeddings: true\n"
                      "bos_token_id: 2\neos_token_id: []\n");
  const Result r = run("bench --model " + dir.file("model.yaml") + " --prompt-len 16 --gen-len 4 --gpu-mem 2MiB " +
                       "--max-batch 8 --hardware " + std::string(FLEXH2O_SOURCE_DIR) +
                       "/configs/hardware/ci-cpu.yaml --out-dir " + dir.file("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* system : {"| accelerate |", "| zero |", "| flexgen |", "| flexgen+h2o |", "| flexgen+4bit |"})
    EXPECT_THAT(r.out, HasSubstr(system));
  const std::string csv = testing::read_file(dir.file("out/results.csv"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 6) << csv;
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    EXPECT_GT(std::filesystem::file_size(dir.file("out/throughput.png")), 1000u);
  }
  expect_clean_error(run("bench --model " + dir.file("model.yaml") + " --systems flexgen+8bit --hardware " +
                         std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/ci-cpu.yaml --out-dir " + dir.file("o3")),
                     "flexgen+8bit");
  expect_clean_error(run("bench --model " + dir.file("model.yaml") + " --systems vllm --hardware " +
                         std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/ci-cpu.yaml --out-dir " + dir.file("o2")),
                     "vllm");
}

TEST(Cli, Llama2cModelFindsItsTokenizerBesideIt) {
  testing::TempDir dir;
  const std::string models = std::string(FLEXH2O_SOURCE_DIR) + "/models/stories260K/";
  std::filesystem::copy_file(models + "stories260K.bin", dir.file("stories260K.bin"));
  std::filesystem::copy_file(models + "tok512.bin", dir.file("tok512.bin"));  // llama2.c's own name
  const Result r = run("run --model " + dir.file("stories260K.bin") + " --prompt Once --gen-len 8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("Once"));
  // Two candidates: the error names both and the flag that picks one.
  std::filesystem::copy_file(models + "tok512.bin", dir.file("tok4096.bin"));
  const Result two = run("run --model " + dir.file("stories260K.bin") + " --prompt Once --gen-len 8");
  expect_clean_error(two, "tok4096.bin");
  EXPECT_THAT(two.err, HasSubstr("tok512.bin"));
  EXPECT_THAT(two.err, HasSubstr("--tokenizer"));
  // tokenizer.bin (llama2.c's default name) wins over the others.
  std::filesystem::copy_file(models + "tok512.bin", dir.file("tokenizer.bin"));
  EXPECT_EQ(run("run --model " + dir.file("stories260K.bin") + " --prompt Once --gen-len 8").code, 0);
}

TEST(Cli, DummyIsAFlagInEverySubcommand) {
  const std::string hw = " --hardware " + std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/ci-cpu.yaml";
  testing::TempDir dir;
  const Result b = run("bench --dummy --model opt-125m --prompt-len 8 --gen-len 2 --max-batch 2 --systems flexgen" + hw +
                       " --out-dir " + dir.file("out"));
  EXPECT_EQ(b.code, 0) << b.err;
  testing::write_file(dir.file("text.txt"), "Once upon a time there was a dog.\n");
  const Result e = run("eval --dummy --text " + dir.file("text.txt") + " --kv full");
  EXPECT_EQ(e.code, 0) << e.err;
  EXPECT_EQ(run("run --dummy --model opt-125m --gen-len 2 --prompt-len 4").code, 0);
}

TEST(Cli, RepeatedPromptIdIsAnError) {
  testing::TempDir dir;
  testing::write_file(dir.file("in.jsonl"),
                      "{\"id\": 1, \"prompt\": \"a\"}\n{\"id\": \"x\", \"prompt\": \"b\"}\n"
                      "{\"id\": 1, \"prompt\": \"c\"}\n");
  const Result r = run("run --prompts " + dir.file("in.jsonl") + " --out " + dir.file("out.jsonl"));
  expect_clean_error(r, "in.jsonl:3");
  EXPECT_THAT(r.err, HasSubstr("line 1"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.jsonl"))) << "nothing is written before the input is checked";
}

TEST(Cli, DoesNotFitNamesSystemTierAndBytes) {
  const std::string hw = " --hardware " + std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/ci-cpu.yaml";
  testing::TempDir dir;
  const Result b = run("bench --model opt-1.3b --gpu-mem 128MiB --cpu-mem 8GiB --systems accelerate" + hw +
                       " --out-dir " + dir.file("out"));
  expect_clean_error(b, "system 'accelerate'");
  EXPECT_THAT(b.err, HasSubstr("gpu tier needs"));
  EXPECT_THAT(b.err, HasSubstr("but has"));
  EXPECT_THAT(b.err, HasSubstr("128.00 MiB"));
  // A fixed policy that does not fit a profile: the plan names it the same way.
  testing::write_file(dir.file("p.yaml"), "gpu_batch_size: 4096\npercent: [100, 0, 100, 0, 100, 0]\n");
  const Result p = run("plan --model opt-1.3b --policy " + dir.file("p.yaml") + hw + " --gpu-mem 1GiB");
  expect_clean_error(p, "p.yaml does not fit");
  EXPECT_THAT(p.err, HasSubstr("gpu tier needs"));
  EXPECT_THAT(p.err, HasSubstr("weights"));
  // A run's own policy is checked the same way before anything is loaded.
  expect_clean_error(run("run --gpu-mem 10KiB"), "but has 9.00 KiB (90% of 10.00 KiB)");
}

// Starts the binary with `args` (split on spaces), stdout and stderr to files in `dir`.
pid_t spawn(const std::string& args, const testing::TempDir& dir) {
  const std::string cmd = "exec " + std::string(FLEXH2O_BINARY) + " " + args + " >" + dir.file("spawn.out") + " 2>" +
                          dir.file("spawn.err") + " </dev/null";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::sort(lines.begin(), lines.end());
  return lines;
}

TEST(Cli, InterruptedJobResumesToTheUninterruptedResult) {
  testing::TempDir dir;
  std::string in;
  for (int i = 0; i < 12; ++i) in += "{\"id\": \"p" + std::to_string(i) + "\", \"tokens\": [2, " + std::to_string(100 + i) + ", 7, 9]}\n";
  testing::write_file(dir.file("in.jsonl"), in);
  // A model small enough to be quick, large enough that a block takes a few tens of ms.
  testing::write_file(dir.file("model.yaml"),
                      "name: small-opt\nfamily: opt\nnum_layers: 6\nhidden_size: 512\nffn_size: 2048\n"
                      "num_heads: 8\nvocab_size: 8000\nmax_positions: 256\ndtype: f16\ntie_embeddings: true\n"
                      "bos_token_id: 2\neos_token_id: []\n");
  const std::string offload = dir.file("offload");
  std::filesystem::create_directory(offload);
  const std::string job = "run --model " + dir.file("model.yaml") + " --dummy --prompts " + dir.file("in.jsonl") +
                          " --gen-len 16 --gpu-batch-size 1 --percent 80 10 100 0 100 0 --offload-dir " + offload +
                          " --out ";
  ASSERT_EQ(run(job + dir.file("full.jsonl")).code, 0);
  const auto full = sorted_lines(testing::read_file(dir.file("full.jsonl")));
  ASSERT_EQ(full.size(), 12u);

  // One signal finishes the block under way; two abandon it. Either way only whole lines.
  for (const int signals : {1, 2}) {
    SCOPED_TRACE(std::to_string(signals) + " signal(s)");
    const std::string out = dir.file("part" + std::to_string(signals) + ".jsonl");
    const pid_t pid = spawn(job + out, dir);
    while (!std::filesystem::exists(out) || std::filesystem::file_size(out) == 0) ::usleep(20000);
    for (int s = 0; s < signals; ++s) {
      ::kill(pid, s == 0 ? SIGINT : SIGTERM);
      ::usleep(50000);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 130) << testing::read_file(dir.file("spawn.err"));
    EXPECT_THAT(testing::read_file(dir.file("spawn.err")), HasSubstr("--resume"));
    const std::string partial = testing::read_file(out);
    EXPECT_EQ(partial.back(), '\n');
    EXPECT_LT(sorted_lines(partial).size(), 12u);
    EXPECT_TRUE(std::filesystem::is_empty(offload)) << "offload files left behind";
    // A torn line, as a kill inside write() would leave, is cut off on resume.
    testing::write_file(out, partial + "{\"id\": \"p7\", \"te");
    const Result resumed = run(job + out + " --resume");
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    EXPECT_THAT(resumed.err, HasSubstr("resuming:"));
    EXPECT_EQ(sorted_lines(testing::read_file(out)), full);
  }
}

// Continuous batching (the default) with requests of mixed max_tokens: the same result lines
// (written as requests end, so compared as sets) as fixed blocks and as each request run alone,
// in memory and with weights, KV cache and hidden states over the gpu/cpu/disk tiers.
TEST(Cli, ContinuousBatchingWritesEachRequestsSoloResult) {
  testing::TempDir dir;
  std::vector<std::string> lines;
  for (int i = 0; i < 11; ++i) {
    std::string tokens = "1";
    for (int t = 0; t < 1 + (i * 7) % 13; ++t) tokens += ", " + std::to_string(5 + (29 * i + 11 * t) % 500);
    lines.push_back("{\"id\": \"r" + std::to_string(i) + "\", \"tokens\": [" + tokens + "], \"max_tokens\": " +
                    std::to_string(1 + (i * 5) % 23) + "}\n");
  }
  std::string all;
  for (const auto& l : lines) all += l;
  testing::write_file(dir.file("in.jsonl"), all);
  const std::string offload = dir.file("offload");
  std::filesystem::create_directory(offload);
  const std::string job = "run --gen-len 24 --gpu-batch-size 2 --num-gpu-batches 2 --prefill-budget 8 --out ";
  std::string alone;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    testing::write_file(dir.file("one.jsonl"), lines[i]);
    std::filesystem::remove(dir.file("one.out"));
    const Result r = run("run --gen-len 24 --gpu-batch-size 1 --prompts " + dir.file("one.jsonl") + " --out " +
                         dir.file("one.out"));
    ASSERT_EQ(r.code, 0) << r.err;
    alone += testing::read_file(dir.file("one.out"));
  }
  const auto want = sorted_lines(alone);
  ASSERT_EQ(want.size(), lines.size());
  for (const std::string& flags :
       std::vector<std::string>{"", " --batching fixed", " --percent 30 40 20 30 50 50 --offload-dir " + offload}) {
    SCOPED_TRACE(flags);
    const std::string out = dir.file("out.jsonl");
    std::filesystem::remove(out);
    const Result r = run(job + out + " --prompts " + dir.file("in.jsonl") + flags);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(sorted_lines(testing::read_file(out)), want);
    EXPECT_THAT(r.err, HasSubstr("slot utilisation"));
  }
  const Result bad = run("run --batching sometimes");
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.err, HasSubstr("--batching: sometimes not in {continuous,fixed}"));
}

// Prompts behind shared instructions give the same results with their prefixes shared as
// without (docs/prefix-sharing.md), in memory and offloaded, and the report counts what was
// shared.
TEST(Cli, PrefixSharingGivesTheSameResultsAsWithout) {
  testing::TempDir dir;
  std::string instructions = "1";
  for (int t = 0; t < 36; ++t) instructions += ", " + std::to_string(7 + (37 * t) % 480);
  std::string all;
  for (int i = 0; i < 10; ++i) {
    std::string tokens = i % 4 == 3 ? "1, 9" : instructions;  // every fourth shares nothing
    for (int t = 0; t < 1 + (i * 5) % 9; ++t) tokens += ", " + std::to_string(11 + (53 * i + 17 * t) % 480);
    all += "{\"id\": " + std::to_string(i) + ", \"tokens\": [" + tokens + "], \"max_tokens\": " +
           std::to_string(2 + (i * 3) % 7) + "}\n";
  }
  testing::write_file(dir.file("in.jsonl"), all);
  const std::string offload = dir.file("offload");
  std::filesystem::create_directory(offload);
  for (const std::string& flags :
       std::vector<std::string>{"", " --percent 30 40 20 30 50 50 --compress-cache --offload-dir " + offload}) {
    SCOPED_TRACE(flags);
    std::map<std::string, nlohmann::json> metrics;
    std::map<std::string, std::vector<std::string>> outs;
    std::map<std::string, std::string> metrics_text;  // stderr's report
    // The pool off the gpu tier too: in memory on cpu, offloaded on disk.
    const std::string pool_off_gpu = flags.empty() ? "cpu" : "disk";
    for (const std::string sharing : {"on", "copy", "off", "pool"}) {
      const std::string out = dir.file("out-" + sharing + ".jsonl"), m = dir.file("m-" + sharing + ".json");
      std::filesystem::remove(out);
      const std::string how = sharing == "pool" ? "on --prefix-pool " + pool_off_gpu : sharing;
      const Result r = run("run --gpu-batch-size 2 --num-gpu-batches 2 --gen-len 8 --prompts " + dir.file("in.jsonl") +
                           " --out " + out + " --metrics " + m + " --prefix-sharing " + how + flags);
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_THAT(r.err, HasSubstr("from shared prefixes, taken by"));
      metrics_text[sharing] = r.err;
      outs[sharing] = sorted_lines(testing::read_file(out));
      metrics[sharing] = nlohmann::json::parse(testing::read_file(m));
    }
    EXPECT_EQ(outs["on"], outs["off"]);
    EXPECT_EQ(outs["copy"], outs["off"]);
    EXPECT_EQ(outs["pool"], outs["off"]);
    EXPECT_EQ(outs["on"].size(), 10u);
    const nlohmann::json &on = metrics["on"], &off = metrics["off"];
    // The instructions are held once (one family in a pool on the gpu tier; rows of 19 slots, not
    // 54, wherever they live); with `copy` they are copied into the rows.
    EXPECT_EQ(on.at("kv_held").at("prefixes"), 1);
    EXPECT_EQ(metrics["copy"].at("kv_held").at("prefixes"), 0);
    EXPECT_EQ(on.at("kv_copy_bytes").at("prefixes").at("total"), 0);
    EXPECT_GT(metrics["copy"].at("kv_copy_bytes").at("prefixes").at("total").get<std::int64_t>(), 0);
    const nlohmann::json& held = on.at("kv_held");
    EXPECT_LT(held.at("bytes").get<std::int64_t>(), held.at("bytes_without").get<std::int64_t>());
    EXPECT_THAT(metrics_text["on"], HasSubstr("KV held once: 1 prefix in 1 pool row (gpu), 1 fill; "));
    EXPECT_THAT(metrics_text["pool"], HasSubstr("KV held once: 1 prefix in 1 pool row (" + pool_off_gpu + "), 1 fill; "));
    EXPECT_EQ(metrics["pool"].at("kv_held").at("pools").at(pool_off_gpu), 1);
    EXPECT_GT(metrics["pool"].at("kv_read_bytes").at("by_tier").at(pool_off_gpu).at("staged").get<std::int64_t>(), 0);
    if (!flags.empty()) {
      EXPECT_GT(held.at("by_tier").at("disk").at("bytes").get<std::int64_t>(), 0);
    }
    EXPECT_EQ(on.at("prompt_tokens"), off.at("prompt_tokens"));
    EXPECT_EQ(off.at("prompt_tokens_computed"), off.at("prompt_tokens"));
    EXPECT_EQ(off.at("prefix_hits"), 0);
    EXPECT_GE(on.at("prefix_hits").get<std::int64_t>(), 6);
    EXPECT_EQ(on.at("prompt_tokens").get<std::int64_t>() - on.at("prompt_tokens_computed").get<std::int64_t>(),
              on.at("prefix_shared_tokens").get<std::int64_t>());
  }
  const Result bad = run("run --prefix-sharing maybe");
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.err, HasSubstr("--prefix-sharing: maybe not in {on,copy,off}"));
  const Result bad_pool = run("run --prefix-pool nvme");
  EXPECT_NE(bad_pool.code, 0);
  EXPECT_THAT(bad_pool.err, HasSubstr("--prefix-pool: nvme not in {auto,gpu,cpu,disk}"));
}

// Gemma 2's alternating sliding windows (the HF fixture: a window of 8 on every other layer,
// soft caps) with prompts behind 30 shared tokens: held once and copied, the same results as
// without sharing, in memory and with the KV cache on disk.
TEST(Cli, PrefixSharingUnderSlidingWindows) {
  testing::TempDir dir;
  std::string all;
  for (int i = 0; i < 8; ++i) {
    std::string tokens = "2";
    for (int t = 0; t < 30; ++t) tokens += ", " + std::to_string(5 + (37 * t) % 240);
    for (int t = 0; t < 1 + (i * 5) % 7; ++t) tokens += ", " + std::to_string(7 + (53 * i + 17 * t) % 240);
    all += "{\"id\": " + std::to_string(i) + ", \"tokens\": [" + tokens + "], \"max_tokens\": " +
           std::to_string(3 + (i * 3) % 9) + "}\n";
  }
  testing::write_file(dir.file("in.jsonl"), all);
  const std::string model = std::string(FLEXH2O_SOURCE_DIR) + "/tests/data/hf/gemma2-v5";
  const std::string offload = dir.file("offload");
  std::filesystem::create_directory(offload);
  for (const std::string& flags : std::vector<std::string>{"", " --percent 100 0 0 0 100 0 --offload-dir " + offload}) {
    SCOPED_TRACE(flags);
    std::map<std::string, std::vector<std::string>> outs;
    std::map<std::string, nlohmann::json> metrics;
    for (const std::string sharing : {"on", "copy", "off"}) {
      const std::string out = dir.file("out-" + sharing + ".jsonl"), m = dir.file("m-" + sharing + ".json");
      std::filesystem::remove(out);
      const Result r = run("run --model " + model + " --gpu-batch-size 2 --num-gpu-batches 2 --ignore-eos --prompts " +
                           dir.file("in.jsonl") + " --out " + out + " --metrics " + m + " --prefix-sharing " + sharing +
                           flags);
      ASSERT_EQ(r.code, 0) << r.err;
      outs[sharing] = sorted_lines(testing::read_file(out));
      metrics[sharing] = nlohmann::json::parse(testing::read_file(m));
    }
    EXPECT_EQ(outs["on"].size(), 8u);
    EXPECT_EQ(outs["on"], outs["off"]);
    EXPECT_EQ(outs["copy"], outs["off"]);
    EXPECT_EQ(metrics["on"].at("kv_held").at("prefixes"), 1);
    EXPECT_GE(metrics["copy"].at("prefix_hits").get<std::int64_t>(), 6);
    EXPECT_EQ(metrics["off"].at("prefix_hits"), 0);
  }
}

// Decode steps as CUDA graphs give the tokens op-by-op steps give (docs/backends.md, "Decode steps
// in CUDA graphs"), under fixed blocks and continuous batching; the CPU ignores the option, so
// on a GPU machine (--backend auto) this is the check end to end.
TEST(Cli, CudaGraphsGiveTheSameTokens) {
  testing::TempDir dir;
  for (const std::string batching : {"fixed", "continuous"}) {
    SCOPED_TRACE(batching);
    std::map<std::string, std::vector<std::string>> outs;
    for (const std::string graphs : {"on", "off"}) {
      const std::string out = dir.file(batching + "-" + graphs + ".jsonl");
      const Result r = run("run --batch 6 --gpu-batch-size 6 --prompt-len 12 --gen-len 24 --batching " + batching +
                           " --out " + out + " --cuda-graphs " + graphs);
      ASSERT_EQ(r.code, 0) << r.err;
      outs[graphs] = sorted_lines(testing::read_file(out));
    }
    EXPECT_EQ(outs["on"], outs["off"]);
    EXPECT_EQ(outs["on"].size(), 6u);
  }
  const Result bad = run("run --cuda-graphs maybe");
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.err, HasSubstr("--cuda-graphs: maybe not in {on,off}"));
}

// --compute-dtype auto settles one precision for the whole job from its GPU batch, never from a
// step's rows, so a request's tokens are the same alone as among others under continuous
// batching: with 16-bit weights on a CPU with native bf16, GPU batches of 64 multiply in bf16
// whether a step holds one row or a hundred, and in f32 below; elsewhere f32 throughout.
TEST(Cli, AutoComputeDtypeIsTheSameAloneAndAmongOthers) {
  testing::TempDir dir;
  std::vector<std::string> lines;
  for (int i = 0; i < 12; ++i) {
    std::string tokens = "1";
    for (int t = 0; t < 4 + (i * 5) % 11; ++t) tokens += ", " + std::to_string(7 + (31 * i + 13 * t) % 500);
    lines.push_back("{\"id\": \"r" + std::to_string(i) + "\", \"tokens\": [" + tokens + "], \"max_tokens\": " +
                    std::to_string(8 + (i * 7) % 17) + "}\n");
  }
  std::string all;
  for (const auto& l : lines) all += l;
  testing::write_file(dir.file("in.jsonl"), all);
  for (const int batch : {4, 64}) {
    SCOPED_TRACE("gpu batch " + std::to_string(batch));
    const std::string job = "run --dtype f16 --compute-dtype auto --gen-len 32 --gpu-batch-size " + std::to_string(batch);
    std::string alone;
    for (const std::string& line : lines) {
      testing::write_file(dir.file("one.jsonl"), line);
      std::filesystem::remove(dir.file("one.out"));
      const Result r = run(job + " --prompts " + dir.file("one.jsonl") + " --out " + dir.file("one.out"));
      ASSERT_EQ(r.code, 0) << r.err;
      alone += testing::read_file(dir.file("one.out"));
    }
    std::filesystem::remove(dir.file("out.jsonl"));
    const Result r = run(job + " --prompts " + dir.file("in.jsonl") + " --out " + dir.file("out.jsonl"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(sorted_lines(testing::read_file(dir.file("out.jsonl"))), sorted_lines(alone));
    // The report says what auto weighed.
    EXPECT_THAT(r.err, HasSubstr("(auto: "));
  }
}

// --out is the user's file: a run that goes wrong leaves it as it was, or whole result lines.
TEST(Cli, ResumeIntoAFileOfOtherTextIsAnErrorThatLeavesIt) {
  testing::TempDir dir;
  const std::string notes = "my notes\nthe last line, without a newline";
  testing::write_file(dir.file("notes.txt"), notes);
  expect_clean_error(run("run --gen-len 2 --out " + dir.file("notes.txt") + " --resume"), "not a result line");
  EXPECT_EQ(testing::read_file(dir.file("notes.txt")), notes);
}

TEST(Cli, ThePromptsFileAsOutIsAnError) {
  testing::TempDir dir;
  const std::string prompts = "{\"id\": 1, \"prompt\": \"Once\"}\n{\"id\": 2, \"prompt\": \"The dog\"}\n";
  testing::write_file(dir.file("in.jsonl"), prompts);
  std::filesystem::create_symlink(dir.file("in.jsonl"), dir.file("link.jsonl"));
  for (const std::string resume : {"", " --resume"}) {
    expect_clean_error(run("run --gen-len 2 --prompts " + dir.file("in.jsonl") + " --out " + dir.file("link.jsonl") +
                           resume),
                       "is the --prompts file");
    EXPECT_EQ(testing::read_file(dir.file("in.jsonl")), prompts);
  }
}

TEST(Cli, ARunThatFailsBeforeItsFirstResultLeavesOutAsItWas) {
  testing::TempDir dir;
  testing::write_file(dir.file("out.jsonl"), "last week's results\n");
  const Result r = run("run --gen-len 2 --cpu-mem 1 --percent 0 100 100 0 100 0 --out " + dir.file("out.jsonl"));
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.code, 128) << "killed by a signal";
  EXPECT_EQ(testing::read_file(dir.file("out.jsonl")), "last week's results\n");
}

TEST(Cli, OutThatIsNoRegularFileIsStreamedToOrRefusedBeforeTheRun) {
  testing::TempDir dir;
  const Result null = run("run --gen-len 2 --batch 2 --out /dev/null");
  EXPECT_EQ(null.code, 0) << null.err;
  expect_clean_error(run("run --gen-len 2 --out /dev/null --resume"), "not a regular file");
  expect_clean_error(run("run --gen-len 2 --out " + dir.path()), "not a regular file");
}

TEST(Cli, AFullDiskLeavesWholeLinesAndSaysHowManyResults) {
  testing::TempDir dir;
  const std::string out = dir.file("out.jsonl");
  // A file size limit stands in for a full disk: the write that crosses it fails part way.
  const std::string cmd = "ulimit -f 2 && trap '' XFSZ && exec " + std::string(FLEXH2O_BINARY) +
                          " run --prompt Once --batch 24 --gpu-batch-size 1 --gen-len 48 --out " + out + " 2>" +
                          dir.file("err") + " >/dev/null";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string err = testing::read_file(dir.file("err"));
  const std::string text = testing::read_file(out);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "a torn last line";
  std::istringstream lines(text);
  std::size_t count = 0;
  for (std::string line; std::getline(lines, line); ++count)
    EXPECT_NO_THROW((void)nlohmann::json::parse(line).at("tokens")) << line;
  EXPECT_THAT(err, HasSubstr("holds the " + std::to_string(count) + " results")) << err;
}

TEST(Cli, TokenizeEncodesAndDecodes) {
  // The embedded model's llama2.c tokenizer: BOS (1) only with --special.
  Result r = run("tokenize --text \"Once upon a time\"");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[403, 407, 261, 378]\n");
  EXPECT_EQ(run("tokenize --text \"Once upon a time\" --special").out, "[1, 403, 407, 261, 378]\n");
  EXPECT_EQ(run("tokenize --decode --text \"[1, 403, 407, 261, 378]\"").out, "Once upon a time\n");

  // Phi-3's tokenizer.json alone; ids and texts from Hugging Face tokenizers.
  const std::string phi3 = " --tokenizer " + std::string(FLEXH2O_TEST_DATA_DIR) + "/tokenizers/phi3/tokenizer.json";
  EXPECT_EQ(run("tokenize" + phi3 + " --text \"Hello <|user|> world\" --special").out,
            "[1, 15043, 29871, 32010, 29871, 3186]\n");
  EXPECT_EQ(run("tokenize" + phi3 + " --text \"Hello <|user|> world\"").out, "[15043, 29871, 32010, 29871, 3186]\n");
  EXPECT_EQ(run("tokenize" + phi3 + " --decode --text \"[1, 15043, 32010, 3186]\"").out, "Hello world\n");
  EXPECT_EQ(run("tokenize" + phi3 + " --decode --special --text \"[1, 15043, 32010, 3186]\"").out,
            "<s> Hello<|user|> world\n");
  testing::TempDir dir;
  testing::write_file(dir.file("text.txt"), "line one\nline two\n");
  testing::write_file(dir.file("ids.json"), "[1, 1196, 697, 13, 1220, 1023, 13]");
  r = run("tokenize" + phi3 + " --file " + dir.file("text.txt"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[1196, 697, 13, 1220, 1023, 13]\n");
  // The text, then the newline the command prints.
  EXPECT_EQ(run("tokenize" + phi3 + " --decode --file " + dir.file("ids.json")).out, "line one\nline two\n\n");
}

// The BOS a text prompt gets: the tokenizer's own post-processor decides (as in Hugging Face
// and vLLM), not config.json's bos_token_id; GPT-2's vocab.json + merges.txt decide nothing,
// so there the config's BOS goes first.
TEST(Cli, TokenizeSpecialFollowsTheTokenizerNotTheConfig) {
  const engine::ModelConfig cfg = testing::tiny_llama_config();  // bos_token_id 1
  ASSERT_EQ(cfg.bos_id, 1);
  testing::TempDir dir;
  testing::export_hf_checkpoint(dir.path(), cfg, engine::load_weights(cfg, engine::DummyWeights(cfg, 3)),
                                kernels::DType::F32, false);
  const nlohmann::json vocab = {{"a", 3}, {"b", 4}, {"ab", 5}, {"<s>", 1}};
  nlohmann::json tokenizer = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}}},
      {"added_tokens", {{{"id", 1}, {"content", "<s>"}, {"special", true}}}},
      {"post_processor", {{"type", "ByteLevel"}}}};
  testing::write_file(dir.file("tokenizer.json"), tokenizer.dump());
  EXPECT_EQ(run("tokenize --model " + dir.path() + " --text ab --special").out, "[5]\n");
  tokenizer["post_processor"] = {{"type", "TemplateProcessing"},
                                 {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                                 {"pair", nlohmann::json::array()},
                                 {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  testing::write_file(dir.file("tokenizer.json"), tokenizer.dump());
  EXPECT_EQ(run("tokenize --model " + dir.path() + " --text ab --special").out, "[1, 5]\n");
  std::filesystem::remove(dir.file("tokenizer.json"));
  testing::write_file(dir.file("vocab.json"), vocab.dump());
  testing::write_file(dir.file("merges.txt"), "a b\n");
  EXPECT_EQ(run("tokenize --model " + dir.path() + " --text ab --special").out, "[1, 5]\n");
  EXPECT_EQ(run("tokenize --model " + dir.path() + " --text ab").out, "[5]\n");
}

// A GGUF file carries its tokenizer (tokenizer.ggml.*): tokenize and run take text without
// --tokenizer; a tokenizer the file describes but flexh2o cannot build is one clear error.
TEST(Cli, GgufFileTokenizesWithItsOwnTokenizer) {
  const std::string gguf = std::string(FLEXH2O_TEST_DATA_DIR) + "/gguf/tiny-llama.gguf";
  EXPECT_EQ(run("tokenize --model " + gguf + " --text \"Once upon a time\" --special").out, "[1, 403, 407, 261, 378]\n");
  EXPECT_EQ(run("tokenize --model " + gguf + " --decode --text \"[1, 403, 407, 261, 378]\"").out, "Once upon a time\n");
  const Result r = run("run --model " + gguf + " --prompt \"Once upon a time\" --gen-len 4");
  EXPECT_EQ(r.code, 0) << r.err;

  // The same file with tokenizer.ggml.model = "bert!" (a string of the same length as "llama").
  std::string bytes = testing::read_file(gguf);
  const std::string key = "tokenizer.ggml.model";
  const std::size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  const std::size_t value = at + key.size() + 4 + 8;  // u32 value type, u64 string length
  ASSERT_EQ(bytes.substr(value, 5), "llama");
  bytes.replace(value, 5, "bert!");
  testing::TempDir dir;
  testing::write_file(dir.file("bad.gguf"), bytes);
  expect_clean_error(run("tokenize --model " + dir.file("bad.gguf") + " --text a"),
                     dir.file("bad.gguf") + ": metadata key 'tokenizer.ggml.model' = \"bert!\" is not supported");
  // --tokenizer replaces the file's.
  EXPECT_EQ(run("tokenize --model " + dir.file("bad.gguf") + " --tokenizer " + std::string(FLEXH2O_SOURCE_DIR) +
                "/models/stories260K/tok512.bin --text \"Once upon a time\" --special")
                .out,
            "[1, 403, 407, 261, 378]\n");
}

TEST(Cli, TokenizeBadInputGivesOneClearError) {
  const std::string phi3 = " --tokenizer " + std::string(FLEXH2O_TEST_DATA_DIR) + "/tokenizers/phi3/tokenizer.json";
  expect_clean_error(run("tokenize"), "--text or --file");
  expect_clean_error(run("tokenize --decode --text \"[1, 2,\""), "JSON array of token ids");
  expect_clean_error(run("tokenize --decode --text \"[1, -2]\""), "-2");
  expect_clean_error(run("tokenize" + phi3 + " --decode --text \"[40000]\""), "40000");
  expect_clean_error(run("tokenize --file /nonexistent/text.txt"), "/nonexistent/text.txt");
  expect_clean_error(run("tokenize --tokenizer /nonexistent/tokenizer.json --text a"), "/nonexistent/tokenizer.json");
  expect_clean_error(run("tokenize --tokenizer " + std::string(FLEXH2O_SOURCE_DIR) +
                         "/models/stories260K/tok512.bin --text a"),
                     "--model");
  testing::TempDir dir;
  testing::write_file(dir.file("tokenizer.json"),
                      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},)"
                      R"( "pre_tokenizer": {"type": "Whitespace"}})");
  const Result r = run("tokenize --tokenizer " + dir.file("tokenizer.json") + " --text a");
  expect_clean_error(r, dir.file("tokenizer.json") + ": pre_tokenizer.type");
  EXPECT_THAT(r.err, HasSubstr("Whitespace"));
}


// --- Hostile and mistaken input (issue 33) ----------------------------------------------------

std::string deep_array(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(Cli, DeepJsonIsOneClearErrorNotACrash) {
  testing::TempDir dir;
  testing::write_file(dir.file("deep.json"), "{\"model\":" + deep_array(100000) + "}\n");
  expect_clean_error(run("tokenize --tokenizer " + dir.file("deep.json") + " --text hi"), "nested deeper");
  testing::write_file(dir.file("ids.json"), deep_array(100000));
  expect_clean_error(run("tokenize --decode --file " + dir.file("ids.json")), "nested deeper");
  testing::write_file(dir.file("in.jsonl"), "{\"id\": 1, \"tokens\": " + deep_array(100000) + "}\n");
  expect_clean_error(run("run --prompts " + dir.file("in.jsonl") + " --gen-len 2"), "in.jsonl:1");
}

TEST(Cli, HugeModelSizesAreErrorsNotOverflows) {
  testing::TempDir dir;
  std::string yaml = testing::read_file(std::string(FLEXH2O_SOURCE_DIR) + "/configs/models/opt-125m.yaml");
  const auto at = yaml.find("ffn_size:");
  yaml.replace(at, yaml.find('\n', at) - at, "ffn_size: 4611686018427387904");
  testing::write_file(dir.file("it.yaml"), yaml);
  expect_clean_error(run("run --model " + dir.file("it.yaml") +
                         " --dummy --batch 2 --prompt-len 4 --gen-len 2 --percent 100 0 100 0 100 0"),
                     "'ffn_size'");
  const Result p = run("plan --model " + dir.file("it.yaml") + " --hardware ci-cpu");
  expect_clean_error(p, "limit of 1048576");
  EXPECT_THAT(p.err, ::testing::Not(HasSubstr("EiB")));
}

// CLI11 rejects these itself (exit 105, its own message format).
void expect_refused_flag(const Result& r, const std::string& mention) {
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.code, 128);
  EXPECT_THAT(r.err, HasSubstr(mention));
}

TEST(Cli, NonFiniteAndOutOfRangeNumbersAreRefused) {
  expect_refused_flag(run("run --temperature nan --gen-len 2"), "'nan' is not a finite number");
  expect_refused_flag(run("run --top-p nan --gen-len 2"), "'nan' is not a finite number");
  expect_refused_flag(run("run --seed -1 --gen-len 2"), "'-1' is not an integer in [0, 18446744073709551615]");
  expect_refused_flag(run("run --seed 99999999999999999999999 --gen-len 2"), "is not an integer in");
  EXPECT_EQ(run("run --seed 18446744073709551615 --gen-len 2").code, 0);
}

TEST(Cli, BadPromptsFilesAreClearErrors) {
  testing::TempDir dir;
  testing::write_file(dir.file("both.jsonl"), "{\"id\": 1, \"prompt\": \"a\", \"tokens\": [1]}\n");
  expect_clean_error(run("run --prompts " + dir.file("both.jsonl") + " --gen-len 2"), "both 'prompt' and 'tokens'");
  expect_clean_error(run("run --prompts /dev/zero --gen-len 2"), "not a regular file");
  expect_clean_error(run("run --hardware /dev/zero --gen-len 2 --batch 2"), "not a regular file");
  expect_clean_error(run("run --policy /dev/zero --gen-len 2"), "not a regular file");
  // Megabytes of text for a context of 512: refused before the tokenizer spends seconds on it.
  testing::write_file(dir.file("long.jsonl"), "{\"id\": \"l\", \"prompt\": \"" + std::string(1 << 20, 'a') + "\"}\n");
  expect_clean_error(run("run --prompts " + dir.file("long.jsonl") + " --gen-len 2"), "512 positions");
}

TEST(Cli, AnExplicitPlacementBeyondMemoryFailsBeforeLoading) {
  // The run's memory (here --gpu-mem and --cpu-mem; by default this machine's free memory
  // within its cgroup) is checked before any weight is made: the planner's message, not a
  // kill by the kernel.
  const Result r = run("run --model opt-1.3b --dummy --batch 8 --prompt-len 16 --gen-len 4 "
                       "--percent 100 0 100 0 100 0 --gpu-mem 512MiB --cpu-mem 512MiB");
  expect_clean_error(r, "does not fit");
  EXPECT_THAT(r.err, HasSubstr("gpu tier needs"));
}

// A fresh memory cgroup (v1, or v2 with the memory controller) limited to `limit` bytes, removed
// at the end; empty path() where this process may not make one (not root, no controller).
class LiveMemoryCgroup {
 public:
  explicit LiveMemoryCgroup(std::int64_t limit) {
    namespace fs = std::filesystem;
    const std::string name = "flexh2o-test-" + std::to_string(::getpid());
    std::error_code ec;
    if (fs::exists("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
      path_ = "/sys/fs/cgroup/memory/" + name;
      limit_file_ = "memory.limit_in_bytes";
    } else if (fs::exists("/sys/fs/cgroup/cgroup.controllers") &&
               testing::read_file("/sys/fs/cgroup/cgroup.subtree_control").find("memory") != std::string::npos) {
      path_ = "/sys/fs/cgroup/" + name;
      limit_file_ = "memory.max";
    }
    if (path_.empty() || !fs::create_directory(path_, ec) || ec) {
      path_.clear();
      return;
    }
    if (!write(limit_file_, std::to_string(limit))) {
      fs::remove(path_, ec);
      path_.clear();
    }
  }
  ~LiveMemoryCgroup() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove(path_, ec);  // its processes have exited
  }
  const std::string& path() const { return path_; }
  // A shell prefix that moves itself into the cgroup, then runs the command after it.
  std::string launcher() const { return "sh -c 'echo $$ > " + path_ + "/cgroup.procs && exec \"$0\" \"$@\"' "; }

 private:
  bool write(const std::string& file, const std::string& text) const {
    FILE* f = std::fopen((path_ + "/" + file).c_str(), "w");
    if (!f) return false;
    const bool ok = std::fputs(text.c_str(), f) >= 0;
    return std::fclose(f) == 0 && ok;
  }
  std::string path_, limit_file_;
};

TEST(Cli, APlacementBeyondTheCgroupsMemoryIsAnErrorNotAKill) {
  // Issue 32: inside a memory cgroup, --percent with no --gpu-mem/--cpu-mem once ran with
  // unlimited tiers and the kernel killed it (exit 137). The tiers now default to the cgroup's
  // limit, so the placement check refuses it before anything is loaded.
  LiveMemoryCgroup cgroup(768LL << 20);
  if (cgroup.path().empty()) GTEST_SKIP() << "cannot make a memory cgroup here (needs root and a memory controller)";
  const Result r = run("run --model opt-1.3b --dummy --batch 8 --prompt-len 16 --gen-len 4 --percent 100 0 100 0 100 0",
                       cgroup.launcher());
  expect_clean_error(r, "does not fit");
  // The same with the weights on the cpu tier: that tier's budget is the cgroup's too.
  expect_clean_error(run("run --model opt-1.3b --dummy --batch 8 --prompt-len 16 --gen-len 4 --percent 0 100 100 0 100 0",
                         cgroup.launcher()),
                     "cpu tier needs");
  // What fits the cgroup runs in it.
  const Result ok = run("run --model opt-125m --dummy --batch 2 --prompt-len 8 --gen-len 2 --percent 100 0 100 0 100 0",
                        cgroup.launcher());
  EXPECT_EQ(ok.code, 0) << ok.err;
}

// The first run's measurement of a model's rates never takes much of the memory a cgroup
// leaves the job: OPT-125M's layer and head (91 MiB) are more than an eighth of 512 MiB, so
// they are not made, and the plan says why.
TEST(Cli, TheModelsRatesAreNotMeasuredBeyondAnEighthOfTheMemoryFree) {
  LiveMemoryCgroup cgroup(512LL << 20);
  if (cgroup.path().empty()) GTEST_SKIP() << "cannot make a memory cgroup here (needs root and a memory controller)";
  testing::TempDir dir;
  const Result r = run("plan --model opt-125m --prompt-len 16 --gen-len 4",
                       "XDG_CACHE_HOME=" + dir.file("cache") + " " + cgroup.launcher());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("this model's rates not measured (a layer and the head take"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("cache") + "/flexh2o/calibration"));
}

TEST(Cli, AKilledRunsOffloadFilesAreReclaimedByTheNext) {
  testing::TempDir dir;
  const std::string off = dir.file("off");
  std::filesystem::create_directory(off);
  testing::write_file(off + "/notes.txt", "the user's");
  const std::string args = "run --model opt-125m --dummy --percent 0 0 100 0 100 0 --batch 2 --prompt-len 8 --offload-dir " + off;
  const pid_t pid = spawn(args + " --gen-len 2000", dir);
  auto lock_count = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(off)) n += e.path().extension() == ".lock";
    return n;
  };
  for (int i = 0; i < 600 && lock_count() == 0; ++i) ::usleep(50000);
  ASSERT_EQ(lock_count(), 1) << "the run made no store file";
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ASSERT_EQ(std::distance(std::filesystem::directory_iterator(off), {}), 3) << "store file, its lock, notes.txt";
  ASSERT_EQ(run(args + " --gen-len 2").code, 0);
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(off)) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"notes.txt"});
}

}  // namespace
}  // namespace flexh2o
