#include "plot.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <unistd.h>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>

namespace meshtensor::cli {

std::string plot_safe(const std::string& text) {
  std::string out;
  for (const char c : text)
    if (std::isalnum(static_cast<unsigned char>(c)) != 0 || std::strchr(" ,:._=-", c) != nullptr)
      out += c;
  return out;
}

void render_plot(OutputFile& png, const std::string& data,
                 const std::function<std::string(const std::string& data_path)>& script) {
  char data_path[] = "/tmp/meshtensor-plot-XXXXXX";
  const int fd = mkstemp(data_path);
  const std::string& path = png.path();
  if (fd < 0) throw DataError(fmt::format("{}: cannot create a temporary file for gnuplot", path));
  close(fd);
  // The image's name is made (and the file created) here too, so gnuplot never writes over a
  // file that someone else put at a guessable name.
  char image_name[] = "/tmp/meshtensor-plot-XXXXXX.png";
  const int image_fd = mkstemps(image_name, 4);
  if (image_fd < 0) {
    std::remove(data_path);
    throw DataError(fmt::format("{}: cannot create a temporary file for gnuplot", path));
  }
  close(image_fd);
  const std::string image_path = image_name;
  {
    std::ofstream out(data_path);
    out << data;
  }
  const std::string commands = fmt::format("set terminal png size 900,500\nset output '{}'\n{}",
                                           image_path, script(data_path));
  FILE* gnuplot = popen("gnuplot 2>&1", "w");
  if (gnuplot == nullptr) {
    std::remove(data_path);
    std::remove(image_path.c_str());
    throw DataError("cannot run gnuplot for --plot (install gnuplot-nox)");
  }
  std::fputs(commands.c_str(), gnuplot);
  const int status = pclose(gnuplot);
  std::remove(data_path);
  std::ifstream image(image_path, std::ios::binary);
  if (status != 0 || !image) {
    std::remove(image_path.c_str());
    throw DataError(fmt::format(
        "gnuplot could not draw {} (exit status {}; is gnuplot-nox installed?)", path, status));
  }
  png.stream() << image.rdbuf();
  image.close();
  std::remove(image_path.c_str());
  png.commit();
}

}  // namespace meshtensor::cli
