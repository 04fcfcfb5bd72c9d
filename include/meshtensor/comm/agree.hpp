#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <meshtensor/comm/communicator.hpp>

namespace meshtensor::comm {

/// `root`'s `text` on every rank of `group` (collective; texts longer than 4095 bytes are cut):
/// how one rank's message, an error found there, reaches the others.
std::string broadcast_text(Communicator& group, const std::string& text, int root);

/// Every rank's `text` on every rank of `group`, in rank order (collective, any lengths).
std::vector<std::string> all_gather_text(Communicator& group, const std::string& text);

/// Collective: returns when no rank of `group` passes a failure; otherwise every rank throws the
/// failure of the lowest failing rank: that rank rethrows its own exception, the others throw
/// the same meshtensor error class with the same message. Work that may fail on some ranks only
/// (reading a file, validating local input) ends with this call, so that no rank goes on to a
/// collective that the failed one never reaches.
void throw_if_any_failed(Communicator& group, const std::exception_ptr& failure);

/// Whether `flag` holds on any rank of `group` (collective, one small all_reduce): how the ranks of
/// a job agree that one of them saw a failure the others did not.
bool on_any_rank(Communicator& group, bool flag);

/// Checks that every rank of `group` passes the same `text` (a configuration: options, a mode, a
/// plan): collective, one small all_reduce when they agree. When they do not, every rank throws
/// the same InvalidArgument naming `what`, group rank 0's text and the first rank that differs
/// with its text, instead of running on with mismatched settings (which may hang or give wrong
/// bits without an error).
void check_same_on_every_rank(Communicator& group, std::string_view what, const std::string& text);

}  // namespace meshtensor::comm
