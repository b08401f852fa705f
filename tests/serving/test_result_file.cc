// The job's --out file (engine/serving/result_file.h): whatever goes wrong, the user's file keeps
// its bytes or only whole result lines.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/serving/request.h"
#include "engine/serving/result_file.h"
#include "tests/support/error_of.h"

#include "tests/support/test_models.h"

namespace flexh2o {
namespace {

using serving::ResultFile;
using testing::error_of;

std::string result(const std::string& id_json, const std::string& text = "x") {
  const std::int32_t tokens[] = {1, 2, 3};
  return ResultFile::line(id_json, text, tokens);
}

TEST(ResultFile, ResumeRefusesAFileOfOtherTextAndLeavesItAsItWas) {
  testing::TempDir dir;
  const std::string path = dir.file("notes.txt");
  // A user's text (last line without newline), results followed by text, text before an
  // unfinished result line, and a line nested deeper than any result (no recursion over it).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string& text : {std::string("my notes\nthe last line, no newline"), std::string("just one line"),
                                  result("1") + "not a result\n", std::string("text\n{\"id\": 7, \"te"),
                                  result("1") + deep + "\n"}) {
    testing::write_file(path, text);
    const std::string err = error_of([&] { ResultFile out(path, true, ""); });
    EXPECT_NE(err.find("not a result line"), std::string::npos) << err;
    EXPECT_NE(err.find(path), std::string::npos) << err;
    EXPECT_EQ(testing::read_file(path), text);
  }
}

TEST(ResultFile, ResumeKeepsResultsAndCutsAnUnfinishedLineOnlyWhenWriting) {
  testing::TempDir dir;
  const std::string path = dir.file("out.jsonl");
  const std::string before = result("\"a\"") + result("2") + "{\"id\": \"c\", \"te";
  testing::write_file(path, before);
  {
    ResultFile out(path, true, "");
    EXPECT_EQ(out.done_ids(), (std::set<std::string>{"\"a\"", "2"}));
  }
  EXPECT_EQ(testing::read_file(path), before) << "nothing written, nothing cut";
  ResultFile out(path, true, "");
  out.add_line(result("\"c\""));
  out.flush();
  EXPECT_EQ(testing::read_file(path), result("\"a\"") + result("2") + result("\"c\""));
}

// A request whose generation failed gets a line saying why beside its tokens so far; a resumed
// run counts it done, as any result.
TEST(ResultFile, AFailedRequestsLineSaysWhyAndCountsAsDone) {
  const std::int32_t tokens[] = {4};
  const std::string failed = ResultFile::line("\"f\"", "x", tokens, "the grammar keeps too many positions open");
  const auto j = nlohmann::json::parse(failed);
  EXPECT_EQ(j["error"], "the grammar keeps too many positions open");
  EXPECT_EQ(j["tokens"], nlohmann::json::array({4}));
  EXPECT_FALSE(nlohmann::json::parse(result("1")).contains("error"));
  testing::TempDir dir;
  const std::string path = dir.file("out.jsonl");
  testing::write_file(path, result("1") + failed);
  ResultFile out(path, true, "");
  EXPECT_EQ(out.done_ids(), (std::set<std::string>{"1", "\"f\""}));
}

TEST(ResultFile, AnExistingFileIsReplacedOnlyByTheFirstResults) {
  testing::TempDir dir;
  const std::string path = dir.file("out.jsonl");
  testing::write_file(path, "the results of last week\n");
  { ResultFile out(path, false, ""); }  // a run that failed before its first result
  EXPECT_EQ(testing::read_file(path), "the results of last week\n");
  ResultFile out(path, false, "");
  out.add_line(result("1"));
  out.flush();
  out.add_line(result("2"));
  out.flush();
  EXPECT_EQ(testing::read_file(path), result("1") + result("2"));
}

// The lock belongs to the open file (flock), so a second open in this same process meets it
// as another run would; through a hard link too.
TEST(ResultFile, ASecondOpenOfAHeldFileIsAnErrorNamingTheHolder) {
  testing::TempDir dir;
  const std::string path = dir.file("out.jsonl");
  testing::write_file(path, result("1"));
  std::filesystem::create_hard_link(path, dir.file("link.jsonl"));
  {
    const ResultFile held(path, true, "");
    for (const std::string& other : {path, dir.file("link.jsonl")})
      for (const bool resume : {false, true}) {
        const std::string err = error_of([&] { ResultFile second(other, resume, ""); });
        EXPECT_NE(err.find("--out " + other + " is in use by another run (pid " + std::to_string(::getpid()) +
                           " on host "),
                  std::string::npos)
            << err;
      }
    EXPECT_EQ(testing::read_file(path), result("1"));
  }
  EXPECT_NO_THROW(ResultFile again(path, true, "")) << "the lock goes with the run";
}

