#pragma once
// A Boost.Test decorator for the few cases whose cost under the sanitizers buys no memory or UB
// coverage that other cases do not already give: training runs that check learning or timing,
// not code. Under AddressSanitizer (tests/sanitize.sh's clang build) such a case is reported as
// skipped, with its reason, in the suite's output and in tests/summary.py's count; the release
// build runs it as usual.
#include <boost/test/unit_test.hpp>

#include <string>

namespace fsdp::testing {

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FSDP_TESTS_UNDER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)  // gcc's spelling
#define FSDP_TESTS_UNDER_ASAN 1
#endif

#ifdef FSDP_TESTS_UNDER_ASAN
inline constexpr bool kUnderSanitizers = true;
#else
inline constexpr bool kUnderSanitizers = false;
#endif

// BOOST_AUTO_TEST_CASE(name, *fsdp::testing::not_under_sanitizers("why"))
inline boost::unit_test::decorator::precondition not_under_sanitizers(std::string why) {
  return boost::unit_test::precondition([why](boost::unit_test::test_unit_id) {
    boost::test_tools::assertion_result r(!kUnderSanitizers);
    r.message() << "not run under the sanitizers: " << why;
    return r;
  });
}

}  // namespace fsdp::testing
