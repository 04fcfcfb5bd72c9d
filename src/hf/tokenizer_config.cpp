#include "tokenizer_config.hpp"

#include <algorithm>
#include <charconv>
#include <optional>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/untrusted_json.hpp>

namespace meshtensor::hf {

namespace {

using Json = nlohmann::json;

/// A token field of tokenizer_config.json: its text ("" for null or absent).
std::string token_field(const Json& config, const char* key, const std::string& file) {
  if (!config.contains(key) || config[key].is_null()) return "";
  const Json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  throw DataError(
      fmt::format("{}: \"{}\" is {}, not a token (its text, or an object with its "
                  "\"content\")",
                  file, key, json_excerpt(value)));
}

/// A true-or-false field, or nullopt when absent or null.
std::optional<bool> flag(const Json& config, const char* key, const std::string& file) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  if (!config[key].is_boolean())
    throw DataError(
        fmt::format("{}: \"{}\" is {}, not true or false", file, key, json_excerpt(config[key])));
  return config[key].get<bool>();
}

/// The id of a special token in the tokenizer, named in errors by the file and field.
std::int64_t id_of(const tokenize::Tokenizer& tokenizer, const std::string& token,
                   const std::string& file, const char* key) {
  const auto id = tokenizer.token_id(token);
  if (!id) throw DataError(fmt::format("{}: {} '{}' is not in the tokenizer", file, key, token));
  return *id;
}

/// add_bos_token / add_eos_token, where given: the tokens around a text become bos and eos.
void apply_added_ends(tokenize::Tokenizer& tokenizer, const Json& config, const std::string& file,
                      const tokenize::SpecialRoles& roles) {
  const std::optional<bool> add_bos = flag(config, "add_bos_token", file);
  const std::optional<bool> add_eos = flag(config, "add_eos_token", file);
  if (!add_bos && !add_eos) return;
  const tokenize::PostProcessor& now = tokenizer.post_processor();
  std::vector<std::int64_t> before = now.before();
  std::vector<std::int64_t> after = now.after();
  std::vector<std::string> before_names;
  std::vector<std::string> after_names;
  const auto end = [&](std::optional<bool> add, const std::string& token, const char* key,
                       std::vector<std::int64_t>& ids, std::vector<std::string>& names) {
    if (!add) {
      for (const std::int64_t id : ids)
        names.push_back(tokenizer.token_bytes(id));
      return;
    }
    ids.clear();
    if (!*add) return;
    if (token.empty())
      throw DataError(fmt::format("{}: \"add_{}\" is true, but it names no {}", file, key, key));
    ids.push_back(id_of(tokenizer, token, file, key));
    names.push_back(token);
  };
  end(add_bos, roles.bos_token, "bos_token", before, before_names);
  end(add_eos, roles.eos_token, "eos_token", after, after_names);
  if (before == now.before() && after == now.after()) return;  // the template as it was
  tokenizer.set_post_processor(
      tokenize::PostProcessor::around(before, after, before_names, after_names), file);
}

/// added_tokens_decoder: each token by its id, marked special or not.
void apply_added_tokens(tokenize::Tokenizer& tokenizer, const Json& config,
                        const std::string& file) {
  if (!config.contains("added_tokens_decoder") || config["added_tokens_decoder"].is_null()) return;
  const Json& added = config["added_tokens_decoder"];
  if (!added.is_object())
    throw DataError(
        fmt::format("{}: \"added_tokens_decoder\" is not an object of tokens by id", file));
  for (const auto& [key, token] : added.items()) {
    std::int64_t id = -1;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    const std::string content = token.is_object() ? token_field(token, "content", file) : "";
    if (error != std::errc() || end != key.data() + key.size() || content.empty()) {
      throw DataError(
          fmt::format("{}: added_tokens_decoder \"{}\" is not an id with a token's "
                      "\"content\"",
                      file, key));
    }
    if (tokenizer.token_id(content) != id) {
      throw DataError(fmt::format(
          "{}: added_tokens_decoder gives id {} to '{}', which the "
          "tokenizer has {}",
          file, id, content,
          tokenizer.token_id(content) ? fmt::format("as id {}", *tokenizer.token_id(content))
                                      : std::string("not at all")));
    }
    if (const std::optional<bool> special = flag(token, "special", file))
      tokenizer.set_special(id, *special);
  }
}

/// A chat_template field: its text, or the "default" one of a list of {"name", "template"}.
std::string chat_template_field(const Json& config, const std::string& file) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return "";
  const Json& value = config["chat_template"];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    for (const Json& named : value) {
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string())
        return named["template"].get<std::string>();
    }
  }
  throw DataError(
      fmt::format("{}: \"chat_template\" is {}, not a template's text (or a list "
                  "holding one named \"default\")",
                  file, json_excerpt(value)));
}