TEST(ResultFile, ANewFileThatGetsNoResultIsRemovedAgain) {
  testing::TempDir dir;
  const std::string path = dir.file("new.jsonl");
  {
    const ResultFile out(path, false, "");
    EXPECT_TRUE(std::filesystem::exists(path)) << "created, to be locked";
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  {
    ResultFile out(path, false, "");
    out.add_line(result("1"));
    out.flush();
  }
  EXPECT_EQ(testing::read_file(path), result("1"));
}

TEST(ResultFile, ResumeRefusesAFileHoldingAnIdTwice) {
  testing::TempDir dir;
  const std::string path = dir.file("out.jsonl");
  const std::string text = result("1") + result("\"a\"") + result("1");
  testing::write_file(path, text);
  const std::string err = error_of([&] { ResultFile out(path, true, ""); });
  EXPECT_NE(err.find(path + ":3: id 1 is on line 1 too"), std::string::npos) << err;
  EXPECT_EQ(testing::read_file(path), text);
  EXPECT_NO_THROW(ResultFile again(path, false, "")) << "the refused run let go of the lock";
}

TEST(ResultFile, ThePromptsFileIsNeverTheOutFile) {
  testing::TempDir dir;
  const std::string prompts = dir.file("in.jsonl");
  const std::string text = "{\"id\": 1, \"prompt\": \"hi\"}\n";
  testing::write_file(prompts, text);
  std::filesystem::create_symlink(prompts, dir.file("symlink.jsonl"));
  std::filesystem::create_hard_link(prompts, dir.file("hardlink.jsonl"));
  for (const std::string& out : {prompts, dir.file("symlink.jsonl"), dir.file("hardlink.jsonl")})
    for (const bool resume : {false, true}) {
      const std::string err = error_of([&] { ResultFile f(out, resume, prompts); });
      EXPECT_NE(err.find("is the --prompts file"), std::string::npos) << out << ": " << err;
      EXPECT_EQ(testing::read_file(prompts), text);
    }
}

TEST(ResultFile, AFailedWriteLeavesOnlyWholeLinesAndSaysHowManyResults) {
  testing::TempDir dir;
  const std::string path = dir.file("out.jsonl");
  ResultFile out(path, false, "");
  out.add_line(result("1"));
  out.flush();
  const std::string first = testing::read_file(path);
  // A file size limit stands in for a full disk: writes past it fail (EFBIG) part way.
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto saved_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = first.size() + 100;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  for (int i = 2; i < 40; ++i) out.add_line(result(std::to_string(i), std::string(20, 'y')));
  const std::string err = error_of([&] { out.flush(); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, saved_handler);
  EXPECT_NE(err.find("holds the 1 results"), std::string::npos) << err;
  EXPECT_EQ(testing::read_file(path), first);
}

TEST(ResultFile, StreamsToADeviceAndRefusesWhatItCannotWrite) {
  testing::TempDir dir;
  ResultFile null("/dev/null", false, "");
  null.add_line(result("1"));
  EXPECT_NO_THROW(null.flush());
  EXPECT_NE(error_of([] { ResultFile f("/dev/null", true, ""); }).find("not a regular file"), std::string::npos);
  EXPECT_NE(error_of([&] { ResultFile f(dir.path(), false, ""); }).find("not a regular file"), std::string::npos);
  EXPECT_NE(error_of([] { ResultFile f("/nonexistent-dir/out.jsonl", false, ""); }).find("/nonexistent-dir/out.jsonl"),
            std::string::npos);
}

TEST(Request, TravelsBetweenRanksWhole) {
  serving::Request r{"\"p7\"", "Once", {2, 100, 7}, 12, {.temperature = 0.5f, .top_p = 0.9f, .seed = 42}, 7};
  r.sampling.top_k = 40;
  r.sampling.min_p = 0.05f;
  r.sampling.repetition_penalty = 1.3f;
  r.sampling.presence_penalty = 0.5f;
  r.sampling.frequency_penalty = -0.25f;
  r.sampling.logit_bias = {{3, -2.0f}, {9, 1.5f}};
  r.sampling.min_tokens = 2;
  r.sampling.ignore_eos = true;
  r.sampling.stop_token_ids = {5, 6};
  r.sampling.logprobs = 3;
  r.source = 4;
  r.choice = 2;
  r.stop = {"\n\n", "END"};
  const serving::Request back = serving::request_from_json(serving::to_json(r));
  EXPECT_EQ(back.id_json, r.id_json);
  EXPECT_EQ(back.text, r.text);
  EXPECT_EQ(back.prompt, r.prompt);
  EXPECT_EQ(back.max_tokens, r.max_tokens);
  EXPECT_EQ(back.sampling.temperature, r.sampling.temperature);
  EXPECT_EQ(back.sampling.top_p, r.sampling.top_p);
  EXPECT_EQ(back.sampling.seed, r.sampling.seed);
  EXPECT_EQ(serving::to_json(back.sampling), serving::to_json(r.sampling)) << "every sampling field travels";
  EXPECT_EQ(back.stream, r.stream);
  EXPECT_EQ(back.source, r.source);
  EXPECT_EQ(back.choice, r.choice);
  EXPECT_EQ(back.stop, r.stop);
}

}  // namespace
}  // namespace flexh2o
