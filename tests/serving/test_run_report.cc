// One RunReport renders every run mode: a rank's part survives its trip to rank 0 as JSON, and
// the data-parallel and pipeline reports total their parts with the --metrics keys MPI runs
// have always written; every mode's interrupt says the same line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "engine/serving/engine.h"
#include "engine/serving/run_report.h"

namespace flexh2o::serving {
namespace {

using ::testing::HasSubstr;

engine::GenerationResult result(std::int64_t prompts, std::int64_t tokens, double prefill, double decode) {
  engine::GenerationResult r;
  r.sequences = prompts;
  r.prompt_tokens = 10 * prompts;
  r.prompt_tokens_computed = 7 * prompts;
  r.generated_tokens = tokens;
  r.prefill_steps = 2;
  r.decode_steps = tokens;
  r.decode_tokens = tokens - prompts;
  r.prefill_seconds = prefill;
  r.decode_seconds = decode;
  return r;
}

RunPart stage(int rank, double wall, double wait) {
  RunPart p{.name = "rank " + std::to_string(rank) + " (h)", .rank = rank, .host = "h"};
  p.placement = Placement{nlohmann::json{{"gpu_batch_size", 2}}, "gpu batch 2 x 1", TierPeaks{1, 2, 3}};
  p.result = result(4, 20, 0.5, 1.5);
  p.slice = policy::StageSlice{2 * rank, 2, rank == 0, rank == 1};
  p.wall_seconds = wall;
  p.wait_seconds = wait;
  p.spans = {{"compute", "compute_layer", "attention.0 b0", 0.25, 0.5, 64}};
  p.kv_reads.in_place = {100 * (rank + 1), 20, 0};
  p.kv_reads.staged = {0, 30, 4 * rank};
  // Each stage's layers' prefix copies from gpu rows into cpu ones; rank 1 forked a prefill on disk.
  p.kv_copies.prefixes.read = {64 * (rank + 1), 0, 0};
  p.kv_copies.prefixes.written = {0, 64 * (rank + 1), 0};
  p.kv_copies.forks.read = {0, 0, 16 * rank};
  p.kv_copies.forks.written = {0, 0, 16 * rank};
  // Rank 0's pool on gpu, rank 1's on cpu; some rows on gpu, the others on cpu.
  p.kv_held = {.prefixes = rank + 1,
               .rows = rank + 1,
               .fills = 2 * (rank + 1),
               .pools = {rank == 0 ? 1 : 0, rank == 0 ? 0 : 1, 0},
               .bytes = {1024 * (rank + 1), 512 * (rank + 1), 0},
               .bytes_without = {2048 * (rank + 1), 1024 * (rank + 1), 0}};
  return p;
}

TEST(RunReport, PartRoundTripsThroughJson) {
  const RunPart p = stage(1, 3.0, 0.75);
  const RunPart q = part_from_json(nlohmann::json::parse(to_json(p, true).dump()));
  EXPECT_EQ(q.name, p.name);
  EXPECT_EQ(q.rank, 1);
  ASSERT_TRUE(q.placement && q.slice);
  EXPECT_EQ(q.placement->policy_text, "gpu batch 2 x 1");
  EXPECT_EQ(q.placement->peaks.disk, 3);
  EXPECT_EQ(q.slice->first_layer, 2);
  EXPECT_TRUE(q.slice->head);
  EXPECT_EQ(q.result.prompt_tokens_computed, 28);
  EXPECT_DOUBLE_EQ(q.result.total_throughput(), p.result.total_throughput());
  EXPECT_DOUBLE_EQ(q.wait_seconds, 0.75);
  ASSERT_EQ(q.spans.size(), 1u);
  EXPECT_EQ(q.spans[0].name, "attention.0 b0");
  EXPECT_EQ(q.kv_reads.in_place, p.kv_reads.in_place);
  EXPECT_EQ(q.kv_reads.staged, p.kv_reads.staged);
  EXPECT_EQ(q.kv_copies.prefixes.read, p.kv_copies.prefixes.read);
  EXPECT_EQ(q.kv_copies.prefixes.written, p.kv_copies.prefixes.written);
  EXPECT_EQ(q.kv_copies.forks.read, p.kv_copies.forks.read);
  EXPECT_EQ(q.kv_copies.forks.written, p.kv_copies.forks.written);
  EXPECT_EQ(q.kv_held.prefixes, 2);
  EXPECT_EQ(q.kv_held.rows, 2);
  EXPECT_EQ(q.kv_held.fills, 4);
  EXPECT_EQ(q.kv_held.pools, p.kv_held.pools);
  EXPECT_EQ(q.kv_held.bytes, p.kv_held.bytes);
  EXPECT_EQ(q.kv_held.bytes_without, p.kv_held.bytes_without);
  // As --metrics has it: no trace, no policy text.
  const nlohmann::json m = to_json(p, false);
  EXPECT_FALSE(m.contains("spans"));
  EXPECT_FALSE(m.contains("policy_text"));
}

TEST(RunReport, PipelineTotalsItsStages) {
  RunReport r;
  r.mode = RunMode::Pipeline;
  r.model = "m";
  r.batching = "continuous";
  r.micro_batches = 2;
  r.parts = {stage(0, 2.0, 0.5), stage(1, 4.0, 1.5)};
  r.total = result(4, 20, 0.5, 1.5);
  const nlohmann::json j = r.to_json();
  EXPECT_EQ(j["mode"], "pipeline");
  EXPECT_EQ(j["stages"].size(), 2u);
  EXPECT_FALSE(j["stages"][0].contains("spans"));
  EXPECT_DOUBLE_EQ(j["total_seconds"].get<double>(), 4.0);  // the longest stage
  EXPECT_DOUBLE_EQ(j["total_throughput"].get<double>(), 20 / 4.0);
  EXPECT_DOUBLE_EQ(j["bubble_share"].get<double>(), (0.5 + 1.5) / (2 * 4.0));
  EXPECT_EQ(j["prompt_tokens_computed"], 28);
  for (const char* key : {"model", "micro_batches", "prompts", "prompt_tokens", "generated_tokens", "batching",
                          "slot_utilisation"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_THAT(r.text(), HasSubstr("stage 1, rank 1 (h): decoder layers 2-3 + head, gpu batch 2 x 1"));
  EXPECT_THAT(r.text(), HasSubstr("KV held once: 3 prefixes in 3 pool rows (gpu, cpu), 6 fills;"));
}

TEST(RunReport, DataParallelTotalsItsRanks) {
  RunReport r;
  r.mode = RunMode::DataParallel;
  r.model = "m";
  RunPart idle{.name = "rank 1 (h)", .rank = 1, .host = "h"};  // dealt no request: no placement
  RunPart busy = stage(0, 0, 0);
  busy.slice.reset();
  busy.finished_requests = 4;
  r.parts = {busy, idle};
  for (const RunPart& p : r.parts) r.total.add(p.result);
  const nlohmann::json j = r.to_json();
  EXPECT_EQ(j["mode"], "data_parallel");
  EXPECT_EQ(j["ranks"].size(), 2u);
  EXPECT_FALSE(j["ranks"][1].contains("policy"));
  EXPECT_EQ(j["ranks"][0]["finished_requests"], 4);
  EXPECT_DOUBLE_EQ(j["total_seconds"].get<double>(), 2.0);  // the slowest rank's prefill + decode
  EXPECT_DOUBLE_EQ(j["total_throughput"].get<double>(), 20 / 2.0);
  EXPECT_EQ(j["prompts"], 4);
  EXPECT_EQ(j["kv_read_bytes"]["total"], 100 + 20 + 30);  // the idle rank read none
  EXPECT_EQ(j["ranks"][0]["kv_read_bytes"]["by_tier"]["cpu"]["staged"], 30);
  EXPECT_EQ(j["kv_held"]["bytes"], 1024 + 512);  // the idle rank held none
  EXPECT_EQ(j["kv_held"]["by_tier"]["cpu"]["bytes_without"], 1024);
  EXPECT_THAT(r.text(), HasSubstr("data parallel over 2 ranks: 4 prompts"));
  EXPECT_EQ(j["kv_held"]["fills"], 2);
  EXPECT_THAT(r.text(), HasSubstr("KV held once: 1 prefix in 1 pool row (gpu), 2 fills; KV cache 1.50 KiB instead of 3.00 KiB "
                                  "(gpu 1.00 KiB instead of 2.00 KiB | cpu 512 B instead of 1.00 KiB)\n"));
}

// The KV read: in all, per step, and per tier in place and staged; over several ranks the
// parts' sum over the job's steps (a pipeline's: rank 0's, each stage reading its layers).
TEST(RunReport, KvReadsByTierAndStep) {
  engine::KvReads r;
  r.in_place = {1000, 200, 0};
  r.staged = {0, 300, 500};
  const nlohmann::json j = kv_reads_json(r, 4);
  EXPECT_EQ(j["total"], 2000);
  EXPECT_DOUBLE_EQ(j["per_step"].get<double>(), 500.0);
  EXPECT_EQ(j["by_tier"]["cpu"]["in_place"], 200);
  EXPECT_EQ(j["by_tier"]["cpu"]["staged"], 300);
  EXPECT_DOUBLE_EQ(j["by_tier"]["cpu"]["per_step"].get<double>(), 125.0);
  EXPECT_DOUBLE_EQ(j["by_tier"]["disk"]["per_step"].get<double>(), 125.0);
  EXPECT_EQ(kv_reads_from_json(j).staged, r.staged);
  EXPECT_EQ(kv_reads_text(r, 4), "KV read: 500 B per step (gpu 250 B in place | cpu 50 B in place | cpu 75 B staged | "
                                 "disk 125 B staged), 1.95 KiB over 4 steps\n");
  // What shared prefixes read once saved: beside the totals, not in them.
  r.shared_prefix_saved = 3072;
  const nlohmann::json saved = kv_reads_json(r, 4);
  EXPECT_EQ(saved["total"], 2000);
  EXPECT_EQ(saved["shared_prefix_saved"], 3072);
  EXPECT_EQ(kv_reads_from_json(saved).shared_prefix_saved, 3072);
  EXPECT_EQ(kv_reads_text(r, 4), "KV read: 500 B per step (gpu 250 B in place | cpu 50 B in place | cpu 75 B staged | "
                                 "disk 125 B staged), 1.95 KiB over 4 steps; 3.00 KiB not read (shared prefixes read once)\n");

  RunReport pipeline;
  pipeline.mode = RunMode::Pipeline;
  pipeline.parts = {stage(0, 2.0, 0.5), stage(1, 4.0, 1.5)};
  pipeline.total = result(4, 20, 0.5, 1.5);  // 22 steps
  const nlohmann::json p = pipeline.to_json()["kv_read_bytes"];
  EXPECT_EQ(p["total"], 100 + 20 + 30 + 200 + 20 + 30 + 4);
  EXPECT_EQ(p["steps"], 22);
  EXPECT_EQ(p["by_tier"]["gpu"]["in_place"], 300);
  EXPECT_EQ(p["by_tier"]["disk"]["staged"], 4);
  EXPECT_THAT(pipeline.text(), HasSubstr(" over 22 steps\n"));
}

// The KV row copies moved: per tier read and written, for shared prefixes and forked prefills
// apart; no line when nothing was copied; over several ranks the parts' sum.
TEST(RunReport, KvCopiesByTier) {
  engine::KvCopies c;
  EXPECT_EQ(kv_copies_text(c), "");
  c.prefixes.read = {2048, 1024, 0};
  c.prefixes.written = {1024, 0, 2048};
  const nlohmann::json j = kv_copies_json(c);
  EXPECT_EQ(j["prefixes"]["total"], 3072);
  EXPECT_EQ(j["prefixes"]["by_tier"]["cpu"]["read"], 1024);
  EXPECT_EQ(j["prefixes"]["by_tier"]["disk"]["written"], 2048);
  EXPECT_EQ(j["forks"]["total"], 0);
  const engine::KvCopies back = kv_copies_from_json(j);
  EXPECT_EQ(back.prefixes.read, c.prefixes.read);
  EXPECT_EQ(back.prefixes.written, c.prefixes.written);
  EXPECT_EQ(kv_copies_text(c), "KV copied: 3.00 KiB for shared prefixes (gpu 2.00 KiB read, 1.00 KiB written | "
                               "cpu 1.00 KiB read, 0 B written | disk 0 B read, 2.00 KiB written), 0 B for forked "
                               "prefills\n");

  for (const RunMode mode : {RunMode::Pipeline, RunMode::DataParallel}) {
    RunReport r;
    r.mode = mode;
    r.batching = "continuous";
    r.parts = {stage(0, 2.0, 0.5), stage(1, 4.0, 1.5)};
    if (mode == RunMode::DataParallel)
      for (RunPart& p : r.parts) p.slice.reset();
    r.total = result(4, 20, 0.5, 1.5);
    const nlohmann::json m = r.to_json()["kv_copy_bytes"];
    EXPECT_EQ(m["prefixes"]["total"], 64 + 128);
    EXPECT_EQ(m["prefixes"]["by_tier"]["gpu"]["read"], 64 + 128);
    EXPECT_EQ(m["prefixes"]["by_tier"]["cpu"]["written"], 64 + 128);
    EXPECT_EQ(m["forks"]["by_tier"]["disk"]["written"], 16);
    EXPECT_THAT(r.text(), HasSubstr("KV copied: 192 B for shared prefixes (gpu 192 B read, 0 B written | cpu 0 B read, "
                                    "192 B written), 16 B for forked prefills (disk 16 B read, 16 B written)\n"));
  }
}

TEST(RunReport, EveryModeSaysOneInterruptLine) {
  EXPECT_EQ(stopped_message("the pipeline", 3, 16, "out.jsonl"),
            "flexh2o: interrupted: the pipeline stopped after 3 of the job's 16 requests; rerun with --resume to "
            "continue\n");
  EXPECT_EQ(stopped_message("the run", 1, 2, ""), "flexh2o: interrupted: the run stopped after 1 of the job's 2 requests\n");
}

}  // namespace
}  // namespace flexh2o::serving
