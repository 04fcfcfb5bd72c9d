// Library messages name settings by their fields in backquotes; front ends rename them.
#include <string>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>

namespace meshtensor {
namespace {

std::string as_flag(std::string_view field) {
  std::string flag = "--" + std::string(field);
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

TEST(SettingNames, BackquotedFieldsTakeTheFrontEndsNames) {
  EXPECT_EQ(with_setting_names("give `micro_batches` 2 or more, or `mesh` 2x2", as_flag),
            "give --micro-batches 2 or more, or --mesh 2x2");
  EXPECT_EQ(
      with_setting_names("`names`: unknown", [](std::string_view f) { return std::string(f); }),
      "names: unknown");
}

TEST(SettingNames, OtherTextIsUnchanged) {
  // Not a field name (a space, a capital), an unmatched quote, no quotes at all.
  EXPECT_EQ(with_setting_names("a `not a field` and `Upper`", as_flag),
            "a `not a field` and `Upper`");
  EXPECT_EQ(with_setting_names("one ` quote", as_flag), "one ` quote");
  EXPECT_EQ(with_setting_names("plain", as_flag), "plain");
  EXPECT_EQ(with_setting_names("``", as_flag), "``");
}

}  // namespace
}  // namespace meshtensor
