#include "serve_bench.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <httplib.h>
#include <optional>
#include <pthread.h>
#include <sched.h>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/generate/generator.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/kernels/openblas_baseline.hpp>
#include <meshtensor/serve/server.hpp>

#include "matmul_bench.hpp"
#include "timing.hpp"

namespace meshtensor::bench {

namespace {

using Clock = std::chrono::steady_clock;

/// Alternating rounds of each server.
constexpr int kRounds = 3;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto at = static_cast<std::size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(at, values.size() - 1)];
}

/// A prompt of `length` letters, different per client and request.
std::string prompt_text(std::int64_t client, std::int64_t request, std::int64_t length) {
  std::string text;
  for (std::int64_t i = 0; i < length; ++i)
    text.push_back(static_cast<char>('a' + (client * 31 + request * 7 + i * 3) % 26));
  return text;
}

/// What one streamed request got.
struct StreamOutcome {
  bool ok = false;
  bool answered = false;  ///< any response arrived
  std::vector<std::int64_t> ids;
  std::vector<double> logprobs;
  double ttft = 0;
  double tpot = 0;
};

/// The numbers of the JSON array after `"key":[` in `text`, parsed with strtod (the server
/// prints doubles with the digits that read back to the same bits); false without the key.
bool numbers_after(const std::string& text, const char* key, std::vector<double>& out) {
  const std::size_t at = text.find(key);
  if (at == std::string::npos) return false;
  const char* p = text.c_str() + at + std::strlen(key);
  while (*p != ']' && *p != '\0') {
    char* end = nullptr;
    out.push_back(std::strtod(p, &end));
    if (end == p) return false;
    p = end;
    if (*p == ',') ++p;
  }
  return *p == ']';
}

/// Reads one event's token ids and log-probabilities without a full JSON parse: the client
/// shares the machine with the server, so it should cost as little as it can.
bool read_chunk(const std::string& event, std::vector<std::int64_t>& ids,
                std::vector<double>& logprobs, Clock::time_point& first, Clock::time_point& last) {
  std::vector<double> numbers;
  if (!numbers_after(event, "\"token_ids\":[", numbers)) return false;
  for (const double id : numbers) {
    if (ids.empty()) first = Clock::now();
    last = Clock::now();
    ids.push_back(static_cast<std::int64_t>(id));
  }
  numbers_after(event, "\"token_logprobs\":[", logprobs);
  return true;
}

/// Sends `body` as a streamed completion and reads its server-sent events.
StreamOutcome stream_request(httplib::Client& client, const std::string& body) {
  StreamOutcome out;
  std::string buffer;
  bool done = false;
  const Clock::time_point start = Clock::now();
  Clock::time_point first;
  Clock::time_point last;
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.body = body;
  request.set_header("Content-Type", "application/json");
  request.content_receiver = [&](const char* data, std::size_t size, std::uint64_t, std::uint64_t) {
    out.answered = true;
    buffer.append(data, size);
    for (std::size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) return false;
      if (event == "data: [DONE]") {
        done = true;
        continue;
      }
      if (!read_chunk(event, out.ids, out.logprobs, first, last)) return false;
    }
    return true;
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(request, response, error);
  out.ok = sent && response.status == 200 && done && !out.ids.empty();
  if (!out.ids.empty()) {
    out.ttft = std::chrono::duration<double>(first - start).count();
    if (out.ids.size() > 1) {
      out.tpot = std::chrono::duration<double>(last - first).count() /
                 static_cast<double>(out.ids.size() - 1);
    }
  }
  return out;
}

std::string request_body(const std::string& prompt, std::int64_t new_tokens, bool probe) {
  nlohmann::json body{{"prompt", prompt}, {"max_tokens", new_tokens}, {"stream", true}};
  if (probe) {
    body["temperature"] = 0.8;
    body["seed"] = 12345;
    body["logprobs"] = 0;
  } else {
    body["temperature"] = 0.0;
  }
  return body.dump();
}

/// A fresh decoder of `config` saved as a checkpoint under `root` (what `train` writes).
void save_fresh_decoder(const nn::DecoderSpec& config, const std::string& root) {
  comm::run_threads(1, [&](comm::Communicator& world) {
    const std::unique_ptr<nn::Decoder> model = nn::make_decoder(config);
    std::vector<checkpoint::SaveItem> items;
    for (nn::Parameter* p : model->parameters())
      items.push_back({"model." + p->name, p->value.shape(), {}, p->value, true});
    checkpoint::SaveOptions options;
    options.metadata["architecture"] = nn::decoder_architecture_text(config);
    checkpoint::save(world, root, 0, items, options);
  });
}

