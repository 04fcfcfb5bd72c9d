// Runs the fuzz target without libFuzzer: every corpus file, then deterministic mutations of
// them (byte flips, insertions, deletions, splices). Usage: <target>_fuzz_smoke <corpus dir>
// [count]
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include <meshtensor/core/random.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {
void run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: fuzz_smoke <corpus dir> [mutations]\n";
    return 2;
  }
  const long mutations = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 200000;
  std::vector<std::string> corpus;
  for (const auto& entry : std::filesystem::directory_iterator(argv[1])) {
    std::ifstream file(entry.path(), std::ios::binary);
    corpus.emplace_back(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }
  if (corpus.empty()) {
    std::cerr << "corpus " << argv[1] << " is empty\n";
    return 2;
  }
  for (const std::string& input : corpus)
    run(input);
  const std::string alphabet = "0123456789xSRP(),@\n sumavgmaxinf-_dpt";
  std::uint64_t state = 1;
  auto next = [&](std::uint64_t bound) { return (state = meshtensor::mix64(state)) % bound; };
  for (long i = 0; i < mutations; ++i) {
    std::string input = corpus[next(corpus.size())];
    const auto edits = 1 + next(4);
    for (std::uint64_t e = 0; e < edits; ++e) {
      const std::size_t at = input.empty() ? 0 : next(input.size() + 1);
      switch (next(4)) {
        case 0:
          if (at < input.size()) input[at] = alphabet[next(alphabet.size())];
          break;
        case 1:
          input.insert(at, 1, alphabet[next(alphabet.size())]);
          break;
        case 2:
          if (at < input.size()) input.erase(at, 1 + next(3));
          break;
        default:
          input.insert(at, corpus[next(corpus.size())].substr(0, 1 + next(12)));
      }
    }
    run(input);
  }
  std::cout << "fuzz smoke: " << corpus.size() << " corpus inputs and " << mutations
            << " mutations, no crash\n";
  return 0;
}
