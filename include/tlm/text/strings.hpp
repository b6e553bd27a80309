#pragma once
// Small string helpers several headers share (C++20's string_view has no contains yet).
#include <string_view>

namespace tlm::detail {

inline bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

}  // namespace tlm::detail
