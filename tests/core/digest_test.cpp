#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/digest.hpp>

namespace meshtensor {
namespace {

TEST(Digest64, SplittingTheStreamDoesNotChangeTheDigest) {
  std::vector<std::byte> bytes(101);
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<std::byte>(i * 37);
  Digest64 whole;
  whole.update(bytes);
  for (std::size_t cut = 0; cut <= bytes.size(); cut += 7) {
    Digest64 parts;
    parts.update(std::span(bytes).first(cut));
    parts.update(std::span(bytes).subspan(cut));
    EXPECT_EQ(parts.finish(), whole.finish()) << cut;
  }
}

TEST(Digest64, LengthAndContentMatter) {
  Digest64 a;
  a.update_u64(0);
  Digest64 b;
  b.update(std::string_view("\0\0\0\0\0\0\0", 7));
  EXPECT_NE(a.finish(), b.finish());
  Digest64 empty;
  EXPECT_NE(empty.finish(), b.finish());
  Digest64 c;
  c.update_u64(1);
  EXPECT_NE(a.finish(), c.finish());
  EXPECT_EQ(digest_hex(0x1234), "0000000000001234");
}

}  // namespace
}  // namespace meshtensor
