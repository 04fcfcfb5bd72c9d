#pragma once

#include <functional>
#include <string>

#include "output_files.hpp"

namespace meshtensor::cli {

/// `text` with every character but letters, digits and " ,:._=-" removed: what may appear in a
/// gnuplot script, which must never parse user text.
std::string plot_safe(const std::string& text);

/// Draws a PNG with gnuplot into `png` (opened by the caller before the run, so a bad path fails
/// first) and commits it: `data` (whitespace-separated columns) goes to a temporary file, and
/// `script(data_path)` gives the plot commands that read it; the terminal and output lines come
/// before them. gnuplot reads and writes only temporary files this function names; the image is
/// copied to the user's file here, so no user path is ever parsed. DataError naming the path
/// when gnuplot is missing or fails.
void render_plot(OutputFile& png, const std::string& data,
                 const std::function<std::string(const std::string& data_path)>& script);

}  // namespace meshtensor::cli
