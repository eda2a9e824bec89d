// The headers the Boost.Test sources share, precompiled once per build for all of them
// (tests/meson.build: test_pch_dep) instead of parsed by each: Boost.Test's framework, the
// standard headers of src/pch/fsdp_pch.h and the project headers most suites include. gcc 12 at
// -O0: test_optim.cpp 5.7 -> 2.6 CPU-s, test_config.cpp 13.8 -> 10.2; clang's sanitizer build:
// test_optim.cpp 5.9 -> 2.9.
//
// Not <boost/test/unit_test.hpp> itself, nor unit_test_suite.hpp: their tails define main() and
// the master suite's name from BOOST_TEST_MODULE, which each suite sets before including them.
// Because this header is included first, Boost's detail/config.hpp no longer sees that macro, so
// the suites are compiled with -DBOOST_TEST_MAIN (what BOOST_TEST_MODULE would have defined).
#include <boost/test/framework.hpp>
#include <boost/test/test_tools.hpp>
#include <boost/test/tree/auto_registration.hpp>
#include <boost/test/tree/global_fixture.hpp>
#include <boost/test/tree/test_case_template.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "comm/comm.h"
#include "config/config.h"
#include "models/model.h"
#include "pch/fsdp_pch.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/memory.h"
