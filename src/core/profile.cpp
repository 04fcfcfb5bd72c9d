#include <chrono>

#include <meshtensor/core/profile.hpp>

namespace meshtensor {

namespace {

using Clock = std::chrono::steady_clock;

struct State {
  bool running = false;
  ProfileRow current = ProfileRow::other;
  Clock::time_point since;
  ProfileSeconds seconds{};
};

thread_local State state;

/// Charges the time since the last charge to the current row.
void charge(Clock::time_point now) {
  state.seconds[static_cast<std::size_t>(state.current)] +=
      std::chrono::duration<double>(now - state.since).count();
  state.since = now;
}

}  // namespace

std::string_view profile_row_name(ProfileRow row) {
  switch (row) {
    case ProfileRow::other:
      return "other";
    case ProfileRow::matmul:
      return "matmul";
    case ProfileRow::attention:
      return "attention";
    case ProfileRow::exact_sums:
      return "exact_sums";
    case ProfileRow::norms_activations:
      return "norms_activations";
    case ProfileRow::loss:
      return "loss";
    case ProfileRow::optimizer:
      return "optimizer";
    case ProfileRow::communication_wait:
      return "communication_wait";
    case ProfileRow::data:
      return "data";
  }
  return "other";
}

void ThreadProfile::resume() {
  if (state.running) return;
  state.running = true;
  state.since = Clock::now();
}

void ThreadProfile::pause() {
  if (!state.running) return;
  charge(Clock::now());
  state.running = false;
}

ProfileSeconds ThreadProfile::take() {
  if (state.running) charge(Clock::now());
  const ProfileSeconds out = state.seconds;
  state.seconds = {};
  return out;
}

ProfileScope::ProfileScope(ProfileRow row) {
  if (!state.running) return;
  charge(Clock::now());
  outer_ = state.current;
  state.current = row;
  active_ = true;
}

ProfileScope::~ProfileScope() {
  if (!active_) return;
  if (state.running) charge(Clock::now());
  state.current = outer_;
}

}  // namespace meshtensor
