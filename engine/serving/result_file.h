// The job's --out file: one JSON line per finished request ({"id", "text", "tokens"}), written
// so that a run never damages what the user had:
//  - Opening takes the file's lock for the whole run (out_lock.h): a second run on it stops
//    with an error naming the holder.
//  - Opening checks what could go wrong later, before the model loads: the path is a regular
//    file or a stream (a character device or FIFO, e.g. /dev/null, written to without
//    truncation or fsync), it is not the prompts file (same device and inode: symlinks and hard
//    links count), and with resume every complete line is a result line and an unfinished last
//    line is the start of one, and no id is on two lines. Only then may the unfinished line be cut.
//  - Nothing is truncated or cut until the first results are written: a run that fails before
//    its first result leaves an existing file exactly as it was (and removes one it created).
//  - Lines are appended whole: when a write or fsync fails (ENOSPC, EFBIG) the part written is
//    cut back and the error says how many results the file holds.
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <sys/stat.h>
#include <sys/types.h>
#include <vector>

namespace flexh2o::serving {

// Which lines a results file holds: our own ({"id", "text", "tokens"}) or OpenAI batch results
// ({"id", "custom_id", "response", "error"}, openai_results.h).
enum class ResultFormat { Simple, OpenAi };

class ResultFile {
 public:
  // resume: keep the results already there (their ids are in done_ids()) and append; otherwise
  // the file is replaced when the first results are written. `prompts_path` (may be empty) must
  // not be the same file. Throws naming the path and what to do.
  ResultFile(std::string path, bool resume, const std::string& prompts_path,
             ResultFormat format = ResultFormat::Simple);
  ~ResultFile();
  ResultFile(const ResultFile&) = delete;
  ResultFile& operator=(const ResultFile&) = delete;

  // Ids (as compact JSON) of the results found when resuming.
  const std::set<std::string>& done_ids() const { return done_ids_; }
  // The line of one result, newline included; `error`: why the request's generation failed
  // ("": it did not), an "error" field beside its text and tokens so far.
  static std::string line(const std::string& id_json, const std::string& text, std::span<const std::int32_t> tokens,
                          const std::string& error = {});
  // Queues whole lines made by line() (here or on another rank).
  void add_line(const std::string& line) { pending_ += line; }
  // Writes the queued lines and fsyncs them (a regular file); on failure cuts the file back to
  // its last whole line and throws.
  void flush();

 private:
  void check_existing(const struct stat& st, const std::string& prompts_path);
  void check_resumable(const std::string& text);
  void start_writing();
  void release();
  [[noreturn]] void fail(const char* what, int err);

  std::string path_;
  bool resume_ = false;
  ResultFormat format_ = ResultFormat::Simple;
  bool stream_ = false;   // not a regular file: written through, never truncated, cut or fsynced, not locked
  int fd_ = -1;           // a regular file: opened and locked at once (out_lock.h); a stream: by the first flush
  bool created_ = false;  // the file was not there before this run
  bool writing_ = false;  // the first flush has truncated (or, resuming, cut) the file
  off_t keep_bytes_ = 0;  // resume: the whole lines found; an unfinished tail after them is cut
  std::int64_t results_ = 0;  // result lines in the file
  std::string pending_;
  std::set<std::string> done_ids_;
};

// Where a job's finished results go: whole lines appended to --out and made durable, or printed
// on stdout without it.
void write_results(std::optional<ResultFile>& out, std::span<const std::string> lines);

}  // namespace flexh2o::serving