/// The ids an eos_token_id field holds: one id, a list of them, or none.
std::vector<std::int64_t> eos_ids(const Json& config, const std::string& file) {
  std::vector<std::int64_t> ids;
  if (!config.is_object() || !config.contains("eos_token_id")) return ids;
  const Json& value = config["eos_token_id"];
  const Json list = value.is_array() ? value : value.is_null() ? Json::array() : Json{value};
  for (const Json& id : list) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0) {
      throw DataError(fmt::format("{}: \"eos_token_id\" is {}, not an id or a list of ids", file,
                                  json_excerpt(value)));
    }
    ids.push_back(id.get<std::int64_t>());
  }
  return ids;
}

}  // namespace

void apply_tokenizer_configs(tokenize::Tokenizer& tokenizer, const Json& tokenizer_config,
                             const std::string& tokenizer_config_file,
                             const Json& generation_config,
                             const std::string& generation_config_file, const Json& model_config,
                             const std::string& model_config_file,
                             const std::string* chat_template_file) {
  tokenize::SpecialRoles roles;
  if (tokenizer_config.is_object()) {
    const std::string& file = tokenizer_config_file;
    roles.bos_token = token_field(tokenizer_config, "bos_token", file);
    roles.eos_token = token_field(tokenizer_config, "eos_token", file);
    roles.pad_token = token_field(tokenizer_config, "pad_token", file);
    for (const auto& [token, key] :
         {std::pair{&roles.bos_token, "bos_token"}, std::pair{&roles.eos_token, "eos_token"},
          std::pair{&roles.pad_token, "pad_token"}}) {
      if (!token->empty()) id_of(tokenizer, *token, file, key);
    }
    apply_added_tokens(tokenizer, tokenizer_config, file);
    apply_added_ends(tokenizer, tokenizer_config, file, roles);
    tokenizer.set_chat_template(chat_template_field(tokenizer_config, file));
  }
  if (chat_template_file != nullptr) tokenizer.set_chat_template(*chat_template_file);
  roles.end_ids = generation_config.is_object() ? eos_ids(generation_config, generation_config_file)
                                                : eos_ids(model_config, model_config_file);
  if (!roles.eos_token.empty()) {
    const std::int64_t eos = *tokenizer.token_id(roles.eos_token);
    if (std::find(roles.end_ids.begin(), roles.end_ids.end(), eos) == roles.end_ids.end())
      roles.end_ids.push_back(eos);
  }
  const std::string& source =
      generation_config.is_object() ? generation_config_file : model_config_file;
  tokenizer.set_roles(std::move(roles), source);
}

Json tokenizer_config_json(const tokenize::Tokenizer& tokenizer, std::int64_t context) {
  const tokenize::SpecialRoles& roles = tokenizer.roles();
  const tokenize::PostProcessor& post = tokenizer.post_processor();
  const auto named = [](const std::string& token) { return token.empty() ? Json() : Json(token); };
  std::string bos = roles.bos_token;
  if (bos.empty() && post.before().size() == 1) bos = tokenizer.token_bytes(post.before()[0]);
  std::string eos = roles.eos_token;
  if (eos.empty() && post.after().size() == 1) eos = tokenizer.token_bytes(post.after()[0]);
  Json added = Json::object();
  for (const tokenize::AddedToken& token : tokenizer.added_tokens()) {
    added[std::to_string(token.id)] = {
        {"content", token.content},         {"lstrip", token.lstrip},
        {"normalized", token.normalized},   {"rstrip", token.rstrip},
        {"single_word", token.single_word}, {"special", token.special}};
  }
  Json out = {{"added_tokens_decoder", added},
              {"bos_token", named(bos)},
              {"clean_up_tokenization_spaces", false},
              {"eos_token", named(eos)},
              {"model_max_length", context},
              {"pad_token", named(roles.pad_token)},
              {"tokenizer_class", "PreTrainedTokenizerFast"}};
  if (!tokenizer.chat_template().empty()) out["chat_template"] = tokenizer.chat_template();
  if (post.before().size() <= 1) out["add_bos_token"] = post.before().size() == 1;
  if (post.after().size() <= 1) out["add_eos_token"] = post.after().size() == 1;
  return out;
}

Json generation_config_json(const tokenize::Tokenizer& tokenizer, std::int64_t context) {
  const std::vector<std::int64_t>& ends = tokenizer.roles().end_ids;
  const std::vector<std::int64_t>& before = tokenizer.post_processor().before();
  return {{"bos_token_id", before.size() == 1 ? Json(before[0]) : Json()},
          {"eos_token_id", ends.empty()       ? Json()
                           : ends.size() == 1 ? Json(ends[0])
                                              : Json(ends)},
          {"max_length", context}};
}

}  // namespace meshtensor::hf