/// A server of `config` on a thread of its own, drained when this goes.
class BenchServer {
 public:
  BenchServer(const std::string& checkpoint, std::int64_t max_batch, std::int64_t clients,
              bool batch_variant, std::int64_t stream_interval_ms) {
    config_.checkpoint = checkpoint;
    config_.port = 0;
    config_.max_batch = max_batch;
    config_.max_queue = std::max<std::int64_t>(256, 4 * clients);
    config_.stream_interval_ms = stream_interval_ms;
    if (batch_variant) config_.batch_variant = kernels::openblas_linear_matmul();
    std::promise<std::string> url;
    std::future<std::string> listening = url.get_future();
    config_.on_listening = [&url](const std::string& at) { url.set_value(at); };
    thread_ = std::thread([this, &url] {
      try {
        comm::run_threads(
            1, [&](comm::Communicator& world) { serve::serve(world, config_, &control_); });
      } catch (...) {
        failure_ = std::current_exception();
        try {
          url.set_exception(std::current_exception());
        } catch (const std::future_error&) {  // it was listening already
        }
      }
    });
    try {
      url_ = listening.get();
    } catch (...) {
      thread_.join();
      throw;
    }
  }
  ~BenchServer() {
    if (thread_.joinable()) stop();
  }
  BenchServer(const BenchServer&) = delete;
  BenchServer& operator=(const BenchServer&) = delete;
  const std::string& url() const { return url_; }
  void stop() {
    control_.drain();
    thread_.join();
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  serve::ServeConfig config_;
  serve::ServeControl control_;
  std::thread thread_;
  std::exception_ptr failure_;
  std::string url_;
};

/// Keeps the calling client thread on the machine's last CPU: the clients stand in for other
/// machines, so they stay off the CPU the generation loop mostly runs on (the server's own HTTP
/// threads are not pinned). On one CPU, nothing changes.
void keep_to_last_cpu() {
  const unsigned count = std::thread::hardware_concurrency();
  if (count < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(count - 1, &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

/// What clients saw during one or more load phases.
struct LoadSamples {
  std::int64_t requests = 0, failed = 0, lost = 0, tokens = 0, probes = 0, probes_same = 0;
  double seconds = 0;
  std::vector<double> ttft, tpot;

  void merge(const LoadSamples& other) {
    requests += other.requests;
    failed += other.failed;
    lost += other.lost;
    tokens += other.tokens;
    probes += other.probes;
    probes_same += other.probes_same;
    seconds += other.seconds;
    ttft.insert(ttft.end(), other.ttft.begin(), other.ttft.end());
    tpot.insert(tpot.end(), other.tpot.begin(), other.tpot.end());
  }

  LoadFigures figures() const {
    LoadFigures f;
    f.requests = requests;
    f.failed = failed;
    f.lost = lost;
    f.tokens = tokens;
    f.seconds = seconds;
    f.requests_per_second = static_cast<double>(requests) / seconds;
    f.tokens_per_second = static_cast<double>(tokens) / seconds;
    f.ttft_p50 = percentile(ttft, 0.5);
    f.ttft_p99 = percentile(ttft, 0.99);
    f.tpot_p50 = percentile(tpot, 0.5);
    f.tpot_p99 = percentile(tpot, 0.99);
    f.probe_identical = probes > 0 && probes == probes_same;
    return f;
  }
};

bool same_bits(const StreamOutcome& a, const StreamOutcome& b) {
  return a.ids == b.ids && a.logprobs.size() == b.logprobs.size() &&
         std::equal(a.logprobs.begin(), a.logprobs.end(), b.logprobs.begin(),
                    [](double x, double y) {
                      return std::bit_cast<std::uint64_t>(x) == std::bit_cast<std::uint64_t>(y);
                    });
}

/// `clients` threads sending streamed requests back to back for `seconds`; client 0 sends the
/// seeded probe every fourth request and compares it with `alone`.
LoadSamples run_load(const std::string& url, const ServeBenchConfig& config, double seconds,
                     const StreamOutcome& alone) {
  std::vector<LoadSamples> per(static_cast<std::size_t>(config.clients));
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (std::int64_t c = 0; c < config.clients; ++c) {
    threads.emplace_back([&, c] {
      keep_to_last_cpu();
      (void)pthread_setname_np(pthread_self(), "bench-client");
      LoadSamples& mine = per[static_cast<std::size_t>(c)];
      httplib::Client client(url);
      client.set_read_timeout(60, 0);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);
      for (std::int64_t r = 0; seconds_since(start) < seconds; ++r) {
        const bool probe = c == 0 && r % 4 == 1;
        const StreamOutcome got = stream_request(
            client, request_body(probe ? "The probe" : prompt_text(c, r, config.prompt_tokens),
                                 config.new_tokens, probe));
        if (!got.answered) {
          ++mine.lost;
          continue;
        }
        if (!got.ok || static_cast<std::int64_t>(got.ids.size()) != config.new_tokens) {
          ++mine.failed;
          continue;
        }
        ++mine.requests;
        mine.tokens += static_cast<std::int64_t>(got.ids.size());
        mine.ttft.push_back(got.ttft);
        mine.tpot.push_back(got.tpot);
        if (probe) {
          ++mine.probes;
          if (same_bits(got, alone)) ++mine.probes_same;
        }
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  LoadSamples all;
  for (const LoadSamples& p : per)
    all.merge(p);
  all.seconds = seconds_since(start);
  return all;
}

/// One load phase of `seconds` against a fresh server; the probe runs alone on it first.
LoadSamples measure_server(const std::string& checkpoint, const ServeBenchConfig& config,
                           bool batch_variant, double seconds) {
  BenchServer server(checkpoint, config.max_batch > 0 ? config.max_batch : config.clients,
                     config.clients, batch_variant, config.stream_interval_ms);
  httplib::Client client(server.url());
  client.set_read_timeout(60, 0);
  client.set_tcp_nodelay(true);
  const StreamOutcome alone =
      stream_request(client, request_body("The probe", config.new_tokens, true));
  if (!alone.ok) throw Error("bench serve: the probe request failed on an idle server");
  LoadSamples samples = run_load(server.url(), config, seconds, alone);
  server.stop();
  return samples;
}

/// The generator alone: `clients` requests of the benchmark's lengths decoded together, three
/// rounds; each round's tokens/s is added to `rates`.
void time_generator(const std::string& checkpoint, const ServeBenchConfig& config,
                    bool batch_variant, std::vector<double>& rates) {
  comm::run_threads(1, [&](comm::Communicator& world) {
    const std::unique_ptr<nn::Decoder> model = generate::load_decoder(world, checkpoint);
    std::optional<nn::BatchVariantScope> variant;
    if (batch_variant) variant.emplace(kernels::openblas_linear_matmul());
    std::vector<generate::Request> requests;
    for (std::int64_t c = 0; c < config.clients; ++c)
      requests.push_back(
          {generate::byte_tokens(prompt_text(c, 0, config.prompt_tokens)), config.new_tokens, {}});
    generate::Generator generator(
        *model, {config.max_batch > 0 ? config.max_batch : config.clients, 64, false});
    for (int round = 0; round < 3; ++round) {
      const Clock::time_point start = Clock::now();
      generator.generate(requests);
      rates.push_back(static_cast<double>(config.clients * config.new_tokens) /
                      seconds_since(start));
    }
  });
}

}  // namespace

ServeBenchResult run_serve_bench(const ServeBenchConfig& config) {
  if (config.clients < 1 || config.seconds <= 0 || config.prompt_tokens < 1 ||
      config.new_tokens < 1)
    throw InvalidArgument("bench serve: clients, seconds, prompt and new tokens must be positive");
  std::string checkpoint = config.checkpoint;
  std::filesystem::path temporary;
  if (checkpoint.empty()) {
    temporary = std::filesystem::temp_directory_path() /
                fmt::format("meshtensor-bench-serve-{}", std::random_device{}());
    save_fresh_decoder(config.model, temporary.string());
    checkpoint = temporary.string();
  }
  ServeBenchResult result;
  try {
    nn::DecoderSpec served;
    comm::run_threads(1, [&](comm::Communicator& world) {
      served = generate::read_architecture(world, checkpoint);
    });
    if (config.prompt_tokens + config.new_tokens > served.context) {
      throw InvalidArgument(fmt::format(
          "bench serve: --prompt-tokens {} plus --new-tokens {} exceed the model's context of {}",
          config.prompt_tokens, config.new_tokens, served.context));
    }
    result.model = nn::decoder_spec_text(served);
    // The servers run in alternating rounds, with the generator timed before, between and
    // after them, so that a machine whose speed drifts during the run favours none of them.
    std::vector<double> rates;
    std::vector<double> variant_rates;
    const auto time_both = [&] {
      time_generator(checkpoint, config, false, rates);
      time_generator(checkpoint, config, true, variant_rates);
    };
    LoadSamples invariant;
    LoadSamples batch_variant;
    for (int round = 0; round < kRounds; ++round) {
      time_both();
      invariant.merge(measure_server(checkpoint, config, false, config.seconds / kRounds));
      batch_variant.merge(measure_server(checkpoint, config, true, config.seconds / kRounds));
    }
    time_both();
    result.invariant = invariant.figures();
    result.batch_variant = batch_variant.figures();
    result.generator_tokens_per_second = median(rates);
    result.generator_batch_variant_tokens_per_second = median(variant_rates);
  } catch (...) {
    if (!temporary.empty()) std::filesystem::remove_all(temporary);
    throw;
  }
  if (!temporary.empty()) std::filesystem::remove_all(temporary);
  return result;
}

}  // namespace meshtensor::bench
