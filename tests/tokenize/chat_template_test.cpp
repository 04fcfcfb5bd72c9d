#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <meshtensor/core/error.hpp>
#include <meshtensor/tokenize/chat_template.hpp>

namespace meshtensor::tokenize {
namespace {

using Value = nlohmann::ordered_json;

std::string render(const std::string& source, const Value& context = Value::object()) {
  return ChatTemplate(source).render(context);
}

// Published templates' shapes (ChatML, Llama 3's, Zephyr's) and the constructs they use, each
// against the text Jinja itself renders (chat_template_cases.json, made by
// chat_template_cases.py with python3-jinja2 set up as transformers sets it up).
TEST(ChatTemplate, RendersAsJinjaRenders) {
  std::ifstream file(std::string(MESHTENSOR_TESTS_SOURCE_DIR) +
                     "/tokenize/chat_template_cases.json");
  ASSERT_TRUE(file) << "chat_template_cases.json";
  const Value cases = Value::parse(file);
  ASSERT_GE(cases.size(), 4u);
  for (auto it = cases.begin(); it != cases.end(); ++it) {
    const Value& c = it.value();
    EXPECT_EQ(render(c["template"].get<std::string>(), c["context"]),
              c["expected"].get<std::string>())
        << it.key();
  }
}

TEST(ChatTemplate, WhitespaceControlAndBlocksTrimAsTransformersSetsThem) {
  EXPECT_EQ(render("a  {%- if true %} b {% endif -%}  c"), "a b c");
  EXPECT_EQ(render("x\n  {% if true %}\ny\n  {% endif %}\nz"), "x\ny\nz");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}"), "a\nb");  // trim_blocks spares output tags
  EXPECT_EQ(render("{# note #}\nq"), "q");
}

TEST(ChatTemplate, RaiseExceptionAndBadValuesAreDataErrorsNamingTheLine) {
  try {
    render("\n{{ raise_exception('Conversation roles must alternate') }}");
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_STREQ(e.what(), "chat template line 2: Conversation roles must alternate");
  }
  EXPECT_THROW(render("{{ 1 + 'a' }}"), DataError);
  EXPECT_THROW(render("{{ 3 // 0 }}"), DataError);
}

TEST(ChatTemplate, UnsupportedConstructsAreRefusedByName) {
  const auto refusal = [](const std::string& source) {
    try {
      ChatTemplate{source};
    } catch (const ParseError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refusal("{% macro f() %}{% endmacro %}").find("'{% macro %}' is not a construct"),
            std::string::npos);
  EXPECT_NE(refusal("{{ x|selectattr('a') }}").find("filter 'selectattr'"), std::string::npos);
  EXPECT_NE(refusal("{% if x is callable %}{% endif %}").find("test 'callable'"),
            std::string::npos);
  EXPECT_NE(refusal("{% if x %}").find("not closed"), std::string::npos);
  EXPECT_NE(refusal("{{ 'open }}").find("not closed"), std::string::npos);
  EXPECT_NE(refusal("{{ }}").find("an expression is missing or ends too early"), std::string::npos);
  EXPECT_NE(refusal("{% for %}").find("expected a name, found the end"), std::string::npos);
  // Input nesting is bounded before it costs a deep stack.
  std::string deep_if;
  for (int i = 0; i < 100000; ++i)
    deep_if += "{% if x %}";
  EXPECT_NE(refusal(deep_if).find("blocks nest deeper than 64"), std::string::npos);
  EXPECT_NE(refusal("{{ " + std::string(100000, '(') + "1 }}").find("nest deeper than 64"),
            std::string::npos);
  EXPECT_NE(refusal("{{ " + std::string(100000, '-') + "1 }}").find("nest deeper than 64"),
            std::string::npos);
  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i)
    nots += "not ";
  EXPECT_NE(refusal(nots + "x }}").find("nest deeper than 64"), std::string::npos);
  EXPECT_EQ(render("{{ ((((1)))) + -(-2) }} {{ not not true }}"), "3 True");
}

}  // namespace
}  // namespace meshtensor::tokenize
