#include <string>

#include <gtest/gtest.h>

#include <meshtensor/core/base64.hpp>
#include <meshtensor/core/error.hpp>

namespace meshtensor {
namespace {

// RFC 4648's test vectors.
TEST(Base64, EncodesTheRfcVectorsAndDecodesThemBack) {
  const std::pair<std::string, std::string> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [bytes, text] : vectors) {
    EXPECT_EQ(base64_encode(bytes), text);
    EXPECT_EQ(base64_decode(text, "t"), bytes);
  }
  std::string all;
  for (int b = 0; b < 256; ++b)
    all += static_cast<char>(b);
  EXPECT_EQ(base64_decode(base64_encode(all), "t"), all);
}

TEST(Base64, NamesACharacterOutsideTheAlphabet) {
  try {
    base64_decode("Zm9v*mFy", "the field");
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("the field: character 4 is not base64"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtensor
