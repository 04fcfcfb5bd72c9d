#include <array>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/file.hpp>
#include <meshtensor/serve/settings.hpp>

namespace meshtensor::serve {

namespace {

constexpr std::array kFields = {
    SettingField{"checkpoint",
                 "checkpoint directory, or a root whose LATEST names one (reloads re-read it)"},
    SettingField{"host", "address to listen on (default 127.0.0.1)"},
    SettingField{"port", "port (default 8000; 0: any free port)"},
    SettingField{"mode", "ordered (default) or exact"},
    SettingField{"max_batch", "choices generated together (default 16)"},
    SettingField{"max_queue", "choices that may wait for a slot; more answer 429 (default 256)"},
    SettingField{"prefill_chunk", "prompt tokens a choice feeds per step (default 64)"},
    SettingField{"max_context",
                 "positions a choice may use, prompt and new tokens (default: the model's "
                 "context); each of max_batch choices holds a key/value cache of this many"},
    SettingField{"max_body_bytes", "largest request body; larger answer 413 (default 1048576)"},
    SettingField{"model_name",
                 "the model's id in the API (default meshtensor-FAMILY: meshtensor-gpt, "
                 "meshtensor-llama)"},
    SettingField{"chat_template",
                 "a file holding a Jinja chat template used for /v1/chat/completions instead of "
                 "the model's own (tokenizer_config.json's)"},
    SettingField{"stream_interval_ms",
                 "after its first chunk, a stream writes at most once per interval, carrying "
                 "every token that arrived meanwhile (default 10; 0: every step)"},
    SettingField{"max_connections",
                 "connections open at once; more are answered 503 and closed (default 4096, "
                 "less when the process may not open that many files)"},
};

}  // namespace

std::span<const SettingField> ServeSettings::table() {
  return kFields;
}

ServeConfig ServeSettings::config() const {
  ServeConfig config;
  config.checkpoint = text("checkpoint", "");
  config.host = text("host", "127.0.0.1");
  if (config.host.empty()) throw ParseError("`host` is empty");
  config.port = static_cast<int>(integer("port", "8000", 0, 65535));
  config.mode = comm::parse_reduction_mode(text("mode", "ordered"));
  if (config.mode == comm::ReductionMode::native) {
    throw ParseError(
        "`mode` native: the server runs in ordered or exact mode (the trainer's bits need one of "
        "them)");
  }
  config.max_batch = integer("max_batch", "16", 1, 4096);
  config.max_queue = integer("max_queue", "256", 1, 1 << 20);
  config.prefill_chunk = integer("prefill_chunk", "64", 1, 1 << 20);
  config.max_context = integer("max_context", "0", 0, std::int64_t{1} << 20);
  config.limits.max_body_bytes = integer("max_body_bytes", "1048576", 1024, std::int64_t{1} << 30);
  config.model_name = text("model_name", "meshtensor-gpt");
  if (config.model_name.empty()) throw ParseError("`model_name` is empty");
  if (const std::string path = text("chat_template", ""); !path.empty()) {
    config.chat_template = read_regular_file(path, std::int64_t{1} << 20, "a chat template");
    config.chat_template_origin = path;
  }
  config.stream_interval_ms = integer("stream_interval_ms", "10", 0, 10000);
  config.max_connections = integer("max_connections", "4096", 1, 1 << 20);
  return config;
}

}  // namespace meshtensor::serve
