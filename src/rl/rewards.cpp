#include <algorithm>
#include <cctype>
#include <map>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/file.hpp>
#include <meshtensor/generate/load.hpp>
#include <meshtensor/rl/rewards.hpp>

namespace meshtensor::rl {

namespace {

std::string lower(std::string_view word) {
  std::string result(word);
  for (char& c : result)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return result;
}

bool is_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/// The records of text as TextCorpus keeps them: each followed by a line holding only "%".
std::vector<std::string_view> records_of(std::string_view text) {
  std::vector<std::string_view> records;
  std::size_t start = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    if (text.substr(at, end - at) == "%") {
      records.push_back(text.substr(start, at - start));
      start = end + 1;
    }
    at = end + 1;
  }
  if (start < text.size()) records.push_back(text.substr(start));
  return records;
}

}  // namespace

std::shared_ptr<const Dictionary> Dictionary::load(const std::string& path) {
  const std::string package_hint =
      path == kDefaultDictionary ? " (install Debian's word list: apt-get install wamerican)" : "";
  std::string text;
  try {
    text = read_regular_file(path, kMaxDictionaryBytes, "a word list");
  } catch (const DataError& e) {
    throw DataError(
        fmt::format("cannot read the word list {}: {}{}", path, e.what(), package_hint));
  }
  auto dictionary = std::make_shared<Dictionary>();
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) dictionary->words_.insert(lower(line));
    start = end + 1;
  }
  if (dictionary->words_.empty())
    throw DataError(fmt::format("the word list {} holds no word{}", path, package_hint));
  return dictionary;
}

bool Dictionary::contains(std::string_view word) const {
  return words_.contains(lower(word));
}

std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> words;
  std::size_t i = 0;
  while (i < text.size()) {
    if (!is_letter(text[i])) {
      ++i;
      continue;
    }
    const std::size_t start = i;
    while (i < text.size() && (is_letter(text[i]) ||
                               (text[i] == '\'' && i + 1 < text.size() && is_letter(text[i + 1]))))
      ++i;
    words.push_back(text.substr(start, i - start));
  }
  return words;
}

double english_word_fraction(const Dictionary& dictionary, std::string_view text) {
  const std::vector<std::string_view> words = split_words(text);
  if (words.empty()) return 0.0;
  constexpr std::size_t kBytesPerWord = 6;
  // A word repeated counts once: a completion of one word over and over is not English.
  std::unordered_set<std::string> english;
  for (const std::string_view word : words) {
    const bool is_english =
        word.size() == 1 ? (word == "a" || word == "A" || word == "I") : dictionary.contains(word);
    if (is_english) english.insert(lower(word));
  }
  // English text has about one word per 6 bytes (its space included): fewer words than that
  // count as missing, so that a completion of a word or two among blanks does not score fully.
  const auto expected = static_cast<std::size_t>((text.size() + kBytesPerWord - 1) / kBytesPerWord);
  return static_cast<double>(english.size()) /
         static_cast<double>(std::max(words.size(), expected));
}

RlTask words_task(std::shared_ptr<const train::TextCorpus> corpus,
                  std::shared_ptr<const Dictionary> dictionary, std::int64_t prompt_bytes) {
  if (prompt_bytes < 1)
    throw InvalidArgument(fmt::format("a prompt of {} bytes is no prompt", prompt_bytes));
  RlTask task;
  task.name = "words";
  const auto length = static_cast<std::size_t>(prompt_bytes);
  for (const std::string_view record : records_of(corpus->validation))
    if (record.size() > length) task.prompts.emplace_back(record.substr(0, length));
  if (task.prompts.empty()) {
    throw InvalidArgument(
        fmt::format("no held-out record of the text is longer than the {} prompt bytes asked for",
                    prompt_bytes));
  }
  task.reward = [dictionary](const std::string&, const std::string& completion) {
    return english_word_fraction(*dictionary, completion);
  };
  task.corpus = std::move(corpus);
  return tokenized(std::move(task), nullptr);
}

RlTask arithmetic_task() {
  RlTask task;
  task.name = "arithmetic";
  auto corpus = std::make_shared<train::TextCorpus>();
  std::string text;
  for (int a = 10; a < 50; ++a) {
    for (int b = 10; b < 50; ++b) {
      task.prompts.push_back(fmt::format("{}+{}=", a, b));
      text += fmt::format("{}+{}={}\n", a, b, a + b);
    }
  }
  train::add_text_records(text, *corpus);
  task.reward = [](const std::string& prompt, const std::string& completion) {
    const auto digit = [&](std::size_t i) {
      return i < completion.size() && std::isdigit(static_cast<unsigned char>(completion[i])) != 0;
    };
    if (!digit(0)) return 0.0;
    const std::string answer =
        std::to_string(std::stoi(prompt.substr(0, 2)) + std::stoi(prompt.substr(3, 2)));
    // A number first, then each leading digit of the sum in place, then the number ending there.
    double reward = 0.25;
    std::size_t matched = 0;
    while (matched < answer.size() && matched < completion.size() &&
           completion[matched] == answer[matched])
      ++matched;
    reward += 0.5 * static_cast<double>(matched) / static_cast<double>(answer.size());
    if (matched == answer.size() && !digit(matched)) reward += 0.25;
    return reward;
  };
  task.corpus = std::move(corpus);
  return tokenized(std::move(task), nullptr);
}

RlTask tokenized(RlTask task, std::shared_ptr<const tokenize::Tokenizer> tokenizer) {
  task.tokenizer = tokenizer ? std::move(tokenizer) : tokenize::byte_tokenizer();
  std::vector<std::vector<std::int64_t>> tokens;
  std::map<std::size_t, std::int64_t> lengths;
  for (const std::string& prompt : task.prompts) {
    tokens.push_back(task.tokenizer->encode_with_specials(prompt));
    ++lengths[tokens.back().size()];
  }
  std::size_t kept = 0;
  std::int64_t most = 0;
  for (const auto& [length, count] : lengths) {
    if (count > most) {
      kept = length;
      most = count;
    }
  }
  std::vector<std::string> prompts;
  task.prompt_tokens.clear();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].size() != kept) continue;
    prompts.push_back(task.prompts[i]);
    task.prompt_tokens.push_back(std::move(tokens[i]));
  }
  task.prompts = std::move(prompts);
  return task;
}

RlTask tokenized_for(RlTask task, const std::string& init) {
  if (init.empty()) return task;
  return tokenized(std::move(task), generate::model_tokenizer(init));
}

RlTask builtin_task(const std::string& name, const std::string& data_path,
                    const std::string& dictionary_path, std::int64_t prompt_bytes) {
  if (name == "words") {
    auto corpus = std::make_shared<const train::TextCorpus>(train::load_text(data_path));
    return words_task(std::move(corpus), Dictionary::load(dictionary_path), prompt_bytes);
  }
  if (name == "arithmetic") return arithmetic_task();
  throw InvalidArgument(fmt::format("task '{}' is not words or arithmetic", name));
}

}  // namespace meshtensor::rl
