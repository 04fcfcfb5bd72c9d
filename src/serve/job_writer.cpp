#include "job_writer.hpp"

namespace meshtensor::serve {

namespace {

std::string event(const std::string& data) {
  return "data: " + data + "\n\n";
}

}  // namespace

JobWriter::JobWriter(std::shared_ptr<Job> job) : job_(std::move(job)) {}

JobWriter::Output JobWriter::next() {
  const std::lock_guard lock(job_->mutex);
  if (job_->version == seen_) return {};
  seen_ = job_->version;
  if (!job_->error.empty()) {
    const std::string error = dump(error_body({500, job_->error, "server_error", "", ""}));
    if (streaming()) return {event(error) + "data: [DONE]\n\n", true};
    return {error, true, 500};
  }
  if (streaming()) return stream_events();
  if (job_->unfinished != 0) return {};
  return {dump(completion_response(job_->header, job_->params, job_->choices)), true};
}

JobWriter::Output JobWriter::stream_events() {
  const Job& job = *job_;
  if (!job.admitted) return {};
  if (!chunks_) chunks_.emplace(job.header, job.params.chat);
  const CompletionParams& params = job.params;
  const std::size_t count = job.choices.size();
  sent_.resize(count, 0);
  started_.resize(count, false);
  closed_.resize(count, false);
  Output out;
  for (std::size_t c = 0; c < count; ++c) {
    const ChoiceResult& choice = job.choices[c];
    if (closed_[c]) continue;
    const bool ended = !choice.finish_reason.empty();
    const std::size_t to = ended ? choice.tokens.size()
                                 : streamable_tokens(choice.tokens, params.stop, *params.tokenizer);
    // A chat choice's first chunk carries the role; a completion's, an echoed prompt.
    const bool with_prompt = (params.chat || params.echo) && !started_[c];
    // An echoed prompt goes out with its scores: it waits until the whole prompt is scored.
    const bool scored =
        !params.echo || !params.logprobs || choice.prompt_scores.size() + 1 >= choice.prompt.size();
    if (with_prompt && !scored && !ended) continue;
    if (to <= sent_[c] && !with_prompt && !ended) continue;
    out.text += event(chunks_->chunk(params, c, choice, sent_[c], to, with_prompt, ended));
    sent_[c] = to;
    started_[c] = true;
    closed_[c] = ended;
  }
  if (job.unfinished == 0) {
    if (params.include_usage) out.text += usage_event();
    out.text += "data: [DONE]\n\n";
    out.finished = true;
  }
  return out;
}

std::string JobWriter::usage_event() const {
  Json last;
  last["id"] = job_->header.id;
  last["object"] = response_object(job_->params.chat, true);
  last["created"] = job_->header.created;
  last["model"] = job_->header.model;
  last["choices"] = Json::array();
  last["usage"] = usage(job_->params, job_->choices);
  return event(dump(last));
}

}  // namespace meshtensor::serve
