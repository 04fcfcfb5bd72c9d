#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtensor::tokenize {

/// The post-processor of a `tokenizer.json`, for one sequence: the special tokens it puts
/// before and after the ids of a text (TemplateProcessing's "single" template, BertProcessing's
/// and RobertaProcessing's cls and sep; ByteLevel's adds none). Hugging Face's encode() adds
/// them unless asked not to.
class PostProcessor {
 public:
  /// None: no tokens are added.
  PostProcessor() = default;
  /// The post-processor `spec` describes (null: none). DataError naming a part meshtensor does
  /// not compute or a template it cannot read.
  static PostProcessor from_json(const nlohmann::json& spec, const std::string& source);
  /// A post-processor that adds `before` and `after` (its spec a TemplateProcessing naming
  /// `names`, the entries of those ids).
  static PostProcessor around(std::vector<std::int64_t> before, std::vector<std::int64_t> after,
                              const std::vector<std::string>& before_names,
                              const std::vector<std::string>& after_names);
  /// The spec as read (null for none; a ByteLevel one for `byte_level` files without one, as
  /// Hugging Face writes them).
  nlohmann::json to_json(bool byte_level) const;
  /// The ids before a sequence.
  const std::vector<std::int64_t>& before() const { return before_; }
  /// The ids after a sequence.
  const std::vector<std::int64_t>& after() const { return after_; }
  /// `ids` without the before() ids at their start and the after() ids at their end, each where
  /// it is there: the ids a text encoded to.
  std::span<const std::int64_t> inner(std::span<const std::int64_t> ids) const;

 private:
  void add(const nlohmann::json& spec, const std::string& type);
  void add_template(const nlohmann::json& spec);
  nlohmann::json spec_;  // null when it adds nothing
  std::vector<std::int64_t> before_;
  std::vector<std::int64_t> after_;
};

}  // namespace meshtensor::tokenize
