#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace meshtensor {

/// Where a training step's time goes (the rows of a step profile).
enum class ProfileRow : std::uint8_t {
  other,               ///< everything outside the rows below
  matmul,              ///< kernels::matmul
  attention,           ///< attention's row kernels, forward and backward
  exact_sums,          ///< binned (exact) sums and their rounding
  norms_activations,   ///< norms, GELU, SwiGLU
  loss,                ///< softmax cross-entropy
  optimizer,           ///< the optimizer step and gradient clipping
  communication_wait,  ///< compute waiting for collectives and pipeline messages
  data,                ///< building the batch
};

/// Number of ProfileRow values.
inline constexpr std::size_t kProfileRows = 9;

/// "matmul", "attention", ... (snake_case, as JSON keys).
std::string_view profile_row_name(ProfileRow row);

/// Seconds per row.
using ProfileSeconds = std::array<double, kProfileRows>;

/// The calling thread's step profile: while running, every moment of the thread's time is
/// charged to exactly one row (the innermost ProfileScope open, else `other`), so the rows add
/// up to the time the profile ran. Off by default; a ProfileScope then costs one test.
class ThreadProfile {
 public:
  /// Starts (or resumes) charging time on this thread.
  static void resume();
  /// Stops charging time on this thread (what was charged stays).
  static void pause();
  /// The seconds charged to each row so far, and zeroes them.
  static ProfileSeconds take();
};

/// Charges the calling thread's time to `row` while it lives (when the thread's profile runs);
/// scopes nest, the innermost one takes the time.
class ProfileScope {
 public:
  explicit ProfileScope(ProfileRow row);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  ProfileRow outer_ = ProfileRow::other;
  bool active_ = false;
};

}  // namespace meshtensor
