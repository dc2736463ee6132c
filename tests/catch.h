// tests/catch.h: Catch2 for the tests, version 2 (Debian 12) or version 3 (Debian 13, Ubuntu
// 24.04): the one CMake found and links (FG_CATCH2_MAJOR, from tests/CMakeLists.txt; a header of
// the other version elsewhere on the include path is not looked at). The tests use the names
// below, which mean the same in both:
//   ContainsSubstring  the string matcher (v2 called it Contains; v3's Contains is for ranges)
//   Approx             Catch::Approx (v2 also had it in the global namespace)
//   EventListenerBase  the base of a listener (v2: TestEventListenerBase, with
//                      CATCH_CONFIG_EXTERNAL_INTERFACES defined first)
#pragma once

#if FG_CATCH2_MAJOR >= 3
#include <catch2/catch_all.hpp>

namespace fg::test {
using Catch::Approx;
using Catch::Matchers::ContainsSubstring;
using EventListenerBase = Catch::EventListenerBase;
}  // namespace fg::test

#else
#include <catch2/catch.hpp>

#include <string>

namespace fg::test {
using Catch::Detail::Approx;
#ifdef CATCH_CONFIG_EXTERNAL_INTERFACES  // v2 declares the listener's base only when asked to
using EventListenerBase = Catch::TestEventListenerBase;
#endif
inline Catch::Matchers::StdString::ContainsMatcher ContainsSubstring(const std::string& text) {
    return Catch::Matchers::Contains(text);
}
}  // namespace fg::test
#endif

using fg::test::Approx;
using fg::test::ContainsSubstring;
