#include <meshtensor/core/error.hpp>

// The hierarchy is header-only; this unit anchors the vtables in the core library.
namespace meshtensor {}
