#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <meshtensor/serve/api.hpp>
#include <meshtensor/serve/scheduler.hpp>

namespace meshtensor::serve {

/// Turns a job's progress into response text: a stream's server-sent events as its tokens
/// arrive, or a non-streamed job's whole answer once it finished.
class JobWriter {
 public:
  explicit JobWriter(std::shared_ptr<Job> job);

  /// What to send now.
  struct Output {
    std::string text;       ///< empty: nothing new
    bool finished = false;  ///< the response ends with `text`
    int status = 200;       ///< a non-streamed answer's status (500 when the job failed)
  };
  /// Takes the job's lock: a stream's new events (each choice's new text, its end, then usage
  /// and [DONE]); a non-streamed job's answer once every choice ended.
  Output next();
  bool streaming() const { return job_->params.stream; }
  const std::shared_ptr<Job>& job() const { return job_; }

 private:
  Output stream_events();
  std::string usage_event() const;

  std::shared_ptr<Job> job_;
  std::uint64_t seen_ = ~std::uint64_t{0};
  std::optional<ChunkWriter> chunks_;  ///< once the job's weights are known
  std::vector<std::size_t> sent_;
  std::vector<bool> started_;
  std::vector<bool> closed_;
};

}  // namespace meshtensor::serve
